"""Fixtures of the napari-glue tests: a fast stand-in segmenter and a small synthetic slide."""

from tests.gui_fixtures import background_workers_end, small_slide, threshold_segmenter

__all__ = ["background_workers_end", "small_slide", "threshold_segmenter"]
