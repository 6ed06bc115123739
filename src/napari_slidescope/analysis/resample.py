"""Resampling images between pixel grids: block means for downsampling, nearest for labels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis.checks import check_image

__all__ = ["block_mean", "resample_nearest"]


def _factors(factor: int | Sequence[int]) -> tuple[int, int]:
    values = np.atleast_1d(np.asarray(factor, dtype=float)).ravel()
    pair = (values[0], values[0]) if values.size == 1 else tuple(values)
    if len(pair) != 2 or any(int(f) != f or f < 1 for f in pair):
        raise ValueError(f"factor: expected an integer >= 1 or a (y, x) pair, got {factor!r}")
    return int(pair[0]), int(pair[1])


def block_mean(
    image: np.ndarray, factor: int | Sequence[int], *, dtype: np.typing.DTypeLike | None = None
) -> np.ndarray:
    """Downsample by averaging ``ky x kx`` blocks (partial edge blocks too).

    Parameters
    ----------
    image : (M, N) or (M, N, C) ndarray of int or float
        Image to downsample.
    factor : int or (int, int)
        Block size ``k`` or ``(ky, kx)``, each >= 1. Output pixel ``(i, j)`` is the mean
        of input pixels ``[i*ky, (i+1)*ky) x [j*kx, (j+1)*kx)``, clipped to the image.
    dtype : dtype, optional
        Output type; default the input's (integers rounded to nearest).

    Returns
    -------
    (ceil(M / ky), ceil(N / kx)[, C]) ndarray

    Raises
    ------
    ValueError
        If the image is empty, not 2D/3D, not numeric, or a factor is not an integer >= 1.

    Examples
    --------
    >>> block_mean(np.arange(16, dtype=np.uint8).reshape(4, 4), 2)
    array([[ 2,  4],
           [10, 12]], dtype=uint8)
    >>> block_mean(np.arange(8, dtype=np.uint8).reshape(2, 4), (2, 4), dtype=np.float32)
    array([[3.5]], dtype=float32)
    """
    image = check_image(image)
    ky, kx = _factors(factor)
    out_dtype = np.dtype(image.dtype if dtype is None else dtype)
    if ky == 1 and kx == 1:
        return image.astype(out_dtype, copy=False)
    h, w = -(-image.shape[0] // ky), -(-image.shape[1] // kx)
    partial = bool(image.shape[0] % ky or image.shape[1] % kx)
    if partial:
        padded = np.zeros((h * ky, w * kx, *image.shape[2:]), image.dtype)
        padded[: image.shape[0], : image.shape[1]] = image
    else:
        padded = image
    integer = np.issubdtype(image.dtype, np.integer)
    if integer and image.dtype.itemsize == 1 and ky * kx <= 257:
        acc_dtype: type = np.uint16
    elif integer and image.dtype.itemsize <= 2:
        acc_dtype = np.uint32
    else:
        acc_dtype = np.float64
    # summing strided slices is several times faster than reshape().sum() or reduceat
    rows: np.ndarray = padded[0::ky].astype(acc_dtype)
    for i in range(1, ky):
        rows += padded[i::ky]
    acc = rows[:, 0::kx].copy()
    for j in range(1, kx):
        acc += rows[:, j::kx]
    if not partial and out_dtype == np.float32:  # every block full: one float32 scale
        out = acc.astype(np.float32)
        out *= np.float32(1.0 / (ky * kx))
        return out
    nr = np.minimum(ky, image.shape[0] - ky * np.arange(h))
    nc = np.minimum(kx, image.shape[1] - kx * np.arange(w))
    count = np.multiply.outer(nr, nc).astype(np.float64)
    mean: np.ndarray = acc / (count if image.ndim == 2 else count[..., None])
    if np.issubdtype(out_dtype, np.integer):
        rounded: np.ndarray = np.rint(mean)
        return rounded.astype(out_dtype)
    return mean.astype(out_dtype)


def resample_nearest(
    src: np.ndarray,
    *,
    src_origin: Sequence[float],
    src_downsample: Sequence[float],
    dst_origin: Sequence[float],
    dst_downsample: Sequence[float],
    dst_shape: Sequence[int],
) -> tuple[Box, np.ndarray] | None:
    """Sample a raster at the pixel centres of another grid, nearest neighbour (for labels).

    Both grids are placed in level-0 pixels: pixel ``(i, j)`` of a grid covers
    ``[origin[0] + i * downsample[0], origin[0] + (i + 1) * downsample[0])`` rows (and
    likewise columns). Each destination pixel takes the source pixel under its centre.

    Parameters
    ----------
    src : (M, N[, ...]) ndarray
        The raster to sample (labels, or any array: values are copied, never mixed).
    src_origin, dst_origin : (float, float)
        Level-0 ``(row, col)`` of the grids' top-left corners.
    src_downsample, dst_downsample : (float, float)
        Level-0 pixels per pixel of each grid, ``(y, x)``.
    dst_shape : (int, int)
        ``(rows, cols)`` of the destination grid.

    Returns
    -------
    (box, patch) or None
        The destination pixels ``(y0, x0, y1, x1)`` whose centres fall inside `src`,
        clipped to `dst_shape`, and the sampled values (shape ``(y1 - y0, x1 - x0[, ...])``);
        None when there are none.

    Examples
    --------
    A 2 x 2 label image at 2x, sampled onto the level-0 grid it covers:

    >>> labels = np.array([[1, 2], [3, 0]], dtype=np.int32)
    >>> box, patch = resample_nearest(
    ...     labels, src_origin=(0, 0), src_downsample=(2, 2),
    ...     dst_origin=(0, 0), dst_downsample=(1, 1), dst_shape=(4, 5))
    >>> box
    (0, 0, 4, 4)
    >>> patch
    array([[1, 1, 2, 2],
           [1, 1, 2, 2],
           [3, 3, 0, 0],
           [3, 3, 0, 0]], dtype=int32)
    """
    index = []
    for ax in (0, 1):
        so, sd = float(src_origin[ax]), float(src_downsample[ax])
        do, dd = float(dst_origin[ax]), float(dst_downsample[ax])
        lo = max(0, math.ceil((so - do) / dd - 0.5 - 1e-9))
        hi = min(int(dst_shape[ax]), math.ceil((so + src.shape[ax] * sd - do) / dd - 0.5 - 1e-9))
        if hi <= lo:
            return None
        centres = do + (np.arange(lo, hi) + 0.5) * dd
        idx = np.clip(np.floor((centres - so) / sd).astype(np.intp), 0, src.shape[ax] - 1)
        index.append((lo, hi, idx))
    (r0, r1, ri), (c0, c1, ci) = index
    return (r0, c0, r1, c1), src[ri[:, None], ci[None, :]]
