"""A slide's tissue regions (``--regions``): the class map, its outlines, the cells per region.

Files in ``OUT/<slide>/``::

    regions.zarr/labels/regions/   the class map as OME-NGFF labels, at the classifier's
                                   working resolution (its scale in µm), classes 1..K
    regions.geojson                the outline of each class's pieces (QuPath annotations)
    regions.csv                    one row per region class: area, share, cells, cells
                                   per mm², cell classes and IHC figures per region

and, with nuclei, the ``region`` (class name, ``""`` off the map) and ``region_id``
(0..K) columns of ``nuclei.parquet`` / ``cells.h5ad`` / ``cells.zarr``, and the
per-region columns of ``summary.csv`` (:func:`region_figures`).
"""

from __future__ import annotations

import csv
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.batch.outputs.classes import SlideClasses
from napari_slidescope.batch.outputs.parts import part_measurements

__all__ = [
    "REGIONS_STORE",
    "RegionColumns",
    "region_columns",
    "region_figures",
    "region_rows",
    "remove_regions",
    "write_regions",
    "write_regions_csv",
]

#: Folder of a slide's class map, beside ``nuclei.parquet``.
REGIONS_STORE = "regions.zarr"


@dataclass(frozen=True)
class RegionColumns:
    """The region of each nucleus of a slide, in ``nuclei.parquet`` order.

    Attributes
    ----------
    region : (K,) ndarray of str
        Class name, ``""`` where the map has none (off tissue, outside the map).
    region_id : (K,) ndarray of int32
        0 there, else the class's index 1..K in the map's ``classes``.
    """

    region: np.ndarray
    region_id: np.ndarray

    def columns(self) -> dict[str, np.ndarray]:
        """Return ``{"region": ..., "region_id": ...}``: the columns the tables gain."""
        return {"region": self.region, "region_id": self.region_id}


def write_regions(slide_dir: Path, regions: Any) -> None:
    """Write ``regions.zarr`` and ``regions.geojson`` of a slide's class map, atomically.

    The store is written into a temporary folder beside it and renamed, like the nuclei's
    label image; its ``labels/regions`` group records the class names and colours.
    """
    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    labels = np.asarray(regions.labels)
    target = slide_dir / REGIONS_STORE
    partial = slide_dir / f".{REGIONS_STORE}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _labels_group(partial)
        mpp = float(regions.mpp)
        pyramid = LabelPyramid(
            (max(1, labels.shape[0]), max(1, labels.shape[1])),
            path=partial / "labels" / "regions",
            mpp=(mpp, mpp),
            name="regions",
        )
        with pyramid.buffered():
            if labels.size:
                pyramid.paste((0, 0, *labels.shape), labels.astype(np.uint32))
        pyramid.close()
        _describe(partial / "labels" / "regions", regions)
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    tmp = slide_dir / f".regions.{os.getpid()}.geojson"
    try:
        regions.to_geojson(tmp)
        os.replace(tmp, slide_dir / "regions.geojson")
    finally:
        tmp.unlink(missing_ok=True)


def remove_regions(slide_dir: Path) -> None:
    """Remove a slide's region files (a run without ``--regions`` after one with it)."""
    shutil.rmtree(slide_dir / REGIONS_STORE, ignore_errors=True)
    for stale in slide_dir.glob(f".{REGIONS_STORE}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    for name in ("regions.geojson", "regions.csv"):
        (slide_dir / name).unlink(missing_ok=True)


def _labels_group(root: Path) -> None:
    import zarr

    group = zarr.open_group(str(root), mode="w")
    group.create_group("labels").attrs.update({"labels": ["regions"]})


def _describe(folder: Path, regions: Any) -> None:
    """Add the class names, colours and grid to the labels image's attributes."""
    import zarr

    group = zarr.open_group(str(folder), mode="r+")
    colors = dict(getattr(regions, "colors", {}) or {})
    label_attrs: dict[str, Any] = {}
    label_attrs["colors"] = [
        {"label-value": k, "rgba": [*map(int, colors[c]), 255]}
        for k, c in enumerate(regions.classes, start=1)
        if c in colors
    ]
    group.attrs.update(
        {
            "image-label": label_attrs,
            "slidescope": {
                "classes": list(regions.classes),
                "downsample": list(map(float, regions.downsample)),
                "origin": list(map(float, regions.origin)),
                "mpp": float(regions.mpp),
            },
        }
    )


def region_columns(slide_dir: Path, tiles: Sequence[int], regions: Any) -> RegionColumns:
    """Return the region under each nucleus's centroid, ids numbered as ``nuclei.parquet``'s.

    The centroid (a pixel index) is taken at its pixel's centre (``+ 0.5``), as
    ``assign_regions`` takes it.
    """
    table = part_measurements(slide_dir, tiles)
    rows = np.asarray(table.get("centroid_row", np.zeros(0)), float) + 0.5
    cols = np.asarray(table.get("centroid_col", np.zeros(0)), float) + 0.5
    ids = np.asarray(regions.class_at(rows, cols)).astype(np.int32)
    names = np.asarray(("", *regions.classes), dtype=str)
    return RegionColumns(names[ids], ids)


def region_figures(
    regions: Any, cells: RegionColumns | None, classes: SlideClasses | None
) -> dict[str, Any]:
    """Return the slide's per-region figures, as ``region_summary`` gives them.

    :func:`~napari_slidescope.pipeline.region_cells.region_summary` of the slide's cells
    (their regions, classes and DAB scores; none without nuclei, and then no cell
    figures): ``{R}_area_mm2``, ``{R}_percent``, ``{R}_cells``, ``{R}_cells_per_mm2``,
    ``{R}_{class}_count`` / ``_per_mm2``, ``{R}_positive_percent``, ``{R}_h_score``...,
    ``tumour_stroma_ratio`` and ``stroma_percent`` when both classes exist.
    """
    from types import SimpleNamespace

    from napari_slidescope.pipeline.region_cells import region_summary

    table: dict[str, np.ndarray] = {
        "region": np.zeros(0, str) if cells is None else cells.region,
    }
    names: list[str] = []
    if classes is not None:
        table["class"] = np.asarray(classes.columns["class"])
        names = list(classes.colors)
        if "dab_score" in classes.columns:
            table["dab_score"] = np.asarray(classes.columns["dab_score"])
    # the whole map counts (region=None); the cell classes in the rules' order
    result = SimpleNamespace(columns=table, classes=names, region=None)
    figures = dict(region_summary(result, regions))
    if cells is None:  # no nuclei were looked for: no cell figures
        for r in regions.classes:
            figures.pop(f"{r}_cells", None)
            figures.pop(f"{r}_cells_per_mm2", None)
    return figures


def region_rows(regions: Any, figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return one row per region class of :func:`region_figures`, for ``regions.csv``.

    A figure ``{R}_{name}`` goes to the row of region ``R`` as ``name`` (the longest
    class name that prefixes it, so ``Tumor stroma`` is not taken for ``Tumor``).
    """
    order = sorted(regions.classes, key=len, reverse=True)
    rows: dict[str, dict[str, Any]] = {r: {"region": r} for r in regions.classes}
    for key, value in figures.items():
        owner = next((r for r in order if key.startswith(f"{r}_")), None)
        if owner is not None:
            rows[owner][key[len(owner) + 1 :]] = value
    return [rows[r] for r in regions.classes]


def write_regions_csv(slide_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``regions.csv``: one row per region class (:func:`region_rows`), atomically."""
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    path = slide_dir / "regions.csv"
    with atomic_write(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if r.get(c) is None else _fmt(r[c]) for c in columns])
    return path


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
