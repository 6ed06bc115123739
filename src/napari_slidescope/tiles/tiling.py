"""Tile grids at a stated µm/px: which tiles a slide has, where, and how each is read.

:func:`tile_slide` lays a grid over a slide *at the requested pixel size* (not at a
level's): tile ``(i, j)`` of a ``tile_px`` grid with stride ``stride_px`` is the crop
``[i * stride_px, i * stride_px + tile_px)`` rows (alike for columns) of a virtual image of
the whole slide at ``mpp`` µm/px. Its footprint on the slide is exact in µm (and so in
level-0 pixels, generally a fraction of a pixel), which is what makes the delivered pixel
size exactly the one asked for (see :mod:`napari_slidescope.tiles.reading`). Ids are the
raster index of the full grid, ``grid_row * grid_cols + grid_col``: the same slide and
parameters give the same ids whatever is kept, dropped or read first.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.slide import level_choice

__all__ = ["TILE_COLUMNS", "TileTable", "tile_slide"]

#: The columns of a :class:`TileTable` and what each holds.
TILE_COLUMNS: dict[str, str] = {
    "id": "raster index of the tile in the full grid (grid_row * grid_cols + grid_col)",
    "grid_row": "row of the tile in the grid",
    "grid_col": "column of the tile in the grid",
    "row0": "level-0 px, first row the tile touches (floor of its exact top edge)",
    "col0": "level-0 px, first column the tile touches",
    "row1": "level-0 px, one past the last row it touches (ceil of its exact bottom edge)",
    "col1": "level-0 px, one past the last column it touches",
    "y_um": "µm, exact top edge of the tile",
    "x_um": "µm, exact left edge of the tile",
    "level": "pyramid level read (the coarsest at least as fine as mpp)",
    "downsample": "level-0 px per pixel of that level (columns)",
    "mpp": "µm/px delivered (the requested mpp, exactly)",
    "tissue_fraction": "fraction of the tile covered by the tissue mask (NaN without one)",
}

_INT_COLUMNS = ("id", "grid_row", "grid_col", "row0", "col0", "row1", "col1", "level")


@dataclass(frozen=True, eq=False)
class TileTable:
    """The tiles of one slide: a column table (numpy arrays) and the grid's parameters.

    Attributes
    ----------
    columns : dict of str to (K,) ndarray
        :data:`TILE_COLUMNS`, one row per tile kept, in id order.
    slide : str
        The slide it was cut from (path or URL without credentials).
    slide_mpp : (float, float)
        Level-0 µm/px ``(y, x)`` used (the slide's, or the one stated).
    mpp : float
        µm/px of every tile delivered.
    tile_px : int
        Tile side in delivered pixels.
    stride_px : int
        Grid step in delivered pixels (``tile_px`` minus the overlap).
    grid_shape : (int, int)
        Rows and columns of the full grid (before tissue gating).
    parameters : dict
        What was asked and what ``"auto"`` resolved to (JSON-able).
    """

    columns: dict[str, np.ndarray] = field(repr=False)
    slide: str
    slide_mpp: tuple[float, float]
    mpp: float
    tile_px: int
    stride_px: int
    grid_shape: tuple[int, int]
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return int(len(self.columns["id"]))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self.row(i)

    @property
    def tile_um(self) -> float:
        """Tile side in µm."""
        return self.tile_px * self.mpp

    def row(self, i: int) -> dict[str, Any]:
        """Tile `i` (position in the table, not id) as a dict of Python scalars."""
        return {k: v[i].item() for k, v in self.columns.items()}

    def boxes(self) -> np.ndarray:
        """``(K, 4)`` level-0 boxes ``(row0, col0, row1, col1)`` covering each tile."""
        return np.stack([self.columns[k] for k in ("row0", "col0", "row1", "col1")], axis=1)

    def footprints(self) -> np.ndarray:
        """``(K, 4)`` exact level-0 footprints ``(y0, x0, y1, x1)`` as floats."""
        y0 = self.columns["y_um"] / self.slide_mpp[0]
        x0 = self.columns["x_um"] / self.slide_mpp[1]
        return np.stack(
            [y0, x0, y0 + self.tile_um / self.slide_mpp[0], x0 + self.tile_um / self.slide_mpp[1]],
            axis=1,
        )

    def centres_um(self) -> np.ndarray:
        """``(K, 2)`` tile centres ``(x, y)`` in µm (the ``obsm["spatial"]`` convention)."""
        half = self.tile_um / 2
        return np.stack([self.columns["x_um"] + half, self.columns["y_um"] + half], axis=1)

    def subset(self, keep: np.ndarray) -> TileTable:
        """Return a table of the rows `keep` (a boolean mask or positions) selects."""
        cols = {k: v[keep] for k, v in self.columns.items()}
        return TileTable(
            cols, self.slide, self.slide_mpp, self.mpp, self.tile_px, self.stride_px,
            self.grid_shape, dict(self.parameters),
        )  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        """Return the grid as a JSON-able dict (file metadata, ``uns``)."""
        return {
            "slide": self.slide,
            "slide_mpp": list(self.slide_mpp),
            "mpp": self.mpp,
            "tile_px": self.tile_px,
            "tile_um": self.tile_um,
            "stride_px": self.stride_px,
            "grid_shape": list(self.grid_shape),
            "parameters": self.parameters,
        }

    def to_pandas(self) -> Any:
        """Return the columns as a pandas DataFrame (``id`` is a column)."""
        import pandas as pd

        return pd.DataFrame({k: v.copy() for k, v in self.columns.items()})

    def outlines(self) -> list[np.ndarray]:
        """Each tile's exact footprint as a closed level-0 ``(row, col)`` ring."""
        f = self.footprints()
        return [
            np.array([[y0, x0], [y0, x1], [y1, x1], [y1, x0], [y0, x0]])
            for y0, x0, y1, x1 in f.tolist()
        ]

    def to_geoparquet(self, path: str | os.PathLike[str]) -> Path:
        """Write the tiles as GeoParquet: footprint polygons in level-0 pixel ``(x, y)``.

        The same conventions as ``nuclei.parquet`` (GeoParquet 1.1, WKB, no CRS, a
        ``slidescope`` key holding :meth:`metadata`); written atomically. Needs pyarrow
        (the ``batch`` or ``scverse`` extra).
        """
        from napari_slidescope._io import atomic_write
        from napari_slidescope.pipeline.geoparquet import (
            file_metadata,
            require_pyarrow,
            wkb_polygons,
        )

        pa = require_pyarrow("TileTable.to_geoparquet")
        import pyarrow.parquet as pq

        wkb, _ = wkb_polygons(self.outlines())
        arrays = {k: pa.array(v) for k, v in self.columns.items()}
        arrays["geometry"] = wkb
        table = pa.table(arrays)
        meta = file_metadata(self.metadata(), cells=False)
        table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})
        path = Path(path)
        with atomic_write(path, "wb") as fh:
            pq.write_table(table, fh)
        return path

    @classmethod
    def from_geoparquet(cls, path: str | os.PathLike[str]) -> TileTable:
        """Read a table :meth:`to_geoparquet` wrote."""
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[b"slidescope"])
        cols = {k: table[k].to_numpy() for k in TILE_COLUMNS}
        return cls(
            cols, meta["slide"], tuple(meta["slide_mpp"]), float(meta["mpp"]),
            int(meta["tile_px"]), int(meta["stride_px"]), tuple(meta["grid_shape"]),
            meta["parameters"],
        )  # fmt: skip

    def to_spatialdata_shapes(self) -> dict[str, Any]:
        """Return the footprints as the parts of a SpatialData shapes element.

        Returns
        -------
        dict
            ``polygons`` (level-0 ``(row, col)`` rings), ``ids`` (tile ids, the index a
            table's ``instance_id`` refers to) and ``slide_mpp``: what
            :func:`~napari_slidescope.tiles.embed.write_tile_embeddings` writes as the
            ``"tiles"`` shapes of a store (``"global"`` level-0 pixels and
            ``"micrometers"`` coordinate systems, as the project's cells).
        """
        return {
            "polygons": self.outlines(),
            "ids": self.columns["id"].copy(),
            "slide_mpp": self.slide_mpp,
        }


def _calibration(slide: Any, slide_mpp: float | tuple[float, float] | None) -> tuple[float, float]:
    name = str(getattr(slide, "path", "slide"))
    if slide_mpp is not None:
        pair = np.atleast_1d(np.asarray(slide_mpp, dtype=float))
        if pair.size == 1:
            pair = np.repeat(pair, 2)
        if pair.shape != (2,) or not np.all(pair > 0):
            raise ValueError(f"{name}: slide_mpp must be a positive µm/px, got {slide_mpp!r}")
        return float(pair[0]), float(pair[1])
    if slide.mpp is None:
        raise ValueError(
            f"{name}: the slide carries no pixel size (µm/px), so tiles at a physical "
            "resolution cannot be cut from it; state it with slide_mpp=... (µm per level-0 "
            "pixel) if you know it"
        )
    return float(slide.mpp[0]), float(slide.mpp[1])


def _count(extent: float, tile: int, stride: int) -> int:
    """Return the tiles along one axis: every start on the slide (the last may hang over)."""
    if extent <= tile:
        return 1
    return int(math.ceil((extent - tile) / stride - 1e-9)) + 1


def tile_slide(
    slide: Any,
    *,
    tile_um: float,
    mpp: float,
    overlap_um: float = 0.0,
    tissue: Any = "auto",
    min_tissue_fraction: float = 0.5,
    slide_mpp: float | tuple[float, float] | None = None,
) -> TileTable:
    """Cut a slide into square tiles of `tile_um` µm delivered at exactly `mpp` µm/px.

    Parameters
    ----------
    slide : Slide
        An open slide (any source :func:`~napari_slidescope.slide.open_slide` opens).
    tile_um : float
        Tile side in µm; the tile has ``round(tile_um / mpp)`` pixels a side (the table
        records the exact side, ``tile_px * mpp``).
    mpp : float
        µm/px of the tiles delivered. Each tile is read from the coarsest level at least
        as fine (1 % tolerance) and resampled to `mpp` by exact pixel-area averaging.
    overlap_um : float
        Overlap between neighbouring tiles in µm (rounded to whole delivered pixels);
        ``0 <= overlap_um < tile_um``.
    tissue : "auto", TissueResult or None
        ``"auto"`` runs :func:`~napari_slidescope.pipeline.tissue.detect_tissue` (a low
        resolution read: glass is never read at full resolution); a TissueResult is used
        as given; None keeps every tile (``tissue_fraction`` NaN).
    min_tissue_fraction : float
        Keep a tile when its tissue fraction is at least this (and above 0).
    slide_mpp : float or (float, float), optional
        Level-0 µm/px of a slide that carries none (else the slide's own is used).

    Returns
    -------
    TileTable
        The kept tiles in id (raster) order.

    Raises
    ------
    ValueError
        Uncalibrated slide without `slide_mpp` (naming the file); a size that is not
        positive; an overlap not smaller than the tile.

    Examples
    --------
    >>> with open_slide("slide.svs") as slide:  # doctest: +SKIP
    ...     tiles = tile_slide(slide, tile_um=112, mpp=0.5)
    >>> len(tiles), tiles.tile_px  # doctest: +SKIP
    (1234, 224)
    """
    mpp0 = _calibration(slide, slide_mpp)
    name = str(getattr(slide, "path", "slide"))
    if not (mpp > 0 and math.isfinite(mpp)):
        raise ValueError(f"mpp must be a positive µm/px, got {mpp!r}")
    if not (tile_um > 0 and math.isfinite(tile_um)):
        raise ValueError(f"tile_um must be a positive size in µm, got {tile_um!r}")
    tile_px = int(round(tile_um / mpp))
    if tile_px < 1:
        raise ValueError(f"tile_um={tile_um} is smaller than one pixel at mpp={mpp}")
    overlap_px = int(round(overlap_um / mpp))
    if not 0 <= overlap_px < tile_px:
        raise ValueError(
            f"overlap_um must be in [0, tile_um), got {overlap_um!r} for tile_um={tile_um!r}"
        )
    if not 0.0 <= min_tissue_fraction <= 1.0:
        raise ValueError(
            f"min_tissue_fraction: expected a fraction in [0, 1], got {min_tissue_fraction!r}"
        )
    stride_px = tile_px - overlap_px
    h0, w0 = slide.shape0
    # the slide's extent in delivered pixels; a tile starts on the slide, the last may hang over
    ext_y = h0 * mpp0[0] / mpp
    ext_x = w0 * mpp0[1] / mpp
    rows = _count(ext_y, tile_px, stride_px)
    cols = _count(ext_x, tile_px, stride_px)
    grid_r, grid_c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    gr, gc = grid_r.ravel(), grid_c.ravel()
    ids = gr * cols + gc
    y_um = gr * stride_px * mpp
    x_um = gc * stride_px * mpp
    side_y, side_x = tile_px * mpp / mpp0[0], tile_px * mpp / mpp0[1]
    fy0, fx0 = y_um / mpp0[0], x_um / mpp0[1]
    eps = 1e-6
    row0 = np.floor(fy0 + eps).astype(np.int64)
    col0 = np.floor(fx0 + eps).astype(np.int64)
    row1 = np.ceil(fy0 + side_y - eps).astype(np.int64)
    col1 = np.ceil(fx0 + side_x - eps).astype(np.int64)

    downsamples = slide.downsamples
    target = (mpp / mpp0[0], mpp / mpp0[1])
    level = level_choice.coarsest_level_not_coarser(downsamples, target)

    resolved: str
    if isinstance(tissue, str):
        if tissue != "auto":
            raise ValueError(f"tissue: expected 'auto', a TissueResult or None, got {tissue!r}")
        from napari_slidescope.pipeline.tissue import detect_tissue

        found = detect_tissue(slide, mpp=slide_mpp if slide.mpp is None else None)
        resolved = f"detect_tissue (mode {found.mode}, threshold {found.threshold:.6g})"
    else:
        found = tissue
        resolved = "none" if tissue is None else "given"
    boxes = np.stack([fy0, fx0, fy0 + side_y, fx0 + side_x], axis=1)
    if found is None:
        frac = np.full(len(ids), np.nan)
        keep = np.ones(len(ids), bool)
    else:
        from napari_slidescope.analysis.geometry import tissue_fraction

        if not hasattr(found, "mask"):
            raise ValueError(
                f"{name}: tissue must be 'auto', a TissueResult or None, got {type(found).__name__}"
            )
        frac = tissue_fraction(found, boxes)
        keep = (frac > 0) & (frac >= min_tissue_fraction)
    cols_out = {
        "id": ids,
        "grid_row": gr,
        "grid_col": gc,
        "row0": row0,
        "col0": col0,
        "row1": row1,
        "col1": col1,
        "y_um": y_um.astype(np.float64),
        "x_um": x_um.astype(np.float64),
        "level": np.full(len(ids), level),
        "downsample": np.full(len(ids), float(downsamples[level][1])),
        "mpp": np.full(len(ids), float(mpp)),
        "tissue_fraction": frac.astype(np.float64),
    }
    cols_out = {
        k: (v.astype(np.int64) if k in _INT_COLUMNS else v)[keep] for k, v in cols_out.items()
    }
    params: dict[str, Any] = {
        "tile_um": float(tile_um),
        "mpp": float(mpp),
        "overlap_um": float(overlap_um),
        "overlap_px": overlap_px,
        "min_tissue_fraction": float(min_tissue_fraction),
        "tissue": resolved,
        "slide_mpp_stated": slide_mpp is not None,
        "level": int(level),
        "resample": "exact pixel-area average (box filter) from the level read",
    }
    return TileTable(cols_out, name, mpp0, float(mpp), tile_px, stride_px, (rows, cols), params)
