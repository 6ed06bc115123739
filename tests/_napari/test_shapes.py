"""Tissue as outlines: smooth polygons aligned in µm, areas shown, edits exported (xvfb-run)."""

import json

import numpy as np
import pytest

from napari_slidescope._napari import shapes as _shapes

pytestmark = pytest.mark.gui


def test_smooth_ring_rounds_corners_and_keeps_area():
    square = np.array([[0, 0], [0, 10], [10, 10], [10, 0]], float)
    ring = _shapes.smooth_ring(square, 2)
    assert len(ring) == 16
    assert ring[:, 0].min() >= 0  # inside the original
    assert ring[:, 0].max() <= 10
    assert 0.8 * 100 < _shapes.ring_area(ring) < 100


def test_tissue_is_shapes_aligned_in_world_with_areas_and_edits_exported(
    make_napari_viewer, small_slide, qtbot, tmp_path
):
    from napari.layers import Shapes

    from napari_slidescope._qt.session import session_for

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (100.0, -40.0)  # a moved slide: the outlines must follow it
    ctl = session_for(viewer)
    ctl.run(image, "tissue", scope="slide")
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    layer = viewer.layers[f"{image.name} tissue"]
    result = ctl.tissue_result(image)
    assert isinstance(layer, Shapes)
    assert len(result.polygons) >= 1
    feats = layer.features
    tissue = feats["role"] == "tissue"
    assert tissue.sum() == len(result.polygons)
    # vertex positions in world coordinates: level-0 (row, col) -> µm on the slide
    ring = result.polygons[0]
    smooth = _shapes.smooth_ring(ring, 2)
    world = np.array([layer.data_to_world(v) for v in layer.data[0]])
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    np.testing.assert_allclose(world, t + s * (smooth - 0.5), atol=1e-6)
    # and the slide's level-0 pixel (r, c) (spanning [r, r + 1) in ring coordinates) is
    # centred at world t + s * (r, c): the same mapping
    np.testing.assert_allclose(image.data_to_world([10.0, 20.0]), t + s * [10, 20])
    # areas: each piece's area (holes deducted) within a few % of the mask's area
    total = float(feats["area_um2"][tissue].sum())
    assert total == pytest.approx(result.area_um2, rel=0.05)
    assert str(feats["area_label"].iloc[0]).endswith("mm²")
    # exports reflect edits: delete the largest piece, the export loses it
    path = tmp_path / "t.geojson"
    _shapes.tissue_export(layer).to_geojson(path)
    before = json.loads(path.read_text())["features"]
    assert len(before) == len(result.polygons)
    layer.selected_data = {0}
    layer.remove_selected()
    _shapes.tissue_export(layer).to_geojson(path)
    after = json.loads(path.read_text())["features"]
    assert len(after) == len(before) - 1
    xy = np.asarray(after[0]["geometry"]["coordinates"][0])[:-1]
    rest = [_shapes.smooth_ring(p, 2) for p in result.polygons[1:]]
    assert any(len(r) == len(xy) and np.allclose(r[:, ::-1], xy, atol=1e-3) for r in rest)


def test_a_new_tissue_result_replaces_the_old_one_in_the_same_layer(
    make_napari_viewer, small_slide, qtbot
):
    from napari_slidescope import detect_tissue

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    whole = detect_tissue(small_slide)
    part = detect_tissue(small_slide, region=(0, 0, 512, 512))
    assert len(whole.polygons) != len(part.polygons) or whole.area_um2 != part.area_um2
    first = _shapes.show_tissue(viewer, image, whole)
    n_layers = len(viewer.layers)
    second = _shapes.show_tissue(viewer, image, part)
    assert second is first  # updated, not re-added
    assert len(viewer.layers) == n_layers
    feats = second.features
    tissue = feats["role"] == "tissue"
    assert len(second.data) == len(feats) == len(part.polygons) + sum(map(len, part.holes))
    assert float(feats["area_um2"][tissue].sum()) == pytest.approx(part.area_um2, rel=0.05)
    assert all(str(v).endswith("mm²") for v in feats["area_label"][tissue])
    assert second.metadata["slidescope_tissue"] is part
    ring = _shapes.smooth_ring(part.polygons[0], 2)
    np.testing.assert_allclose(second.data[0], ring - 0.5, atol=1e-6)
    # edits after the replacement still update the areas
    second.selected_data = {0}
    second.remove_selected()
    assert len(second.features) == len(second.data)


def test_analyse_inside_the_selected_shape(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline.nuclei import segment_nuclei
    from napari_slidescope.pipeline.regions import inside_polygon

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (30.0, 60.0)
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    ring = np.array([[100.0, 200.0], [150.0, 1300.0], [900.0, 900.0], [700.0, 250.0]])
    world = t + s * (ring - 0.5)  # a polygon drawn in world coordinates (µm)
    shapes = viewer.add_shapes([world], shape_type="polygon", name="drawn")
    shapes.selected_data = {0}
    np.testing.assert_allclose(_shapes.selected_polygon(viewer, image), ring, atol=1e-6)
    ctl = session_for(viewer)
    opts = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}
    ctl.run(image, "nuclei", scope="shape", nuclei_run={**opts, "segmenter": threshold_segmenter()})
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    table = _layers_canvas(viewer, image).table()
    assert table["id"].size > 0
    assert inside_polygon(table["centroid_row"], table["centroid_col"], ring).all()
    ref = segment_nuclei(
        str(small_slide), region=ring, segmenter=threshold_segmenter(), tissue="auto", **opts
    )
    assert table["id"].size == ref.count
    np.testing.assert_allclose(np.sort(table["area_um2"]), np.sort(ref.columns["area_um2"]))


def _layers_canvas(viewer, image):
    from napari_slidescope._napari.layers import canvas_of

    return canvas_of(viewer.layers[f"{image.name} nuclei"])


def test_a_polygon_run_records_the_polygon_as_analysed(
    make_napari_viewer, small_slide, qtbot, threshold_segmenter
):
    from napari_slidescope._qt.session import session_for
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    triangle = np.array([[0.0, 0.0], [0.0, 1024.0], [768.0, 0.0]])
    box = (0, 0, 768, 1024)  # the triangle's bounding box
    ctl = session_for(viewer)
    opts = {"target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}
    opts["segmenter"] = threshold_segmenter()
    ctl.run(image, "nuclei", region=triangle, nuclei_run=opts)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    canvas = _layers_canvas(viewer, image)
    np.testing.assert_allclose(canvas.regions[-1], triangle)
    first = int(canvas.table()["id"].size)
    # the rest of the box, analysed next in "add" mode, is new ground: its nuclei count
    ctl.run(image, "nuclei", region=box, mode="add", nuclei_run=opts)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    table = canvas.table()
    ref = segment_nuclei(str(small_slide), region=box, tissue="auto", **opts)
    assert 0 < first < table["id"].size == ref.count
    assert np.unique(table["id"]).size == table["id"].size


def test_tissue_area_inside_a_polygon_is_the_polygon_s():
    from types import SimpleNamespace

    from napari_slidescope._qt.session import tissue_area_um2

    tissue = SimpleNamespace(
        mask=np.ones((100, 100), bool), mpp=2.0, origin=(0.0, 0.0), downsample=(2.0, 2.0)
    )  # 200 x 200 level-0 px of tissue, 4 µm² per mask pixel
    triangle = np.array([[0.0, 0.0], [0.0, 200.0], [200.0, 0.0]])
    assert tissue_area_um2(tissue, [(0, 0, 200, 200)]) == pytest.approx(40_000)
    assert tissue_area_um2(tissue, [triangle]) == pytest.approx(20_000, rel=0.03)
    # the union: a triangle inside a box adds nothing
    assert tissue_area_um2(tissue, [(0, 0, 200, 200), triangle]) == pytest.approx(40_000)


def test_finished_tiles_of_a_polygon_run_count_only_inside_the_polygon():
    from types import SimpleNamespace

    from napari_slidescope._qt.session import _core_area

    triangle = np.array([[0.0, 0.0], [0.0, 200.0], [200.0, 0.0]])
    run = SimpleNamespace(polygon=triangle)
    part = _core_area(run, (0, 100, 100, 200))  # a tile the hypotenuse halves
    assert np.asarray(part).ndim == 2
    assert np.asarray(part).max(axis=0)[1] <= 200
    assert _core_area(run, (150, 150, 200, 200)) == (150, 150, 150, 150)  # outside: empty
    assert _core_area(SimpleNamespace(polygon=None), (0, 0, 10, 10)) == (0, 0, 10, 10)
