"""The console helpers (napari_slidescope.viewer re-exports _napari.console) in a viewer."""

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
    scene = getattr(viewer, "scene", None)
    camera = scene.camera if scene is not None and hasattr(scene, "camera") else viewer.camera
    camera.center, camera.zoom = (256.0, 384.0), 2.0
    qtbot.wait(30)
    box = visible_region(viewer)
    assert box == viewport.visible_region(viewer, image)

    tissue = add_tissue(viewer, scope="slide")
    assert tissue.name == f"{image.name} tissue"
    assert tissue.data.any() and tissue.data.shape == (128, 192)  # 8 µm/px over 1024 x 1536 µm
    # aligned with the slide in world coordinates (pixel centres)
    np.testing.assert_allclose(tissue.scale, (8.0, 8.0))
    np.testing.assert_allclose(tissue.translate, np.asarray(image.translate) + 0.5 * (16 / 2 - 0.5))

    nuclei = add_nuclei(viewer, target_mpp=0.5)
    assert nuclei.name == f"{image.name} nuclei"
    assert nuclei.data.shape == (box[2] - box[0], box[3] - box[1])
    text = str(summary(viewer))
    assert "nuclei" in text

    worker = add_nuclei(viewer, scope="slide", target_mpp=0.5, wait=False)
    assert worker is not None
    cancel(viewer)
    qtbot.waitUntil(lambda: not worker.is_running, timeout=20_000)


def test_helpers_say_when_there_is_no_slide(make_napari_viewer):
    from napari_slidescope.viewer import add_nuclei

    viewer = make_napari_viewer()
    with pytest.raises(ValueError, match="no slide"):
        add_nuclei(viewer)
