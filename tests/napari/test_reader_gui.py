"""The reader inside a real viewer (run under xvfb-run)."""

import pytest

pytestmark = pytest.mark.gui


def test_viewer_open_shared_svs_and_ndpi(make_napari_viewer, shared_file):
    viewer = make_napari_viewer()
    svs = shared_file("CMU-1-Small-Region.svs")
    [layer] = viewer.open(str(svs), plugin="napari-slidescope")
    assert layer.rgb
    assert layer.name == "CMU-1-Small-Region.svs"
    assert tuple(layer.scale) == pytest.approx((0.499, 0.499))
    assert tuple(str(u) for u in layer.units) == ("micrometer", "micrometer")
    ndpi = shared_file("test3-DAPI-2-387.ndpi")
    [layer2] = viewer.open(str(ndpi), plugin="napari-slidescope")
    assert layer2.multiscale and len(layer2.data) == 4
    assert tuple(layer2.scale) == pytest.approx((0.22817, 0.22817), rel=1e-3)
    assert layer2.data[0].shape == (4864, 3968, 3)


def test_viewer_open_qptiff_splits_channels(make_napari_viewer, shared_file):
    viewer = make_napari_viewer()
    layers = viewer.open(str(shared_file("small_vectra.qptiff")), plugin="napari-slidescope")
    assert [ly.name for ly in layers] == [
        f"small_vectra.qptiff [{c}]" for c in ("DAPI", "FITC", "Cy3")
    ]


def test_sample_slide_renders(make_napari_viewer, sample_slide, qtbot):
    viewer = make_napari_viewer(show=True)
    path, _ = sample_slide
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    viewer.reset_view()
    qtbot.wait(500)
    shot = viewer.screenshot(canvas_only=True, flash=False)
    assert shot.ndim == 3
    # pink tissue and white glass are both on screen
    rgb = shot[..., :3].reshape(-1, 3).astype(int)
    pink = (rgb[:, 0] > 180) & (rgb[:, 1] < 190) & (rgb[:, 2] > 170)
    assert pink.mean() > 0.05
    assert layer.multiscale
