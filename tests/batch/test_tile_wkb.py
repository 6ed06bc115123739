"""A tile's outlines as WKB, all at once: the bytes of one polygon at a time."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.analysis.geometry import labels_to_polygons, labels_to_rings
from napari_slidescope.batch.tasks import _outlines_wkb, wkb_polygon, wkb_polygons, wkb_ring


def _labels(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.zeros((60, 80), np.int32)
    for i in range(1, 25):
        y, x = rng.integers(0, 55), rng.integers(0, 75)
        labels[y : y + rng.integers(1, 6), x : x + rng.integers(1, 6)] = i
    return labels


@pytest.mark.parametrize("seed", range(3))
def test_bulk_wkb_is_wkb_polygon_of_each_ring(seed):
    labels = _labels(seed)
    coords, offsets, ids = labels_to_rings(labels, downsample=(2.0, 4.0), origin=(100.0, 7.0))
    polys, _ = labels_to_polygons(labels, downsample=(2.0, 4.0), origin=(100.0, 7.0))
    got = wkb_polygons(coords, offsets)
    assert got == [wkb_polygon(p) for p in polys]
    for data, ring in zip(got, polys, strict=True):
        np.testing.assert_array_equal(wkb_ring(data)[:-1, ::-1], ring)


def test_outlines_follow_the_table_order_and_refuse_a_missing_nucleus():
    labels = _labels(0)
    ids = np.unique(labels[labels > 0])
    polys, found = labels_to_polygons(labels)
    by_id = dict(zip(found.tolist(), polys, strict=True))
    order = ids[::-1].copy()
    got = _outlines_wkb(labels, order, (1.0, 1.0), (0.0, 0.0))
    assert got == [wkb_polygon(by_id[int(i)]) for i in order]
    assert wkb_polygons(np.zeros((0, 2)), np.zeros(1, np.int64)) == []
    with pytest.raises(ValueError, match="no pixels"):
        _outlines_wkb(labels, np.array([ids.max() + 1]), (1.0, 1.0), (0.0, 0.0))
