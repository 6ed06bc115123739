"""The tiles task's files: ``tiles.parquet`` and ``tile_embeddings.zarr`` (``--tiles``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["TILE_EMBEDDINGS_STORE", "TILES_FILE", "remove_tiles", "write_tiles"]

#: The tile table, GeoParquet (:meth:`~napari_slidescope.tiles.TileTable.to_geoparquet`).
TILES_FILE = "tiles.parquet"
#: The tiles x features AnnData (zarr) of ``--embed``.
TILE_EMBEDDINGS_STORE = "tile_embeddings.zarr"


def write_tiles(slide_dir: Path, tiles: Any, embeddings: Any | None) -> None:
    """Write a slide's tile table and, with a model, its embeddings (each whole or not at all).

    The store is written into a temporary folder beside it and renamed; without
    embeddings, one an earlier run left is removed (it would not match the tiles).
    """
    from napari_slidescope.tiles.cohort import _write_zarr

    tiles.to_geoparquet(slide_dir / TILES_FILE)
    store = slide_dir / TILE_EMBEDDINGS_STORE
    if embeddings is None:
        shutil.rmtree(store, ignore_errors=True)
        return
    partial = slide_dir / f".{TILE_EMBEDDINGS_STORE}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    _write_zarr(embeddings, partial)
    shutil.rmtree(store, ignore_errors=True)
    os.replace(partial, store)


def remove_tiles(slide_dir: Path) -> None:
    """Remove a slide's tile files (a run without ``--tiles`` after one with it)."""
    (slide_dir / TILES_FILE).unlink(missing_ok=True)
    for name in (TILE_EMBEDDINGS_STORE, f".{TILE_EMBEDDINGS_STORE}.partial"):
        shutil.rmtree(slide_dir / name, ignore_errors=True)
