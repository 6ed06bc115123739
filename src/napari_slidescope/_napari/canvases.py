"""Nuclei canvases: the rasters a viewer run paints its nuclei into, in numpy alone.

A result raster has an ``origin`` (level-0 ``(y, x)`` of the top-left corner of its pixel
``[0, 0]``, level-0 pixel ``i`` spanning ``[i, i + 1)``) and a ``downsample`` (level-0
pixels per raster pixel). Nuclei accumulate on a :class:`ResultCanvas` (a dense int32
raster on a fixed grid) that grows when a run covers new ground, or, for a whole slide and
runs larger than :data:`MAX_CANVAS_PIXELS`, on a :class:`PyramidCanvas`: a label pyramid on
disk, exact at every zoom. Tiles are mapped onto the canvas grid on the worker thread
(:func:`tile_patch`). Nothing here imports napari: :mod:`napari_slidescope._napari.layers`
shows a canvas as a Labels layer and pastes patches on the main thread.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis.resample import resample_nearest

Pair = tuple[float, float]
#: Level-0 ``(row, col)`` outlines and their ids.
Outlines = tuple[list[np.ndarray], np.ndarray]
#: An analysed area: a level-0 box, or a polygon's level-0 ``(row, col)`` ring.
Area = Box | np.ndarray

__all__ = [
    "MAX_CANVAS_PIXELS",
    "Area",
    "Outlines",
    "Pair",
    "Patch",
    "PyramidCanvas",
    "ResultCanvas",
    "pyramid_outlines",
    "tile_patch",
]

#: Most pixels of a dense nuclei canvas (int32: 256 MiB); larger runs use a pyramid.
MAX_CANVAS_PIXELS = 64 * 2**20


@dataclass
class Patch:
    """Nuclei of one finished tile, already on a canvas grid (made on the worker thread).

    Attributes
    ----------
    box : (int, int, int, int)
        Canvas pixels ``(y0, x0, y1, x1)`` covered by ``labels``.
    labels : (M, N) ndarray of int32 or None
        Final nucleus ids (0 = none), duplicates of earlier runs removed; None when the
        worker already pasted them into a :class:`PyramidCanvas`.
    table : dict of str to ndarray
        Table rows of the new nuclei, ``id`` final.
    done, total : int
        Progress of the run in tiles.
    cells : (M, N) ndarray of int32 or None
        The new nuclei's cells over ``box`` (same ids as ``labels``) when the run grows
        cells; None without cells, or when the worker already pasted them into the
        canvas's cell pyramid.
    outlines, cell_outlines : (list of (K, 2) ndarray, ndarray) or None
        The new nuclei's (and cells') level-0 ``(row, col)`` outlines and final ids,
        traced on the worker thread from the tile's own labels at the working
        resolution, as ``segment_nuclei(labels=False)`` keeps them: what an export writes.
    """

    box: Box
    labels: np.ndarray | None
    table: dict[str, np.ndarray]
    done: int
    total: int
    cells: np.ndarray | None = None
    outlines: Outlines | None = None
    cell_outlines: Outlines | None = None


@dataclass(eq=False)
class _Canvas:
    """What both canvases keep: their grid over the slide and the nuclei found so far.

    Attributes
    ----------
    origin, downsample : (float, float)
        The grid: level-0 corner of its pixel ``[0, 0]`` and level-0 pixels per pixel.
    mpp : (float, float)
        µm per level-0 pixel of the image.
    regions : list of box or (K, 2) ndarray
        Level-0 areas analysed so far, each a box or a polygon's ``(row, col)`` ring (a
        nucleus whose centroid lies in one was found).
    tables : list of dict
        Table chunks, in arrival order.
    next_id : int
        Largest id used so far.
    identity : dict or None
        What found the nuclei on the canvas, every default resolved
        (:func:`~napari_slidescope._napari.jobs.nuclei_identity`): "Add (skip
        duplicates)" adds to the canvas only a run with the same identity.
    cells : ndarray or LabelPyramid or None
        The nuclei's cells on the same grid, with the same ids (runs with
        ``cell_expansion_um``): an int32 raster like ``data`` on a :class:`ResultCanvas`,
        a second label pyramid on a :class:`PyramidCanvas`; None without cells.
    """

    origin: Pair
    downsample: Pair
    mpp: Pair
    regions: list[Area] = field(default_factory=list, kw_only=True)
    tables: list[dict[str, np.ndarray]] = field(default_factory=list, kw_only=True)
    next_id: int = field(default=0, kw_only=True)
    identity: dict[str, Any] | None = field(default=None, kw_only=True)
    cells: Any = field(default=None, repr=False, kw_only=True)
    #: The nuclei's (and cells') outlines as the runs traced them, one entry per table
    #: chunk; ``traced`` is False once a chunk came without them (then exports trace the
    #: canvas again).
    outline_parts: list[Outlines] = field(default_factory=list, repr=False, kw_only=True)
    cell_outline_parts: list[Outlines] = field(default_factory=list, repr=False, kw_only=True)
    traced: bool = field(default=True, kw_only=True)
    #: Weak reference to the layer last uploaded whole (a strong one would keep a deleted
    #: layer alive: ``layers._CANVASES`` maps layer -> canvas, and a weak key whose value refers
    #: back to it is never released).
    drawn: weakref.ref | None = field(default=None, repr=False, compare=False, kw_only=True)

    @property
    def cell_data(self) -> Any:
        """The cells as a layer's data (a raster, or a pyramid's levels); None without cells."""
        if self.cells is None:
            return None
        return getattr(self.cells, "levels", self.cells)

    def table(self) -> dict[str, np.ndarray]:
        """All table rows so far (one per nucleus on the canvas)."""
        from napari_slidescope.analysis.measure import concat_tables, empty_table

        return concat_tables(self.tables) if self.tables else empty_table()

    def keep(self, patch: Patch) -> None:
        """Record a patch's table rows and outlines (main thread)."""
        if not (patch.table and "id" in patch.table and patch.table["id"].size):
            return
        self.tables.append(patch.table)
        self.next_id = max(self.next_id, int(patch.table["id"].max()))
        if patch.outlines is None or (self.cells is not None and patch.cell_outlines is None):
            self.traced = False
            return
        self.outline_parts.append(patch.outlines)
        if patch.cell_outlines is not None:
            self.cell_outline_parts.append(patch.cell_outlines)

    def _shown(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` the canvas still shows (all, unless a subclass can tell)."""
        return np.ones(np.shape(ids), bool)

    def _kept(self, region: Box, origin: tuple[int, int]) -> Any:
        """Return the ``NucleiResult`` of the kept outlines and table (None when not traced)."""
        if not self.traced:
            return None
        table = self.table()
        shown = self._shown(table["id"])
        if not shown.all():
            table = {k: np.asarray(v)[shown] for k, v in table.items()}

        def joined(parts: list[Outlines]) -> Outlines:
            polys = [p for ps, _ in parts for p in ps]
            ids = np.concatenate([i for _, i in parts]) if parts else np.zeros(0, np.int64)
            keep = np.isin(ids, table["id"])
            if keep.all():
                return polys, ids
            return [polys[j] for j in np.flatnonzero(keep).tolist()], ids[keep]

        return self._result(
            table, region, labels=None, origin=origin, outlines=joined(self.outline_parts),
            cell_outlines=joined(self.cell_outline_parts) if self.cells is not None else None,
        )  # fmt: skip

    def _result(self, table: dict[str, np.ndarray], region: Box, **fields: Any) -> Any:
        """Return a ``NucleiResult`` on this grid with `table` (its rows are the count)."""
        from napari_slidescope.pipeline.nuclei import NucleiResult

        return NucleiResult(
            mpp=(self.mpp[0] * self.downsample[0], self.mpp[1] * self.downsample[1]),
            downsample=self.downsample,
            count=int(table["id"].size),
            columns=table,
            region=region,
            **fields,
        )


@dataclass(eq=False)
class ResultCanvas(_Canvas):
    """Nuclei found so far for one image layer: a raster on a grid, and its table.

    Attributes
    ----------
    data : (M, N) ndarray of int32
        Nucleus ids on the grid.
    Other attributes as :class:`_Canvas`.
    """

    data: np.ndarray

    @classmethod
    def for_region(
        cls, region: Box, downsample: Pair, mpp: Pair, *, max_pixels: int = MAX_CANVAS_PIXELS
    ) -> ResultCanvas:
        """Make an empty canvas over a level-0 `region`, coarser than `downsample` if too large."""
        y0, x0, y1, x1 = region
        dy, dx = downsample
        k = max(1.0, math.sqrt((y1 - y0) / dy * (x1 - x0) / dx / max_pixels))
        k = float(math.ceil(k - 1e-9))
        ds = (dy * k, dx * k)
        shape = (math.ceil((y1 - y0) / ds[0] - 1e-9), math.ceil((x1 - x0) / ds[1] - 1e-9))
        return cls((float(y0), float(x0)), ds, mpp, np.zeros(shape, np.int32))

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the grid."""
        return (int(self.data.shape[0]), int(self.data.shape[1]))

    @property
    def box0(self) -> tuple[float, float, float, float]:
        """Level-0 extent ``(y0, x0, y1, x1)`` of the raster."""
        (oy, ox), (dy, dx) = self.origin, self.downsample
        return (oy, ox, oy + self.data.shape[0] * dy, ox + self.data.shape[1] * dx)

    def grown(self, region: Box, *, max_pixels: int = MAX_CANVAS_PIXELS) -> ResultCanvas | None:
        """Return this canvas grown (same grid) to hold `region`; None when too large."""
        (oy, ox), (dy, dx) = self.origin, self.downsample
        r0 = min(0, math.floor((region[0] - oy) / dy + 1e-9))
        c0 = min(0, math.floor((region[1] - ox) / dx + 1e-9))
        r1 = max(self.data.shape[0], math.ceil((region[2] - oy) / dy - 1e-9))
        c1 = max(self.data.shape[1], math.ceil((region[3] - ox) / dx - 1e-9))
        if (r0, c0, r1, c1) == (0, 0, *self.data.shape):
            return self
        if (r1 - r0) * (c1 - c0) > max_pixels:
            return None
        data = np.zeros((r1 - r0, c1 - c0), np.int32)
        inner = (slice(-r0, -r0 + self.data.shape[0]), slice(-c0, -c0 + self.data.shape[1]))
        data[inner] = self.data
        cells = None
        if self.cells is not None:
            cells = np.zeros_like(data)
            cells[inner] = self.cells
        return ResultCanvas(
            (oy + r0 * dy, ox + c0 * dx), self.downsample, self.mpp, data,
            regions=list(self.regions), tables=list(self.tables), next_id=self.next_id,
            identity=self.identity, cells=cells, outline_parts=list(self.outline_parts),
            cell_outline_parts=list(self.cell_outline_parts), traced=self.traced,
        )  # fmt: skip

    def _shown(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` are still painted (the user may erase nuclei from a dense layer)."""
        ids = np.asarray(ids, np.int64)
        if ids.size == 0:
            return np.zeros(0, bool)
        top = max(int(ids.max()), self.next_id) + 1
        present = np.bincount(self.data.ravel(), minlength=top) > 0
        return present[np.clip(ids, 0, len(present) - 1)] & (ids >= 0)

    def kept_result(self) -> Any:
        """Return the nuclei as the runs found them: their own outlines and table, untraced.

        A ``NucleiResult`` with ``labels=None`` and the outlines the worker traced from
        each tile at the working resolution (what ``segment_nuclei(labels=False)``
        keeps); nuclei erased from the layer are left out. None when some nuclei came
        without outlines (then :meth:`to_result` traces the canvas).
        """
        (oy, ox), (y0, x0, y1, x1) = self.origin, self.box0
        region = (int(y0), int(x0), int(math.ceil(y1)), int(math.ceil(x1)))
        return self._kept(region, (int(round(oy)), int(round(ox))))

    def to_result(self) -> Any:
        """Return the canvas as a ``NucleiResult`` (for export) of what the layer shows.

        Nuclei the user erased from the layer (painting 0 over them) leave the table too
        (and their cells the result's ``cells``).
        """
        table = self.table()
        shown = np.isin(table["id"], np.unique(self.data))
        cells = self.cells
        if not shown.all():
            table = {k: np.asarray(v)[shown] for k, v in table.items()}
            if cells is not None:  # the cells of erased nuclei go with them
                cells = np.where(np.isin(cells, table["id"]), cells, 0).astype(np.int32)
        (oy, ox), (y0, x0, y1, x1) = self.origin, self.box0
        region = (int(y0), int(x0), int(math.ceil(y1)), int(math.ceil(x1)))
        return self._result(
            table, region, labels=self.data, origin=(int(round(oy)), int(round(ox))),
            cells=cells,
        )  # fmt: skip


@dataclass(eq=False)
class PyramidCanvas(_Canvas):
    """Nuclei of a whole slide on disk: a :class:`LabelPyramid` over the slide, and a table.

    Used when a run covers more than :data:`MAX_CANVAS_PIXELS` on the working grid (a
    whole slide): the layer is a multiscale Labels layer whose levels are the pyramid's,
    so it is exact at full zoom and memory stays within the pyramid's chunk cache
    whatever the slide's area. The worker thread pastes each tile into the pyramid
    (:func:`tile_patch`); the main thread only keeps the table and refreshes the view.
    Attributes as :class:`_Canvas`, and ``pyramid``; ``origin`` is the slide's corner.
    """

    pyramid: Any

    @classmethod
    def for_slide(
        cls,
        shape0: tuple[int, int],
        downsample: Pair,
        mpp: Pair,
        *,
        read_chunk: int | None = None,
    ) -> PyramidCanvas:
        """Make an empty pyramid over a whole slide of level-0 `shape0`, on a `downsample` grid.

        `read_chunk` is the chunk grid the layer advertises to napari (see
        :func:`image_read_chunk`); by default the pyramid's storage chunk.
        """
        from napari_slidescope.pipeline.label_pyramid import LabelPyramid

        shape = (
            math.ceil(shape0[0] / downsample[0] - 1e-9),
            math.ceil(shape0[1] / downsample[1] - 1e-9),
        )
        pyramid = LabelPyramid(shape, read_chunk=read_chunk)
        return cls((0.0, 0.0), tuple(downsample), mpp, pyramid)  # type: ignore[arg-type]

    @property
    def data(self) -> list[Any]:
        """The pyramid's levels, finest first (a multiscale layer's data)."""
        return self.pyramid.levels

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the finest grid."""
        return self.pyramid.shape

    def grown(self, region: Box, **_: Any) -> PyramidCanvas:
        """Return self: the pyramid spans the whole slide already."""
        return self

    def kept_result(self) -> Any:
        """Return the nuclei as the runs found them: their own outlines and table, untraced.

        See :meth:`ResultCanvas.kept_result` (a multiscale layer cannot be painted, so
        every nucleus of the table is kept). None when some nuclei came without outlines.
        """
        h, w = self.shape
        region = (0, 0, math.ceil(h * self.downsample[0]), math.ceil(w * self.downsample[1]))
        return self._kept(region, (0, 0))

    def to_result(self) -> Any:
        """Return the nuclei as a ``NucleiResult`` with outlines (no dense labels).

        With cells, their outlines too (``cell_outlines``).
        """
        table = self.table()
        outlines = pyramid_outlines(self.pyramid, table, self.origin, self.downsample)
        present = np.isin(table["id"], outlines[1])  # nuclei deleted from the layer go
        table = {k: np.asarray(v)[present] for k, v in table.items()}
        h, w = self.shape
        region = (0, 0, math.ceil(h * self.downsample[0]), math.ceil(w * self.downsample[1]))
        cell_outlines = None
        if self.cells is not None:
            cell_outlines = pyramid_outlines(self.cells, table, self.origin, self.downsample)
        return self._result(
            table, region, labels=None, origin=(0, 0), outlines=outlines,
            cell_outlines=cell_outlines,
        )  # fmt: skip


def pyramid_outlines(
    pyramid: Any,
    table: dict[str, np.ndarray],
    origin: Pair,
    downsample: Pair,
    *,
    block: int = 2048,
    margin: int = 128,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Outline every nucleus of a label pyramid, one block of level 0 at a time.

    A nucleus is outlined by the block that holds its centroid (from `table`, level-0
    px), read with a `margin` (grid px) so that nuclei smaller than the margin are whole:
    each nucleus exactly once, and memory of one block whatever the slide's size.

    Returns
    -------
    polygons, ids
        Level-0 ``(row, col)`` rings and their ids (nuclei of `table` found in the pyramid).
    """
    from napari_slidescope.analysis.geometry import labels_to_polygons

    ids = np.asarray(table["id"])
    if ids.size == 0:
        return [], np.zeros(0, np.int64)
    (oy, ox), (dy, dx) = origin, downsample
    rows = np.floor((np.asarray(table["centroid_row"]) - oy) / dy).astype(np.int64)
    cols = np.floor((np.asarray(table["centroid_col"]) - ox) / dx).astype(np.int64)
    by, bx = rows // block, cols // block
    order = np.lexsort((bx, by))
    polys: list[np.ndarray] = []
    out_ids: list[np.ndarray] = []
    keys = np.stack([by[order], bx[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    for s, e in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        r, c = int(keys[s, 0]), int(keys[s, 1])
        y0, x0 = max(0, r * block - margin), max(0, c * block - margin)
        y1, x1 = (r + 1) * block + margin, (c + 1) * block + margin
        lab = pyramid.read(0, (y0, x0, y1, x1))
        want = ids[order[s:e]]
        uniq, inv = np.unique(np.where(np.isin(lab, want), lab, 0), return_inverse=True)
        compact = inv.reshape(lab.shape).astype(np.int32)  # 0 stays 0: uniq[0] == 0
        if uniq[0] != 0:
            compact += 1
            uniq = np.r_[0, uniq]
        p, i = labels_to_polygons(
            compact, downsample=downsample, origin=(oy + y0 * dy, ox + x0 * dx)
        )
        polys.extend(p)
        out_ids.append(uniq[i])
    return polys, (np.concatenate(out_ids) if out_ids else np.zeros(0, np.int64))


def tile_patch(
    step: Any,
    *,
    origin: Pair,
    downsample: Pair,
    shape: tuple[int, int],
    covered: Sequence[Area] = (),
    id_offset: int = 0,
    pyramid: Any = None,
    cell_pyramid: Any = None,
) -> Patch | None:
    """Map a finished tile (a ``NucleiStep``) onto a canvas grid; runs on the worker thread.

    Parameters
    ----------
    step : NucleiStep
        The tile's labels (region-unique ids over ``tile.box`` of ``step.plan``) and table.
    origin, downsample, shape
        The canvas grid (see :class:`ResultCanvas`).
    covered : sequence of box or (K, 2) ndarray
        Level-0 areas of earlier runs (boxes, polygon rings): nuclei whose centroid lies in
        one are dropped.
    id_offset : int
        Added to the ids of this run (ids already on the canvas).
    pyramid : LabelPyramid, optional
        The grid's store (a :class:`PyramidCanvas`): the labels are pasted into it here,
        on the worker thread, and the patch carries none.
    cell_pyramid : LabelPyramid, optional
        The grid's store of cells (``PyramidCanvas.cells``): the tile's cells (``cells``
        of its ``TileResult``, same ids as its nuclei) are pasted into it here. Without
        one, the patch carries the tile's cells (if any) on the canvas grid.
    """
    res, plan = step.result, step.plan
    labels, table = res.labels, dict(res.table)
    cells = getattr(res, "cells", None)
    if "id" in table and covered and table["id"].size:
        rows, cols = table["centroid_row"], table["centroid_col"]
        from napari_slidescope.pipeline.regions import inside_region

        dup = np.zeros(np.shape(rows), bool)
        for area in covered:
            dup |= inside_region(rows, cols, area)
        if dup.any():
            gone = table["id"][dup]
            labels = np.where(np.isin(labels, gone), 0, labels)
            if cells is not None:
                cells = np.where(np.isin(cells, gone), 0, cells)
            table = {k: np.asarray(v)[~dup] for k, v in table.items()}
    (dy, dx), box = plan.downsample, res.tile.box
    tile_origin = (plan.origin[0] + box[0] * dy, plan.origin[1] + box[1] * dx)
    ids = np.asarray(table.get("id", np.zeros(0, np.int64)))
    outlines = _traced(labels, ids, tile_origin, plan.downsample, id_offset)
    cell_lines = None
    if cells is not None:
        cell_lines = _traced(cells, ids, tile_origin, plan.downsample, id_offset)
    if id_offset:
        labels = np.where(labels > 0, labels + np.int32(id_offset), 0).astype(np.int32)
        if cells is not None:
            cells = np.where(cells > 0, cells + np.int32(id_offset), 0).astype(np.int32)
        if "id" in table:
            table["id"] = np.asarray(table["id"]) + id_offset
    grid: dict[str, Any] = {
        "src_origin": tile_origin,
        "src_downsample": plan.downsample,
        "dst_origin": origin,
        "dst_downsample": downsample,
        "dst_shape": shape,
    }
    out = resample_nearest(labels, **grid)
    if out is None:
        return None
    labels = out[1].astype(np.int32, copy=False)
    cell_out = None
    if cells is not None:  # the same tile box on the same grid: the same patch box
        moved = resample_nearest(cells, **grid)
        cell_out = None if moved is None else moved[1].astype(np.int32, copy=False)
        if cell_pyramid is not None and moved is not None:
            cell_pyramid.paste(moved[0], cell_out)
            cell_out = None
    if pyramid is not None:
        pyramid.paste(out[0], labels)
        return Patch(out[0], None, table, step.done, step.total, cell_out, outlines, cell_lines)
    return Patch(out[0], labels, table, step.done, step.total, cell_out, outlines, cell_lines)


def _traced(
    labels: np.ndarray, ids: np.ndarray, origin: Pair, downsample: Pair, id_offset: int
) -> Outlines:
    """Level-0 outlines of the nuclei `ids` of a tile's labels; ids shifted by `id_offset`.

    The ids are made compact first, so tracing costs the tile's nuclei, not the run's
    largest id.
    """
    from napari_slidescope.analysis.geometry import labels_to_polygons

    if ids.size == 0:
        return [], np.zeros(0, np.int64)
    uniq, inv = np.unique(np.where(np.isin(labels, ids), labels, 0), return_inverse=True)
    compact = inv.reshape(labels.shape).astype(np.int32)  # 0 stays 0: uniq[0] == 0
    if uniq[0] != 0:
        compact += 1
        uniq = np.r_[0, uniq]
    polys, i = labels_to_polygons(compact, downsample=downsample, origin=origin)
    return polys, uniq[i].astype(np.int64) + id_offset
