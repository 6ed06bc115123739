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
