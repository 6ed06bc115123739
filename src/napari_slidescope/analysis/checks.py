"""Argument checks shared by the analysis and pipeline functions."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_rgb(image: Any, name: str, *, ndim: int | None = 3) -> None:
    """Raise unless `image` is RGB uint8 with `ndim` dimensions (reads shape and dtype only).

    ``ndim=3`` expects one ``(H, W, 3)`` image, ``ndim=4`` a ``(B, H, W, 3)`` batch, ``None``
    any ``(..., 3)`` array of at least two dimensions. Only ``shape`` and ``dtype`` are
    read, so a lazy (dask) array is not loaded.

    Raises
    ------
    ValueError
        Naming `name`, saying what was expected and what came (grayscale, RGBA, dtype).
    """
    shape, dtype = tuple(image.shape), np.dtype(image.dtype)
    expected = {None: "(..., 3)", 4: "(B, H, W, 3)"}.get(ndim, "(H, W, 3)")
    gray = len(shape) == (2 if ndim is None else ndim - 1)
    if ndim is None:
        ndim = max(len(shape), 2)
    if len(shape) != ndim or shape[-1] != 3:
        what = "grayscale" if gray else f"{shape[-1]}-channel"
        if len(shape) == ndim and shape[-1] == 4:
            what = "RGBA"
        raise ValueError(
            f"{name} must be an RGB image of shape {expected}; got a {what} array of shape "
            f"{shape} (convert RGBA or grayscale to RGB first)"
        )
    if dtype != np.uint8:
        raise ValueError(f"{name} must be uint8 (0-255); got dtype {dtype}")


def check_image(image: Any, name: str = "image") -> np.ndarray:
    """Return `image` as an array, or raise unless it is a non-empty 2D/3D numeric image.

    Raises
    ------
    ValueError
        Naming `name`, saying what was expected and what came (shape or dtype).
    """
    image = np.asarray(image)
    if image.ndim not in (2, 3) or image.size == 0:
        raise ValueError(
            f"{name}: expected a non-empty (M, N) or (M, N, C) array, got shape {image.shape}"
        )
    if image.dtype == bool or not (
        np.issubdtype(image.dtype, np.integer) or np.issubdtype(image.dtype, np.floating)
    ):
        raise ValueError(f"{name}: expected an integer or float array, got dtype {image.dtype}")
    return image
