"""Cells grown from nuclei: never into a neighbour, never beyond the distance."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope.analysis.cells import compartment_means, expand_cells, owned_cells


def _nuclei(seed=0, shape=(120, 120), n=25):
    rng = np.random.default_rng(seed)
    lab = np.zeros(shape, np.int32)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    for k in range(1, n + 1):
        cy, cx, r = rng.uniform(5, shape[0] - 5), rng.uniform(5, shape[1] - 5), rng.uniform(2, 5)
        disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        lab[disk & (lab == 0)] = k
    return lab


def test_expansion_never_crosses_a_neighbour_nor_exceeds_the_distance():
    nuclei = _nuclei()
    d = 6.0
    cells = expand_cells(nuclei, d)
    # nuclei keep their pixels
    assert np.array_equal(cells[nuclei > 0], nuclei[nuclei > 0])
    # every cell pixel is within d of its own nucleus and at least as close to it as to any other
    for i in np.unique(nuclei[nuclei > 0]):
        dist_own = ndi.distance_transform_edt(nuclei != i)
        dist_other = ndi.distance_transform_edt((nuclei == 0) | (nuclei == i))
        px = cells == i
        assert dist_own[px].max() <= d + 1e-9
        assert (dist_own[px] <= dist_other[px] + 1e-9).all()
    # background within d of some nucleus is claimed; beyond d it is not
    dist_any = ndi.distance_transform_edt(nuclei == 0)
    assert (cells[dist_any <= d - 1] > 0).all()
    assert (cells[dist_any > d] == 0).all()


def test_compartments_partition_the_cell():
    nuclei = _nuclei(1)
    cells = expand_cells(nuclei, 4)
    ids = np.unique(nuclei[nuclei > 0])
    ones = np.ones((*nuclei.shape, 1))
    m = compartment_means(nuclei, cells, ids, ones, ["one"])
    nucleus_px = ndi.sum(nuclei > 0, nuclei, ids)
    assert np.array_equal(m["cell_area_px"], m["cytoplasm_area_px"] + nucleus_px)
    rng = np.random.default_rng(2)
    v = rng.random((*nuclei.shape, 1))
    m = compartment_means(nuclei, cells, ids, v, ["v"])
    ok = m["cytoplasm_area_px"] > 0
    weighted = m["v_nucleus_mean"] * nucleus_px + m["v_cytoplasm_mean"] * m["cytoplasm_area_px"]
    assert np.allclose(weighted[ok] / m["cell_area_px"][ok], m["v_cell_mean"][ok])
    assert np.allclose(m["v_nucleus_mean"], ndi.mean(v[..., 0], nuclei, ids))


def test_owned_cells_are_stopped_by_neighbours_the_tile_does_not_own():
    nuclei = np.zeros((1, 12), np.int32)
    nuclei[0, 2] = 7  # owned, renumbered 1
    nuclei[0, 6] = 9  # a neighbour owned by another tile
    owned = np.where(nuclei == 7, 1, 0).astype(np.int32)
    cells = owned_cells(nuclei, owned, 3)
    assert cells.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]]


def test_model_cells_follow_the_model_within_the_expansion():
    from napari_slidescope.analysis.cells import model_cells

    nuclei = np.zeros((20, 40), np.int32)
    nuclei[8:12, 4:8] = 1  # its model cell: columns 0-13
    nuclei[8:12, 16:20] = 2  # 2 and 3 share one model cell (columns 14-33)
    nuclei[8:12, 26:30] = 3
    nuclei[8:12, 35:38] = 4  # no model cell: the expansion
    model = np.zeros_like(nuclei)
    model[7:13, 0:14] = 10  # narrower than the expansion (rows 5-14)
    model[3:17, 14:34] = 20
    d = 3.0
    cells = model_cells(nuclei, model, d)
    grown = expand_cells(nuclei, d)
    for i in (1, 2, 3, 4):
        assert np.all(cells[nuclei == i] == i)  # the nucleus lies in its cell
    # within the expansion region: never beyond the distance, never into a neighbour
    assert np.all((cells == 0) | (cells == grown))
    assert np.all(model[(cells == 1) & (nuclei != 1)] == 10)
    assert set(np.unique(model[(cells == 2) | (cells == 3)])) == {20}
    # the shared model cell is split at the Voronoi boundary; 4 keeps its expansion
    assert np.array_equal(cells == 4, grown == 4)
    assert np.array_equal(cells[cells > 0] > 0, grown[cells > 0] > 0)
    assert (cells == 1).sum() < (grown == 1).sum()  # the model cuts the expansion
    # owned_cells with a model: the same cells under the tile's own ids
    owned = np.where(nuclei == 2, 1, 0).astype(np.int32)
    assert np.array_equal(owned_cells(nuclei, owned, d, model) == 1, cells == 2)
