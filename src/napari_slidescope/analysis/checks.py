"""Argument checks shared by the analysis and pipeline functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt


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


def check_image(image: npt.ArrayLike, name: str = "image") -> np.ndarray:
    """Return `image` as an array, or raise unless it is a non-empty 2D/3D numeric image.

    Raises
    ------
    ValueError
        Naming `name`, saying what was expected and what came (shape or dtype).
    """
    arr = np.asarray(image)
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise ValueError(
            f"{name}: expected a non-empty (M, N) or (M, N, C) array, got shape {arr.shape}"
        )
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError(f"{name}: expected an integer or float array, got dtype {arr.dtype}")
    return arr


#: Fields both built-in nuclei methods share that must be positive finite numbers.
_POSITIVE_NUCLEI_FIELDS = ("target_mpp", "background_radius_um", "sigma_um", "min_seed_distance_um")


def check_nuclei_params(params: Any) -> None:
    """Raise unless the parameters the built-in nuclei methods share are valid.

    Checks ``target_mpp``, ``background_radius_um``, ``sigma_um`` and
    ``min_seed_distance_um`` (positive, finite), ``0 <= min_area_um2 < max_area_um2``
    and ``seed_radii_um`` (at least one, all positive). Each method's own fields are
    checked by its parameter class.

    Raises
    ------
    ValueError
        Naming the parameter class and field, saying what was expected and what came.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(target_mpp=0.5, background_radius_um=12.0, sigma_um=0.7,
    ...                     min_seed_distance_um=3.0, min_area_um2=10.0, max_area_um2=5.0,
    ...                     seed_radii_um=(2.5,))
    >>> check_nuclei_params(p)
    Traceback (most recent call last):
    ...
    ValueError: SimpleNamespace needs 0 <= min_area_um2 < max_area_um2; got 10.0 and 5.0
    """
    cls = type(params).__name__
    for name in _POSITIVE_NUCLEI_FIELDS:
        value = getattr(params, name)
        if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{cls}.{name} must be a positive number; got {value!r}")
    if not 0 <= params.min_area_um2 < params.max_area_um2:
        raise ValueError(
            f"{cls} needs 0 <= min_area_um2 < max_area_um2; "
            f"got {params.min_area_um2!r} and {params.max_area_um2!r}"
        )
    radii = params.seed_radii_um
    if not radii or min(radii) <= 0:
        raise ValueError(f"{cls}.seed_radii_um must be positive radii; got {radii!r}")
