"""A polygon region: the nuclei of its bounding box whose centroid lies inside it."""

import numpy as np
import pytest

from napari_slidescope.pipeline.regions import inside_polygon, split_region


def test_split_region_boxes_polygons_and_shapely():
    assert split_region((1, 2, 3, 4)) == ((1, 2, 3, 4), None)
    assert split_region(None) == (None, None)
    box, ring = split_region([(10.5, 20), (10.5, 80), (60, 50)])
    assert box == (10, 20, 60, 80)
    assert ring.shape == (3, 2)
    import shapely.geometry as shapely

    box, ring = split_region(shapely.Polygon([(20, 10), (80, 10), (50, 60)]))  # (x, y)
    assert box == (10, 20, 60, 80)
    np.testing.assert_array_equal(ring[0], [10, 20])
    with pytest.raises(ValueError, match="3 finite"):
        split_region([(0, 0), (1, 1)])
    assert inside_polygon(np.array([30.0, 5.0]), np.array([50.0, 5.0]), ring).tolist() == [
        True,
        False,
    ]


def test_polygon_region_equals_box_run_filtered_by_centroid(sample_slide):
    from napari_slidescope.pipeline.nuclei import segment_nuclei
    from napari_slidescope.pipeline.tissue import detect_tissue

    path, _ = sample_slide
    poly = np.array([[300.0, 400.0], [300.0, 1400.0], [1100.0, 1000.0], [900.0, 450.0]])
    box, _ = split_region(poly)
    opts = {"target_mpp": 0.5, "tissue": False, "workers": 1, "segmenter": "builtin"}
    full = segment_nuclei(str(path), region=box, **opts)
    part = segment_nuclei(str(path), region=poly, **opts)
    inside = inside_polygon(full.columns["centroid_row"], full.columns["centroid_col"], poly)
    assert 0 < inside.sum() < full.count
    assert part.count == int(inside.sum())
    np.testing.assert_allclose(
        np.sort(part.columns["area_um2"]), np.sort(full.columns["area_um2"][inside])
    )
    # the labels: the box run's labels with the nuclei outside the polygon erased
    expected = np.where(np.isin(full.labels, full.columns["id"][~inside]), 0, full.labels)
    np.testing.assert_array_equal(part.labels, expected)
    # tissue clipped to the polygon: none outside it
    tissue = detect_tissue(str(path), region=poly)
    clipped = detect_tissue(str(path), region=box)
    assert 0 < tissue.area_px < clipped.area_px


def _ring_area(ring):
    r, c = np.asarray(ring, float).T
    return abs(np.dot(r, np.roll(c, 1)) - np.dot(c, np.roll(r, 1))) / 2


def test_clip_area_keeps_the_part_inside_a_box():
    from napari_slidescope.pipeline.regions import clip_area, inside_region

    triangle = np.array([[0.0, 0.0], [0.0, 100.0], [100.0, 0.0]])
    part = clip_area(triangle, (0, 0, 50, 50))  # the lower-left square of the triangle
    assert _ring_area(part) == pytest.approx(50 * 50)
    part = clip_area(triangle, (0, 50, 50, 100))  # a square the hypotenuse halves
    assert _ring_area(part) == pytest.approx(50 * 50 / 2)
    assert clip_area(triangle, (60, 60, 90, 90)) is None  # beyond the hypotenuse
    assert clip_area((0, 0, 10, 10), (5, 5, 20, 20)) == (5, 5, 10, 10)
    assert clip_area((0, 0, 10, 10), (10, 0, 20, 10)) is None
    # a concave ring (a U): clipped to its lower half, the gap stays outside
    u = np.array(
        [[0, 0], [30, 0], [30, 10], [10, 10], [10, 20], [30, 20], [30, 30], [0, 30]], float
    )
    part = clip_area(u, (15, 0, 30, 30))
    rows, cols = np.array([20.0, 20.0, 20.0, 5.0]), np.array([5.0, 15.0, 25.0, 15.0])
    np.testing.assert_array_equal(inside_region(rows, cols, part), [True, False, True, False])
    np.testing.assert_array_equal(
        inside_region(rows, cols, (0, 0, 10, 20)), [False, False, False, True]
    )
