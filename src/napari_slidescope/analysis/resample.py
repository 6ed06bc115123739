"""Resampling images between pixel grids: block means for downsampling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from napari_slidescope.analysis.checks import check_image

__all__ = ["block_mean"]


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
    mean = acc / (count if image.ndim == 2 else count[..., None])
    if np.issubdtype(out_dtype, np.integer):
        return np.rint(mean).astype(out_dtype)
    return mean.astype(out_dtype)
