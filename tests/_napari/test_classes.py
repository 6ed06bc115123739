"""Cell classes in napari: class colours, legend, cells layer, classified GeoJSON (xvfb-run)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gui

SEG = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}


def test_classify_colours_nuclei_by_class_with_a_legend(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._napari.session import controller_for
    from napari_slidescope.viewer import classify

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = controller_for(viewer)
    options = {**SEG, "segmenter": threshold_segmenter()}
    ctl.run(image, "nuclei", scope="slide", nuclei_options=options)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    layer = viewer.layers[f"{image.name} nuclei"]
    od = layer.features["hematoxylin_od_mean"].to_numpy()
    t = float(np.median(od))  # half the nuclei above: two classes
    # the synthetic H&E slide has no DAB: score its hematoxylin as if it were
    from napari_slidescope._napari.classes import _legend, show_classes
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope.pipeline.classify import classify_cells

    result = canvas_of(layer).to_result()
    result.table["dab_od_mean"] = np.asarray(result.table["hematoxylin_od_mean"])
    res = classify_cells(result, dab=(t, t + 5, t + 10))
    show_classes(layer, res)
    dock = _legend(viewer, res, 0.5)
    ids, cls = res.table["id"], res.table["class"]
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
    from napari_slidescope._napari.classify_widget import ClassifyWidget
    from napari_slidescope._napari.session import controller_for
    from napari_slidescope.pipeline.classify import load_rules
    from napari_slidescope.sample_cells import make_hdab

    path = make_hdab(seed=9, shape=(256, 256)).write(tmp_path / "ki67.ome.tif")
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    ctl = controller_for(viewer)
    viewer.reset_view()
    ctl.run(image, "nuclei", scope="visible", nuclei_options={**SEG, "segmenter": "builtin"})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    dock = ClassifyWidget(viewer)
    res = dock.apply()
    assert set(res.table["class"]) <= {"Negative", "1+", "2+", "3+"}
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
