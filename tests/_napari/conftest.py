"""Fixtures of the napari-glue tests: a fast stand-in segmenter and a small synthetic slide."""

from tests.gui_fixtures import small_slide, threshold_segmenter

__all__ = ["small_slide", "threshold_segmenter"]
