"""Nuclei are drawn as outlines by default (as QuPath draws detections), filled one click
away, and the tiles painted during a run show the same outlines a full redraw would (xvfb-run)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gui

SEG = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}


@pytest.fixture(scope="module")
def small_slide(tmp_path_factory):
    """A 1024 x 1536 synthetic slide at 0.5 µm/px (as tests/_napari/conftest.py's)."""
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("small") / "small.svs"
    write_sample_slide(path, shape=(1024, 1536), mpp=0.5, seed=2, tile=128)
    return path


@pytest.mark.parametrize("scope", ["visible", "slide"])
def test_nuclei_are_outlined_and_painted_tiles_match_a_full_redraw(
    make_napari_viewer, small_slide, qtbot, scope
):
    from tests.fakes import ThresholdSegmenter

    from napari_slidescope._qt.session import session_for

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    viewer.reset_view()
    ctl = session_for(viewer)
    ctl.run(image, "nuclei", scope=scope, nuclei_options={**SEG, "segmenter": ThresholdSegmenter()})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    qtbot.wait(50)
    layer = viewer.layers[f"{image.name} nuclei"]
    assert layer.contour == 1
    painted = np.array(layer._slice.image.view, copy=True)  # as the run's patches left it
    raw = np.asarray(layer._slice.image.raw)
    assert (raw > 0).sum() > 1000
    layer.refresh()
    redrawn = np.asarray(layer._slice.image.view)
    assert np.array_equal(painted, redrawn)
    outline_px = int((redrawn[..., 3] > 0).sum()) if redrawn.ndim == 3 else int((redrawn > 0).sum())
    assert 0 < outline_px < 0.8 * int((raw > 0).sum())  # interiors are left clear
    layer.contour = 0  # "filled": one click in the layer controls
    filled = np.asarray(layer._slice.image.view)
    filled_px = int((filled[..., 3] > 0).sum()) if filled.ndim == 3 else int((filled > 0).sum())
    assert filled_px > outline_px
