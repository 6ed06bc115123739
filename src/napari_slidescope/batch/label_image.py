"""The whole-slide label image of a batch result, as OME-NGFF labels beside the tables.

Layout (NGFF's labels group; there is no image in the store, the slide stays where it is)::

    OUT/<slide>/labels.zarr/labels/          attrs {"labels": ["nuclei"(, "cells")]}
    OUT/<slide>/labels.zarr/labels/nuclei/   a multiscale labels image (LabelPyramid)
    OUT/<slide>/labels.zarr/labels/cells/    (runs with cell_expansion_um)

Level 0 is the slide's level-0 pixel grid; the ids are those of ``nuclei.parquet``. The
image is painted from the tiles' outlines (the Parquet parts, tile by tile in plan
order, each tile's ids shifted as :func:`~napari_slidescope.batch.outputs.write_nuclei`
shifts them), so memory holds one tile; it is written into a temporary folder beside
the target and renamed, like the SpatialData store. Readers (napari through this
plugin, napari-ome-zarr, any zarr reader) then show the nuclei of a whole slide without
drawing one polygon. :func:`parquet_label_pyramid` paints the same image from a
``nuclei.parquet`` alone, for results written before the label image existed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.pipeline.label_pyramid import LabelPyramid, zarr_major

__all__ = [
    "LABELS_STORE",
    "label_image_path",
    "paint_polygons",
    "parquet_label_pyramid",
    "write_label_image",
]

#: Folder of a slide's label images, beside ``nuclei.parquet``.
LABELS_STORE = "labels.zarr"


def label_image_path(slide_dir: str | os.PathLike[str], name: str = "nuclei") -> Path:
    """Return ``<slide_dir>/labels.zarr/labels/<name>`` (whether or not it exists)."""
    return Path(slide_dir) / LABELS_STORE / "labels" / name


def paint_polygons(pyramid: LabelPyramid, ids: np.ndarray, rings: Sequence[np.ndarray]) -> None:
    """Paint polygons into a label pyramid, one paste over their common bounding box.

    Parameters
    ----------
    pyramid : LabelPyramid
        Level 0 in the rings' pixels.
    ids : (N,) ndarray of int
        The id of each polygon (> 0).
    rings : sequence of (K, 2) ndarray of float
        Each polygon's exterior ring, level-0 ``(x, y)`` (WKB order); a pixel belongs to a
        polygon when its centre lies inside. Earlier polygons win overlaps.
    """
    from skimage.draw import polygon

    if not len(rings):
        return
    h, w = pyramid.shape
    lo = np.array([r.min(axis=0) for r in rings])
    hi = np.array([r.max(axis=0) for r in rings])
    x0, y0 = (max(0, int(np.floor(v))) for v in lo.min(axis=0))
    x1 = min(w, int(np.ceil(hi[:, 0].max())) + 1)
    y1 = min(h, int(np.ceil(hi[:, 1].max())) + 1)
    if y1 <= y0 or x1 <= x0:
        return
    canvas = np.zeros((y1 - y0, x1 - x0), np.int32)
    for k, ring in enumerate(rings):
        # a bounding-box-sized fill per polygon: never a canvas-sized mask
        bx0, by0 = int(np.floor(lo[k, 0])), int(np.floor(lo[k, 1]))
        bx1, by1 = int(np.ceil(hi[k, 0])) + 1, int(np.ceil(hi[k, 1])) + 1
        rr, cc = polygon(ring[:, 1] - 0.5 - by0, ring[:, 0] - 0.5 - bx0, (by1 - by0, bx1 - bx0))
        rr, cc = rr + (by0 - y0), cc + (bx0 - x0)
        ok = (rr >= 0) & (rr < canvas.shape[0]) & (cc >= 0) & (cc < canvas.shape[1])
        rr, cc = rr[ok], cc[ok]
        free = canvas[rr, cc] == 0
        canvas[rr[free], cc[free]] = ids[k]
    pyramid.paste((y0, x0, y1, x1), canvas)


def _rings(column: Any) -> list[np.ndarray]:
    from napari_slidescope.batch.tasks import wkb_ring

    return [wkb_ring(b) for b in column.to_pylist()]


def write_label_image(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    shape0: tuple[int, int],
    mpp: tuple[float, float] | None,
    zarr_format: int = 2,
) -> Path:
    """Write ``labels.zarr`` of a slide from its tile parts (before they are removed).

    Parameters
    ----------
    slide_dir : Path
        ``OUT/<slide>/`` holding ``parts/``.
    tiles : sequence of int
        The tiles in plan order (the order that numbers the ids).
    shape0 : (int, int)
        Level-0 ``(rows, cols)`` of the slide.
    mpp : (float, float) or None
        µm per level-0 pixel (NGFF scale), None when the slide is uncalibrated.
    zarr_format : {2, 3}
        2: NGFF 0.4 (read by zarr 2 and 3); 3: NGFF 0.5 (zarr >= 3).

    Returns
    -------
    Path
        The ``labels.zarr`` folder.
    """
    import pyarrow.parquet as pq

    from napari_slidescope.batch.outputs import part_path

    target = Path(slide_dir) / LABELS_STORE
    partial = target.with_name(f".{LABELS_STORE}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    schemas = [pq.read_schema(part_path(slide_dir, i)) for i in tiles]
    names = ["nuclei"]
    if schemas and all("cell_geometry" in s.names for s in schemas):
        names.append("cells")
    _labels_group(partial, names, zarr_format)
    pyramids = {
        n: LabelPyramid(
            shape0,
            path=partial / "labels" / n,
            mpp=mpp,
            name=n,
            zarr_format=zarr_format,
            cache_bytes=64 * 2**20,
        )  # fmt: skip
        for n in names
    }
    try:
        offset = 0
        with contextlib.ExitStack() as stack:
            for p in pyramids.values():
                stack.enter_context(p.buffered())
            for index in tiles:
                columns = ["id", "geometry", *(["cell_geometry"] if "cells" in pyramids else [])]
                part = pq.read_table(part_path(slide_dir, index), columns=columns)
                ids = part.column("id").to_numpy().astype(np.int64) + offset
                paint_polygons(pyramids["nuclei"], ids, _rings(part.column("geometry")))
                if "cells" in pyramids:
                    paint_polygons(pyramids["cells"], ids, _rings(part.column("cell_geometry")))
                offset += part.num_rows
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for p in pyramids.values():
        p.close()
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


def _labels_group(root: Path, names: list[str], zarr_format: int) -> None:
    """Create an NGFF store's root group and its ``labels`` group listing `names`."""
    import zarr

    attrs: dict[str, Any] = {"labels": names}
    if zarr_major() < 3:
        group = zarr.open_group(str(root), mode="w")
    else:
        fmt: Any = zarr_format
        group = zarr.open_group(store=str(root), mode="w", zarr_format=fmt)
        if zarr_format == 3:
            attrs = {"ome": {"version": "0.5", "labels": names}}
    group.create_group("labels").attrs.update(attrs)


def parquet_label_pyramid(
    path: str | os.PathLike[str],
    shape0: tuple[int, int],
    *,
    root: str | os.PathLike[str] | None = None,
) -> LabelPyramid:
    """Paint a ``nuclei.parquet``'s outlines into a temporary label pyramid (ids its ``id``).

    One row group (a tile of the batch run) at a time: memory holds one tile's outlines.
    """
    import pyarrow.parquet as pq

    pyramid = LabelPyramid((max(1, int(shape0[0])), max(1, int(shape0[1]))), root=root)
    pf = pq.ParquetFile(path)
    with pyramid.buffered():
        for g in range(pf.num_row_groups):
            part = pf.read_row_group(g, columns=["id", "geometry"])
            ids = part.column("id").to_numpy().astype(np.int64)
            paint_polygons(pyramid, ids, _rings(part.column("geometry")))
    return pyramid
