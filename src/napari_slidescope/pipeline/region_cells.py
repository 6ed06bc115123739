"""Cells by tissue region: :func:`assign_regions` and :func:`region_summary`.

Each nucleus (or cell) gets the class of the region map pixel under its centroid: a
``region`` text column (``""`` outside the map or off tissue) and a ``region_id`` number
(0 there, else 1..K). Text columns flow into GeoParquet and AnnData ``obs`` as they are;
QuPath GeoJSON measurements are numbers, so they carry ``region_id`` (the classes are
named in the region outlines' file). :func:`region_summary` gives per region the area,
cells, cells per mm², the cell classes and IHC scores per region (Ki-67 index in the
tumour, CD8+ per mm² of stroma) and the tumour-stroma ratio when both classes exist.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from napari_slidescope.analysis.phenotypes import ihc_summary
from napari_slidescope.pipeline.region_map import RegionMap

__all__ = ["assign_regions", "region_summary", "tumour_stroma_ratio"]

#: Class names read as tumour and as stroma for the tumour-stroma ratio (case-insensitive).
TUMOUR_NAMES = ("tumor", "tumour", "tumor epithelium", "tumour epithelium")
STROMA_NAMES = ("stroma", "tumor stroma", "tumour stroma")


def assign_regions(result: Any, regions: RegionMap) -> Any:
    """Return the nuclei result with each nucleus's region (``region``, ``region_id`` columns).

    Parameters
    ----------
    result : NucleiResult
        Nuclei with ``centroid_row`` / ``centroid_col`` (level-0 px).
    regions : RegionMap
        A class map of the same slide (:func:`classify_regions`).

    Returns
    -------
    NucleiResult
        A copy whose table has ``region`` (class name, ``""`` where the map has none) and
        ``region_id`` (0..K); ``parameters["regions"]`` records the map's parameters.

    Raises
    ------
    ValueError
        If the table has no centroids.
    """
    table = dict(result.columns)
    if "centroid_row" not in table or "centroid_col" not in table:
        raise ValueError("assign_regions: the nuclei table has no centroid_row/centroid_col")
    # centroid_row is a pixel index (its centre is +0.5 in continuous level-0 coordinates)
    ids = regions.class_at(
        np.asarray(table["centroid_row"], float) + 0.5,
        np.asarray(table["centroid_col"], float) + 0.5,
    )
    names = np.asarray(("", *regions.classes), dtype=str)
    table["region"] = names[ids]
    table["region_id"] = ids.astype(np.int32)
    params = dict(getattr(result, "parameters", {}) or {})
    params["regions"] = dict(regions.parameters) | {"classes": list(regions.classes)}
    return dataclasses.replace(result, columns=table, parameters=params)


def _match(classes: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    for c in classes:
        if c.lower() in names:
            return c
    return None


def tumour_stroma_ratio(regions: RegionMap) -> float | None:
    """Tumour area over tumour + stroma area, or None without both classes.

    (Pathologists report the stroma share, ``1 - ratio``, as "stroma percentage"; both are
    in :func:`region_summary`.)
    """
    t, s = _match(regions.classes, TUMOUR_NAMES), _match(regions.classes, STROMA_NAMES)
    if t is None or s is None:
        return None
    areas = regions.area_um2
    total = areas[t] + areas[s]
    return areas[t] / total if total > 0 else None


def region_summary(result: Any, regions: RegionMap) -> dict[str, Any]:
    """Return per-region figures of the cells of a result (after :func:`assign_regions`).

    Parameters
    ----------
    result : NucleiResult
        Nuclei with a ``region`` column (assigned here when missing); with ``class``
        (cell classes) and ``dab_score`` (IHC) columns the figures include them.
    regions : RegionMap

    Returns
    -------
    dict
        For each region class ``R``: ``R_area_mm2`` (within the nuclei's region),
        ``R_percent`` (of the classified area, ignored classes left out), ``R_cells``,
        ``R_cells_per_mm2``; with cell classes ``R_{class}_count`` and
        ``R_{class}_per_mm2``; with IHC scores ``R_positive_percent`` (the Ki-67 index
        in the tumour), ``R_h_score`` and the other
        :func:`~napari_slidescope.analysis.phenotypes.ihc_summary` figures; and
        ``tumour_stroma_ratio`` / ``stroma_percent`` when tumour and stroma exist.
    """
    if "region" not in result.columns:
        result = assign_regions(result, regions)
    table = result.columns
    region = np.asarray(table["region"]).astype(str)
    areas = _areas_within(regions, getattr(result, "region", None))
    fractions = {c: f for c, f in _fractions(areas, regions.ignore).items()}
    out: dict[str, Any] = {}
    cls = np.asarray(table["class"]).astype(str) if "class" in table else None
    cell_classes = list(getattr(result, "classes", {}) or []) or (
        sorted(set(cls.tolist())) if cls is not None else []
    )
    dab = np.asarray(table["dab_score"]) if "dab_score" in table else None
    for name in regions.classes:
        mm2 = areas[name] / 1e6
        here = region == name
        n = int(np.count_nonzero(here))
        out[f"{name}_area_mm2"] = mm2
        if name in fractions:
            out[f"{name}_percent"] = 100.0 * fractions[name]
        out[f"{name}_cells"] = n
        out[f"{name}_cells_per_mm2"] = n / mm2 if mm2 > 0 else float("nan")
        if cls is not None:
            for c in cell_classes:
                k = int(np.count_nonzero(here & (cls == c)))
                out[f"{name}_{c}_count"] = k
                out[f"{name}_{c}_per_mm2"] = k / mm2 if mm2 > 0 else float("nan")
        if dab is not None:
            for key, v in ihc_summary(dab[here], area_mm2=mm2 if mm2 > 0 else None).items():
                out[f"{name}_{key}"] = v
    t, s = _match(regions.classes, TUMOUR_NAMES), _match(regions.classes, STROMA_NAMES)
    if t is not None and s is not None and areas[t] + areas[s] > 0:
        out["tumour_stroma_ratio"] = areas[t] / (areas[t] + areas[s])
        out["stroma_percent"] = 100.0 * areas[s] / (areas[t] + areas[s])
    return out


def _fractions(areas: dict[str, float], ignore: tuple[str, ...]) -> dict[str, float]:
    kept = {c: a for c, a in areas.items() if c not in ignore}
    total = sum(kept.values())
    return {c: (a / total if total > 0 else 0.0) for c, a in kept.items()}


def _areas_within(regions: RegionMap, box: Any) -> dict[str, float]:
    """Class areas (µm²) of the map within a level-0 box (None: all of it)."""
    lab = regions.labels
    if box is not None:
        y0, x0, y1, x1 = (float(v) for v in box)
        dy, dx = regions.downsample
        oy, ox = regions.origin
        r0, c0 = max(0, int(np.floor((y0 - oy) / dy))), max(0, int(np.floor((x0 - ox) / dx)))
        r1, c1 = int(np.ceil((y1 - oy) / dy)), int(np.ceil((x1 - ox) / dx))
        lab = lab[r0:r1, c0:c1]
    counts = np.bincount(lab.ravel(), minlength=len(regions.classes) + 1)
    return {c: float(counts[k + 1]) * regions.pixel_um2 for k, c in enumerate(regions.classes)}
