"""Real-colour smoke test of tissue regions on real H&E tiles (NCT-CRC-HE-100K samples).

Seven 224 x 224 px tiles (0.5 µm/px) of seven colorectal tissue classes side by side; a
polygon in the left half of each tile trains the classifier, and the right half of each
tile must come out mostly its own class. One tile per class from one slide collection: a
check that real colours and textures go through the features and the forest, not an
accuracy figure.
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_slidescope import classify_regions, train_region_classifier
from napari_slidescope.slide import ArraySlide

pytest.importorskip("sklearn")

TILES = {
    "Tumor": "TUM-AACHEHDV.tif",
    "Stroma": "STR-AACRYYNQ.tif",
    "Fat": "ADI-AAQEFMRI.tif",
    "Lymphocytes": "LYM-AATTSRNN.tif",
    "Necrosis": "DEB-ACHGAMCT.tif",
    "Muscle": "MUS-AACVWIEK.tif",
    "Mucosa": "NORM-AAAWMSFI.tif",
}


def test_real_tiles_come_out_as_their_class(testdata):
    folder = testdata / "regions" / "nct_crc_he_100k_samples" / "images"
    if not folder.is_dir():
        pytest.skip(f"{folder}: no such folder (the real region textures)")
    tiles = [tifffile.imread(folder / name)[..., :3] for name in TILES.values()]
    slide = ArraySlide(np.concatenate(tiles, axis=1), mpp=0.5, name="nct-mosaic")
    examples = {
        c: [
            np.array(
                [
                    [20.0, k * 224 + 20],
                    [20, k * 224 + 100],
                    [200, k * 224 + 100],
                    [200, k * 224 + 20],
                ]
            )
        ]
        for k, c in enumerate(TILES)
    }
    clf = train_region_classifier(slide, examples)
    rm = classify_regions(slide, clf, tissue=False)
    assert rm.labels.shape == (56, 7 * 56)
    for k, name in enumerate(TILES):
        right = rm.labels[5:50, k * 56 + 30 : k * 56 + 51]  # the held-out right half
        counts = np.bincount(right.ravel(), minlength=len(TILES) + 1)[1:]
        assert clf.class_names[int(np.argmax(counts))] == name, (name, counts)
