"""The console helpers, under the name the README and users' scripts import.

The helpers live in :mod:`napari_slidescope._qt.console`; this module re-exports them
so that ``from napari_slidescope.viewer import add_slide, add_nuclei`` keeps working.
Importing it does not import napari.
"""

from napari_slidescope._napari.tiles import add_tile_overlay
from napari_slidescope._qt.cell_classes_dock import add_cells, classify
from napari_slidescope._qt.console import (
    add_nuclei,
    add_slide,
    add_tissue,
    cancel,
    summary,
    visible_region,
)

__all__ = [
    "add_cells",
    "add_nuclei",
    "add_slide",
    "add_tile_overlay",
    "add_tissue",
    "cancel",
    "classify",
    "summary",
    "visible_region",
]
