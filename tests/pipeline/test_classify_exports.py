"""Classified cells out to QuPath GeoJSON (and back), with their nuclei."""

from __future__ import annotations

import json

import numpy as np
import pytest

from napari_slidescope import classify_cells, segment_nuclei
from napari_slidescope.analysis.qupath import read_objects
from napari_slidescope.sample_cells import MULTIPLEX_RULES, make_multiplex


@pytest.fixture(scope="module")
def classified():
    truth = make_multiplex(seed=4, shape=(300, 300))
    res = segment_nuclei(
        np.moveaxis(truth.image[:1], 0, -1)[..., 0],
        mpp=truth.mpp,
        segmenter="builtin-fluorescence",
        tissue=False,
        cell_expansion_um=4,
    )
    # a nuclear-channel array has one channel: classify on it with a fixed threshold
    return classify_cells(res, markers={"intensity": 400.0})


@pytest.mark.parametrize("name", ["cells.geojson", "cells.geojson.gz"])
def test_geojson_cells_carry_nucleus_and_classification(classified, tmp_path, name):
    path = classified.to_geojson(tmp_path / name)
    objects = read_objects(path)
    assert len(objects) == classified.count
    by_id = {int(o.measurements["id"]): o for o in objects}
    for k, i in enumerate(classified.columns["id"]):
        o = by_id[int(i)]
        assert o.object_type == "cell"
        assert o.nucleus
        assert o.class_name == classified.columns["class"][k]
        assert o.color == classified.classes[o.class_name]
        assert "class" not in o.measurements
    # the cell contains its nucleus
    o = objects[0]
    cell, nucleus = o.polygons[0][0], o.nucleus[0][0]
    assert nucleus.min(axis=0).min() >= cell.min(axis=0).min() - 1e-9
    if name.endswith(".geojson"):
        doc = json.loads(path.read_text())
        feat = doc["features"][0]
        assert set(feat["properties"]["classification"]) == {"name", "color"}
        assert feat["nucleusGeometry"]["type"] == "Polygon"


def test_unclassified_nuclei_stay_detections(tmp_path):
    truth = make_multiplex(seed=4, shape=(200, 200))
    res = segment_nuclei(truth.image[0], mpp=truth.mpp, segmenter="builtin-fluorescence")
    objects = read_objects(res.to_geojson(tmp_path / "n.geojson"))
    assert {o.object_type for o in objects} == {"detection"}
    assert {o.class_name for o in objects} == {"Nucleus"}
    assert MULTIPLEX_RULES  # the rules the benchmark uses are importable
