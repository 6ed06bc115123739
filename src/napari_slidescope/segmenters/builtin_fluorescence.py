"""The built-in fluorescence method (:mod:`napari_slidescope.analysis.fluorescence_nuclei`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from napari_slidescope.analysis.fluorescence_nuclei import FluorescenceParams, FluorescenceSegmenter

__all__ = ["create", "missing_reason"]


def missing_reason() -> str | None:
    """Return None: the method needs numpy, scipy and scikit-image only."""
    return None


def create(*, params: FluorescenceParams | None = None, **fields: Any) -> FluorescenceSegmenter:
    """Create the segmenter (``fields``: :class:`FluorescenceParams` fields to change)."""
    base = params if params is not None else FluorescenceParams()
    if fields:
        base = dataclasses.replace(base, **fields)
    return FluorescenceSegmenter(base)
