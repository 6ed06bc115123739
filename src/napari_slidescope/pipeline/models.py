"""Moved to :mod:`napari_slidescope.segmenters` (this module re-exports it)."""

from napari_slidescope.segmenters import (
    SegmenterUnavailableError,
    available_segmenters,
    get_segmenter,
    missing_reason,
    register_segmenter,
    segmenter_target_mpp,
)

__all__ = [
    "SegmenterUnavailableError",
    "available_segmenters",
    "get_segmenter",
    "missing_reason",
    "register_segmenter",
    "segmenter_target_mpp",
]
