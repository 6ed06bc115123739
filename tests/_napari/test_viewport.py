"""The visible region: camera and canvas -> level-0 box (pure math and a real viewer)."""

import numpy as np
import pytest

from napari_slidescope._napari.viewport import box_to_world, camera_of, visible_box, visible_region

pytestmark = pytest.mark.gui


def test_visible_box_maps_camera_through_scale_and_translate():
    # 200 x 100 screen px at zoom 2 -> 100 x 50 world units -> 200 x 100 px at 0.5 units/px
    box = visible_box(
        (50.0, 100.0), 2.0, (100, 200), scale=(0.5, 0.5), translate=(0.25, 0.25), shape0=(999, 999)
    )
    assert box == (50, 100, 150, 300)
    # a pixel cut by the canvas edge counts as visible
    box = visible_box(
        (50.0, 100.0), 2.0, (100, 200), scale=(0.5, 0.5), translate=(0, 0), shape0=(999, 999)
    )
    assert box == (50, 100, 151, 301)


def test_visible_box_clips_to_the_slide_and_reports_nothing_visible():
    box = visible_box((0.0, 0.0), 1.0, (100, 100), scale=(1, 1), translate=(0, 0), shape0=(40, 30))
    assert box == (0, 0, 40, 30)
    assert (
        visible_box((1e6, 1e6), 1.0, (100, 100), scale=(1, 1), translate=(0, 0), shape0=(40, 30))
        is None
    )
    with pytest.raises(ValueError, match="zoom"):
        visible_box((0, 0), 0.0, (10, 10), scale=(1, 1), translate=(0, 0), shape0=(4, 4))


def _canvas_corners_world(viewer):
    """World (y, x) of the canvas's top-left and bottom-right corners, from vispy itself."""
    canvas = viewer.window._qt_viewer.canvas
    view = canvas.view
    transform = view.transform * view.scene.transform
    h, w = viewer.canvas.size
    tl = transform.imap([0, 0])[:2][::-1]
    br = transform.imap([w, h])[:2][::-1]
    return np.array(tl), np.array(br)


def test_region_matches_canvas_extent_in_a_real_viewer(make_napari_viewer, sample_slide, qtbot):
    viewer = make_napari_viewer(show=True)
    path, _ = sample_slide
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    slide = box_to_world(
        (0, 0, *layer.data[0].shape[:2]), scale=layer.scale, translate=layer.translate
    )
    sy, sx = layer.scale
    for center, zoom in [((300.0, 500.0), 2.0), ((512.3, 767.9), 0.7), ((20.0, 40.0), 3.3)]:
        camera_of(viewer).center = center
        camera_of(viewer).zoom = zoom
        qtbot.wait(30)
        box = visible_region(viewer, layer)
        tl, br = _canvas_corners_world(viewer)
        one_px = 1 / zoom  # one screen pixel in world units
        # napari's camera model and vispy's transform agree within one screen pixel
        h, w = viewer.canvas.size
        half = np.array([h, w]) / (2 * zoom)
        np.testing.assert_allclose(tl, np.array(center) - half, atol=one_px)
        np.testing.assert_allclose(br, np.array(center) + half, atol=one_px)
        # the box is the smallest set of whole pixels covering the canvas, clipped to the slide
        wy0, wx0, wy1, wx1 = box_to_world(box, scale=layer.scale, translate=layer.translate)
        for edge, canvas_edge, step, lo in [(wy0, tl[0], sy, slide[0]), (wx0, tl[1], sx, slide[1])]:
            expected = max(canvas_edge, lo)
            assert expected - step - one_px < edge <= expected + one_px
        for edge, canvas_edge, step, hi in [(wy1, br[0], sy, slide[2]), (wx1, br[1], sx, slide[3])]:
            expected = min(canvas_edge, hi)
            assert expected - one_px <= edge < expected + step + one_px


def test_offscreen_slide_raises(make_napari_viewer, sample_slide, qtbot):
    viewer = make_napari_viewer(show=True)
    path, _ = sample_slide
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    camera_of(viewer).center = (1e6, 1e6)
    qtbot.wait(20)
    with pytest.raises(ValueError, match="none of the slide"):
        visible_region(viewer, layer)
