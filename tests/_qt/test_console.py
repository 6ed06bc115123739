"""The console helpers (napari_slidescope.viewer re-exports _qt.console) in a viewer."""

import numpy as np
import pytest

pytestmark = pytest.mark.gui


def test_console_helpers_one_line_each(make_napari_viewer, sample_slide, qtbot):
    from napari_slidescope._napari import viewport
    from napari_slidescope.viewer import (
        add_nuclei,
        add_slide,
        add_tissue,
        cancel,
        summary,
        visible_region,
    )

    viewer = make_napari_viewer(show=True)
    path, _ = sample_slide
    image = add_slide(viewer, path)
    assert viewer.layers.selection.active is image
    camera = viewport.camera_of(viewer)
    camera.center, camera.zoom = (256.0, 384.0), 2.0
    qtbot.wait(30)
    box = visible_region(viewer)
    assert box == viewport.visible_region(viewer, image)

    tissue = add_tissue(viewer, scope="slide")
    assert tissue.name == f"{image.name} tissue"
    assert len(tissue.data) >= 1  # outlines
    assert set(tissue.shape_type) == {"polygon"}
    # aligned with the slide in world coordinates: the slide's scale and translate
    np.testing.assert_allclose(tissue.scale, image.scale)
    np.testing.assert_allclose(tissue.translate, image.translate)
    ring = tissue.data[0]  # inside the slide (2048 x 3072 level-0 px)
    assert ring.min() >= -0.5
    assert ring[:, 0].max() <= 2048
    assert ring[:, 1].max() <= 3072

    nuclei = add_nuclei(viewer, target_mpp=0.5, segmenter="builtin")
    assert nuclei.name == f"{image.name} nuclei"
    assert nuclei.data.shape == (box[2] - box[0], box[3] - box[1])
    text = str(summary(viewer))
    assert "nuclei" in text

    worker = add_nuclei(viewer, scope="slide", target_mpp=0.5, segmenter="builtin", wait=False)
    assert worker is not None
    cancel(viewer)
    qtbot.waitUntil(lambda: not worker.is_running, timeout=60_000)


def test_helpers_say_when_there_is_no_slide(make_napari_viewer):
    from napari_slidescope.viewer import add_nuclei

    viewer = make_napari_viewer()
    with pytest.raises(ValueError, match="no slide"):
        add_nuclei(viewer)
