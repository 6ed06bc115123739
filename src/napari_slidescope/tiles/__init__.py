"""Tiles and embeddings for machine learning.

Tile grids at a stated µm/px, fast reading (an iterator and a PyTorch dataset) and
features from the user's own model.

GUI-free; pyarrow, anndata, torch and onnxruntime are imported only where used.
"""

from __future__ import annotations

from napari_slidescope.tiles.cohort import embed_slide, embed_slides
from napari_slidescope.tiles.embed import embed_tiles, load_model, write_tile_embeddings
from napari_slidescope.tiles.reading import TileDataset, area_resize, iter_tiles, read_tile
from napari_slidescope.tiles.tiling import TILE_COLUMNS, TileTable, tile_slide

__all__ = [
    "TILE_COLUMNS",
    "TileDataset",
    "TileTable",
    "area_resize",
    "embed_slide",
    "embed_slides",
    "embed_tiles",
    "iter_tiles",
    "load_model",
    "read_tile",
    "tile_slide",
    "write_tile_embeddings",
]
