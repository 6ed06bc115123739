"""Deprecated, private: the warning category's home is :mod:`napari_slidescope.errors`.

Only modules still being edited on other branches import through this re-export
(tests/test_structure.py lists them); once they import :mod:`napari_slidescope.errors`,
this module goes.
"""

from napari_slidescope.errors import SlidescopeWarning

__all__ = ["SlidescopeWarning"]
