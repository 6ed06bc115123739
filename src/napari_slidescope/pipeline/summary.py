"""The one definition of tissue area and of the summary figures of a nuclei run.

Every entry point reports its figures through these two functions: ``detect_tissue``
(``TissueResult.area_um2``), the console's ``summary()`` and the widget's result line (the
viewer's :class:`~napari_slidescope._qt.session.Summary`), and the batch's
``summary.csv`` and manifests. The same nuclei over the same tissue therefore give the
same density everywhere.

Tissue area
    The level-0 area of the tissue mask's pixels inside the analysed area (the tissue
    result's own region by default). A mask pixel counts for the part of it that lies
    inside: exactly for boxes and unions of boxes (a mask pixel at the slide's edge, or
    cut by a tile's edge, counts for its part inside), by its centre for polygons.
Density
    Nuclei per mm² of that tissue area; mean nucleus area: the mean of ``area_um2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["NucleiFigures", "nuclei_figures", "tissue_area_px", "tissue_area_um2"]


def _edges(n: int, start: float, step: float) -> np.ndarray:
    return start + step * np.arange(n + 1, dtype=np.float64)


def _boxes_coverage(
    shape: tuple[int, int],
    origin: tuple[float, float],
    downsample: tuple[float, float],
    boxes: Sequence[Sequence[float]],
) -> np.ndarray:
    """Level-0 area of each mask pixel inside the union of `boxes` (exact)."""
    ey = _edges(shape[0], origin[0], downsample[0])
    ex = _edges(shape[1], origin[1], downsample[1])
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    # compressed grid: every pixel edge and every box edge inside the mask's extent
    ys = np.unique(np.clip(np.concatenate([ey, b[:, 0], b[:, 2]]), ey[0], ey[-1]))
    xs = np.unique(np.clip(np.concatenate([ex, b[:, 1], b[:, 3]]), ex[0], ex[-1]))
    cy, cx = (ys[:-1] + ys[1:]) / 2, (xs[:-1] + xs[1:]) / 2
    covered = np.zeros((cy.size, cx.size), bool)
    for y0, x0, y1, x1 in b:
        r = slice(*np.searchsorted(cy, [y0, y1]))
        c = slice(*np.searchsorted(cx, [x0, x1]))
        covered[r, c] = True
    cell = covered * np.outer(np.diff(ys), np.diff(xs))
    # cells back to mask pixels: each pixel edge is one of the grid's edges
    ry = np.searchsorted(ys, ey[:-1])
    rx = np.searchsorted(xs, ex[:-1])
    if cell.size == 0:
        return np.zeros(shape)
    # (a pixel that is one cell keeps its value: reduceat over one index per row or column
    # is the identity, skipped as it costs a whole-mask pass)
    if ry.size != cell.shape[0]:
        cell = np.add.reduceat(cell, ry, axis=0)
    if rx.size != cell.shape[1]:
        cell = np.add.reduceat(cell, rx, axis=1)
    area: np.ndarray = cell
    return area


def _overlap(n: int, start: float, step: float, lo: float, hi: float) -> np.ndarray:
    """Length of each of `n` pixel spans ``[start + i*step, start + (i+1)*step)`` in [lo, hi)."""
    e = _edges(n, start, step)
    out: np.ndarray = np.clip(np.minimum(e[1:], hi) - np.maximum(e[:-1], lo), 0.0, None)
    return out


def _box_area(
    mask: np.ndarray,
    origin: tuple[float, float],
    downsample: tuple[float, float],
    box: Sequence[float],
) -> float:
    """:func:`_boxes_coverage` summed over the mask for one box, without a whole-mask array.

    A pixel's part inside a box is the product of its row's and its column's overlaps:
    only the rows the box overlaps are counted, the columns wholly inside it with one
    count per row, and the (at most two) columns it cuts are added with their overlap.
    """
    y0, x0, y1, x1 = (float(v) for v in box)
    wy = _overlap(mask.shape[0], origin[0], downsample[0], y0, y1)
    wx = _overlap(mask.shape[1], origin[1], downsample[1], x0, x1)
    ex = _edges(mask.shape[1], origin[1], downsample[1])
    rows = np.flatnonzero(wy)  # one run: the rows the box overlaps
    if rows.size == 0:
        return 0.0
    band = mask[rows[0] : rows[-1] + 1]
    whole = np.flatnonzero((ex[:-1] >= x0) & (ex[1:] <= x1))  # one run of columns
    per_row = np.zeros(band.shape[0])
    if whole.size:
        per_row += np.count_nonzero(band[:, whole[0] : whole[-1] + 1], axis=1) * downsample[1]
    cut = np.flatnonzero((wx > 0) & ((ex[:-1] < x0) | (ex[1:] > x1)))
    for j in cut:  # the columns that hold a box edge
        per_row += band[:, j] * wx[j]
    return float(wy[rows[0] : rows[-1] + 1] @ per_row)


def tissue_area_px(
    mask: np.ndarray,
    origin: tuple[float, float],
    downsample: tuple[float, float],
    areas: Sequence[Any],
) -> float:
    """Tissue area in level-0 pixels: the mask's pixels inside the union of `areas`.

    Parameters
    ----------
    mask : (M, N) ndarray of bool
        Tissue mask.
    origin : (float, float)
        Level-0 ``(y, x)`` of the top-left corner of ``mask[0, 0]``.
    downsample : (float, float)
        Level-0 pixels per mask pixel.
    areas : sequence of box or ring
        Half-open level-0 boxes ``(y0, x0, y1, x1)`` (each mask pixel counts for its part
        inside their union) and polygon ``(row, col)`` rings (a mask pixel inside one by
        its centre counts whole).

    Returns
    -------
    float
    """
    from napari_slidescope.pipeline.regions import inside_region

    mask = np.asarray(mask, bool)
    if not areas or mask.size == 0:
        return 0.0
    dy, dx = (float(v) for v in downsample)
    oy, ox = (float(v) for v in origin)
    boxes = [a for a in areas if np.asarray(a).ndim == 1]
    rings = [np.asarray(a, float) for a in areas if np.asarray(a).ndim == 2]
    if len(boxes) == 1 and not rings:
        return _box_area(mask, (oy, ox), (dy, dx), boxes[0])
    cover = np.zeros(mask.shape)
    if boxes:
        cover = _boxes_coverage(mask.shape, (oy, ox), (dy, dx), boxes)
    if rings:
        cy = oy + (np.arange(mask.shape[0]) + 0.5) * dy
        cx = ox + (np.arange(mask.shape[1]) + 0.5) * dx
        inside = np.zeros(mask.shape, bool)
        for ring in rings:
            lo, hi = ring.min(axis=0), ring.max(axis=0)
            rows = np.flatnonzero((cy >= lo[0]) & (cy < hi[0]))
            cols = np.flatnonzero((cx >= lo[1]) & (cx < hi[1]))
            if rows.size == 0 or cols.size == 0:
                continue
            rr, cc = np.meshgrid(rows, cols, indexing="ij")
            hit = inside_region(cy[rr].ravel(), cx[cc].ravel(), ring).reshape(rr.shape)
            inside[rr, cc] |= hit
        cover = np.maximum(cover, inside * (dy * dx))
    return float(cover[mask].sum())


def tissue_area_um2(tissue: Any, areas: Sequence[Any] | None = None) -> float | None:
    """Tissue area in µm² of a tissue result, inside `areas` (default: its own region).

    Parameters
    ----------
    tissue : TissueResult
        Or any object with ``mask``, ``mpp`` (µm per mask pixel, None when uncalibrated),
        ``origin``, ``downsample`` and, without `areas`, ``region``.
    areas : sequence of box or ring, optional
        Level-0 boxes and polygon rings (see :func:`tissue_area_px`).

    Returns
    -------
    float or None
        None when `tissue` is None or uncalibrated, or `areas` is empty.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> t = SimpleNamespace(mask=np.ones((2, 2), bool), mpp=4.0, origin=(0, 0),
    ...                     downsample=(8.0, 8.0), region=(0, 0, 12, 16))
    >>> tissue_area_um2(t)  # 12 x 16 level-0 px of 0.5 µm
    48.0
    """
    if tissue is None or tissue.mpp is None:
        return None
    if areas is None:
        areas = [tuple(tissue.region)]
    if not areas:
        return None
    dy, dx = (float(v) for v in tissue.downsample)
    px = tissue_area_px(tissue.mask, tissue.origin, (dy, dx), areas)
    return px * float(tissue.mpp) ** 2 / (dy * dx)


@dataclass(frozen=True)
class NucleiFigures:
    """The summary figures of a run's nuclei over its tissue.

    Attributes
    ----------
    count : int
        Nuclei.
    tissue_mm2 : float or None
        Tissue area (:func:`tissue_area_um2`) in mm²; None when unknown or uncalibrated.
    density_per_mm2 : float or None
        Nuclei per mm² of tissue; None without tissue area.
    mean_area_um2 : float or None
        Mean nucleus area; None without nuclei.
    """

    count: int
    tissue_mm2: float | None
    density_per_mm2: float | None
    mean_area_um2: float | None


def nuclei_figures(
    count: int, tissue_um2: float | None, area_um2_sum: float | None = None
) -> NucleiFigures:
    """Return the summary figures of `count` nuclei over `tissue_um2` of tissue.

    Parameters
    ----------
    count : int
        Nuclei.
    tissue_um2 : float or None
        Tissue area in µm² (:func:`tissue_area_um2`).
    area_um2_sum : float, optional
        Sum of the nuclei's ``area_um2`` (NaNs left out).

    Examples
    --------
    >>> nuclei_figures(2970, 577_837.7, 2970 * 40.0).density_per_mm2  # doctest: +ELLIPSIS
    5139.85...
    """
    count = int(count)
    mm2 = None if tissue_um2 is None else float(tissue_um2) / 1e6
    density = count / mm2 if mm2 else None
    mean = float(area_um2_sum) / count if count and area_um2_sum is not None else None
    return NucleiFigures(count, mm2, density, mean)
