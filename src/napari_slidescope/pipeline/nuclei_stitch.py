"""Label assembly of a nuclei run: one label image, or outlines when the image would be too big.

The tiles' owned nuclei are pasted into the region's label image
(:func:`~napari_slidescope.pipeline.tiling.paste_owned`), or, beyond
:data:`DENSE_LABELS_BYTES`, kept as level-0 outlines; an array source's labels are
resampled to the array's own pixels (:func:`_to_level0`).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.analysis.geometry import labels_to_polygons
from napari_slidescope.analysis.measure import concat_tables
from napari_slidescope.analysis.resample import resample_nearest
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.pipeline.nuclei_result import NucleiResult
from napari_slidescope.pipeline.runner import TileResult
from napari_slidescope.pipeline.tiling import TilePlan, paste_owned

__all__ = ["DENSE_LABELS_BYTES"]


#: Largest label image ``segment_nuclei`` builds with ``labels="auto"`` (1 GiB of
#: int32: 16k x 16k px at the working resolution, a 4 x 4 mm region at 0.25 µm/px).
#: Beyond it the result keeps the table and one outline per nucleus, not the image.
DENSE_LABELS_BYTES = 2**30


def _dense_labels(labels: bool | str, plan: TilePlan, is_array: bool) -> bool:
    """Whether segment_nuclei builds the label image (see its ``labels`` parameter)."""
    if is_array or labels is True:
        return True
    if labels is False:
        return False
    nbytes = 4 * math.prod(plan.shape)
    if nbytes <= DENSE_LABELS_BYTES:
        return True
    warnings.warn(
        f"segment_nuclei: the labels of this region ({plan.shape[0]} x {plan.shape[1]} px at "
        f"{plan.mpp:g} µm/px) would take {nbytes / 2**30:.1f} GiB; the result keeps the "
        "table and each nucleus's outline (labels=None). Pass labels=True to build the "
        "image anyway, or use iter_segment_nuclei to stream the tiles.",
        SlidescopeWarning,
        stacklevel=3,
    )
    return False


class _Assembly:
    """The region's label image (or outlines) and table, built from its tiles in plan order.

    With ``dense`` each tile's owned nuclei (and cells) are pasted into one label image of
    the plan's working grid; without, each tile's nuclei become level-0 outlines at once,
    so memory grows with the number of nuclei, not with the region.
    """

    def __init__(self, plan: TilePlan, *, dense: bool, with_cells: bool) -> None:
        self.plan, self.with_cells = plan, with_cells
        self.image = np.zeros(plan.shape, np.int32) if dense else None
        self.cell_image = np.zeros(plan.shape, np.int32) if dense and with_cells else None
        self.polys: list[np.ndarray] = []
        self.poly_ids: list[np.ndarray] = []
        self.cell_polys: list[np.ndarray] = []
        self.cell_ids: list[np.ndarray] = []
        self.tables: list[dict[str, np.ndarray]] = []

    def add(self, result: TileResult) -> None:
        """Add one tile's owned nuclei (region-unique ids) and table rows."""
        plan, cells = self.plan, result.cells
        if self.image is not None:
            paste_owned(self.image, result.labels, result.tile)
            if self.cell_image is not None and cells is not None:
                paste_owned(self.cell_image, cells, result.tile)
        else:  # outlines in level-0 px, tile by tile: memory grows with the nuclei only
            dy, dx = plan.downsample
            y0, x0 = result.tile.box[:2]
            tile_origin = (plan.origin[0] + y0 * dy, plan.origin[1] + x0 * dx)
            p, i = labels_to_polygons(result.labels, downsample=plan.downsample, origin=tile_origin)
            self.polys.extend(p)
            self.poly_ids.append(i)
            if cells is not None:
                p, i = labels_to_polygons(cells, downsample=plan.downsample, origin=tile_origin)
                self.cell_polys.extend(p)
                self.cell_ids.append(i)
        self.tables.append(result.table)

    def result(
        self, *, array_pixels: bool, segmenter: str, parameters: dict[str, Any]
    ) -> NucleiResult:
        """Return the :class:`NucleiResult` of the tiles added.

        ``array_pixels``: an array source, whose labels are resampled to the array's own
        pixels when the working grid differs from them.
        """
        plan, image, cell_image = self.plan, self.image, self.cell_image
        table = concat_tables(self.tables)
        origin, downsample = plan.origin, plan.downsample
        out_mpp: float | tuple[float, float] = plan.mpp
        if image is not None and array_pixels and plan.downsample != (1.0, 1.0):
            image = _to_level0(image, plan)
            if cell_image is not None:
                cell_image = _to_level0(cell_image, plan)
            downsample = (1.0, 1.0)
            out_mpp = (plan.mpp / plan.downsample[0], plan.mpp / plan.downsample[1])
            if out_mpp[0] == out_mpp[1]:
                out_mpp = out_mpp[0]
        outlines = cell_outlines = None
        if image is None:
            ids = np.concatenate(self.poly_ids) if self.poly_ids else np.zeros(0, np.int64)
            outlines = (self.polys, ids)
            if self.with_cells:
                ids = np.concatenate(self.cell_ids) if self.cell_ids else np.zeros(0, np.int64)
                cell_outlines = (self.cell_polys, ids)
        return NucleiResult(
            labels=image,
            mpp=out_mpp,
            origin=origin,
            downsample=downsample,
            count=int(table["id"].size),
            columns=table,
            region=plan.region,
            segmenter=segmenter,
            source=None if plan.path is None else Path(plan.path),
            parameters=dict(parameters),
            outlines=outlines,
            cells=cell_image,
            cell_outlines=cell_outlines,
        )


def _to_level0(labels: np.ndarray, plan: TilePlan) -> np.ndarray:
    """Nearest-neighbour labels on the level-0 pixels of the plan's region."""
    y0, x0, y1, x1 = plan.region
    out = np.zeros((y1 - y0, x1 - x0), labels.dtype)
    sampled = resample_nearest(
        labels,
        src_origin=plan.origin,
        src_downsample=plan.downsample,
        dst_origin=(y0, x0),
        dst_downsample=(1.0, 1.0),
        dst_shape=out.shape,
    )
    if sampled is not None:
        (r0, c0, r1, c1), patch = sampled
        out[r0:r1, c0:c1] = patch
    return out
