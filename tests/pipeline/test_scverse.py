"""result.to_anndata(): cells x markers that anndata itself reads back."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import classify_cells, segment_nuclei
from napari_slidescope.sample_cells import make_multiplex

anndata = pytest.importorskip("anndata", reason="the scverse extra is not installed")


def test_anndata_shapes_markers_and_spatial_in_um(tmp_path):
    truth = make_multiplex(seed=8, shape=(256, 256))
    path = truth.write(tmp_path / "mx.ome.tif")
    res = segment_nuclei(path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=4)
    res = classify_cells(res, markers={"CD3": "auto", "PanCK": 300.0})
    adata = res.to_anndata()
    assert adata.shape == (res.count, len(truth.channels))
    assert list(adata.var_names) == list(truth.channels)
    assert np.allclose(adata.X[:, 1], res.columns["CD3_cell_mean"])
    assert np.allclose(adata.obsm["spatial"][:, 0], res.columns["centroid_x_um"])
    assert np.allclose(adata.obsm["spatial"][:, 1], res.columns["centroid_y_um"])
    # µm, not pixels: the slide's pixels are 0.5 µm
    assert adata.obsm["spatial"].max() <= 256 * truth.mpp
    assert list(adata.obs["class"].astype(str)) == res.columns["class"].tolist()
    assert adata.obs["CD3_positive"].dtype == bool
    assert (adata.obs["slide"] == "mx.ome.tif").all()
    nuc = res.to_anndata(compartment="nucleus")
    assert np.allclose(nuc.X[:, 0], res.columns["DAPI_nucleus_mean"])
    adata.write_h5ad(tmp_path / "cells.h5ad")
    back = anndata.read_h5ad(tmp_path / "cells.h5ad")
    assert back.shape == adata.shape
    assert list(back.var_names) == list(truth.channels)
    assert list(back.obs["class"].astype(str)) == res.columns["class"].tolist()
    with pytest.raises(ValueError, match="cytoplasm"):
        classify_cells(
            segment_nuclei(truth.image[0], mpp=0.5, segmenter="builtin-fluorescence"),
            markers={"intensity": 1.0},
        ).to_anndata(compartment="cytoplasm")


# a flat image gives the segmenter nothing to prepare on: it says so, and finds nothing
@pytest.mark.filterwarnings("ignore:FluorescenceSegmenter.prepare\\(\\) was not called")
def test_anndata_of_a_slide_without_nuclei_has_no_rows(tmp_path):
    """A slide with no nucleus (glass only) gives an empty table of the same markers."""
    truth = make_multiplex(seed=8, shape=(256, 256))
    truth.image[:] = 50  # flat: no nucleus anywhere
    path = truth.write(tmp_path / "empty.ome.tif")
    res = segment_nuclei(path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=4)
    assert res.count == 0
    adata = res.to_anndata()
    assert adata.shape == (0, len(truth.channels))
    assert list(adata.var_names) == list(truth.channels)
    assert adata.obsm["spatial"].shape == (0, 2)
    adata.write_h5ad(tmp_path / "cells.h5ad")
    assert anndata.read_h5ad(tmp_path / "cells.h5ad").shape == (0, len(truth.channels))
