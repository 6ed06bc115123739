"""Unit-pair parsing shared by every layer (slide, analysis, pipeline); numpy only."""

from __future__ import annotations

from collections.abc import Sequence

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
