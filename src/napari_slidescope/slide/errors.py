"""Errors raised when a slide cannot be opened or read.

Defined in :mod:`napari_slidescope.errors`.
"""

from napari_slidescope.errors import SlideError

__all__ = ["SlideError"]
