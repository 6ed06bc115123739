"""Deprecated: import SlideError from :mod:`napari_slidescope.errors` instead.

A re-export kept for code outside the package that imports this public path; the package
itself never imports through it (tests/test_structure.py checks), and it may go in a
later release. ``napari_slidescope.slide.SlideError`` and ``napari_slidescope.SlideError``
are the same class.
"""

from napari_slidescope.errors import SlideError

__all__ = ["SlideError"]
