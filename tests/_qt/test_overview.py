"""The "Slide overview" dock widget in a real viewer (run under xvfb-run)."""

import numpy as np
import pytest
import tifffile
from qtpy.QtCore import QPoint, QPointF, Qt

from napari_slidescope._napari.viewport import camera_of, visible_region
from napari_slidescope._qt.overview import OverviewWidget

pytestmark = pytest.mark.gui


def _overview(make_napari_viewer, path, qtbot):
    viewer = make_napari_viewer(show=True)
    layers = viewer.open(str(path), plugin="napari-slidescope")
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide overview")
    assert isinstance(widget, OverviewWidget)
    widget.resize(300, 240)
    qtbot.wait(10)
    return viewer, layers, widget


def _multichannel_slide(path):
    """A 3-channel uint16 OME-TIFF pyramid (1024 x 1536, 3 levels), distinct per channel."""
    rng = np.random.default_rng(0)
    base = np.zeros((3, 1024, 1536), np.uint16)
    base[0, :512] = 4000  # channel 0: top half
    base[1, :, :768] = 3000  # channel 1: left half
    base[2] = rng.integers(0, 500, base.shape[1:], dtype=np.uint16)
    levels = [base, base[:, ::2, ::2].copy(), base[:, ::4, ::4].copy()]
    meta = {
        "axes": "CYX",
        "PhysicalSizeX": 0.5,
        "PhysicalSizeY": 0.5,
        "Channel": {"Name": ["DAPI", "CD3", "CK"]},
    }
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(levels[0], tile=(128, 128), subifds=2, metadata=meta)
        for level in levels[1:]:
            tif.write(level, tile=(128, 128), subfiletype=1)
    return path


def _check_click_and_follow(viewer, layer, widget, qtbot):
    camera = camera_of(viewer)
    target = widget._target_rect()
    h0, w0 = widget._shape0
    sy, sx = (float(v) for v in layer.scale[-2:])
    ty, tx = (float(v) for v in layer.translate[-2:])
    # one thumbnail pixel in world units: the tolerance of a click
    th, tw = widget.thumbnail.shape[:2]
    tol = 2 * max(sy * h0 / th, sx * w0 / tw)
    for fy, fx in [(0.25, 0.75), (0.6, 0.3)]:
        point = QPoint(
            round(target.left() + fx * target.width()), round(target.top() + fy * target.height())
        )
        qtbot.mouseClick(widget, Qt.MouseButton.LeftButton, pos=point)
        expected = (ty + sy * (fy * h0 - 0.5), tx + sx * (fx * w0 - 0.5))
        np.testing.assert_allclose(tuple(camera.center)[-2:], expected, atol=tol)
    # a drag moves the camera along with the mouse
    start = QPoint(round(target.left() + 0.1 * target.width()), round(target.center().y()))
    end = QPoint(round(target.left() + 0.9 * target.width()), round(target.center().y()))
    qtbot.mousePress(widget, Qt.MouseButton.LeftButton, pos=start)
    qtbot.mouseMove(widget, end)
    qtbot.mouseRelease(widget, Qt.MouseButton.LeftButton, pos=end)
    assert tuple(camera.center)[-1] == pytest.approx(tx + sx * (0.9 * w0 - 0.5), abs=tol)
    # the rectangle follows the camera
    for center, zoom in [((200.0, 300.0), 2.0), ((400.0, 100.0), 0.7)]:
        camera.center = center
        camera.zoom = zoom
        qtbot.wait(5)
        assert widget.view_box == visible_region(viewer, layer)
    # a drawn rectangle lies where the box maps on the thumbnail
    rect = widget._box_rect()
    y0, x0, _, _ = widget.view_box
    corner = widget.world_at(QPointF(rect.left() + 1e-6, rect.top() + 1e-6))
    np.testing.assert_allclose(corner, (ty + sy * (y0 - 0.5), tx + sx * (x0 - 0.5)), atol=1e-3)


def test_overview_moves_camera_and_follows_it_rgb(make_napari_viewer, sample_slide, qtbot):
    path, _ = sample_slide
    viewer, [image], widget = _overview(make_napari_viewer, path, qtbot)
    assert widget.layer is image
    np.testing.assert_array_equal(widget.thumbnail, np.asarray(image.data[-1])[..., :3])
    _check_click_and_follow(viewer, image, widget, qtbot)
    # off the thumbnail (the letterbox), a click does nothing
    camera = camera_of(viewer)
    before = tuple(camera.center)
    assert widget.world_at(QPointF(-5.0, -5.0)) is None
    assert tuple(camera.center) == before
    # removing the slide clears the overview
    viewer.layers.remove(image)
    assert widget.layer is None
    assert widget.thumbnail is None
    assert widget.view_box is None
    widget.repaint()  # paints "No slide open" without error


def test_overview_composites_a_multichannel_slide(make_napari_viewer, tmp_path, qtbot):
    path = _multichannel_slide(tmp_path / "mc.ome.tif")
    viewer, layers, widget = _overview(make_napari_viewer, path, qtbot)
    assert len(layers) == 3
    assert widget.layer in layers
    assert widget.thumbnail.shape == (256, 384, 3)
    thumb = widget.thumbnail.astype(int)
    # the top half has channel 0 on, the left half channel 1: the quadrants differ
    quads = [thumb[:128, :192], thumb[:128, 192:], thumb[128:, :192], thumb[128:, 192:]]
    means = [q.reshape(-1, 3).mean(0) for q in quads]
    assert len({tuple(np.round(m)) for m in means}) == 4
    assert means[3].sum() < min(m.sum() for m in means[:3])  # neither channel 0 nor 1
    _check_click_and_follow(viewer, widget.layer, widget, qtbot)
    widget.close()
    assert widget._connections == []


def test_overview_rebuilds_once_after_display_changes(make_napari_viewer, tmp_path, qtbot):
    from napari_slidescope._qt.overview import thumbnail_rgb

    path = _multichannel_slide(tmp_path / "mc.ome.tif")
    viewer, layers, widget = _overview(make_napari_viewer, path, qtbot)
    before, built = widget.thumbnail.copy(), widget.rebuilds
    top = layers[0]  # channel 0: bright in the top half
    for hi in (8000.0, 16000.0, 40000.0):  # a drag of the contrast slider
        top.contrast_limits = (0.0, hi)
    top.colormap = "magenta"
    assert widget.rebuilds == built  # debounced: nothing yet
    qtbot.waitUntil(lambda: widget.rebuilds > built, timeout=5_000)
    qtbot.wait(300)
    assert widget.rebuilds == built + 1  # one rebuild for the four changes
    np.testing.assert_array_equal(widget.thumbnail, thumbnail_rgb(layers))
    assert not np.array_equal(widget.thumbnail, before)
    # hiding a channel leaves it out of the thumbnail
    layers[1].visible = False
    qtbot.waitUntil(lambda: widget.rebuilds == built + 2, timeout=5_000)
    np.testing.assert_array_equal(widget.thumbnail, thumbnail_rgb([layers[0], layers[2]]))
    # layers no longer shown are no longer followed
    widget.close()
    assert widget._layer_connections == []
    top.contrast_limits = (0.0, 500.0)
    qtbot.wait(300)
    assert widget.rebuilds == built + 2


def test_overview_rebuilds_an_rgb_slide_on_new_contrast_limits(
    make_napari_viewer, sample_slide, qtbot
):
    viewer, [layer], widget = _overview(make_napari_viewer, sample_slide[0], qtbot)
    before = widget.thumbnail.copy()
    layer.contrast_limits = (60.0, 200.0)
    qtbot.waitUntil(lambda: not np.array_equal(widget.thumbnail, before), timeout=5_000)
    small = np.asarray(layer.data[-1])[..., :3].astype(np.float32)
    expected = (np.clip((small - 60) / 140, 0, 1) * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(widget.thumbnail, expected)
