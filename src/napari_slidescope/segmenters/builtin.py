"""The built-in H&E method.

An adapter over :class:`~napari_slidescope.analysis.brightfield_nuclei.BuiltinSegmenter`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from napari_slidescope.analysis.brightfield_nuclei import BuiltinSegmenter, NucleiParams

__all__ = ["create", "missing_reason"]


def missing_reason() -> str | None:
    """Return None: the method needs numpy, scipy and scikit-image only."""
    return None


def create(
    *, params: NucleiParams | None = None, stains: Any = None, **fields: Any
) -> BuiltinSegmenter:
    """Create the segmenter (the registry's constructor).

    Parameters
    ----------
    params : NucleiParams, optional
        All parameters at once.
    stains : StainMatrix, optional
        Fixed stain vectors (default: estimated per run).
    **fields
        :class:`~napari_slidescope.analysis.brightfield_nuclei.NucleiParams` fields to change
        (``target_mpp=0.5``, ``min_area_um2=15``...).
    """
    base = params if params is not None else NucleiParams()
    if fields:
        base = dataclasses.replace(base, **fields)
    return BuiltinSegmenter(base, stains=stains)
