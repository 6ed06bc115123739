"""The one rule for the resolution nuclei are segmented at.

The API (:func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`), the widget, the
console helpers and the batch engine all call :func:`working_mpp` with the slide's own
pixel size (never a rounded one), so they segment the same pixels and count the same nuclei.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from napari_slidescope.errors import UncalibratedWarning
from napari_slidescope.segmenters.base import Input, as_segmenter

__all__ = ["UncalibratedWarning", "segmenter_mpp", "working_mpp"]


def segmenter_mpp(segmenter: Any, *, input: Input = "brightfield") -> float:
    """Return a segmenter's own working resolution (µm/px): a name, a segmenter or a number.

    A name reads the registry without creating a segmenter; ``"auto"`` is the resolution
    of the segmenter :func:`~napari_slidescope.segmenters.resolve_auto` picks for `input`.
    """
    from napari_slidescope.segmenters.registry import AUTO, resolve_auto, segmenter_target_mpp

    if isinstance(segmenter, str):
        name = resolve_auto(input, warn=False) if segmenter == AUTO else segmenter
        return segmenter_target_mpp(name)
    if isinstance(segmenter, int | float):
        return float(segmenter)
    return float(as_segmenter(segmenter).target_mpp)


def working_mpp(
    segmenter: Any,
    slide_mpp: float | tuple[float, float] | None,
    requested: float | None = None,
    *,
    input: Input = "brightfield",
) -> float:
    """Return the working resolution (µm/px) to segment a slide at.

    The segmenter's own resolution, but never finer than the slide's pixels (a 20x slide is
    not upsampled to 40x) unless the user asks for it with `requested`.

    Parameters
    ----------
    segmenter : str, Segmenter or float
        A registered name, a segmenter (its ``target_mpp``) or a resolution in µm/px.
    slide_mpp : float or (float, float) or None
        The slide's own level-0 pixel size (unrounded: 0.499, not 0.50), or None when the
        slide is uncalibrated.
    requested : float, optional
        A resolution the user asked for; it wins (None or 0: not asked).
    input : {"brightfield", "fluorescence"}
        The kind of image, for ``segmenter="auto"``.

    Returns
    -------
    float
        µm per working pixel. For an uncalibrated slide (and nothing requested) this is the
        segmenter's own resolution, and the slide's pixels are taken to be at it (read as
        they are, not resampled); an :class:`UncalibratedWarning` says so.

    Raises
    ------
    ValueError
        If `requested` or `slide_mpp` is not a positive number.

    Examples
    --------
    >>> working_mpp(0.25, 0.499)
    0.499
    >>> working_mpp(0.5, (0.25, 0.25))
    0.5
    >>> working_mpp(0.5, 0.25, requested=0.25)
    0.25
    """
    if requested:
        req = float(requested)
        if not (req > 0 and math.isfinite(req)):
            raise ValueError(f"requested working resolution must be > 0 µm/px; got {requested!r}")
        return req
    own = segmenter_mpp(segmenter, input=input)
    if slide_mpp is None:
        warnings.warn(
            f"the slide has no pixel size: its pixels are taken to be {own:g} µm/px (the "
            "segmenter's working resolution) and read as they are; pass mpp= to calibrate",
            UncalibratedWarning,
            stacklevel=2,
        )
        return own
    pair = (slide_mpp, slide_mpp) if isinstance(slide_mpp, int | float) else tuple(slide_mpp)
    finest = min(float(v) for v in pair)
    if not (finest > 0 and math.isfinite(finest)):
        raise ValueError(f"slide_mpp must be positive µm/px; got {slide_mpp!r}")
    return max(own, finest)
