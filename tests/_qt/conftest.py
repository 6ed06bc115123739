"""Fixtures of the Qt tests: the stand-in segmenter, a small slide, a docked widget."""

from tests.gui_fixtures import dock_slide, small_slide, threshold_segmenter

__all__ = ["dock_slide", "small_slide", "threshold_segmenter"]
