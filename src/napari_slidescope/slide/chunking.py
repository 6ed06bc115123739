"""Byte-budget dask chunks that respect a level's native chunks.

A dask chunk is always a whole multiple of the native chunk (a tile, or for NDPI the
8-row JPEG restart band) along each spatial axis, is as close to square in pixels as the
native shape allows, and holds at most ``budget`` bytes unless one native chunk alone is
larger. Non-spatial axes (samples, channels) keep their native chunk size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

#: Default dask chunk budget: 4 MiB, i.e. 1024 x 1024 RGB px for 256 x 256 tiles.
DEFAULT_CHUNK_BYTES = 4 * 2**20

#: Environment variable that overrides the default budget (bytes, or with a KiB/MiB suffix).
CHUNK_BYTES_ENV = "SLIDESCOPE_CHUNK_BYTES"

_UNITS = {"": 1, "b": 1, "kib": 2**10, "kb": 10**3, "mib": 2**20, "mb": 10**6, "gib": 2**30}


def parse_bytes(value: int | str) -> int:
    """Parse a byte count given as an int or a string such as ``"4 MiB"``.

    Raises
    ------
    ValueError
        If the value is not a positive size.
    """
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits) :]
        if unit not in _UNITS or not digits:
            raise ValueError(f"chunk size {value!r} is not a byte count such as 4194304 or '4 MiB'")
        n = int(float(digits) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"chunk size must be positive, got {value!r}")
    return n


def default_chunk_bytes() -> int:
    """Return the chunk budget from ``$SLIDESCOPE_CHUNK_BYTES`` or the built-in default."""
    env = os.environ.get(CHUNK_BYTES_ENV)
    return parse_bytes(env) if env else DEFAULT_CHUNK_BYTES


def choose_chunks(
    shape: Sequence[int],
    native: Sequence[int],
    itemsize: int,
    *,
    spatial: tuple[int, int],
    budget: int = DEFAULT_CHUNK_BYTES,
) -> tuple[int, ...]:
    """Choose dask chunks for one level.

    Parameters
    ----------
    shape : sequence of int
        Shape of the level, e.g. ``(Y, X, 3)`` or ``(C, Y, X)``.
    native : sequence of int
        The file's native chunk shape, same length as `shape`.
    itemsize : int
        Bytes per array element.
    spatial : (int, int)
        Indices of the row and column axes in `shape`.
    budget : int
        Target bytes per dask chunk.

    Returns
    -------
    chunks : tuple of int
        Chunk shape: along each spatial axis a whole multiple of the native chunk, clipped
        to the axis length; other axes keep the native chunk.

    Raises
    ------
    ValueError
        If shapes disagree or a size is not positive.

    Examples
    --------
    >>> choose_chunks((40000, 40000, 3), (256, 256, 3), 1, spatial=(0, 1), budget=4 * 2**20)
    (1024, 1024, 3)
    >>> choose_chunks((4864, 3968, 3), (8, 3968, 3), 1, spatial=(0, 1), budget=4 * 2**20)
    (352, 3968, 3)
    """
    if len(shape) != len(native):
        raise ValueError(f"shape {tuple(shape)} and native chunks {tuple(native)} differ in length")
    if any(s <= 0 for s in shape) or any(n <= 0 for n in native) or itemsize <= 0 or budget <= 0:
        raise ValueError(f"sizes must be positive: shape={shape}, native={native}, budget={budget}")
    yax, xax = spatial
    chunks = [min(int(n), int(s)) for n, s in zip(native, shape, strict=True)]
    per_pixel = itemsize * math.prod(c for i, c in enumerate(chunks) if i not in (yax, xax))
    budget_px = budget / per_pixel
    ny, nx = chunks[yax], chunks[xax]
    my, mx = _best_multiples(ny, nx, int(shape[yax]), int(shape[xax]), budget_px)
    chunks[yax] = min(my * ny, shape[yax])
    chunks[xax] = min(mx * nx, shape[xax])
    return tuple(chunks)


def _best_multiples(ny: int, nx: int, h: int, w: int, budget_px: float) -> tuple[int, int]:
    """Pick native-chunk multiples: longest short side in budget, then squarest, then largest.

    Sizes are measured after clipping to the level (an edge multiple may overhang it).
    """
    max_my, max_mx = -(-h // ny), -(-w // nx)

    def fit_x(my: int) -> int:
        cy = min(my * ny, h)
        if cy * w <= budget_px:
            return max_mx
        return min(max_mx, max(1, int(budget_px // (cy * nx))))

    def fit_y(mx: int) -> int:
        cx = min(mx * nx, w)
        if cx * h <= budget_px:
            return max_my
        return min(max_my, max(1, int(budget_px // (cx * ny))))

    side = math.sqrt(budget_px)
    ys = {1, max_my, *range(max(1, int(side // ny) - 1), int(side // ny) + 3)}
    xs = {1, max_mx, *range(max(1, int(side // nx) - 1), int(side // nx) + 3)}
    candidates = set()
    for my in (min(max(y, 1), max_my) for y in ys):
        mx = fit_x(my)
        candidates.add((my, mx))
        candidates.add((my, min(mx, max(1, round(my * ny / nx)))))
    for mx in (min(max(x, 1), max_mx) for x in xs):
        my = fit_y(mx)
        candidates.add((my, mx))
        candidates.add((min(my, max(1, round(mx * nx / ny))), mx))

    def score(c: tuple[int, int]) -> tuple[bool, int, float, int]:
        cy, cx = min(c[0] * ny, h), min(c[1] * nx, w)
        fits = cy * cx <= budget_px or c == (1, 1)
        return (fits, min(cy, cx), -max(cy, cx) / min(cy, cx), cy * cx)

    my, mx = max(candidates, key=score)
    # An axis that is already whole leaves the budget to the other one.
    if mx == max_mx:
        my = max(my, fit_y(mx))
    if my == max_my:
        mx = max(mx, fit_x(my))
    return my, mx
