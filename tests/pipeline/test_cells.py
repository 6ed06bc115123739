"""segment_nuclei(cell_expansion_um=...): cells the same whatever the tiling; per-compartment
measurements."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import classify_cells, segment_nuclei
from napari_slidescope.analysis.cells import expand_cells
from napari_slidescope.analysis.phenotypes import dab_scores, ihc_summary
from napari_slidescope.pipeline.cell_classes import class_summary
from napari_slidescope.sample_cells import make_hdab, make_multiplex


@pytest.fixture(scope="module")
def multiplex():
    return make_multiplex(seed=3, shape=(400, 400))


def test_tiled_cells_equal_one_expansion_of_the_nuclei(multiplex):
    image = multiplex.image[0]  # DAPI
    res = segment_nuclei(
        image,
        mpp=multiplex.mpp,
        segmenter="builtin-fluorescence",
        tissue=False,
        cell_expansion_um=4.0,
        tile_size_um=60,
    )
    assert res.count > 50
    assert np.array_equal(res.cells, expand_cells(res.labels, 4.0 / multiplex.mpp))
    for name in ("intensity_nucleus_mean", "intensity_cytoplasm_mean", "intensity_cell_mean"):
        assert name in res.columns
    assert np.allclose(res.columns["intensity_nucleus_mean"], res.columns["intensity_mean"])
    # nuclear DAPI: brighter in the nucleus than in the cytoplasm
    assert np.nanmedian(res.columns["intensity_nucleus_mean"]) > 2 * np.nanmedian(
        res.columns["intensity_cytoplasm_mean"]
    )
    assert (res.columns["cell_area_um2"] >= res.columns["area_um2"]).all()


def test_multiplex_slide_names_every_channel_per_compartment(multiplex, tmp_path):
    path = multiplex.write(tmp_path / "mx.ome.tif")
    res = segment_nuclei(path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=4)
    for ch in multiplex.channels:
        for comp in ("nucleus", "cytoplasm", "cell"):
            assert f"{ch}_{comp}_mean" in res.columns
    assert res.cells is not None


@pytest.mark.parametrize("bad", [-1.0, 0, float("nan"), "5", True])
def test_bad_cell_expansion_is_refused(bad):
    with pytest.raises(ValueError, match="cell_expansion_um"):
        segment_nuclei(np.zeros((64, 64), np.uint8), mpp=0.5, cell_expansion_um=bad)


@pytest.fixture(scope="module")
def hdab():
    return make_hdab(seed=5, shape=(400, 400))


def test_h_dab_is_recognised_and_scored_close_to_the_truth(hdab):
    res = segment_nuclei(hdab.image, mpp=hdab.mpp, segmenter="builtin", tissue=False)
    assert "dab_od_mean" in res.columns
    assert "eosin_od_mean" not in res.columns
    assert res.count >= 0.95 * hdab.nuclei.max()  # DAB-dark nuclei are found too
    out = classify_cells(res, dab=True)
    got = class_summary(out)
    want = ihc_summary(dab_scores(hdab.dab))
    assert got["positive_percent"] == pytest.approx(want["positive_percent"], abs=5)
    assert got["h_score"] == pytest.approx(want["h_score"], abs=15)
    # the user can say which stain it is
    he = segment_nuclei(hdab.image, mpp=hdab.mpp, segmenter="builtin", tissue=False, stain="H&E")
    assert "eosin_od_mean" in he.columns
    assert "dab_od_mean" not in he.columns
    with pytest.raises(ValueError, match="stain"):
        segment_nuclei(hdab.image, mpp=hdab.mpp, stain="DAB")


def test_membrane_dab_on_the_cell_compartment(hdab):
    mem = make_hdab(seed=6, shape=(300, 300), membrane=True)
    res = segment_nuclei(
        mem.image, mpp=mem.mpp, segmenter="builtin", tissue=False, cell_expansion_um=4
    )
    assert "dab_od_cell_mean" in res.columns
    assert "hematoxylin_od_cytoplasm_mean" in res.columns
    out = classify_cells(res, dab={"thresholds": (0.05, 0.1, 0.15), "compartment": "cell"})
    nuc = classify_cells(res, dab={"thresholds": (0.05, 0.1, 0.15), "compartment": "nucleus"})
    # the membrane stain is seen on the cell, hardly in the nucleus
    assert out.columns["dab_positive"].mean() > nuc.columns["dab_positive"].mean() + 0.2
