import numpy as np
import pytest

from napari_slidescope.analysis.measure import (
    COLUMNS,
    concat_tables,
    empty_table,
    measure_nuclei,
    write_csv,
)


def disc(lab, cy, cx, r, value):
    yy, xx = np.mgrid[: lab.shape[0], : lab.shape[1]]
    lab[(yy - cy) ** 2 + (xx - cx) ** 2 <= r**2] = value


def test_physical_units_and_level0_centroids():
    lab = np.zeros((100, 120), np.int32)
    disc(lab, 30, 40, 12, 1)
    disc(lab, 70, 90, 6, 2)
    t = measure_nuclei(lab, mpp=0.5, origin=(1000, 2000), downsample=2.0)
    assert list(t) == list(COLUMNS)
    assert t["id"].tolist() == [1, 2]
    np.testing.assert_allclose(t["area_um2"], np.pi * (np.array([12, 6]) * 0.5) ** 2, rtol=0.1)
    np.testing.assert_allclose(t["perimeter_um"], 2 * np.pi * np.array([12, 6]) * 0.5, rtol=0.15)
    # working pixel (30, 40) covers level-0 [1060, 1062) x [2080, 2082): centre index 1060.5
    np.testing.assert_allclose(t["centroid_row"], [1060.5, 1140.5])
    np.testing.assert_allclose(t["centroid_col"], [2080.5, 2180.5])
    np.testing.assert_allclose(t["centroid_y_um"], (t["centroid_row"] + 0.5) * 0.25)
    np.testing.assert_allclose(t["centroid_x_um"], (t["centroid_col"] + 0.5) * 0.25)
    assert (t["eccentricity"] < 0.3).all()
    assert (t["solidity"] > 0.9).all()
    assert np.isnan(t["hematoxylin_od_mean"]).all()


def test_mean_optical_density_per_nucleus():
    lab = np.zeros((20, 20), np.int32)
    lab[2:6, 2:6] = 1
    lab[10:15, 10:15] = 3
    od = np.zeros((20, 20, 3), np.float32)
    od[lab == 1] = (0.8, 0.1, 0)
    od[lab == 3] = (0.2, 0.5, 0)
    t = measure_nuclei(lab, mpp=(0.5, 0.25), od=od)
    np.testing.assert_allclose(t["hematoxylin_od_mean"], [0.8, 0.2], rtol=1e-6)
    np.testing.assert_allclose(t["eosin_od_mean"], [0.1, 0.5], rtol=1e-6)
    np.testing.assert_allclose(t["area_um2"], [16 * 0.125, 25 * 0.125])


def test_empty_and_errors(tmp_path):
    t = measure_nuclei(np.zeros((8, 8), np.int32), mpp=0.5)
    assert list(t) == list(COLUMNS)
    assert all(v.size == 0 for v in t.values())
    with pytest.raises(ValueError, match="labels"):
        measure_nuclei(np.zeros((8, 8), float), mpp=0.5)
    with pytest.raises(ValueError, match="mpp"):
        measure_nuclei(np.zeros((8, 8), np.int32), mpp=0)
    with pytest.raises(ValueError, match="od"):
        measure_nuclei(np.ones((8, 8), np.int32), mpp=1, od=np.zeros((4, 4, 3)))
    both = concat_tables([empty_table(), {}, measure_nuclei(np.ones((4, 4), np.int32), mpp=1)])
    assert both["id"].tolist() == [1]
    path = write_csv(both, tmp_path / "t.csv")
    lines = path.read_text().splitlines()
    assert lines[0].split(",") == list(COLUMNS)
    assert len(lines) == 2


def _blobs(seed, shape=(90, 110)):
    """Random touching and separate objects, some at the border, some with holes."""
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    smooth = ndi.gaussian_filter(rng.random(shape), 2.0)
    lab = ndi.label(smooth > np.quantile(smooth, 0.6))[0]
    seeds = np.zeros(shape, np.int32)
    k = 12
    seeds[rng.integers(0, shape[0], k), rng.integers(0, shape[1], k)] = np.arange(1, k + 1)
    _, (iy, ix) = ndi.distance_transform_edt(seeds == 0, return_indices=True)
    split = np.where(lab > 0, seeds[iy, ix], 0)  # touching neighbours
    return np.where(np.arange(shape[1]) < shape[1] // 2, lab, split + lab.max()).astype(np.int32)


@pytest.mark.parametrize("seed", range(4))
def test_matches_regionprops(seed):
    from skimage.measure import regionprops_table

    lab = _blobs(seed)
    lab[lab == 3] = 0  # a missing id
    od = np.random.default_rng(seed).random((*lab.shape, 3)).astype(np.float32)
    t = measure_nuclei(lab, mpp=1.0, od=od)
    ref = regionprops_table(
        lab,
        intensity_image=od[..., :2],
        properties=["label", "centroid", "area", "perimeter", "eccentricity", "solidity"]
        + ["intensity_mean"],
    )
    assert t["id"].tolist() == ref["label"].tolist()
    pairs = {
        "centroid_row": "centroid-0",
        "centroid_col": "centroid-1",
        "area_um2": "area",
        "perimeter_um": "perimeter",
        "eccentricity": "eccentricity",
        "solidity": "solidity",
        "hematoxylin_od_mean": "intensity_mean-0",
        "eosin_od_mean": "intensity_mean-1",
    }
    for col, prop in pairs.items():
        # the OD means are float64 sums of the float32 densities; regionprops averages in
        # float32, within its rounding (about 1e-7 per addition) of the exact means
        tol = 1e-5 if col.endswith("od_mean") else 1e-12
        np.testing.assert_allclose(t[col], ref[prop], rtol=tol, atol=1e-12, err_msg=col)


def test_negative_labels_are_background():
    lab = np.zeros((10, 10), np.int32)
    lab[1:4, 1:4] = 2
    lab[6:9, 6:9] = -1
    t = measure_nuclei(lab, mpp=1.0)
    assert t["id"].tolist() == [2]
    assert t["area_um2"].tolist() == [9.0]


def test_negative_optical_densities_are_clipped_at_zero():
    # colour deconvolution gives small negative amounts of a stain a pixel does not hold
    lab = np.zeros((20, 20), np.int32)
    lab[2:8, 2:8] = 1
    lab[10:16, 10:16] = 2
    od = np.zeros((20, 20, 3), np.float32)
    od[lab == 1] = (0.6, -0.24, 0)
    od[10:16, 10:13] = (0.4, 0.3, 0)
    od[10:16, 13:16] = (0.4, -0.1, 0)  # half the nucleus: none of the stain, noise below 0
    t = measure_nuclei(lab, mpp=0.5, od=od)
    np.testing.assert_allclose(t["eosin_od_mean"], [0.0, 0.15], rtol=1e-6)
    np.testing.assert_allclose(t["hematoxylin_od_mean"], [0.6, 0.4], rtol=1e-6)
    assert (t["eosin_od_mean"] >= 0).all()


def test_concat_of_empty_tables_keeps_their_columns():
    from napari_slidescope.analysis.measure import concat_tables, empty_table

    empty = {"id": np.zeros(0, np.int64), "DAPI_mean": np.zeros(0)}
    got = concat_tables([{}, empty, dict(empty)])
    assert list(got) == ["id", "DAPI_mean"]
    assert got["id"].dtype == np.int64
    assert all(v.size == 0 for v in got.values())
    assert list(concat_tables([])) == list(empty_table())


@pytest.mark.parametrize("seed", range(6))
def test_solidity_matches_convex_hull_image_on_odd_shapes(seed):
    """Objects in pieces, with holes, one pixel wide, touching the edges: skimage's hulls."""
    from skimage.morphology import convex_hull_image

    rng = np.random.default_rng(seed)
    lab = rng.integers(0, 6, (rng.integers(1, 40), rng.integers(1, 40))).astype(np.int32)
    lab[:, :2] = 0
    lab[0, :] = 7  # one pixel high, along the edge
    t = measure_nuclei(lab, mpp=1.0)
    for i, solidity in zip(t["id"], t["solidity"], strict=True):
        mask = lab == i
        assert solidity == mask.sum() / np.count_nonzero(convex_hull_image(mask))
