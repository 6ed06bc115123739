"""Cells drawn live by a run of the "Slide analysis" dock with cell expansion (xvfb-run)."""

import warnings

import numpy as np
import pytest

from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.viewport import camera_of, visible_region
from napari_slidescope.errors import SlidescopeWarning

pytestmark = pytest.mark.gui

SEG = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}


def _wait(qtbot, ctl, timeout=60_000):
    qtbot.waitUntil(lambda: not ctl.busy, timeout=timeout)


def _view(viewer, qtbot, center=(260.0, 380.0), zoom=2.0):
    camera_of(viewer).center = center  # µm: a part of the small slide
    camera_of(viewer).zoom = zoom
    qtbot.wait(30)


def _each_cell_holds_its_nucleus(nuclei, cells):
    inside = nuclei > 0
    assert inside.any()
    np.testing.assert_array_equal(cells[inside], nuclei[inside])


def test_visible_region_run_with_cell_expansion_draws_cells(dock_slide, small_slide, qtbot):
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    viewer, [image], widget = dock_slide(small_slide)
    _view(viewer, qtbot)
    region = visible_region(viewer, image)
    widget.task.value = "nuclei"
    widget.scope.value = "visible"
    widget.mode.value = "replace"
    widget.segmenter.value = "builtin"
    widget.nuclei_mpp.value = 0.5
    widget.cell_expansion_um.value = 3.0
    assert widget.run_options()["nuclei_run"].options.cell_expansion_um == 3.0
    assert widget.run() is not None
    _wait(qtbot, widget.session)
    nuclei = viewer.layers[f"{image.name} nuclei"]
    cells = viewer.layers[f"{image.name} cells"]
    assert cells.contour == 1
    assert not cells.multiscale
    np.testing.assert_allclose(cells.scale, nuclei.scale)
    np.testing.assert_allclose(cells.translate, nuclei.translate)
    assert cells.data.shape == nuclei.data.shape
    # the same ids as the nuclei, each cell around its nucleus
    assert set(np.unique(cells.data)) == set(np.unique(nuclei.data))
    _each_cell_holds_its_nucleus(nuclei.data, cells.data)
    assert (cells.data > 0).sum() > (nuclei.data > 0).sum()
    # the library's cells of the same region and options, pixel for pixel
    with warnings.catch_warnings():  # a small region: the live run fell back the same way
        warnings.filterwarnings("ignore", "stain estimation fell back", SlidescopeWarning)
        ref = segment_nuclei(
            str(small_slide), region=region, segmenter="builtin", target_mpp=0.5,
            cell_expansion_um=3.0,
        )  # fmt: skip
    assert ref.count == int(nuclei.features.shape[0]) > 3
    np.testing.assert_array_equal(nuclei.data, ref.labels)
    np.testing.assert_array_equal(cells.data, ref.cells)
    # the compartments are in the table, and the canvas's result carries the cells
    assert "cytoplasm_area_um2" in nuclei.features.columns or any(
        "cytoplasm" in c for c in nuclei.features.columns
    )
    res = _layers.canvas_of(nuclei).to_result()
    assert res.has_cells
    np.testing.assert_array_equal(res.cells, ref.cells)
    # a run without cell expansion replaces the nuclei and draws no cells
    widget.cell_expansion_um.value = widget.cell_expansion_um.min
    assert widget.run_options()["nuclei_run"].options.cell_expansion_um is None
    widget.run()
    _wait(qtbot, widget.session)
    assert f"{image.name} cells" not in viewer.layers
    assert int(viewer.layers[f"{image.name} nuclei"].features.shape[0]) == ref.count


def test_run_without_cell_expansion_adds_no_cells_layer(dock_slide, small_slide, qtbot):
    viewer, [image], widget = dock_slide(small_slide)
    _view(viewer, qtbot)
    widget.task.value = "nuclei"
    widget.scope.value = "visible"
    widget.segmenter.value = "builtin"
    widget.nuclei_mpp.value = 0.5
    widget.cell_expansion_um.value = widget.cell_expansion_um.min  # "off"
    widget.run()
    _wait(qtbot, widget.session)
    assert int(viewer.layers[f"{image.name} nuclei"].features.shape[0]) > 0
    assert f"{image.name} cells" not in viewer.layers


def test_add_skips_duplicate_cells_and_cancel_keeps_them(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    opts = {**SEG, "segmenter": threshold_segmenter(), "cell_expansion_um": 2.0}
    first, second = (200, 300, 500, 700), (400, 500, 800, 1000)  # overlapping boxes
    ctl.run(image, "nuclei", region=first, mode="replace", nuclei_run=opts)
    _wait(qtbot, ctl)
    ctl.run(image, "nuclei", region=second, mode="add", nuclei_run=opts)
    _wait(qtbot, ctl)
    nuclei = viewer.layers[f"{image.name} nuclei"]
    cells = viewer.layers[f"{image.name} cells"]
    ids = np.unique(nuclei.data)
    assert set(np.unique(cells.data)) == set(ids.tolist())
    assert int(nuclei.features.shape[0]) == ids.size - 1  # no duplicates
    _each_cell_holds_its_nucleus(nuclei.data, cells.data)
    np.testing.assert_allclose(cells.translate, nuclei.translate)
    # growing into a whole-slide pyramid keeps the cells drawn so far, in place
    dense = _layers.canvas_of(nuclei)
    assert dense.downsample == (1.0, 1.0)
    _, pyr, _, _ = _layers.prepare_nuclei_layer(
        viewer, image, (0, 0, *image.data[0].shape[:2]), dense.downsample, mode="add",
        pyramid=True, cells=True,
    )  # fmt: skip
    moved = _layers.prepare_cells_layer(viewer, image, pyr)
    assert moved.multiscale
    assert moved.contour == 1
    (oy, ox), (h, w) = (int(v) for v in dense.origin), dense.cells.shape
    np.testing.assert_array_equal(np.asarray(moved.data[0])[oy : oy + h, ox : ox + w], dense.cells)
    # a cancelled run keeps the cells of the tiles it finished
    from tests.fakes import GatedSegmenter

    gated = GatedSegmenter(threshold_segmenter(), free=2)
    opts = {**opts, "segmenter": gated}
    worker = ctl.run(image, "nuclei", scope="slide", mode="replace", nuclei_run=opts)
    run = ctl._run
    # the two tiles let through are shown (their post-processing may still be running when
    # the third reaches the gate), the third is held
    qtbot.waitUntil(lambda: run.pbar.n >= 2 and gated.held.is_set(), timeout=60_000)
    ctl.cancel()
    gated.gate.set()
    assert ctl.outcome.state == "cancelled"
    qtbot.waitUntil(lambda: not worker.is_running, timeout=60_000)
    qtbot.wait(50)  # tiles that finished after Cancel (on disk already) are counted too
    nuclei = viewer.layers[f"{image.name} nuclei"]
    cells = viewer.layers[f"{image.name} cells"]
    assert cells.multiscale
    ids = set(np.unique(np.asarray(nuclei.data[0])).tolist()) - {0}
    assert ids
    assert ids == set(nuclei.features["index"].tolist())
    assert set(np.unique(np.asarray(cells.data[0])).tolist()) - {0} == ids


def test_whole_slide_cells_are_a_multiscale_layer(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    viewer = make_napari_viewer(show=True)
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = session_for(viewer)
    opts = {**SEG, "cell_expansion_um": 3.0}
    ctl.run(image, "nuclei", scope="slide", nuclei_run={**opts, "segmenter": threshold_segmenter()})
    _wait(qtbot, ctl)
    nuclei = viewer.layers[f"{image.name} nuclei"]
    cells = viewer.layers[f"{image.name} cells"]
    assert nuclei.multiscale
    assert cells.multiscale
    assert len(cells.data) == len(nuclei.data) >= 2
    assert cells.contour == 1
    np.testing.assert_allclose(cells.scale, nuclei.scale)
    np.testing.assert_allclose(cells.translate, nuclei.translate)
    ref = segment_nuclei(
        str(small_slide), segmenter=threshold_segmenter(), tissue=ctl.tissue_result(image),
        **opts,
    )  # fmt: skip
    assert ref.count > 20
    h, w = ref.cells.shape
    np.testing.assert_array_equal(np.asarray(nuclei.data[0])[:h, :w], ref.labels)
    np.testing.assert_array_equal(np.asarray(cells.data[0])[:h, :w], ref.cells)
    # the result exports the cells' outlines too
    res = _layers.canvas_of(nuclei).to_result()
    assert res.has_cells
    assert set(res.cell_outlines[1].tolist()) == set(ref.columns["id"].tolist())
    # classes colour the nuclei layer, and the cells in the same colours
    from napari_slidescope._qt.cell_classes_dock import show_classes
    from napari_slidescope.pipeline.cell_classes import classify_cells

    od = np.asarray(res.columns["hematoxylin_od_mean"])
    res.columns["dab_od_mean"] = od  # an H&E slide: score its hematoxylin as if it were DAB
    t = float(np.median(od))
    classified = classify_cells(res, dab=(t, t + 5, t + 10))
    show_classes(nuclei, classified)
    assert set(classified.columns["class"]) == {"Negative", "1+"}
    for i, c in zip(classified.columns["id"][:20], classified.columns["class"][:20], strict=True):
        want = np.array(classified.classes[str(c)]) / 255
        assert np.allclose(nuclei.colormap.map(int(i))[:3], want, atol=1 / 255)
        assert np.allclose(cells.colormap.map(int(i))[:3], want, atol=1 / 255)
    assert "class" in nuclei.features.columns
