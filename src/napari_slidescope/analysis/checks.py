"""Argument checks shared by the analysis and pipeline functions."""

from __future__ import annotations

from typing import Any

import numpy as np


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
