"""The errors and warnings the public API raises, in one public place.

Each is also importable from where it was first defined (for example
``napari_slidescope.slide.SlideError`` or ``napari_slidescope.segmenters.SegmenterInfoWarning``):
those names are this module's classes, so ``except`` clauses work with either path. The
package's own modules import them from here.

Every warning the package emits is a :class:`SlidescopeWarning`, so one filter turns
them all into errors or silences them::

    import warnings
    from napari_slidescope.errors import SlidescopeWarning

    warnings.simplefilter("error", SlidescopeWarning)

Examples
--------
>>> from napari_slidescope.errors import SlideError
>>> str(SlideError("slide.svs", "not a TIFF file"))
'slide.svs: not a TIFF file'
"""

from __future__ import annotations

import os

__all__ = [
    "Cancelled",
    "ClassifierFileError",
    "InstallError",
    "SegmenterInfoWarning",
    "SegmenterMismatchWarning",
    "SegmenterUnavailableError",
    "SlideError",
    "SlidescopeWarning",
    "UncalibratedWarning",
]


class SlidescopeWarning(UserWarning):
    """A recoverable oddity in a slide or in analysis input (e.g. missing calibration)."""


class UncalibratedWarning(SlidescopeWarning):
    """The slide has no pixel size: its pixels are taken to be at the working resolution."""


class SegmenterMismatchWarning(SlidescopeWarning):
    """A segmenter runs on an image of the other kind (brightfield vs fluorescence)."""


class SegmenterInfoWarning(SlidescopeWarning):
    """``segmenter="auto"`` ran the built-in method: which one ran, and how to get better."""


class SlideError(ValueError):
    """A file could not be opened or read as a whole-slide image.

    The message always names the file and the problem.

    Parameters
    ----------
    path : str or os.PathLike
        The file (or URL) that could not be opened or read.
    problem : str
        What was wrong with it.

    Attributes
    ----------
    path : str
        The file, as a string.
    problem : str
        What was wrong with it.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class SegmenterUnavailableError(RuntimeError):
    """A registered segmenter cannot be used here (package or model file missing)."""


class InstallError(RuntimeError):
    """A model could not be installed (the message says why; nothing was installed)."""


class ClassifierFileError(ValueError):
    """A classifier file that is foreign, damaged or from an incompatible version."""


class Cancelled(Exception):
    """The run was cancelled (its ``cancel`` event was set).

    Parameters
    ----------
    stage : str
        Where the run noticed, e.g. ``"tissue detection"``.

    Attributes
    ----------
    stage : str
        Where the run noticed.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage
        super().__init__(f"cancelled during {stage}")
