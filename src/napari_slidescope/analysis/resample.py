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
    rows_in, cols_in = image.shape[:2]
    h, w = -(-rows_in // ky), -(-cols_in // kx)
    rest = image.shape[2:]
    partial = bool(rows_in % ky or cols_in % kx)
    acc_dtype = _accumulator(image.dtype, ky * kx)
    out = np.empty((h, w, *rest), out_dtype)
    # Strips of output rows through buffers allocated once: a whole-image temporary is
    # fresh memory, whose first touch costs more than the arithmetic in a new process.
    step = max(1, _STRIP_BYTES // max(cols_in * math.prod(rest) * acc_dtype.itemsize, 1))
    step = min(step, h)
    rows_buf = np.empty((step, cols_in, *rest), acc_dtype)
    acc_buf = np.empty((step, w, *rest), acc_dtype)
    nc = np.minimum(kx, cols_in - kx * np.arange(w))
    for o0 in range(0, h, step):
        o1 = min(o0 + step, h)
        _block_sums(image, ky, kx, o0, o1, rows_buf, acc_buf)
        acc = acc_buf[: o1 - o0]
        nr = np.minimum(ky, rows_in - ky * np.arange(o0, o1))
        _divide(acc, nr, nc, ky * kx, out[o0:o1], every_block_full=not partial)
    return out


#: Bytes of the row-sum buffer of one strip of :func:`block_mean`.
_STRIP_BYTES = 1 << 20


def _accumulator(dtype: np.dtype, n: int) -> np.dtype:
    """Return the dtype that sums `n` values of `dtype` exactly (integers), else float64."""
    if np.issubdtype(dtype, np.integer) and dtype.itemsize <= 2:
        info = np.iinfo(dtype)
        for acc in (
            (np.int16, np.int32, np.int64) if info.min < 0 else (np.uint16, np.uint32, np.uint64)
        ):
            limits = np.iinfo(acc)
            if n * info.max <= limits.max and n * info.min >= limits.min:
                return np.dtype(acc)
    return np.dtype(np.float64)


def _block_sums(
    image: np.ndarray,
    ky: int,
    kx: int,
    o0: int,
    o1: int,
    rows_buf: np.ndarray,
    acc_buf: np.ndarray,
) -> None:
    """Sum the blocks of output rows ``o0:o1`` into ``acc_buf[: o1 - o0]``."""
    n = o1 - o0
    stop = min(o1 * ky, image.shape[0])
    rows = rows_buf[:n]
    for i in range(ky):
        part = image[o0 * ky + i : stop : ky]  # row i of each block (the last may lack it)
        if i == 0:
            np.copyto(rows, part, casting="unsafe")
        else:
            rows[: part.shape[0]] += part
    acc = acc_buf[:n]
    # summing strided slices is several times faster than reshape().sum() or reduceat
    np.copyto(acc, rows[:, 0::kx])
    for j in range(1, kx):
        part = rows[:, j::kx]
        acc[:, : part.shape[1]] += part


def _divide(
    acc: np.ndarray,
    nr: np.ndarray,
    nc: np.ndarray,
    full: int,
    out: np.ndarray,
    *,
    every_block_full: bool,
) -> None:
    """Write the block means ``acc / (nr x nc)`` into `out` (integers rounded half to even)."""
    count: np.ndarray | int = full
    if every_block_full and out.dtype == np.float32:  # one float32 scale
        np.copyto(out, acc, casting="unsafe")
        out *= np.float32(1.0 / full)
        return
    if int(nr.min()) * int(nc.min()) != full:  # partial blocks in this strip
        counts = np.multiply.outer(nr, nc)
        count = counts[..., None] if acc.ndim == 3 else counts
    if np.issubdtype(acc.dtype, np.integer) and np.issubdtype(out.dtype, np.integer):
        # exactly np.rint(acc / count): a half is exact in float64, and any other
        # fraction is at least 1 / (2 count) away from a half
        if isinstance(count, int) and count & (count - 1) == 0:  # a power of two: shifts
            shift = count.bit_length() - 1
            q, r = acc >> shift, acc & (count - 1)  # floor division and its remainder
        else:
            q, r = np.divmod(acc, count)
        r <<= 1
        half = r == count
        half &= (q & 1).astype(bool)
        q += r > count
        q += half
        np.copyto(out, q, casting="unsafe")
        return
    mean = acc / count
    if np.issubdtype(out.dtype, np.integer):
        mean = np.rint(mean)
    np.copyto(out, mean, casting="unsafe")


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
