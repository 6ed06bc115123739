"""H&E or H-DAB from estimated stain vectors."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.analysis.stains import (
    RUIFROK_HDAB,
    RUIFROK_HE,
    estimate_stains,
    for_stain,
    stain_kind,
)


def test_reference_vectors():
    assert stain_kind(RUIFROK_HE) == "H&E"
    assert stain_kind(RUIFROK_HDAB) == "H-DAB"


def test_real_ihc_and_real_h_and_e(testdata):
    import tifffile
    from skimage import data

    assert stain_kind(estimate_stains(data.immunohistochemistry())) == "H-DAB"
    folder = testdata / "nuclei_gt" / "monuseg_train"
    crops = sorted(p for p in folder.glob("*.tif") if "_instances" not in p.name)
    assert crops, f"{folder}: no MoNuSeg crops"
    for path in crops:
        assert stain_kind(estimate_stains(tifffile.imread(path)[..., :3])) == "H&E", path.name


def test_for_stain_keeps_or_replaces_vectors():
    assert for_stain(RUIFROK_HE, "auto").second == "eosin"
    assert for_stain(RUIFROK_HE, "H-DAB") is RUIFROK_HDAB
    dab = for_stain(RUIFROK_HDAB, "auto")
    assert dab.second == "dab"
    assert np.allclose(dab.eosin, RUIFROK_HDAB.eosin)
    with pytest.raises(ValueError, match="stain"):
        for_stain(RUIFROK_HE, "Masson")
