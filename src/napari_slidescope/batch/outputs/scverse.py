"""The scverse files of a slide: ``cells.h5ad`` (AnnData) and ``cells.zarr`` (SpatialData)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.batch.outputs.classes import SlideClasses
from napari_slidescope.batch.outputs.parts import part_measurements, part_outlines
from napari_slidescope.batch.outputs.regions import RegionColumns


def write_anndata(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    slide: str,
    mpp: Any,
    classes: SlideClasses | None = None,
    regions: RegionColumns | None = None,
) -> Path:
    """Write ``cells.h5ad``: the slide's cells x markers (``to_anndata``), atomically.

    Read from the parts (measurements only), ids as in ``nuclei.parquet``, with the class
    and positivity columns when the slide was classified.
    """
    from napari_slidescope.pipeline.nuclei_result import NucleiResult
    from napari_slidescope.pipeline.scverse import to_anndata

    table = part_measurements(slide_dir, tiles)
    colors: dict[str, tuple[int, int, int]] = {}
    if classes is not None:
        table.update(classes.columns)
        colors = classes.colors
    if regions is not None:  # the region of each cell: obs "region", "region_id"
        table.update(regions.columns())
    n = int(np.asarray(table["id"]).size)
    res = NucleiResult(None, mpp, (0, 0), (1.0, 1.0), n, table, (0, 0, 0, 0), classes=colors)
    adata = to_anndata(res, slide=slide)
    path = slide_dir / "cells.h5ad"
    tmp = slide_dir / f".cells.h5ad.{os.getpid()}.tmp"
    try:
        adata.write_h5ad(tmp)  # h5py writes a path; renamed into place when complete
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: The SpatialData store of a slide (``--spatialdata``), beside ``cells.h5ad``.
SPATIALDATA_STORE = "cells.zarr"


def write_spatialdata(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    slide_path: str,
    shape0: tuple[int, int],
    mpp: Any,
    segmenter: str = "",
    classes: SlideClasses | None = None,
    regions: RegionColumns | None = None,
) -> Path | None:
    """Write ``cells.zarr``: the slide's SpatialData store, whole or not at all.

    Built from the parts as :func:`write_anndata` builds its table (ids as in
    ``nuclei.parquet``, the class columns when classified), with the nucleus and cell
    outlines the parts hold, by :meth:`NucleiResult.to_spatialdata` with
    ``image="reference"``: the store names the slide (`slide_path`, as the manifest shows
    it) and its level-0 frame rather than copying its pixels, which would double the
    output by the size of every slide. The store is written into a temporary folder in
    `slide_dir` and renamed into place once complete; an old store is moved aside first and
    removed only after the new one is in place, so an interrupted write leaves the old
    store (or none) and no temporary folder.

    A slide without nuclei gets no store (and loses an old one; None is returned):
    spatialdata rejects a store whose shapes are empty (``read_zarr``, 0.7.3).
    """
    from napari_slidescope.pipeline.nuclei_result import NucleiResult
    from napari_slidescope.pipeline.sdata import to_spatialdata

    table = part_measurements(slide_dir, tiles)
    colors: dict[str, tuple[int, int, int]] = {}
    if classes is not None:
        table.update(classes.columns)
        colors = classes.colors
    if regions is not None:  # the region of each cell: obs "region", "region_id"
        table.update(regions.columns())
    ids = np.asarray(table["id"], dtype=np.int64).reshape(-1)
    if ids.size == 0:
        remove_spatialdata(slide_dir)
        return None
    nuclei, cells = part_outlines(slide_dir, tiles)
    # a URL stays a string (a Path would fold its "//"); to_spatialdata records str(source)
    source: Any = slide_path if "://" in slide_path else Path(slide_path)
    res = NucleiResult(
        None,
        mpp,
        (0, 0),
        (1.0, 1.0),
        int(ids.size),
        table,
        (0, 0, int(shape0[0]), int(shape0[1])),
        segmenter=segmenter,
        source=source,
        outlines=(nuclei, ids),
        cell_outlines=None if cells is None else (cells, ids),
        classes=colors,
    )
    path = slide_dir / SPATIALDATA_STORE
    tmp = slide_dir / f".{SPATIALDATA_STORE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    old = tmp.with_suffix(".old")
    try:
        to_spatialdata(res, tmp / SPATIALDATA_STORE, image="reference")
        if path.exists():
            os.replace(path, old)  # aside: the new store is complete, the old one still whole
        os.replace(tmp / SPATIALDATA_STORE, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return path


def remove_spatialdata(slide_dir: Path) -> None:
    """Remove a slide's SpatialData store and any temporary folder a killed write left."""
    shutil.rmtree(slide_dir / SPATIALDATA_STORE, ignore_errors=True)
    for stale in slide_dir.glob(f".{SPATIALDATA_STORE}.*"):
        shutil.rmtree(stale, ignore_errors=True)
