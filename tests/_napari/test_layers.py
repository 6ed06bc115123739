"""Result layers come back after the user deletes them between runs (run under xvfb-run).

The viewer is not shown: with it shown, deleting the last layers drawn above the slide
crashes this CI's software OpenGL (Mesa 22.3 swrast) on the second repaint, whatever
the plugin does. That crash is upstream (vispy/napari GL program deletion, see
napari PR #8122 and vispy issue #1611) and reproduces with plain ``add_image`` /
``add_labels`` / ``layers.remove``; it is not a fault of :mod:`~._napari.layers`.
"""

import gc
import weakref

import numpy as np
import pytest

from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.layers import canvas_of

pytestmark = pytest.mark.gui


def test_result_layers_come_back_after_both_are_deleted(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    ctl = widget.session
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "tile_size_um": 128.0}
    names = (f"{image.name} tissue", f"{image.name} nuclei")
    counts = []
    for _ in range(3):  # the first run, then twice after deleting both result layers
        ctl.run(image, "tissue", scope="slide")
        qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
        ctl.run(image, "nuclei", scope="slide", nuclei_run=seg)
        qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
        assert all(name in viewer.layers for name in names)
        layer = viewer.layers[names[1]]
        canvas = canvas_of(layer)
        assert canvas is not None  # a whole-slide run: a pyramid
        assert layer.multiscale
        assert layer.data[0] is canvas.data[0]
        ids = set(np.unique(np.asarray(layer.data[0])).tolist()) - {0}
        assert ids == set(canvas.table()["id"].tolist())
        counts.append(layer.features.shape[0])
        for name in names:
            viewer.layers.remove(name)
        del layer, canvas
        qtbot.wait(50)  # an event loop: Qt deletes the finished run's slot proxies
        gc.collect()
        assert not any(ly.name in names for ly in _layers._CANVASES)  # nothing stale kept
    assert counts[0] > 0
    assert counts == [counts[0]] * 3


def test_a_painted_canvas_does_not_keep_its_deleted_layer_alive():
    """``_CANVASES`` is weak on layers: the canvas must not refer back to its layer."""
    from napari.layers import Labels

    canvas = _layers.ResultCanvas.for_region((0, 0, 64, 64), (1.0, 1.0), (0.5, 0.5))
    layer = Labels(canvas.data)
    _layers._CANVASES[layer] = canvas
    labels = np.zeros((8, 8), np.int32)
    labels[2:5, 2:5] = 1
    for y in (0, 16):  # the first patch uploads the texture whole, the next one in part
        patch = _layers.Patch((y, 0, y + 8, 8), labels, {"id": np.array([y + 1])}, 1, 2)
        _layers.paint_patch(layer, canvas, patch)
    assert canvas.data[3, 3] == 1
    assert canvas_of(layer) is canvas
    ref = weakref.ref(layer)
    del layer
    gc.collect()
    assert ref() is None
