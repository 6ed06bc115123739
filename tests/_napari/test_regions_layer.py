"""Tissue regions in napari: examples from a Shapes layer, the class map as a Labels layer."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import RegionMap, Stroke
from napari_slidescope._napari.regions import examples_from_shapes, show_regions


def test_shapes_become_strokes_and_polygons():
    from napari.layers import Shapes

    layer = Shapes(
        [
            np.array([[10.0, 10], [10, 60], [30, 90]]),
            np.array([[100.0, 100], [100, 150], [150, 150], [150, 100]]),
            np.array([[200.0, 200], [200, 260], [240, 260], [240, 200]]),
            np.array([[5.0, 5], [6, 6]]),
        ],
        shape_type=["path", "polygon", "ellipse", "line"],
        features={"class": ["Tumor", "Stroma", "Stroma", ""]},
    )
    ex = examples_from_shapes(layer, stroke_width_um=15.0)
    assert set(ex) == {"Tumor", "Stroma"}  # the unclassified line is left out
    (stroke,) = ex["Tumor"]
    assert isinstance(stroke, Stroke) and stroke.width_um == 15.0
    assert np.allclose(stroke.vertices[0], [10.5, 10.5])  # data -> level-0 pixel centres
    poly, ellipse = ex["Stroma"]
    assert poly.shape == (4, 2) and ellipse.shape[0] > 8
    assert np.allclose(ellipse.mean(axis=0), [220.5, 230.5])


def test_region_map_is_drawn_over_the_slide():
    from napari.components import ViewerModel

    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((4096, 4096), np.uint8), name="slide", scale=(0.5, 0.5))
    labels = np.zeros((600, 512), np.uint8)
    labels[:300] = 1
    labels[300:] = 2
    rm = RegionMap(
        labels=labels,
        classes=("Tumor", "Stroma"),
        colors={"Tumor": (255, 0, 0), "Stroma": (0, 255, 0)},
        ignore=(),
        downsample=(4.0, 4.0),
        origin=(1600.0, 0.0),
        mpp=2.0,
        region=(1600, 0, 4000, 2048),
    )
    layer = show_regions(viewer, image, rm)
    assert layer.name == "slide regions" and layer.multiscale
    assert layer.data[0] is labels
    assert np.allclose(layer.scale, (2.0, 2.0))
    # the map's pixel (0, 0) covers level-0 [1600, 1604) x [0, 4): centre 1601.5, 1.5
    assert np.allclose(layer.data_to_world((0, 0)), (0.5 * 1601.5, 0.5 * 1.5))
    assert np.allclose(layer.colormap.map(np.array([1]))[0], (1, 0, 0, 1))
    again = show_regions(viewer, image, rm)
    assert again is layer and len(viewer.layers) == 2


def test_area_figures_of_a_hand_made_map():
    labels = np.array([[0, 1, 1], [2, 2, 3]], np.uint8)
    rm = RegionMap(
        labels, ("Tumor", "Stroma", "Ignore"), {}, ("Ignore",), (4.0, 4.0), (0.0, 0.0), 2.0,
        (0, 0, 8, 12),
    )  # fmt: skip
    assert rm.area_um2 == {"Tumor": 8.0, "Stroma": 8.0, "Ignore": 4.0}
    assert rm.fractions == {"Tumor": 0.5, "Stroma": 0.5}
    assert rm.class_at(np.array([1.0, 5.0, 100.0]), np.array([5.0, 11.0, 1.0])).tolist() == [
        1,
        3,
        0,
    ]
    with pytest.raises(Exception):  # noqa: B017  (frozen)
        rm.mpp = 1.0  # type: ignore[misc]
