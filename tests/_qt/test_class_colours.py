"""One source of truth for cell classes (issue 36, item 4): the docks, the legend, the canvas
and the exports show a class in one colour, and each dock starts from what the slide is
(brightfield or fluorescence, its markers) and from its last classification (xvfb-run)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.sample_cells import make_multiplex

pytestmark = pytest.mark.gui
pytest.importorskip("sklearn")


@pytest.fixture
def multiplex_nuclei(make_napari_viewer, tmp_path):
    """A viewer with a multiplex slide (DAPI, CD3, CD8, PanCK, Ki67) and its nuclei layer."""
    from napari_slidescope.viewer import add_nuclei, add_slide

    path = make_multiplex(seed=3, shape=(256, 256)).write(tmp_path / "mx.ome.tif")
    viewer = make_napari_viewer()
    add_slide(viewer, path)
    dapi = next(ly for ly in viewer.layers if "DAPI" in ly.name)
    viewer.layers.selection.active = dapi
    add_nuclei(viewer, segmenter="builtin-fluorescence", target_mpp=0.5)
    return viewer, viewer.layers[f"{dapi.name} nuclei"]


def test_the_docks_follow_a_fluorescence_slide_and_its_last_classification(multiplex_nuclei):
    from napari_slidescope._qt.cell_classifier_dock import CellClassifierWidget
    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope.analysis.class_colors import class_colors
    from napari_slidescope.viewer import classify

    viewer, nuclei = multiplex_nuclei
    rules = ClassifyWidget(viewer)
    # no DAB on a fluorescence slide: IHC scoring is not offered, rules are
    assert rules.mode.currentText() == "Phenotype rules"
    assert not rules.mode.model().item(0).isEnabled()
    assert "CD8" in rules.status.text()
    forest = CellClassifierWidget(viewer)
    assert forest.layer is nuclei
    # the markers, not tumour / lymphocyte / stroma, and the registry's colours
    assert list(forest.classes) == ["CD3+", "CD8+", "Ki67+", "PanCK+", "Other"]
    assert forest.classes == class_colors(forest.classes)
    # classified by markers in the console: both docks open on that classification
    result = classify(viewer, layer=nuclei, phenotypes={"T cell": "CD3+", "Tumor": "PanCK+"})
    again = ClassifyWidget(viewer)
    assert again.mode.currentText() == "Phenotype rules"
    assert again.current_rules().phenotypes == result.classification["rules"]["phenotypes"]
    later = CellClassifierWidget(viewer)
    assert later.classes == dict(result.classes)
    assert later.classes["Tumor"] == (200, 0, 0)  # QuPath's Tumor, in every dock


def test_dock_legend_canvas_and_export_agree_on_class_colours(multiplex_nuclei, tmp_path):
    import json

    from napari_slidescope import train_classifier
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope._qt.cell_classifier_dock import CellClassifierWidget
    from napari_slidescope.viewer import classify

    viewer, nuclei = multiplex_nuclei
    dock = CellClassifierWidget(viewer)
    for name in list(dock.classes):
        dock.remove_class(name)
    for name in ("Tumor", "Lymphocyte", "Stroma"):
        dock.add_class(name)  # colours from the registry, not from the list's order
    table = canvas_of(nuclei).table()
    ids = np.asarray(table["id"])
    big = np.asarray(table["area_um2"]) > np.median(table["area_um2"])
    examples = {int(i): ("Tumor" if b else "Lymphocyte") for i, b in zip(ids, big, strict=True)}
    examples.update({int(ids[k]): "Stroma" for k in range(0, len(ids), 7)})
    # trained in the console without colours: its classes sort Lymphocyte, Stroma, Tumor
    clf = train_classifier(table, examples)
    result = classify(viewer, layer=nuclei, classifier=clf)
    for name in ("Tumor", "Lymphocyte", "Stroma"):
        assert result.classes[name] == dock.classes[name], name  # legend == dock
    i, c = int(result.table["id"][0]), str(result.table["class"][0])
    want = np.array(result.classes[c]) / 255
    assert np.allclose(nuclei.colormap.map(i)[:3], want, atol=1 / 255)  # canvas
    out = result.to_geojson(tmp_path / "cells.geojson")
    feats = json.loads(out.read_text())["features"]
    named = [f["properties"]["classification"] for f in feats]
    colours = {c["name"]: c["color"] for c in named}
    assert set(colours) == set(result.table["class"].tolist())
    for name, rgb in colours.items():
        assert tuple(rgb) == dock.classes[name]  # export
