"""Which pyramid level to read for a working resolution: two rules, named for how they differ.

:func:`nearest_level`
    The level whose pixel size is nearest the target on a log scale, finer *or coarser*.
    Right for looking (tissue detection, thumbnails): a level 1.4x coarser than the target
    is a better picture of it than one 2.8x finer.
:func:`coarsest_level_not_coarser`
    The coarsest level that is still at least as fine as the target (within 1 %), so the
    working pixels are always made by downsampling, never by upsampling. Right for
    measuring (nuclei segmentation), where detail lost in a coarser level cannot come back.

:func:`nearest_factor`
    The whole number of a level's pixels per working pixel that comes nearest the target
    on a log scale (a level at 4.04 µm/px read for 8 µm/px: 2, a working pixel of
    8.09 µm, not 1 and 4.04 µm, which holds four times the pixels).

All take downsample factors, ``(y, x)`` level-0 pixels per pixel, the unit every slide
knows whether or not it is calibrated.

Examples
--------
Levels at 1x, 4x and 16x; a target of 3x:

>>> downsamples = [(1.0, 1.0), (4.0, 4.0), (16.0, 16.0)]
>>> nearest_level(downsamples, (3.0, 3.0))
1
>>> coarsest_level_not_coarser(downsamples, (3.0, 3.0))
0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["coarsest_level_not_coarser", "nearest_factor", "nearest_level"]

#: A level counts as "not coarser" up to this relative excess (float rounding of shapes).
_NOT_COARSER_TOLERANCE = 1.01


def _check_target(target: tuple[float, float]) -> None:
    if not (target[0] > 0 and target[1] > 0):
        raise ValueError(f"target downsample must be two positive numbers (y, x), got {target!r}")


def nearest_level(downsamples: Sequence[tuple[float, float]], target: tuple[float, float]) -> int:
    """Return the level whose downsample is nearest `target` on a log scale.

    Parameters
    ----------
    downsamples : sequence of (float, float)
        ``(y, x)`` level-0 pixels per pixel of each level, finest first.
    target : (float, float)
        ``(y, x)`` level-0 pixels per working pixel; the x factor decides.

    Returns
    -------
    level : int
        Ties go to the finer level.

    Raises
    ------
    ValueError
        If `target` is not positive.

    Examples
    --------
    >>> nearest_level([(1.0, 1.0), (4.0, 4.0)], (2.0, 2.0))  # a tie: the finer one
    0
    >>> nearest_level([(1.0, 1.0), (4.0, 4.0)], (2.5, 2.5))
    1
    """
    _check_target(target)
    costs = [abs(math.log(ds[1] / target[1])) for ds in downsamples]
    best = min(costs)
    return next(i for i, c in enumerate(costs) if c <= best + 1e-9)


def coarsest_level_not_coarser(
    downsamples: Sequence[tuple[float, float]], target: tuple[float, float]
) -> int:
    """Return the coarsest level that is at least as fine as `target` on both axes.

    Parameters
    ----------
    downsamples, target
        As for :func:`nearest_level` (a target that is not positive raises the same
        ValueError), but both axes of `target` count.

    Returns
    -------
    level : int
        Level 0 when every other level is coarser than `target` (beyond 1 %).

    Examples
    --------
    >>> coarsest_level_not_coarser([(1.0, 1.0), (4.0, 4.0)], (3.9, 3.9))
    0
    >>> coarsest_level_not_coarser([(1.0, 1.0), (4.0, 4.0)], (4.0, 4.0))
    1
    """
    _check_target(target)
    limit_y = target[0] * _NOT_COARSER_TOLERANCE
    limit_x = target[1] * _NOT_COARSER_TOLERANCE
    best = 0
    for i, (dy, dx) in enumerate(downsamples):
        if dy <= limit_y and dx <= limit_x and dy >= downsamples[best][0]:
            best = i
    return best


def nearest_factor(level: float, target: float) -> int:
    """Return the whole factor ``k >= 1`` that brings `level` nearest `target` (log scale).

    Parameters
    ----------
    level : float
        Level-0 pixels per pixel of the level read (or its µm/px).
    target : float
        Level-0 pixels per working pixel wanted (or its µm/px: the same unit as `level`).

    Returns
    -------
    k : int
        ``k * level`` is the working pixel; 1 when the level is at least as coarse as
        the target (a level is never upsampled). Ties go to the smaller factor.

    Raises
    ------
    ValueError
        If `level` or `target` is not positive.

    Examples
    --------
    >>> nearest_factor(4.04, 8.0)
    2
    >>> nearest_factor(3.0, 8.0)
    3
    >>> nearest_factor(16.0, 8.0)
    1
    """
    if not (level > 0 and target > 0):
        raise ValueError(f"downsamples must be positive, got level={level!r}, target={target!r}")
    ratio = target / level
    if ratio <= 1:
        return 1
    k = int(math.floor(ratio))
    # between k and k + 1: the nearer on a log scale (k * (k + 1) is the square of the midpoint)
    return k + 1 if ratio * ratio > k * (k + 1) * (1 + 1e-9) else k
