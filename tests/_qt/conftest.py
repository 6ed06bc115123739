"""Fixtures of the Qt tests: the stand-in segmenter, a small slide, a docked widget."""

from tests.gui_fixtures import background_workers_end, dock_slide, small_slide, threshold_segmenter

__all__ = ["background_workers_end", "dock_slide", "small_slide", "threshold_segmenter"]
