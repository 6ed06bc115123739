"""The project's warning category, kept for old imports.

Its home is :mod:`napari_slidescope.errors`.
"""

from napari_slidescope.errors import SlidescopeWarning

__all__ = ["SlidescopeWarning"]
