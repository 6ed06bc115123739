import numpy as np
import pytest

from napari_slidescope.analysis.cell_features import (
    cell_features,
    default_features,
    density_name,
    neighbourhood_mean,
    smoothed_name,
)
from napari_slidescope.analysis.measure import measure_nuclei


def _table(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "id": np.arange(1, n + 1, dtype=np.int32),
        "centroid_y_um": rng.uniform(0, 300, n),
        "centroid_x_um": rng.uniform(0, 200, n),
        "area_um2": rng.uniform(15, 120, n),
        "perimeter_um": rng.uniform(14, 45, n),
        "eccentricity": rng.uniform(0, 1, n),
        "solidity": rng.uniform(0.8, 1, n),
        "hematoxylin_od_mean": np.where(rng.uniform(size=n) < 0.1, np.nan, rng.uniform(0, 1, n)),
        "eosin_od_mean": rng.uniform(0, 1, n),
        "hematoxylin_od_std": rng.uniform(0, 0.3, n),
        "hematoxylin_od_skew": rng.normal(0, 1, n),
    }


@pytest.mark.parametrize("radius", [5.0, 25.0, 60.0])
def test_smoothed_features_equal_brute_force_mean(radius):
    t = _table()
    names, x = cell_features(t, radius_um=radius)
    pts = np.column_stack([t["centroid_y_um"], t["centroid_x_um"]])
    d = np.hypot(*(pts[:, None, :] - pts[None, :, :]).transpose(2, 0, 1))
    near = d <= radius
    for col in ("area_um2", "hematoxylin_od_mean", "circularity"):
        v = x[:, names.index(col)].astype(np.float64)
        ok = np.isfinite(v)
        brute = np.array([v[row & ok].mean() if (row & ok).any() else np.nan for row in near])
        got = x[:, names.index(smoothed_name(col, radius))]
        np.testing.assert_allclose(got, brute, rtol=1e-5, equal_nan=True)
    density = x[:, names.index(density_name(radius))]
    np.testing.assert_allclose(density, near.sum(1) / (np.pi * radius**2) * 1e6, rtol=1e-5)


def test_coincident_points_count_both_ways():
    pts = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 4.0]])
    v = np.array([1.0, 2.0, 9.0])
    m, n = neighbourhood_mean(pts, v, 4.0)
    assert n.tolist() == [3, 3, 3]
    assert np.allclose(m.ravel(), 4.0)
    m, n = neighbourhood_mean(pts, v, 4.0, rows=np.array([1]))
    assert n.tolist() == [3]
    assert np.allclose(m.ravel(), 4.0)


def test_rows_subset_sees_all_neighbours():
    t = _table()
    names, full = cell_features(t)
    rows = np.array([3, 100, 7])
    names2, part = cell_features(t, rows=rows)
    assert names2 == names
    np.testing.assert_array_equal(part, full[rows])


def test_neighbourhood_mean_doc_and_errors():
    pts = np.array([[0.0, 0.0], [0.0, 3.0], [0.0, 10.0]])
    m, n = neighbourhood_mean(pts, np.array([1.0, 3.0, 8.0]), 5.0)
    assert m.ravel().tolist() == [2.0, 2.0, 8.0]
    assert n.tolist() == [2, 2, 1]
    with pytest.raises(ValueError, match="radius_um"):
        neighbourhood_mean(pts, np.ones(3), 0)
    with pytest.raises(ValueError, match="points_um"):
        neighbourhood_mean(pts, np.ones(4), 5)


def test_missing_columns_are_named():
    t = _table()
    del t["hematoxylin_od_std"]
    assert "hematoxylin_od_std" not in default_features(t)
    with pytest.raises(ValueError, match="hematoxylin_od_std"):
        cell_features(t, ["area_um2", smoothed_name("hematoxylin_od_std", 10)])


def test_hematoxylin_texture_columns():
    lab = np.zeros((40, 40), np.int32)
    lab[2:12, 2:12] = 1  # even chromatin
    lab[20:36, 20:36] = 2  # pale with one dark nucleolus
    od = np.zeros((40, 40, 3), np.float32)
    od[..., 0] = 0.9
    od[20:36, 20:36, 0] = 0.3
    od[26:29, 26:29, 0] = 1.2
    t = measure_nuclei(lab, mpp=0.5, od=od)
    assert t["hematoxylin_od_std"][0] == pytest.approx(0.0, abs=1e-6)
    assert t["hematoxylin_od_skew"][0] == 0.0
    v = od[20:36, 20:36, 0].astype(np.float64)
    assert t["hematoxylin_od_std"][1] == pytest.approx(v.std(), rel=1e-5)
    skew = ((v - v.mean()) ** 3).mean() / v.std() ** 3
    assert t["hematoxylin_od_skew"][1] == pytest.approx(skew, rel=1e-5)
    assert t["hematoxylin_od_skew"][1] > 2
    no_od = measure_nuclei(lab, mpp=0.5)
    assert np.isnan(no_od["hematoxylin_od_std"]).all()
