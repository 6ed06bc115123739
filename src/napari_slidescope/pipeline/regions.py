"""Sources and regions: what the analysis functions accept, validated once."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from napari_slidescope._units import as_pair
from napari_slidescope.analysis.checks import check_rgb
from napari_slidescope.slide import ArraySlide, Slide, open_slide


class SlideLike(Protocol):
    """What the analysis pipeline needs from a slide (Slide and ArraySlide both fit)."""

    axes: str
    mpp: tuple[float, float] | None
    format: str

    @property
    def levels(self) -> list[Any]: ...  # noqa: D102

    @property
    def shape0(self) -> tuple[int, int]: ...  # noqa: D102

    @property
    def downsamples(self) -> list[tuple[float, float]]: ...  # noqa: D102

    def level_for_mpp(self, target_mpp: float) -> int: ...  # noqa: D102

    def close(self) -> None: ...  # noqa: D102

    def read_region(  # noqa: D102
        self, region: tuple[int, int, int, int], *, level: int = 0
    ) -> np.ndarray: ...


def as_slide(
    source: Any, *, mpp: float | tuple[float, float] | None = None
) -> tuple[SlideLike, bool]:
    """Turn an analysis `source` into a slide.

    Parameters
    ----------
    source : Slide, ArraySlide, str, PathLike, (M, N, 3) ndarray of uint8 or (M, N) ndarray
        An open slide, a path to one, an RGB image or one fluorescence channel.
    mpp : float or (float, float), optional
        Micrometres per pixel of an array source (required for arrays); for a slide it
        overrides a missing calibration only.

    Returns
    -------
    slide : SlideLike
        The slide to read from.
    owned : bool
        True when this function opened the slide and the caller must close it.

    Raises
    ------
    ValueError
        If an array source has no `mpp` or the wrong shape or dtype.
    TypeError
        If `source` is of an unsupported type.
    """
    if isinstance(source, Slide | ArraySlide):
        if source.mpp is None and mpp is not None:
            source.mpp = as_pair(mpp, "mpp")
        return source, False
    if isinstance(source, str | os.PathLike):
        slide = open_slide(source)
        if slide.mpp is None and mpp is not None:
            slide.mpp = as_pair(mpp, "mpp")
        return slide, True
    if hasattr(source, "shape") and hasattr(source, "dtype"):
        if len(source.shape) != 2:  # (M, N) is one fluorescence channel
            check_rgb(source, "image")
        if mpp is None:
            raise ValueError(
                "image: an array source needs its pixel size: pass mpp=<micrometres per pixel>"
            )
        return ArraySlide(source, mpp=mpp, name="image"), False
    raise TypeError(f"source must be a Slide, a path or an RGB array, got {type(source).__name__}")


def check_region(
    region: tuple[int, int, int, int] | None, shape0: tuple[int, int], *, name: str = "region"
) -> tuple[int, int, int, int]:
    """Validate a level-0 box ``(y0, x0, y1, x1)`` (half-open) and clip it to the slide.

    None means the whole slide. This is the one rule of every region entry point
    (``detect_tissue``, ``segment_nuclei`` and their streaming variants, the widget and
    the console helpers): the part of a box outside the slide holds no pixels, so an
    analysis covers the part inside and reports that as its ``region`` (no tissue and
    no nucleus can lie outside the slide); a box with no part on the slide raises,
    naming the box and the slide's size, rather than giving an empty result.
    ``Slide.read_region`` follows the same rule for pixels: it pads the part outside
    with a documented fill, keeping the box's shape.

    Raises
    ------
    ValueError
        If the box is malformed, empty, or does not overlap the slide.
    """
    h, w = shape0
    if region is None:
        return (0, 0, int(h), int(w))
    try:
        y0, x0, y1, x1 = (int(round(float(v))) for v in region)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be (y0, x0, y1, x1) in level-0 pixels, got {region!r}"
        ) from None
    if y1 <= y0 or x1 <= x0:
        raise ValueError(f"{name} {region!r} is empty: need y1 > y0 and x1 > x0")
    cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y1, h), min(x1, w)
    if cy1 <= cy0 or cx1 <= cx0:
        raise ValueError(f"{name} {region!r} lies outside the slide (level 0 is {h} x {w} px)")
    return (cy0, cx0, cy1, cx1)


def split_region(region: Any) -> tuple[Any, np.ndarray | None]:
    """Split a `region` into a level-0 box and an optional polygon.

    Parameters
    ----------
    region : box, (N, 2) array-like, shapely Polygon or None
        A box ``(y0, x0, y1, x1)``; a polygon as level-0 ``(row, col)`` vertices
        (N >= 3); or a shapely ``Polygon`` in level-0 ``(x, y)`` (the GeoJSON / WKB
        convention, e.g. a QuPath annotation or a ``nuclei.parquet`` outline).

    Returns
    -------
    box, polygon
        The box to analyse (a polygon's bounding box, half-open, whole pixels) and the
        polygon's ``(row, col)`` ring, or ``(region, None)`` for a box or None.

    Raises
    ------
    ValueError
        If a polygon has fewer than 3 vertices or non-finite ones.
    """
    if region is None:
        return None, None
    if hasattr(region, "exterior") and hasattr(region, "bounds"):  # shapely, (x, y)
        ring = np.asarray(region.exterior.coords, float)[:, ::-1]
    else:
        arr = np.asarray(region, dtype=object)
        if arr.ndim != 2:
            return region, None
        ring = np.asarray(region, float)
    if ring.ndim != 2 or ring.shape[1] != 2 or len(ring) < 3 or not np.isfinite(ring).all():
        raise ValueError(
            f"region: a polygon needs at least 3 finite (row, col) vertices, got shape {ring.shape}"
        )
    if len(ring) > 3 and np.array_equal(ring[0], ring[-1]):
        ring = ring[:-1]
    lo, hi = np.floor(ring.min(axis=0)), np.ceil(ring.max(axis=0))
    return (int(lo[0]), int(lo[1]), int(hi[0]), int(hi[1])), ring


def inside_polygon(rows: np.ndarray, cols: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """Return which level-0 points ``(rows[i], cols[i])`` lie inside a ``(row, col)`` ring."""
    from skimage.measure import points_in_poly

    contains: Callable[[np.ndarray, np.ndarray], np.ndarray] = points_in_poly  # (untyped)
    pts = np.stack([np.asarray(rows, float), np.asarray(cols, float)], axis=1)
    if len(pts) == 0:
        return np.zeros(0, bool)
    return np.asarray(contains(pts, np.asarray(ring, float)), bool)


def inside_region(rows: np.ndarray, cols: np.ndarray, region: Any) -> np.ndarray:
    """Return which level-0 points lie inside an analysed area.

    Parameters
    ----------
    rows, cols : (N,) ndarray of float
        Level-0 ``(row, col)`` of the points.
    region : (int, int, int, int) or (M, 2) ndarray of float
        A half-open box ``(y0, x0, y1, x1)``, or a polygon's ``(row, col)`` ring (what
        :func:`split_region` returns for a polygon region).

    Returns
    -------
    inside : (N,) ndarray of bool
    """
    rows, cols = np.asarray(rows, float), np.asarray(cols, float)
    ring = np.asarray(region, float)
    if ring.ndim == 2:
        return inside_polygon(rows, cols, ring)
    y0, x0, y1, x1 = (float(v) for v in ring)
    return (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)


def clip_area(area: Any, box: Any) -> Any:
    """Return the part of an analysed `area` inside a level-0 `box`, or None if empty.

    Parameters
    ----------
    area : (int, int, int, int) or (M, 2) ndarray of float
        A half-open box ``(y0, x0, y1, x1)`` or a polygon's ``(row, col)`` ring.
    box : (int, int, int, int)
        The box to clip to (e.g. a tile that finished).

    Returns
    -------
    clipped : box, (K, 2) ndarray of float, or None
        A box for a box; for a ring, the ring clipped to the box (Sutherland-Hodgman: a
        concave ring may come back with zero-width bridges along the box's edges, which
        :func:`inside_region` counts as outside).
    """
    y0, x0, y1, x1 = (float(v) for v in box)
    ring = np.asarray(area, float)
    if ring.ndim != 2:
        a0, b0, a1, b1 = ring
        out = (max(a0, y0), max(b0, x0), min(a1, y1), min(b1, x1))
        return tuple(int(v) for v in out) if out[0] < out[2] and out[1] < out[3] else None
    pts = [tuple(p) for p in ring]
    for axis, bound, keep_above in ((0, y0, True), (0, y1, False), (1, x0, True), (1, x1, False)):
        if not pts:
            return None

        def inside(
            p: tuple[float, float], a: int = axis, v: float = bound, up: bool = keep_above
        ) -> bool:
            return p[a] >= v if up else p[a] <= v

        out_pts: list[tuple[float, float]] = []
        for i, cur in enumerate(pts):
            prev = pts[i - 1]
            if inside(cur):
                if not inside(prev):
                    out_pts.append(_cross(prev, cur, axis, bound))
                out_pts.append(cur)
            elif inside(prev):
                out_pts.append(_cross(prev, cur, axis, bound))
        pts = out_pts
    if len(pts) < 3:
        return None
    clipped = np.asarray(pts, float)
    twice_area = np.dot(clipped[:, 0], np.roll(clipped[:, 1], 1)) - np.dot(
        clipped[:, 1], np.roll(clipped[:, 0], 1)
    )
    return clipped if abs(twice_area) > 0 else None


def _cross(
    p: tuple[float, float], q: tuple[float, float], axis: int, v: float
) -> tuple[float, float]:
    """Where segment p-q crosses the line ``coordinate[axis] == v``."""
    t = (v - p[axis]) / (q[axis] - p[axis])
    other = 1 - axis
    point = [0.0, 0.0]
    point[axis] = v
    point[other] = p[other] + t * (q[other] - p[other])
    return (point[0], point[1])
