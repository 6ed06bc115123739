"""Errors raised when a slide cannot be opened or read."""

from __future__ import annotations

import os


class SlideError(ValueError):
    """A file could not be opened or read as a whole-slide image.

    The message always names the file and the problem.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
