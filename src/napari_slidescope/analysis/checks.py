"""Argument checks shared by the analysis and pipeline functions: images and unit pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def as_pair(value: float | Sequence[float], name: str) -> tuple[float, float]:
    """Return a positive ``(y, x)`` pair from a number or a pair (µm per pixel, downsample...).

    Raises
    ------
    ValueError
        Naming `name`, if `value` is not one positive finite number or two of them.

    Examples
    --------
    >>> as_pair(0.25, "mpp")
    (0.25, 0.25)
    >>> as_pair((0.5, 0.25), "mpp")
    (0.5, 0.25)
    """
    try:
        values = np.atleast_1d(np.asarray(value, dtype=float)).ravel()
    except (TypeError, ValueError):
        values = np.array([np.nan])
    pair = (values[0], values[0]) if values.size == 1 else tuple(values)
    if len(pair) != 2 or not all(np.isfinite(v) and v > 0 for v in pair):
        raise ValueError(f"{name}: expected a positive number or (y, x) pair, got {value!r}")
    return (float(pair[0]), float(pair[1]))


def check_rgb(image: Any, name: str, *, ndim: int = 3) -> None:
    """Raise unless `image` is RGB uint8 with `ndim` dimensions (reads shape and dtype only).

    ``ndim=3`` expects one ``(H, W, 3)`` image, ``ndim=4`` a ``(B, H, W, 3)`` batch. Only
    ``shape`` and ``dtype`` are read, so a lazy (dask) array is not loaded.

    Raises
    ------
    ValueError
        Naming `name`, saying what was expected and what came (grayscale, RGBA, dtype).
    """
    shape, dtype = tuple(image.shape), np.dtype(image.dtype)
    expected = "(B, H, W, 3)" if ndim == 4 else "(H, W, 3)"
    if len(shape) != ndim or shape[-1] != 3:
        what = "grayscale" if len(shape) == ndim - 1 else f"{shape[-1]}-channel"
        if len(shape) == ndim and shape[-1] == 4:
            what = "RGBA"
        raise ValueError(
            f"{name} must be an RGB image of shape {expected}; got a {what} array of shape "
            f"{shape} (convert RGBA or grayscale to RGB first)"
        )
    if dtype != np.uint8:
        raise ValueError(f"{name} must be uint8 (0-255); got dtype {dtype}")
