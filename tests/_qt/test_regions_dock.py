"""The "Tissue regions" dock: strokes, live preview, run on slide, cancel, files."""

import json
import threading

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def region_slide(tmp_path_factory):
    """A synthetic H&E slide with known regions: 1 mm square at 0.5 µm/px."""
    from napari_slidescope import write_region_slide

    path = tmp_path_factory.mktemp("regions") / "regions.svs"
    truth = write_region_slide(path, shape=(2048, 2048), region_um=200.0, seed=3)
    return path, truth


def _dock(dock_slide, path, qtbot):
    viewer, [image], dock = dock_slide(path, "Tissue regions")
    viewer.reset_view()
    qtbot.wait(10)
    return viewer, image, dock


def _idle(dock, qtbot, timeout=120_000):
    qtbot.waitUntil(lambda: not dock.busy and not dock._timer.isActive(), timeout=timeout)


def test_strokes_live_preview_matches_truth(dock_slide, region_slide, qtbot):
    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    assert dock.image is image
    assert list(dock.classes)[-1] == "Ignore"
    layer = dock.shapes
    assert layer.name == f"{image.name} region examples"
    assert np.allclose(layer.scale, image.scale)
    # strokes drawn programmatically, as a user's paths with the class selected
    dock.add_examples(truth.example_lines(per_class=5))
    assert len(layer.data) == 25
    assert set(layer.shape_type) == {"path"}
    # a shape drawn while a class is selected gets that class
    dock.select_class("Fat")
    assert layer.feature_defaults["class"][0] == "Fat"
    _idle(dock, qtbot)
    regions = dock.preview_regions
    assert regions is not None
    assert dock.classifier is not None
    assert "classified in" in dock.status.text()
    preview = viewer.layers[f"{image.name} regions preview"]
    assert preview.data.shape == regions.labels.shape if not preview.multiscale else True
    want = truth.grid(regions.downsample[0], regions.labels.shape, regions.origin)
    on = (regions.labels > 0) & (want > 0)
    assert on.mean() > 0.5
    assert (regions.labels[want == 0] == 0).mean() > 0.8  # "Tissue only": glass left out
    # class k of the map is classifier class k; the truth numbers REGION_CLASSES the same way
    from napari_slidescope.sample_regions import REGION_CLASSES

    names = np.array(["", *regions.classes])
    assert (names[regions.labels[on]] == np.array(["", *REGION_CLASSES])[want[on]]).mean() > 0.8
    # renaming a class renames its shapes
    dock.rename_class("Fat", "Adipose")
    assert "Adipose" in set(layer.features["class"])
    assert "Fat" not in set(layer.features["class"])
    _idle(dock, qtbot)


def test_run_on_slide_areas_save_load_export(dock_slide, region_slide, qtbot, tmp_path):
    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    dock.live.setChecked(False)
    dock.add_examples(truth.example_lines(per_class=5))
    tiles = []
    dock._bridge.tile.connect(lambda box, labels: tiles.append(box))
    worker = dock.run_on_slide()
    assert worker is not None
    assert not dock.run_button.isEnabled()
    _idle(dock, qtbot)
    assert tiles, "no tile streamed into the layer"
    regions = dock.regions
    assert regions is not None
    layer = viewer.layers[f"{image.name} regions"]
    assert np.allclose(np.asarray(layer.scale) / np.asarray(regions.downsample), image.scale)
    rows = dock.areas()
    assert {r[1] for r in rows} == set(regions.classes)
    pct = [r[3] for r in rows if r[3] is not None]
    assert sum(pct) == pytest.approx(100.0)
    assert dock.table.rowCount() == len(rows)
    assert "classified in" in dock.status.text()
    # per annotation: a square shape layer over the top-left quarter
    viewer.add_shapes(
        [np.array([[0, 0], [0, 1024], [1024, 1024], [1024, 0]], float)],
        shape_type="polygon",
        name="annotations",
        scale=image.scale,
        translate=image.translate,
    )
    dock.annotations_box.setCurrentText("annotations")
    rows = dock.areas()
    inside = sum(r[2] for r in rows if r[0] == "annotations #1")
    assert 0 < inside < sum(r[2] for r in rows if r[0] == "slide")
    # without the tissue gate the glass gets a class too
    gated = int((regions.labels > 0).sum())
    dock.tissue_only.setChecked(False)
    dock.run_on_slide()
    _idle(dock, qtbot)
    assert int((dock.regions.labels > 0).sum()) > gated
    # save / load round trip
    saved = dock.save_classifier(tmp_path / "regions.npz")
    from napari_slidescope import load_region_classifier

    assert load_region_classifier(saved).sha256 == dock.classifier.sha256
    dock.remove_class("Tumor")
    dock.classifier = None
    clf = dock.load_classifier(saved)
    assert "Tumor" in dock.classes
    assert dock.classifier is clf
    # export
    out = dock.export_geojson(tmp_path / "regions.geojson")
    doc = json.loads(out.read_text())
    names = {f["properties"]["classification"]["name"] for f in doc["features"]}
    assert names <= set(regions.classes) and names


def test_cancel_and_bad_files(dock_slide, region_slide, qtbot, tmp_path):
    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    dock.live.setChecked(False)
    dock.add_examples(truth.example_lines(per_class=5))
    # a run cancelled at its first tile stops with a message, the GUI usable again (the
    # flag is set in the worker as it says it started: a slot queued to the GUI thread
    # could come after the one tile of this slide)
    from qtpy.QtCore import Qt

    dock._bridge.started.connect(lambda *_: dock._cancel.set(), Qt.ConnectionType.DirectConnection)
    dock.run_on_slide()
    _idle(dock, qtbot)
    assert dock.regions is None
    assert "Cancel" in dock.status.text()
    assert dock.run_button.isEnabled()
    # a file that is not a classifier: a message, no exception
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert dock._report(dock.load_classifier, bad) is None
    assert "bad.npz" in dock.status.text()
    # examples from a QuPath GeoJSON of classified annotations
    gj = tmp_path / "examples.geojson"
    feats = [
        {
            "type": "Feature",
            "geometry": {"type": "LineString", "coordinates": [[100, 100], [180, 100]]},
            "properties": {"classification": {"name": "Tumor", "color": [200, 0, 0]}},
        },
        {
            "type": "Feature",
            "geometry": {
                "type": "Polygon",
                "coordinates": [[[300, 300], [400, 300], [400, 400], [300, 400], [300, 300]]],
            },
            "properties": {"classification": {"name": "Vessel", "color": [0, 200, 200]}},
        },
    ]
    gj.write_text(json.dumps({"type": "FeatureCollection", "features": feats}))
    before = len(dock.shapes.data)
    assert dock.load_examples(gj) == 2
    assert len(dock.shapes.data) == before + 2
    assert "Vessel" in dock.classes
    assert list(dock.shapes.shape_type[-2:]) == ["path", "polygon"]
    # the examples layer saved by napari's QuPath writer loads back: strokes stay strokes
    from napari_slidescope._napari.qupath import write_geojson_layers

    saved = tmp_path / "saved.geojson"
    write_geojson_layers(str(saved), [dock.shapes.as_layer_data_tuple()])
    back = json.loads(saved.read_text())["features"]
    assert len(back) == len(dock.shapes.data)
    kinds = {f["geometry"]["type"] for f in back}
    assert kinds == {"LineString", "Polygon"}
    assert {f["properties"]["classification"]["name"] for f in back} >= {"Tumor", "Vessel"}
    n = len(dock.shapes.data)
    assert dock.load_examples(saved) == n
    assert len(dock.shapes.data) == 2 * n
    kinds = list(dock.shapes.shape_type)
    shapes = zip(dock.shapes.data, kinds, strict=True)
    paths = [np.round(d, 3).tobytes() for d, k in shapes if k == "path"]
    assert sorted(paths[: len(paths) // 2]) == sorted(paths[len(paths) // 2 :])  # same pixels
    # a GeoJSON without classified annotations: a message
    empty = tmp_path / "empty.geojson"
    empty.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    assert dock._report(dock.load_examples, empty) is None
    assert "no classified annotations" in dock.status.text()


def test_preview_reuses_cached_tiles_and_cancels_a_stale_one(dock_slide, region_slide, qtbot):
    from napari_slidescope import classify_regions
    from napari_slidescope._napari.jobs import SlideSource

    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    dock.live.setChecked(False)
    dock.add_examples(truth.example_lines(per_class=3))
    dock.preview()
    _idle(dock, qtbot)
    cache = dock._opened.get(SlideSource.from_layer(image))
    computed = cache.computed_tiles
    assert computed > 0
    first = dock.preview_regions
    # the final classifier is the preview's, and it classifies as the preview showed
    assert dock.classifier.parameters["stains"] == "slide"
    direct = classify_regions(cache.slide, dock.classifier, region=first.region)
    np.testing.assert_array_equal(first.labels, direct.labels)
    # the same view again: every tile cached, the layer shows the same classes
    dock.preview()
    _idle(dock, qtbot)
    assert cache.computed_tiles == computed
    np.testing.assert_array_equal(dock.preview_regions.labels, first.labels)
    # a stroke more, then a second update while the first runs: the first is cancelled
    dock.add_examples({"Tumor": [truth.example_lines(per_class=1, seed=7)["Tumor"][0]]})
    dock._timer.stop()
    errors = []
    worker = dock.preview()
    worker.errored.connect(errors.append)
    dock.preview()
    assert dock._preview_again
    _idle(dock, qtbot)
    assert all(type(e).__name__ == "Cancelled" for e in errors)
    assert "classified in" in dock.status.text()
    assert dock.classifier.sha256 != first.parameters["classifier_sha256"]  # retrained
    assert dock.preview_regions.parameters["classifier_sha256"] == dock.classifier.sha256
    assert cache.computed_tiles == computed  # the stroke lay in view: no feature computed


def test_a_stroke_update_keeps_the_previous_classes_until_replaced(dock_slide, region_slide, qtbot):
    from napari_slidescope import classify_regions
    from napari_slidescope._napari.jobs import SlideSource

    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    dock.live.setChecked(False)
    dock.add_examples(truth.example_lines(per_class=3))
    dock.preview()
    _idle(dock, qtbot)
    assert dock.status.text().endswith("up to date")
    layer = viewer.layers[f"{image.name} regions preview"]

    def shown():
        return np.array(layer.data[0] if layer.multiscale else layer.data)

    before = shown()
    np.testing.assert_array_equal(before, dock.preview_regions.labels)
    assert (before > 0).mean() > 0.3
    # a stroke: a new classifier predicts every tile again, centre first
    dock.add_examples({"Tumor": [truth.example_lines(per_class=1, seed=7)["Tumor"][0]]})
    dock._timer.stop()
    at_start, at_first, painted, statuses = [], [], [], []

    def on_map(regions, done):
        at_start.append(shown())
        statuses.append(dock.status.text())

    def on_tile(regions, box, labels):
        painted.append(box)
        if len(painted) == 1:
            dock._painted_at = 0.0
            dock._on_preview_tile(regions, box, labels)  # the first partial repaint
            at_first.append(shown())
            statuses.append(dock.status.text())

    dock._bridge.preview_map.connect(on_map)
    dock._bridge.preview_tile.connect(on_tile)
    try:
        dock.preview()
        _idle(dock, qtbot)
    finally:
        dock._bridge.preview_map.disconnect(on_map)
        dock._bridge.preview_tile.disconnect(on_tile)
    assert len(painted) > 4, "the stroke update predicted the view again, tile by tile"
    # no blank flash: the previous classes stay where no new tile came yet
    np.testing.assert_array_equal(at_start[0], before)
    y0, x0, y1, x1 = painted[-1]  # a tile far from the centre, painted last
    np.testing.assert_array_equal(at_first[0][y0:y1, x0:x1], before[y0:y1, x0:x1])
    assert before[y0:y1, x0:x1].any()
    a, b, c, d = painted[0]  # the first tile shows its new classes
    regions = dock.preview_regions
    np.testing.assert_array_equal(at_first[0][a:c, b:d], regions.labels[a:c, b:d])
    assert all("updating" in s for s in statuses)  # a mix is never called finished
    # done: the layer shows exactly what classify_regions gives, and says so
    cache = dock._opened.get(SlideSource.from_layer(image))
    direct = classify_regions(cache.slide, dock.classifier, region=regions.region)
    np.testing.assert_array_equal(shown(), direct.labels)
    assert regions.parameters["classifier_sha256"] == dock.classifier.sha256
    assert not np.array_equal(direct.labels, before)  # the stroke changed some classes
    assert dock.status.text().endswith("up to date")


def test_closing_while_a_worker_uses_the_slide_waits_for_it(region_slide):
    """The dock destroyed mid-preview: its slide closes when the worker is done, not before."""
    from napari_slidescope import open_slide
    from napari_slidescope._qt.regions_dock import _OpenSlide

    slide_path, _ = region_slide

    class Source:  # what _OpenSlide reads of a SlideSource
        name, path, array, shape0, mpp = "s", str(slide_path), None, (2048, 2048), (0.5, 0.5)

        def open(self):
            return open_slide(slide_path)

    opened = _OpenSlide()
    cancel, run_cancel = threading.Event(), threading.Event()
    opened.watch("preview", threading.Event())
    opened.watch("preview", cancel)  # the latest preview's flag
    opened.watch("run", run_cancel)
    with opened.using(Source()) as preview:
        closed = []
        real_close = preview.slide.close
        preview.slide.close = lambda: (closed.append(1), real_close())
        opened.close()  # from the GUI thread, the worker still reading
        assert closed == []
        assert cancel.is_set() and run_cancel.is_set()  # their work is no longer wanted
        assert preview.slide.read_level(0, (0, 0, 8, 8)).shape[:2] == (8, 8)
    assert closed == [1]
    assert opened._preview is None
    opened.close()  # again, nothing open: nothing happens
    assert closed == [1]


def test_a_closed_dock_no_longer_follows_its_examples_layer(dock_slide, region_slide, qtbot):
    """The examples layer stays in the viewer after the dock is closed: editing it reaches
    no slot of the dock (the slot ran partway, recolouring the shapes, until it read a
    deleted widget; napari then dropped it on the RuntimeError)."""
    path, truth = region_slide
    viewer, image, dock = _dock(dock_slide, path, qtbot)
    layer = dock._examples_layer()
    seen = []
    dock._examples_changed = lambda: seen.append(len(layer.data))  # what an edit reaches
    layer.add([np.array([[10.0, 10.0], [40.0, 40.0]])], shape_type="path")
    assert seen  # followed while the dock is open
    destroyed = []
    dock.destroyed.connect(lambda *_: destroyed.append(1))
    dock.deleteLater()
    qtbot.waitUntil(lambda: destroyed == [1], timeout=10_000)
    seen.clear()
    layer.add([np.array([[50.0, 50.0], [80.0, 80.0]])], shape_type="path")
    layer.data = layer.data[:1]
    assert seen == []
    assert len(layer.data) == 1
