"""Fixtures of the napari tests: a fast stand-in segmenter and a small synthetic slide."""

import time

import numpy as np
import pytest
from scipy import ndimage as ndi


class ThresholdSegmenter:
    """A fast stand-in for the real segmenter: dark-green pixels, opened and labelled."""

    name = "threshold"
    target_mpp = 0.5
    min_overlap_um = 8.0

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def predict(self, tiles, *, mpp):
        if self.delay:
            time.sleep(self.delay)
        return (tiles[..., 1] < 130)[..., None].astype(np.float32)

    def postprocess(self, raw, *, mpp):
        return ndi.label(ndi.binary_opening(raw[..., 0] > 0.5))[0].astype(np.int32)


@pytest.fixture
def threshold_segmenter():
    """The stand-in segmenter class (call it, optionally with ``delay=`` seconds)."""
    return ThresholdSegmenter


@pytest.fixture(scope="session")
def small_slide(tmp_path_factory):
    """A 1024 x 1536 synthetic slide at 0.5 µm/px (whole-slide runs in a few seconds)."""
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("small") / "small.svs"
    write_sample_slide(path, shape=(1024, 1536), mpp=0.5, seed=2, tile=128)
    return path


@pytest.fixture
def dock_slide(make_napari_viewer, qtbot):
    """Open a slide in a shown viewer and dock a plugin widget: ``(viewer, layers, widget)``."""

    def dock(path, widget="Slide analysis"):
        viewer = make_napari_viewer(show=True)
        layers = viewer.open(str(path), plugin="napari-slidescope")
        _, docked = viewer.window.add_plugin_dock_widget("napari-slidescope", widget)
        qtbot.wait(10)
        return viewer, layers, docked

    return dock
