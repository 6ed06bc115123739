"""Cell classes in napari: class colours, legend, cells layer, classified GeoJSON (xvfb-run)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gui

SEG = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}


def test_classify_colours_nuclei_by_class_with_a_legend(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.viewer import classify

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = session_for(viewer)
    options = {**SEG, "segmenter": threshold_segmenter()}
    ctl.run(image, "nuclei", scope="slide", nuclei_run=options)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    layer = viewer.layers[f"{image.name} nuclei"]
    od = layer.features["hematoxylin_od_mean"].to_numpy()
    t = float(np.median(od))  # half the nuclei above: two classes
    # the synthetic H&E slide has no DAB: score its hematoxylin as if it were
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope._qt.cell_classes_dock import _legend, show_classes
    from napari_slidescope.pipeline.cell_classes import classify_cells

    result = canvas_of(layer).to_result()
    result.columns["dab_od_mean"] = np.asarray(result.columns["hematoxylin_od_mean"])
    res = classify_cells(result, dab=(t, t + 5, t + 10))
    show_classes(layer, res)
    dock = _legend(viewer, res, 0.5)
    ids, cls = res.columns["id"], res.columns["class"]
    assert set(cls) == {"Negative", "1+"}
    for i, c in zip(ids[:20], cls[:20], strict=True):
        want = np.array(res.classes[str(c)]) / 255
        assert np.allclose(layer.colormap.map(int(i))[:3], want, atol=1 / 255)
    assert list(layer.features["class"]) == [
        dict(zip(ids.tolist(), cls.tolist(), strict=True))[int(i)] for i in layer.features["index"]
    ]
    text = " ".join(w.text() for w in dock.findChildren(type(dock.layout().itemAt(0).widget())))
    assert "Negative" in text
    assert "H-score" in text
    with pytest.raises(ValueError, match="no DAB"):
        classify(viewer, dab=True)  # an H&E slide has no DAB


def test_cells_layer_and_classified_geojson_read_back(make_napari_viewer, tmp_path):
    from napari_slidescope import classify_cells, segment_nuclei
    from napari_slidescope.sample_cells import make_hdab
    from napari_slidescope.viewer import add_cells

    truth = make_hdab(seed=3, shape=(256, 256))
    path = truth.write(tmp_path / "ihc.ome.tif")
    res = classify_cells(
        segment_nuclei(path, segmenter="builtin", tissue=False, cell_expansion_um=3), dab=True
    )
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    cells = add_cells(viewer, res, image)
    assert cells.contour == 1
    assert cells.name == f"{image.name} cells"
    assert np.array_equal(np.asarray(cells.data), res.cells)
    # the classified export opens as detections in their class colours
    out = res.to_geojson(tmp_path / "cells.geojson")
    [det] = viewer.open(str(out), plugin="napari-slidescope")
    feats = det.features
    assert set(feats["class"]) <= {"Negative", "1+", "2+", "3+"}
    row = int(np.flatnonzero(feats["class"].to_numpy() == "3+")[0])
    assert np.allclose(
        det.colormap.map(int(feats["index"][row]))[:3], np.array(res.classes["3+"]) / 255, atol=1e-3
    )


def test_classification_dock_scores_ihc_and_round_trips_rules(make_napari_viewer, tmp_path, qtbot):
    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline.cell_classes import load_rules
    from napari_slidescope.sample_cells import make_hdab

    path = make_hdab(seed=9, shape=(256, 256)).write(tmp_path / "ki67.ome.tif")
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    ctl = session_for(viewer)
    viewer.reset_view()
    ctl.run(image, "nuclei", scope="visible", nuclei_run={**SEG, "segmenter": "builtin"})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    dock = ClassifyWidget(viewer)
    res = dock.apply()
    assert set(res.columns["class"]) <= {"Negative", "1+", "2+", "3+"}
    assert res.count > 20
    layer = viewer.layers[f"{image.name} nuclei"]
    assert "class" in layer.features
    # thresholds out of order are refused, named in the status line
    dock.thresholds[0].setValue(0.5)
    with pytest.raises(ValueError, match="must increase"):
        dock.apply()
    assert "must increase" in dock.status.text()
    dock.thresholds[0].setValue(0.1)
    saved = dock.save(tmp_path / "rules.json")
    assert load_rules(saved).dab["thresholds"] == (0.1, 0.4, 0.6)
    other = ClassifyWidget(viewer)
    other.load(saved)
    assert other.current_rules() == load_rules(saved)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        other.load(tmp_path / "bad.json")
    assert "not JSON" in other.status.text()


def _drag(canvas, axes, x0, x1, release=True):
    """Press at data x `x0` mid-height of `axes`, move to `x1` in steps, release there."""
    from matplotlib.backend_bases import MouseButton, MouseEvent

    canvas.draw()  # as on screen: the view limits (and so the transforms) are up to date
    y = axes.transAxes.transform((0, 0.5))[1]
    steps = np.linspace(x0, x1, 4)
    for name, x in [("button_press_event", x0)] + [("motion_notify_event", v) for v in steps]:
        px = axes.transData.transform((x, 0))[0]
        MouseEvent(name, canvas, px, y, button=MouseButton.LEFT)._process()
    if release:
        px = axes.transData.transform((x1, 0))[0]
        MouseEvent("button_release_event", canvas, px, y, button=MouseButton.LEFT)._process()


def test_dragging_a_threshold_on_the_histogram_reclassifies_live(
    make_napari_viewer, tmp_path, qtbot
):
    from napari_slidescope._qt.cell_classes_dock import classify
    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope._qt.session import session_for
    from napari_slidescope._qt.table import NucleiTableWidget
    from napari_slidescope.pipeline.cell_classes import load_rules
    from napari_slidescope.sample_cells import make_hdab

    path = make_hdab(seed=9, shape=(256, 256)).write(tmp_path / "ki67.ome.tif")
    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    ctl = session_for(viewer)
    viewer.reset_view()
    ctl.run(image, "nuclei", scope="visible", nuclei_run={**SEG, "segmenter": "builtin"})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    layer = viewer.layers[f"{image.name} nuclei"]
    table = NucleiTableWidget(viewer)
    dock = ClassifyWidget(viewer)
    res = dock.apply()  # IHC at 0.2 / 0.4 / 0.6 on the nucleus
    col = "dab_od_mean"
    dab = np.asarray(res.columns[col])
    table.hist_column.setCurrentIndex(table.hist_column.findData(col))
    assert table.thresholds(col) == [
        ("DAB", 0, 0.2, "1+"),
        ("DAB", 1, 0.4, "2+"),
        ("DAB", 2, 0.6, "3+"),
    ]
    assert len(table._lines) == 3
    assert table.thresholds("area_um2") == []
    # drag the 1+ line from 0.2 to a value with cells on both sides of it
    between = np.sort(dab[(dab > 0.2) & (dab < 0.4)])
    k = between.size // 2
    new = float(between[k - 1] + between[k]) / 2
    assert k >= 2
    meta = layer.metadata
    _drag(table.canvas, table.axes, 0.2, new, release=False)  # still held: live
    qtbot.waitUntil(lambda: meta["slidescope_classification"]["dab_thresholds"][0] != 0.2)
    assert meta["slidescope_classification"]["dab_thresholds"][0] == pytest.approx(new, abs=0.01)
    _drag(table.canvas, table.axes, new, new)  # let go there
    t1 = dock.current_rules().dab["thresholds"][0]
    assert t1 == pytest.approx(new, abs=0.01)  # a display pixel of the histogram
    assert layer.metadata["slidescope_classification"]["dab_thresholds"][0] == t1
    ids = np.asarray(res.columns["id"])
    neg = np.array(res.classes["Negative"]) / 255
    moved = ids[(dab > 0.2) & (dab <= t1)]
    kept = ids[(dab > t1) & (dab <= 0.4)]
    for i in moved:  # once 1+, now negative: their colour followed
        assert np.allclose(layer.colormap.map(int(i))[:3], neg, atol=1 / 255)
    for i in kept:
        assert np.allclose(
            layer.colormap.map(int(i))[:3], np.array(res.classes["1+"]) / 255, atol=1 / 255
        )
    # the line stays between its neighbours, and the saved rules hold the dragged value
    _drag(table.canvas, table.axes, t1, 0.9)
    t = dock.current_rules().dab["thresholds"]
    assert t[0] < t[1] == pytest.approx(0.4)
    assert t[0] == pytest.approx(0.4, abs=1e-5)
    saved = load_rules(dock.save(tmp_path / "rules.json"))
    assert saved.dab["thresholds"] == tuple(t)
    assert tuple(layer.metadata["slidescope_classification"]["dab_thresholds"]) == tuple(t)
    # a marker's positivity threshold: one line, dragged, into the rules file's markers
    res = classify(viewer, markers={"hematoxylin_od": 0.3})
    hema = np.asarray(res.columns["hematoxylin_od_mean"])
    table.hist_column.setCurrentIndex(table.hist_column.findData("hematoxylin_od_mean"))
    [(marker, index, value, label)] = table.thresholds("hematoxylin_od_mean")
    assert (marker, index, value, label) == ("hematoxylin_od", 0, 0.3, "hematoxylin_od+")
    target = float(np.median(hema))
    _drag(table.canvas, table.axes, 0.3, target)
    rules = dock.current_rules()
    got = rules.markers["hematoxylin_od"]["threshold"]
    assert got == pytest.approx(target, abs=0.02)
    assert dock.mode.currentIndex() == 1
    pos = np.array(layer.metadata["slidescope_classes"]["hematoxylin_od"]) / 255
    for i in ids[hema > got][:20]:
        assert np.allclose(layer.colormap.map(int(i))[:3], pos, atol=1 / 255)
    assert layer.features["hematoxylin_od_positive"].sum() == (hema > got).sum()


def test_classification_dock_counts_cells_per_mm2_in_the_selected_shape(
    make_napari_viewer, tmp_path, qtbot
):
    from napari_slidescope._napari.shapes import aligned, to_layer_coords
    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.sample_cells import make_hdab

    truth = make_hdab(seed=9, shape=(256, 256))
    path = truth.write(tmp_path / "ki67.ome.tif")
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    ctl = session_for(viewer)
    viewer.reset_view()
    ctl.run(image, "nuclei", scope="visible", nuclei_run={**SEG, "segmenter": "builtin"})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    dock = ClassifyWidget(viewer)
    with pytest.raises(ValueError, match="Apply first"):
        dock.count_in_annotation()
    res = dock.apply()
    # a "tumour annotation": the left half of the image, drawn over the slide
    ring = np.array([[0, 0], [0, 128], [256, 128], [256, 0]], float)  # level-0 (row, col)
    shapes = viewer.add_shapes(
        [to_layer_coords(ring)], shape_type="polygon", name="tumour", **aligned(image)
    )
    with pytest.raises(ValueError, match="no shape selected"):
        dock.count_in_annotation()
    shapes.selected_data = {0}
    s = dock.count_in_annotation()
    inside = np.asarray(res.columns["centroid_col"]) < 128
    assert s["cells"] == int(inside.sum()) > 10
    assert s["area_mm2"] == pytest.approx(256 * 128 * truth.mpp**2 / 1e6)
    for name in res.classes:
        n = int((np.asarray(res.columns["class"])[inside] == name).sum())
        assert s[f"{name}_count"] == n
        assert s[f"{name}_per_mm2"] == pytest.approx(n / s["area_mm2"])
    assert "H-score" in dock.status.text()
    assert "/mm²" in dock.status.text()
