"""The "Cell classifier" dock: examples by clicking, live training, preview, legend, saving."""

import numpy as np
import pytest

from napari_slidescope._napari.viewport import camera_of

pytest.importorskip("sklearn")
pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def cells_slide(tmp_path_factory):
    """A synthetic H&E slide with three nucleus populations (256 µm at 0.5 µm/px)."""
    from napari_slidescope.sample_cell_types import write_cells_slide

    path = tmp_path_factory.mktemp("cells") / "cells.svs"
    truth = write_cells_slide(path, 256, mpp=0.5, seed=3)
    return path, truth


class _Click:
    """What napari hands a mouse callback, for a press at a world position."""

    def __init__(self, position):
        self.position = position
        self.view_direction = None
        self.dims_displayed = [0, 1]


def test_mark_train_preview_legend_and_save(dock_slide, cells_slide, qtbot, tmp_path, monkeypatch):
    from napari.utils.colormaps import DirectLabelColormap

    from napari_slidescope._qt import cell_classifier_dock as cell_classifier
    from napari_slidescope._qt.cell_classes_dock import LEGEND_NAME
    from napari_slidescope.pipeline.cell_classes import classify_cells
    from napari_slidescope.pipeline.cell_forest import load_classifier
    from napari_slidescope.sample_cell_types import CLASS_NAMES

    path, truth = cells_slide
    viewer, [image], analysis = dock_slide(path)
    ctl = analysis.session
    seg = {"segmenter": "builtin", "target_mpp": 0.5, "workers": 1}
    ctl.run(image, "nuclei", region=(0, 0, 512, 512), nuclei_run=seg)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    _, dock = viewer.window.add_plugin_dock_widget(
        "napari-slidescope", "Cell classifier", tabify=True
    )
    layer = dock.layer
    assert layer is not None
    assert layer.name.endswith("nuclei")
    plain = layer.colormap  # the segmentation's own colours, before any class colours them
    # classes: add, rename, remove
    assert list(dock.classes) == ["Tumor", "Lymphocyte", "Stroma"]
    dock.rename_class("Stroma", "Spindle")
    dock.add_class("Necrosis")
    dock.remove_class("Necrosis")
    assert list(dock.classes) == ["Tumor", "Lymphocyte", "Spindle"]
    table = dock._table()
    cls = truth.class_at(table["centroid_y_um"], table["centroid_x_um"])
    # examples: clicks on nuclei with the class selected (5 per class)
    dock.mark_button.setChecked(True)
    for k, name in enumerate(CLASS_NAMES):
        dock.select_class(name)
        for r in np.flatnonzero(cls == k)[:5]:
            world = image.data_to_world((table["centroid_row"][r], table["centroid_col"][r]))
            before = len(dock.examples)
            dock._on_viewer_click(viewer, _Click(tuple(world)))
            if len(dock.examples) == before:  # the centroid missed its nucleus
                dock.mark(int(table["id"][r]))
    assert {c: list(dock.examples.values()).count(c) for c in CLASS_NAMES} == dict.fromkeys(
        CLASS_NAMES, 5
    )
    # the example points, coloured by class
    points = viewer.layers[f"{layer.name} examples"]
    assert len(points.data) == 15
    # live preview: trained after the clicks, nuclei in view coloured by class
    assert dock.classifier is not None
    assert set(dock.classifier.class_names) == set(CLASS_NAMES)
    assert isinstance(layer.colormap, DirectLabelColormap)
    in_view = dock._visible_rows(table)
    assert 0 < in_view.size < len(table["id"])  # the preview colours the nuclei in view
    some = int(table["id"][[r for r in in_view if cls[r] == 0][-1]])
    lym = tuple(v / 255 for v in dock.classes["Lymphocyte"])
    np.testing.assert_allclose(layer.colormap.color_dict[some][:3], lym)
    assert "Lymphocyte" in dock.legend.text()
    assert "Tumor" in dock.legend.text()
    # too many nuclei in view: the preview waits for a closer view
    monkeypatch.setattr(cell_classifier, "PREVIEW_MAX", 3)
    assert dock.preview() == {}
    assert "zoom in" in dock.legend.text()
    monkeypatch.undo()
    # unmark with a second click, re-mark
    first = next(iter(dock.examples))
    name = dock.examples[first]
    dock.mark(first, name)
    assert first not in dock.examples
    dock.mark(first, name)
    dock.last_counts = {}
    dock.classify_all()  # (waiting on its finished signal races a worker that ends first)
    qtbot.waitUntil(lambda: "Classified" in dock.status.text(), timeout=60_000)
    counts = dock.last_counts
    assert "class" in layer.features
    assert LEGEND_NAME in viewer.window.dock_widgets
    viewer.reset_view()
    qtbot.wait(200)
    viewer.screenshot(str(tmp_path / "cell_classes.png"), canvas_only=False)
    camera_of(viewer).zoom *= 3
    qtbot.wait(200)
    viewer.screenshot(str(tmp_path / "cell_classes_zoom.png"), canvas_only=True)
    # the whole layer: same classes as classify_cells with the same classifier
    res = classify_cells(canvas_of_layer(layer).to_result(), classifier=dock.classifier)
    expect = {c: int((res.columns["class"] == c).sum()) for c in dock.classifier.class_names}
    assert counts == expect
    assert sum(counts.values()) == len(table["id"])
    right = (res.columns["class"] == np.asarray(CLASS_NAMES)[cls.clip(0)])[cls >= 0]
    assert right.mean() > 0.7  # 5 examples per class; the benchmark measures accuracy
    # a selected shape: the nuclei inside it, counts and densities in the legend
    corners = [(0, 0), (0, 512), (256, 512), (256, 0)]
    ring = np.array([image.data_to_world(p) for p in corners])
    shapes = viewer.add_shapes([ring], shape_type="polygon", name="region")
    shapes.selected_data = {0}
    viewer.layers.selection.active = shapes
    in_shape = dock.classify_in_shape()
    top = np.asarray(res.columns["centroid_row"]) < 256
    want = {c: int((res.columns["class"][top] == c).sum()) for c in dock.classifier.class_names}
    assert in_shape == want
    assert "in the shape" in dock.legend.text()
    assert "/mm²" in dock.legend.text()
    viewer.reset_view()
    qtbot.wait(200)
    viewer.screenshot(str(tmp_path / "cell_classes_shape.png"), canvas_only=False)
    # saving through the button's file dialog: the file loads to the same classifier
    from qtpy.QtWidgets import QFileDialog

    saved = tmp_path / "cells.npz"
    chosen = staticmethod(lambda *args, **kwargs: (str(saved), ""))
    monkeypatch.setattr(QFileDialog, "getSaveFileName", chosen)
    dock.save_button.click()
    assert dock.status.text() == "Saved cells.npz"
    assert load_classifier(saved).sha256 == dock.classifier.sha256
    # loading it back (into a fresh dock): its classes join the list and it previews
    other = cell_classifier.CellClassifierWidget(viewer)
    # a fresh dock starts from the layer's last classification, in its colours
    assert other.classes == layer.metadata["slidescope_classes"]
    other.remove_class("Spindle")
    other.load_classifier(saved)
    assert other.classifier.sha256 == dock.classifier.sha256
    assert set(CLASS_NAMES) <= set(other.classes)
    assert other.classes["Spindle"] == dock.classes["Spindle"]
    bad = tmp_path / "bad.npz"
    bad.write_text("not a classifier")
    chosen = staticmethod(lambda *args, **kwargs: (str(bad), ""))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", chosen)
    other.load_button.click()  # the error goes to the status line, the classifier stays
    assert "bad.npz: not a napari-slidescope classifier" in other.status.text()
    assert other.classifier.sha256 == dock.classifier.sha256
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: ("", "")))
    other.load_button.click()  # the dialog cancelled: nothing happens
    assert "bad.npz" in other.status.text()
    assert layer.colormap != plain  # (the loaded classifier coloured the nuclei)
    dock.show_plain_colors()
    assert layer.colormap == plain


def canvas_of_layer(layer):
    from napari_slidescope._napari.layers import canvas_of

    return canvas_of(layer)


def test_no_layer_and_bad_names_are_clear(make_napari_viewer, qtbot):
    from napari_slidescope._qt.cell_classifier_dock import CellClassifierWidget

    viewer = make_napari_viewer()
    dock = CellClassifierWidget(viewer)
    assert dock.layer is None
    with pytest.raises(ValueError, match="already used"):
        dock.add_class("Tumor")
    with pytest.raises(ValueError, match="not one of the classes"):
        dock.mark(3, "Nope")
    with pytest.raises(ValueError, match="nothing to save"):
        dock.save_classifier("x.npz")
    dock.mark(3, "Tumor")
    dock.mark(4, "Lymphocyte")  # live training finds no nuclei layer: said in the status
    assert "no nuclei layer" in dock.status.text()
