"""Tile plans: cut a level-0 region into overlapping tiles at a working resolution.

A :class:`TilePlan` describes how a level-0 box of a slide is covered, at a working
resolution (``target_mpp``), by equally sized tiles that overlap by at least the
segmenter's ``min_overlap_um``. Each tile owns a *core*; the cores partition the
region exactly. A nucleus belongs to the one tile whose core holds its centroid, so
each nucleus is found once and never cut at a seam (:func:`owned_labels`,
:func:`paste_owned`). :func:`read_tile` reads a tile's pixels at the working
resolution, identically whichever tile a working pixel belongs to.

Plans hold plain ints, floats and the slide path only, so they can be pickled and
handed to other processes (e.g. a ``dask.distributed`` cluster): a task carries a
path and coordinates, never pixels or open file handles.

Coordinates
-----------
Working pixel ``(r, c)`` of a plan covers the level-0 area
``[origin_y + r * downsample_y, origin_y + (r + 1) * downsample_y)`` (same for x),
where ``origin`` is the region's top-left level-0 pixel. Working boxes are
``(y0, x0, y1, x1)`` half-open, relative to the region's working grid.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope._types import Box
from napari_slidescope._units import as_pair
from napari_slidescope.analysis.resample import block_mean

__all__ = [
    "Box",
    "Tile",
    "TilePlan",
    "make_plan",
    "owned_labels",
    "paste_owned",
    "read_tile",
]


@dataclass(frozen=True)
class Tile:
    """One tile of a :class:`TilePlan`.

    Attributes
    ----------
    index : int
        Position of the tile in the plan (row-major).
    grid : tuple of int
        ``(row, col)`` of the tile in the tile grid.
    box : tuple of int
        Working-resolution box ``(y0, x0, y1, x1)`` the tile covers (core plus
        overlap), relative to the region's working grid. All tiles of a plan have
        the same box shape.
    core : tuple of int
        Working-resolution box the tile owns; the cores of a plan partition it.
    box0 : tuple of int
        Level-0 box ``(y0, x0, y1, x1)`` covering ``box`` (pixels to read).
    path : str or None
        Path of the slide, or None for in-memory sources.
    """

    index: int
    grid: tuple[int, int]
    box: Box
    core: Box
    box0: Box
    path: str | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the tile at working resolution."""
        return (self.box[2] - self.box[0], self.box[3] - self.box[1])

    @property
    def core_in_tile(self) -> Box:
        """The core as a box relative to the tile's own pixels."""
        y0, x0 = self.box[0], self.box[1]
        return (self.core[0] - y0, self.core[1] - x0, self.core[2] - y0, self.core[3] - x0)


@dataclass(frozen=True)
class TilePlan:
    """How a level-0 region is cut into tiles at a working resolution.

    Attributes
    ----------
    region : tuple of int
        Level-0 box ``(y0, x0, y1, x1)`` of the region.
    mpp : float
        Working resolution in µm per pixel.
    downsample : tuple of float
        ``(y, x)`` level-0 pixels per working pixel.
    shape : tuple of int
        ``(rows, cols)`` of the region at working resolution.
    tile_size : int
        Nominal (largest) core size in working pixels; the cores of an axis are
        ``shape / grid_shape`` (+-1 px).
    overlap : int
        Minimum context on each side of a core, in working pixels.
    tiles : tuple of Tile
        Row-major tiles.
    path : str or None
        Path of the slide, or None for in-memory sources.
    """

    region: Box
    mpp: float
    downsample: tuple[float, float]
    shape: tuple[int, int]
    tile_size: int
    overlap: int
    tiles: tuple[Tile, ...] = field(repr=False)
    path: str | None = None

    @property
    def origin(self) -> tuple[int, int]:
        """Level-0 ``(y, x)`` of working pixel ``(0, 0)``'s top-left corner."""
        return (self.region[0], self.region[1])

    @property
    def grid_shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the tile grid."""
        return (
            math.ceil(self.shape[0] / self.tile_size),
            math.ceil(self.shape[1] / self.tile_size),
        )

    def __len__(self) -> int:
        return len(self.tiles)

    def __iter__(self) -> Iterator[Tile]:
        return iter(self.tiles)

    def working_to_level0(self, box: Box) -> Box:
        """Level-0 box covering a working box (clipped to the region)."""
        dy, dx = self.downsample
        oy, ox = self.origin
        r = self.region
        return (
            max(r[0], oy + math.floor(box[0] * dy + 1e-9)),
            max(r[1], ox + math.floor(box[1] * dx + 1e-9)),
            min(r[2], oy + math.ceil(box[2] * dy - 1e-9)),
            min(r[3], ox + math.ceil(box[3] * dx - 1e-9)),
        )

    def subset(self, indices: list[int] | np.ndarray) -> tuple[Tile, ...]:
        """Tiles with the given indices, in plan order."""
        keep = {int(i) for i in indices}
        return tuple(t for t in self.tiles if t.index in keep)


def make_plan(
    region: Box,
    *,
    slide_mpp: float | tuple[float, float],
    target_mpp: float,
    tile_size_um: float,
    min_overlap_um: float,
    path: str | None = None,
) -> TilePlan:
    """Cut a level-0 region into tiles at a working resolution.

    Parameters
    ----------
    region : tuple of int
        Level-0 box ``(y0, x0, y1, x1)``; must be non-empty.
    slide_mpp : float or tuple of float
        Level-0 µm per pixel, ``(y, x)`` or one value for both.
    target_mpp : float
        Working resolution in µm per pixel.
    tile_size_um : float
        Largest size of a tile's core in µm (cores are balanced, see Returns).
        Tiles read up to ``2 * overlap`` more.
    min_overlap_um : float
        Context needed on each side of a core, in µm (at least two nucleus
        diameters for seamless results).
    path : str, optional
        Slide path stored in the plan and its tiles.

    Returns
    -------
    plan : TilePlan
        Tiles in row-major order. Per axis the region is split into
        ``ceil(extent / tile)`` cores of equal size (+-1 px), none larger than
        ``tile_size_um``. All tile boxes have the same shape: per axis the largest
        core plus the context any tile needs (``core + 2 * overlap`` when there are
        interior tiles, ``core + overlap`` with two tiles, the region with one);
        tiles at the region's edges are shifted inwards to that shape.

    Raises
    ------
    ValueError
        If the region is empty or a size or resolution is not positive.
    """
    y0, x0, y1, x1 = (int(v) for v in region)
    if y1 <= y0 or x1 <= x0:
        raise ValueError(f"region: expected a non-empty (y0, x0, y1, x1) box, got {region}")
    mpp = as_pair(slide_mpp, "slide_mpp")
    for name, value in (("target_mpp", target_mpp), ("tile_size_um", tile_size_um)):
        if not value > 0:
            raise ValueError(f"{name}: expected a positive number, got {value!r}")
    if not (mpp[0] > 0 and mpp[1] > 0):
        raise ValueError(f"slide_mpp: expected positive µm per pixel, got {slide_mpp!r}")
    if min_overlap_um < 0:
        raise ValueError(f"min_overlap_um: expected >= 0, got {min_overlap_um!r}")
    ds = (target_mpp / mpp[0], target_mpp / mpp[1])
    shape = (
        max(1, math.ceil((y1 - y0) / ds[0] - 1e-9)),
        max(1, math.ceil((x1 - x0) / ds[1] - 1e-9)),
    )
    tile = max(1, round(tile_size_um / target_mpp))
    overlap = math.ceil(min_overlap_um / target_mpp - 1e-9)
    plan = TilePlan(
        region=(y0, x0, y1, x1),
        mpp=float(target_mpp),
        downsample=ds,
        shape=shape,
        tile_size=tile,
        overlap=overlap,
        tiles=(),
        path=path,
    )
    rows, cols = plan.grid_shape
    (ycores, ysize), (xcores, xsize) = (
        _axis_cores(shape[0], rows, overlap),
        _axis_cores(shape[1], cols, overlap),
    )
    tiles: list[Tile] = []
    for i, (cy0, cy1) in enumerate(ycores):
        by0 = min(max(cy0 - overlap, 0), shape[0] - ysize)
        for j, (cx0, cx1) in enumerate(xcores):
            bx0 = min(max(cx0 - overlap, 0), shape[1] - xsize)
            box = (by0, bx0, by0 + ysize, bx0 + xsize)
            tiles.append(
                Tile(
                    index=len(tiles),
                    grid=(i, j),
                    box=box,
                    core=(cy0, cx0, cy1, cx1),
                    box0=plan.working_to_level0(box),
                    path=path,
                )
            )
    object.__setattr__(plan, "tiles", tuple(tiles))
    return plan


def _axis_cores(n_px: int, n: int, overlap: int) -> tuple[list[tuple[int, int]], int]:
    """Split ``n_px`` pixels into ``n`` cores of equal size (+-1) and the tile size they need.

    Equal cores never exceed the nominal core (``n = ceil(n_px / core)``) and do not
    leave a thin last core that would cost a whole tile. The tile size is the largest
    core-plus-context any tile needs: ``core + 2 * overlap`` with interior tiles,
    ``core + overlap`` when every tile touches an edge of the region (two per axis),
    the region itself with one.
    """
    edges = [k * n_px // n for k in range(n + 1)]
    cores = list(zip(edges[:-1], edges[1:], strict=True))
    size = max(min(c1 + overlap, n_px) - max(c0 - overlap, 0) for c0, c1 in cores)
    return cores, size


def _axis_positions(
    n0: int, n: int, origin: int, ds: float, level_ds: float, start: int, k: int
) -> np.ndarray:
    """Working pixel centres ``n0 .. n0 + n`` as coordinates in a k-binned level array."""
    centre0 = origin + (np.arange(n0, n0 + n) + 0.5) * ds  # continuous level-0 coordinate
    index_l = centre0 / level_ds - 0.5  # index coordinate at the level
    return (index_l - start - (k - 1) / 2) / k


def _lerp_weights(pos: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Lower neighbour indices and weights of fractional ``pos`` (edge-clamped).

    The weights are None when every position is (within 1e-4) on a sample, so the
    interpolation is a plain selection of rows or columns.
    """
    pos = np.clip(pos, 0, n - 1)
    i0 = np.floor(pos).astype(np.intp)
    w = (pos - i0).astype(np.float32)
    return (i0, None) if not np.any(w > 1e-4) else (i0, w)


def _select(a: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    """``np.take(a, index, axis)``, as a view when the indices are a contiguous run."""
    if index.size and index[-1] - index[0] == index.size - 1 and np.all(np.diff(index) == 1):
        sl = [slice(None)] * a.ndim
        sl[axis] = slice(int(index[0]), int(index[-1]) + 1)
        return a[tuple(sl)]
    return np.take(a, index, axis=axis)


def _lerp(a: np.ndarray, i0: np.ndarray, w: np.ndarray | None, axis: int) -> np.ndarray:
    """Linear interpolation of ``a`` along ``axis`` between ``i0`` and ``i0 + 1``."""
    if w is None:
        return _select(a, i0, axis)
    i1 = np.minimum(i0 + 1, a.shape[axis] - 1)
    shape = [1] * a.ndim
    shape[axis] = -1
    w = w.reshape(shape)
    # in place, the same float32 operations in the same order as
    # ``take(i0) * (1 - w) + take(i1) * w``: two arrays of the output's size, not four;
    # integer pixels are converted after the rows / columns are taken, not before
    out = np.take(a, i0, axis=axis).astype(np.float32, copy=False)
    out *= 1 - w
    hi = np.take(a, i1, axis=axis).astype(np.float32, copy=False)
    hi *= w
    out += hi
    return out


def read_tile(slide: Any, tile: Tile, plan: TilePlan, *, level: int) -> np.ndarray:
    """Read one tile's pixels and resample them to the working resolution.

    The level is first binned by the integer part of the resampling factor on a
    grid fixed by the slide (not by the tile), then linearly interpolated at the
    working pixel centres, so a working pixel has the same value in every tile.

    Parameters
    ----------
    slide : Slide-like
        Has ``read_region(box, *, level)`` and ``downsamples``.
    tile : Tile
        Tile to read.
    plan : TilePlan
        The tile's plan (origin and downsample of the working grid).
    level : int
        Pyramid level to read from.

    Returns
    -------
    pixels : (M, N, C) ndarray
        The tile at working resolution, shape ``tile.shape + (C,)``, the slide's dtype:
        C = 3 for RGB, the channels (last) of a multichannel slide, 1 for grayscale.
    """
    ly_ds, lx_ds = (float(v) for v in slide.downsamples[level])
    dy, dx = plan.downsample
    ky, kx = max(1, math.floor(dy / ly_ds + 1e-3)), max(1, math.floor(dx / lx_ds + 1e-3))
    b = tile.box0
    my, mx = (ky + 1) * ly_ds, (kx + 1) * lx_ds  # margins for interpolation
    shape0 = getattr(slide, "shape0", None) or (10**12, 10**12)
    y0, x0 = max(0, math.floor(b[0] - my)), max(0, math.floor(b[1] - mx))
    y1, x1 = min(shape0[0], math.ceil(b[2] + my)), min(shape0[1], math.ceil(b[3] + mx))
    arr = _channels_last(np.asarray(slide.read_region((y0, x0, y1, x1), level=level)), slide)
    if arr.ndim != 3:
        raise ValueError(f"tile {tile.index}: expected (Y, X, C) pixels, got shape {arr.shape}")
    if arr.dtype == bool or arr.dtype.kind not in "uif":
        raise ValueError(
            f"tile {tile.index}: expected integer or float pixels, got dtype {arr.dtype}"
        )
    sy, sx = math.floor(y0 / ly_ds), math.floor(x0 / lx_ds)  # level index of arr[0, 0]
    # bin on a slide-fixed grid: drop rows/cols before the next multiple of k
    ty, tx = (-sy) % ky, (-sx) % kx
    hy, hx = (arr.shape[0] - ty) // ky, (arr.shape[1] - tx) // kx
    if hy < 1 or hx < 1:
        raise ValueError(
            f"tile {tile.index}: read {arr.shape} pixels for box {b}, too few to resample"
        )
    a = arr[ty : ty + hy * ky, tx : tx + hx * kx]
    pos_y = _axis_positions(tile.box[0], tile.shape[0], plan.origin[0], dy, ly_ds, sy + ty, ky)
    pos_x = _axis_positions(tile.box[1], tile.shape[1], plan.origin[1], dx, lx_ds, sx + tx, kx)
    iy: np.ndarray | None
    ix: np.ndarray | None
    iy, wy = _lerp_weights(pos_y, hy)
    ix, wx = _lerp_weights(pos_x, hx)
    # Rows / columns that are only selected (no binning, no interpolation) are selected
    # on the uint8 pixels before anything is converted: the same values, far less work.
    # A level already at the working resolution is then a crop of what was read.
    if ky == 1 and wy is None and iy is not None:
        a, iy = _select(a, iy, 0), None
    if kx == 1 and wx is None and ix is not None:
        a, ix = _select(a, ix, 1), None
    if iy is None and ix is None and ky == 1 and kx == 1:
        return np.ascontiguousarray(a)
    # A 1 x 1 mean is the pixels themselves: the interpolation below (there is one, else
    # the crop above returned) converts them to float32 after taking its rows, so a level
    # read at under twice the working resolution is not first converted whole (a 40x level
    # for 0.5 µm/px: 4 bytes per value of a region four times the tile's area)
    f = a if ky == 1 and kx == 1 else block_mean(a, (ky, kx), dtype=np.float32)
    if iy is not None:
        f = _lerp(f, iy, wy, 0)
    if ix is not None:
        f = _lerp(f, ix, wx, 1)
    if arr.dtype.kind in "ui":  # f is this function's own float32 array: rounded in place
        info = np.iinfo(arr.dtype)
        f += 0.5
        np.clip(f, info.min, info.max, out=f)
    return f.astype(arr.dtype)


def _channels_last(arr: np.ndarray, slide: Any) -> np.ndarray:
    """Pixels as (Y, X, C): RGB (alpha dropped), multichannel ``CYX`` moved, ``YX`` as C=1."""
    axes = getattr(slide, "axes", "YXS")
    if axes == "CYX" and arr.ndim == 3:
        return np.moveaxis(arr, 0, -1)
    if arr.ndim == 2:
        return arr[..., np.newaxis]
    if arr.ndim == 3 and axes == "YXS" and arr.shape[2] >= 3:
        return arr[..., :3]
    return arr


def _compact(labels: np.ndarray) -> np.ndarray:
    """Labels as a non-negative integer array whose ids are few enough for ``find_objects``.

    Negative values count as background; ids far beyond the number of pixels (sparse
    ids of some models) are renumbered ``1..n`` keeping their order.
    """
    if labels.dtype.kind not in "iu":
        labels = labels.astype(np.int64)
    if labels.size == 0:
        return labels
    if labels.dtype.kind == "i" and labels.min() < 0:
        labels = np.where(labels > 0, labels, 0)
    if int(labels.max()) > labels.size:
        ids = np.unique(labels)
        ids = ids[ids > 0]
        labels = np.where(labels > 0, np.searchsorted(ids, labels) + 1, 0)
    return labels


def owned_labels(labels: np.ndarray, tile: Tile) -> np.ndarray:
    """Keep only the nuclei a tile owns, renumbered ``1..n`` in label order.

    Parameters
    ----------
    labels : (M, N) ndarray of int
        Labels of the whole tile (shape ``tile.shape``); values <= 0 are background.
    tile : Tile
        The tile; a nucleus is owned when the floor of its centroid lies in
        ``tile.core``.

    Returns
    -------
    owned : (M, N) ndarray of int32
        Owned nuclei (whole, including parts outside the core), others zeroed.
    """
    labels = np.asarray(labels)
    if labels.shape != tile.shape:
        raise ValueError(
            f"labels of tile {tile.index}: expected shape {tile.shape}, got {labels.shape}"
        )
    labels = _compact(labels)
    cy0, cx0, cy1, cx1 = tile.core_in_tile
    slices = ndi.find_objects(labels) if labels.size else []
    keep = []
    # The floor of a centroid lies inside the object's bounding box: objects whose box is
    # inside the core are owned, objects whose box misses it are not; only those across
    # the core's edge need their centroid (exact: integer sums over one division, as in
    # ``ndi.center_of_mass``).
    for i, sl in enumerate(slices, 1):
        if sl is None:
            continue
        ys, xs = sl
        if ys.stop <= cy0 or ys.start >= cy1 or xs.stop <= cx0 or xs.start >= cx1:
            continue
        if ys.start < cy0 or ys.stop > cy1 or xs.start < cx0 or xs.stop > cx1:
            m = labels[sl] == i
            n = float(np.count_nonzero(m))
            rows = np.count_nonzero(m, axis=1) @ np.arange(ys.start, ys.stop)
            cols = np.count_nonzero(m, axis=0) @ np.arange(xs.start, xs.stop)
            fy = math.floor(float(rows) / n + 1e-9)
            fx = math.floor(float(cols) / n + 1e-9)
            if not (cy0 <= fy < cy1 and cx0 <= fx < cx1):
                continue
        keep.append(i)
    if not keep:
        return np.zeros(labels.shape, np.int32)
    lut = np.zeros(len(slices) + 1, np.int32)
    lut[keep] = np.arange(1, len(keep) + 1, dtype=np.int32)
    return np.asarray(lut[labels])


def paste_owned(out: np.ndarray, owned: np.ndarray, tile: Tile, *, offset: int = 0) -> None:
    """Paste a tile's owned nuclei into a region label image, in place.

    Pixels already labelled in ``out`` are kept (the earlier tile wins), so the
    result does not depend on anything but the pasting order.

    Parameters
    ----------
    out : (M, N) ndarray of int32
        Label image of the whole region at working resolution.
    owned : (m, n) ndarray of int
        The tile's owned labels (local ids ``1..k``), shape ``tile.shape``.
    tile : Tile
        Where to paste.
    offset : int
        Added to the local ids.
    """
    y0, x0, y1, x1 = tile.box
    dst = out[y0:y1, x0:x1]
    mask = (owned > 0) & (dst == 0)
    dst[mask] = owned[mask] + offset
