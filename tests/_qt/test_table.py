"""The "Nuclei measurements" dock: rows, sorting, range filter, histogram, selection."""

import numpy as np
import pytest

from napari_slidescope._qt.table import NucleiTableModel

pytestmark = pytest.mark.gui


def _table(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "id": np.arange(1, n + 1, dtype=np.int32),
        "area_um2": rng.uniform(10, 300, n),
        "centroid_row": rng.uniform(0, 1000, n),
        "centroid_col": rng.uniform(0, 1000, n),
        "eccentricity": rng.uniform(0, 1, n),
    }


def test_model_sorts_and_filters_with_numpy(qtbot):
    from qtpy.QtCore import Qt

    table = _table()
    model = NucleiTableModel()
    model.set_table(table)
    assert model.rowCount() == 50
    assert model.columns[:2] == ["id", "area_um2"]
    assert model.headerData(1, Qt.Orientation.Horizontal) == "Area (µm²)"
    model.sort(1, Qt.SortOrder.DescendingOrder)
    shown = model.values("area_um2")
    assert np.all(np.diff(shown) <= 0)
    assert shown[0] == table["area_um2"].max()
    model.set_filter("area_um2", 100, 200)
    inside = (table["area_um2"] >= 100) & (table["area_um2"] <= 200)
    assert model.rowCount() == inside.sum()
    assert model.total == 50
    assert np.all(np.diff(model.values("area_um2")) <= 0)  # still sorted
    nid = int(table["id"][inside][0])
    assert model.nucleus_id(model.row_of(nid)) == nid
    assert model.row_of(int(table["id"][~inside][0])) == -1
    # pixel positions read as whole numbers
    i = model.row_of(nid)
    text = model.data(model.index(i, model.columns.index("centroid_row")))
    assert text == f"{int(round(table['centroid_row'][nid - 1])):,}"


def test_table_dock_follows_a_run_and_selection_moves_the_camera(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._napari.viewport import camera_of

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    dock = widget.open_table()
    ctl = widget.session
    ctl.run(image, "tissue", scope="slide")
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    assert dock.tissue.text().startswith("Tissue: ")
    assert "% of the area" in dock.tissue.text()
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    ctl.run(image, "nuclei", region=(0, 0, 512, 768), nuclei_run=seg)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    layer = viewer.layers[f"{image.name} nuclei"]
    n = layer.features.shape[0]
    assert n > 3
    assert dock.model.total == dock.model.rowCount() == n
    assert dock.heading.text().startswith(f"{n} of {n} nuclei shown")
    assert dock.axes.get_xlabel() == "Area (µm²)"  # the histogram, area by default
    assert sum(p.get_height() for p in dock.axes.patches) == n

    # a row selection centres the view on the nucleus and rings it
    dock.view.selectRow(2)
    rec = dock.model.record(2)
    world = np.asarray(image.translate) + np.asarray(image.scale) * (
        np.array([rec["centroid_row"], rec["centroid_col"]]) - 0.5
    )
    np.testing.assert_allclose(camera_of(viewer).center[-2:], world, atol=1e-6)
    ring = viewer.layers[f"{image.name} selected nucleus"]
    np.testing.assert_allclose(ring.data[0], world)
    assert layer.selected_label == int(rec["id"])

    # clicking a nucleus in the viewer selects its row, without moving the view
    other = dock.model.nucleus_id(0)
    centre = tuple(camera_of(viewer).center)
    assert dock.select_nucleus(other)
    assert dock.model.nucleus_id(dock.view.selectionModel().selectedRows()[0].row()) == other
    assert tuple(camera_of(viewer).center) == centre

    # the range filter, and the histogram of what is shown
    areas = layer.features["area_um2"].to_numpy()
    lo = float(np.median(areas))
    dock.set_filter("area_um2", lo, 1e9)
    assert dock.model.rowCount() == int((dock.model._table["area_um2"] >= lo).sum()) < n
    assert sum(p.get_height() for p in dock.axes.patches) == dock.model.rowCount()


def test_hover_values_are_readable(make_napari_viewer, small_slide, qtbot, threshold_segmenter):
    viewer = make_napari_viewer(show=False)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    from napari_slidescope._qt import session

    ctl = session.session_for(viewer)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    ctl.run(image, "nuclei", region=(0, 0, 512, 768), nuclei_run=seg)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    feats = viewer.layers[f"{image.name} nuclei"].features
    # the table's names (the CSV and GeoJSON use them too), shown as whole numbers
    for col in ("centroid_row", "centroid_col", "centroid_y_um", "centroid_x_um"):
        assert np.issubdtype(feats[col].dtype, np.integer), col
    assert "area_um2" in feats.columns
