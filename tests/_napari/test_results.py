"""Whole-slide nuclei as a multiscale layer: exact at full zoom, bounded in memory (xvfb-run)."""

import numpy as np
import pytest

from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.viewport import camera_of

pytestmark = pytest.mark.gui

SEG = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}


def _whole_slide_run(viewer, image, ctl, segmenter, qtbot):
    ctl.run(image, "nuclei", scope="slide", nuclei_run={**SEG, "segmenter": segmenter})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    return viewer.layers[f"{image.name} nuclei"]


def test_whole_slide_nuclei_are_exact_at_full_zoom(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = session_for(viewer)
    layer = _whole_slide_run(viewer, image, ctl, threshold_segmenter(), qtbot)
    assert layer.multiscale
    assert len(layer.data) >= 2
    canvas = _layers.canvas_of(layer)
    assert isinstance(canvas, _layers.PyramidCanvas)
    ref = segment_nuclei(
        str(small_slide),
        segmenter=threshold_segmenter(),
        tissue=ctl.tissue_result(image),
        **SEG,
    )
    assert ref.count > 20
    assert ref.downsample == canvas.downsample
    # zoom onto a level-0 window: the displayed tile is level 0 and equals the reference
    y0, x0 = 400, 600
    camera = camera_of(viewer)
    camera.center = ((y0 + 64) * image.scale[0], (x0 + 64) * image.scale[1])
    camera.zoom = 8.0
    qtbot.wait(50)
    layer.refresh()
    assert layer.data_level == 0
    tile = layer._slice.image.raw
    cy, cx = (int(v) for v in layer._slice.tile_to_data.translate[-2:])
    assert tile.shape[0] > 32
    assert tile.shape[1] > 32
    oy, ox = ref.origin
    expected = ref.labels[cy - oy : cy - oy + tile.shape[0], cx - ox : cx - ox + tile.shape[1]]
    assert expected.any()
    np.testing.assert_array_equal(tile, expected)
    # and the whole finest level, not only the window on screen
    np.testing.assert_array_equal(
        np.asarray(layer.data[0])[: ref.labels.shape[0], : ref.labels.shape[1]], ref.labels
    )
    # hovering a nucleus shows its measurements: one feature row per id
    feats = layer.features
    assert set(feats["index"]) == set(ref.columns["id"].tolist())
    nid = int(expected[expected > 0][0])
    row = feats[feats["index"] == nid]
    assert row.shape[0] == 1
    assert row["area_um2"].iloc[0] > 0
    pos = np.argwhere(expected == nid)[0] + (cy, cx)
    world = pos * np.asarray(image.scale) + np.asarray(image.translate)
    assert layer.get_value(world, world=True) == (0, nid)  # (level, value)
    # napari loads the labels in whole cells of the image's chunk grid, so a small pan
    # inside them re-slices neither layer (before, the labels were re-read at every move)
    chunk = _layers.image_read_chunk(image, canvas.downsample)
    assert canvas.pyramid.read_chunk == chunk
    assert layer.data[0].chunks == (chunk, chunk)
    box, image_box = layer.corner_pixels.copy(), image.corner_pixels.copy()
    assert (box[0, -2:] % chunk == 0).all()
    camera = camera_of(viewer)
    camera.center = (camera.center[0] + 3.0, camera.center[1] + 3.0)
    qtbot.wait(50)
    np.testing.assert_array_equal(layer.corner_pixels, box)
    np.testing.assert_array_equal(image.corner_pixels, image_box)


def test_memory_does_not_grow_with_the_slide(
    make_napari_viewer, tmp_path, qtbot, threshold_segmenter, monkeypatch
):
    """On a slide 4x larger, the result's in-memory structures stay within the same bound."""
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline import label_pyramid
    from napari_slidescope.sample_data import write_sample_slide

    bound = 2**20  # 4 chunks: far less than level 0 of either slide (6 and 24 MiB)
    monkeypatch.setattr(label_pyramid, "DEFAULT_CACHE_BYTES", bound)
    written = []
    for k, shape in enumerate([(1024, 1536), (2048, 3072)]):
        path = tmp_path / f"s{k}.svs"
        write_sample_slide(path, shape=shape, mpp=0.5, seed=2, tile=128)
        viewer = make_napari_viewer()
        [image] = viewer.open(str(path), plugin="napari-slidescope")
        ctl = session_for(viewer)
        layer = _whole_slide_run(viewer, image, ctl, threshold_segmenter(), qtbot)
        canvas = _layers.canvas_of(layer)
        pyr = canvas.pyramid
        assert layer.multiscale
        assert pyr.levels[0].shape[0] >= shape[0]
        # no array as large as the slide anywhere in the canvas: the labels are on disk
        arrays = [v for v in vars(canvas).values() if isinstance(v, np.ndarray)]
        assert not arrays
        assert pyr.cache_bytes == bound
        assert 0 < pyr.nbytes_cached <= bound
        written.append(pyr.chunks_written * pyr.chunk**2 * 4)  # bytes of labels on disk
        assert written[-1] > 4 * bound
        # a nucleus far from the last tiles painted is still there (read back from disk)
        ids = canvas.table()["id"]
        r, c = (
            int(v) for v in (canvas.table()["centroid_row"][0], canvas.table()["centroid_col"][0])
        )
        assert layer.data[0][r, c] in ids
    assert written[1] > 2 * written[0]  # the larger slide's labels went to disk, not memory


def test_nuclei_erased_in_the_layer_leave_the_exports(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter, tmp_path
):
    import json

    from napari_slidescope._qt.session import session_for

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = session_for(viewer)
    opts = {**SEG, "segmenter": threshold_segmenter()}
    ctl.run(image, "nuclei", region=(0, 0, 512, 768), nuclei_run=opts)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    layer = viewer.layers[f"{image.name} nuclei"]
    assert not layer.multiscale  # a region run: an editable dense layer
    before = _layers.canvas_of(layer).to_result()
    gone = int(before.columns["id"][0])
    layer.data[layer.data == gone] = 0  # what the eraser / fill-with-0 tools do
    layer.refresh()
    after = _layers.canvas_of(layer).to_result()
    assert after.count == before.count - 1
    assert gone not in after.columns["id"]
    after.to_csv(tmp_path / "n.csv")
    after.to_geojson(tmp_path / "n.geojson")
    feats = json.loads((tmp_path / "n.geojson").read_text())["features"]
    assert len(feats) == after.count
    assert (tmp_path / "n.csv").read_text().count("\n") == after.count + 1
