"""A slide's tissue regions (``--regions``): the class map, its outlines, the cells per region.

Files in ``OUT/<slide>/``::

    regions.zarr/labels/regions/   the class map as OME-NGFF labels, at the classifier's
                                   working resolution (its scale in µm), classes 1..K
    regions.geojson                the outline of each class's pieces (QuPath annotations)
    regions.csv                    one row per region class: area, cells, cells per mm²,
                                   cell classes and IHC figures per region

and, with nuclei, the ``region`` (class name, ``""`` off the map) and ``region_id``
(0..K) columns of ``nuclei.parquet`` / ``cells.h5ad`` / ``cells.zarr``, and the
``regions`` column of ``summary.csv``.
"""

from __future__ import annotations

import csv
import os
import shutil
from collections.abc import Sequence
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
    "region_rows",
    "regions_text",
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


def region_rows(
    regions: Any, cells: RegionColumns | None, classes: SlideClasses | None
) -> list[dict[str, Any]]:
    """Return one row per region class: its area and, with nuclei, its cells.

    ``region``, ``area_mm2``, ``area_percent`` (of the classes not ignored; None for an
    ignored class), and with nuclei ``cells``, ``cells_per_mm2``, with classified cells
    ``<class>_count`` per cell class and, for IHC-scored cells, ``positive_percent``
    (the Ki-67 index in that region) and ``h_score``.
    """
    area = dict(regions.area_um2)
    fractions = dict(regions.fractions)
    out = []
    for k, name in enumerate(regions.classes, start=1):
        mm2 = float(area.get(name, 0.0)) / 1e6
        share = fractions.get(name)
        row: dict[str, Any] = {
            "region": name,
            "area_mm2": mm2,
            "area_percent": None if share is None else 100.0 * float(share),
        }
        if cells is not None:
            inside = cells.region_id == k
            n = int(np.count_nonzero(inside))
            row["cells"] = n
            row["cells_per_mm2"] = n / mm2 if mm2 > 0 else None
            if classes is not None:
                row.update(_class_figures(classes, inside))
        out.append(row)
    return out


def _class_figures(classes: SlideClasses, inside: np.ndarray) -> dict[str, Any]:
    """Return the counts per cell class, and the IHC figures, of the cells `inside` a region."""
    names = np.asarray(classes.columns["class"])[inside]
    out: dict[str, Any] = {f"{c}_count": int(np.count_nonzero(names == c)) for c in classes.colors}
    if "dab_score" in classes.columns:
        from napari_slidescope.analysis.phenotypes import ihc_summary

        ihc = ihc_summary(np.asarray(classes.columns["dab_score"])[inside])
        for key in ("positive_percent", "h_score"):
            if key in ihc:
                out[key] = ihc[key]
    return out


def regions_text(rows: Sequence[dict[str, Any]]) -> str:
    """Return the ``regions`` field of ``summary.csv``: ``"name: 1.2 mm² (40%), ..."``."""
    parts = []
    for r in rows:
        text = f"{r['region']}: {r['area_mm2']:.4g} mm²"
        if r.get("area_percent") is not None:
            text += f" ({r['area_percent']:.3g}%)"
        if r.get("cells") is not None:
            text += f", {r['cells']} cells"
            if r.get("cells_per_mm2") is not None:
                text += f" ({r['cells_per_mm2']:.4g}/mm²)"
        if r.get("positive_percent") is not None:
            text += f", {r['positive_percent']:.3g}% positive"
        parts.append(text)
    return "; ".join(parts)


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
