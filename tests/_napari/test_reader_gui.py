"""The reader inside a real viewer (run under xvfb-run)."""

import numpy as np
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
    assert layer2.multiscale
    assert len(layer2.data) == 4
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


SHARED = {
    "CMU-1-Small-Region.svs": (1, 0.499),
    "TCGA-CR-7395-01A-01-TS1.svs": (2, None),
    "openslide-python_small.svs": (1, 0.499),
    "test3-DAPI-2-387.ndpi": (4, 0.22817),
    "test3-TRITC-2-560.ndpi": (4, 0.22817),
    "small_vectra.qptiff": (1, 0.49652),
    "derived/derived_CMU-1-Small-Region_subifd-pyramid.ome.tif": (4, 0.499),
    "derived/derived_CMU-1-Small-Region_generic-pyramid.tif": (4, 0.499),
}


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_shared_slide_opens_in_the_viewer(make_napari_viewer, shared_file, name):
    from napari_slidescope import SlidescopeWarning

    nlevels, mpp = SHARED[name]
    viewer = make_napari_viewer()
    path = str(shared_file(name))
    if mpp is None:
        with pytest.warns(SlidescopeWarning, match="no pixel size"):
            layers = viewer.open(path, plugin="napari-slidescope")
    else:
        layers = viewer.open(path, plugin="napari-slidescope")
    for layer in layers:
        data = layer.data if layer.multiscale else [layer.data]
        assert len(data) == nlevels
        expected_scale = (1.0, 1.0) if mpp is None else (mpp, mpp)
        assert tuple(layer.scale[-2:]) == pytest.approx(expected_scale, rel=1e-3)
    # the smallest level napari would show equals tifffile's decode of that level
    import tifffile

    layer = layers[0]
    top = np.asarray(layer.data[-1] if layer.multiscale else layer.data)
    with tifffile.TiffFile(path) as tif:
        series = max(
            tif.series, key=lambda s: s.shape[s.axes.index("Y")] * s.shape[s.axes.index("X")]
        )
        expected = series.levels[nlevels - 1].asarray()
    if expected.ndim == 3 and series.axes.startswith("C"):
        expected = expected[0]
    np.testing.assert_array_equal(top, expected)


@pytest.mark.parametrize("name", ["CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi"])
def test_drag_and_drop_path_offers_this_reader(make_napari_viewer, shared_file, name):
    # drag-and-drop and File > Open ask npe2 for the compatible readers of the path; when
    # several plugins claim it napari asks the user once per extension
    from npe2 import PluginManager

    path = str(shared_file(name))
    viewer = make_napari_viewer()
    manager = PluginManager.instance()
    manager.discover()
    readers = {r.plugin_name for r in manager.iter_compatible_readers(path)}
    assert "napari-slidescope" in readers
    [layer] = viewer.open(path, plugin="napari-slidescope")
    assert layer.metadata["path"] == path


def _cached_tiles(owner):
    from napari_slidescope.slide import tile_cache

    return [k for k in list(tile_cache()._items) if isinstance(k, tuple) and k[:1] == (owner,)]


def test_removing_the_layer_releases_its_slide(make_napari_viewer, sample_slide):
    from napari_slidescope._napari import open_slides

    viewer = make_napari_viewer()
    path, _ = sample_slide
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    slide = open_slides._OPEN[-1]
    assert layer.metadata[open_slides.SLIDE_KEY] == slide._owner
    np.asarray(layer.data[0][:600, :600])  # decoded tiles go to the shared cache
    assert _cached_tiles(slide._owner)
    [other] = viewer.open(str(path), plugin="napari-slidescope")  # a second, separate slide
    np.asarray(other.data[0][:600, :600])
    viewer.add_labels(np.zeros((64, 64), np.int32), name="nuclei")  # a result layer
    viewer.layers.remove(layer)
    assert not _cached_tiles(slide._owner)
    assert slide._tif.filehandle.closed
    assert slide not in open_slides._OPEN
    other_slide = open_slides._OPEN[-1]
    assert _cached_tiles(other_slide._owner)  # the other slide is untouched
    assert np.asarray(other.data[0][:600, :600]).any()
    viewer.layers.clear()
    assert not _cached_tiles(other_slide._owner)
    assert other_slide not in open_slides._OPEN


def test_a_multichannel_slide_stays_open_while_a_channel_is_shown(make_napari_viewer, shared_file):
    from napari_slidescope._napari import open_slides

    viewer = make_napari_viewer()
    layers = viewer.open(str(shared_file("small_vectra.qptiff")), plugin="napari-slidescope")
    slide = open_slides._OPEN[-1]
    for layer in layers[:-1]:
        viewer.layers.remove(layer)
        assert slide in open_slides._OPEN
        assert not slide._tif.filehandle.closed
    assert np.asarray(layers[-1].data[:16, :16]).shape == (16, 16)  # still readable
    viewer.layers.remove(layers[-1])
    assert slide not in open_slides._OPEN
    assert slide._tif.filehandle.closed
