"""The cell classifier on synthetic H&E: classes hold across magnifications."""

import numpy as np
import pytest

pytest.importorskip("sklearn")

from napari_slidescope.pipeline.cell_classes import classify_cells  # noqa: E402
from napari_slidescope.pipeline.cell_forest import train_classifier  # noqa: E402
from napari_slidescope.pipeline.nuclei import segment_nuclei  # noqa: E402
from napari_slidescope.sample_cell_types import CLASS_NAMES, downsample_rgb, make_cells_image  # noqa: E402

#: Nuclei that keep their class between the 40x and 20x scan (matched through the truth).
AGREEMENT_40X_20X = 0.9


def _segment(rgb, mpp):
    # the working resolution is the image's own: features must carry over in µm, not px
    return segment_nuclei(rgb, mpp=mpp, target_mpp=mpp, tissue=False, segmenter="builtin")


def _truth_ids(res, truth):
    r = (np.asarray(res.columns["centroid_y_um"]) / truth.mpp).astype(int)
    c = (np.asarray(res.columns["centroid_x_um"]) / truth.mpp).astype(int)
    return truth.labels[r.clip(0, truth.labels.shape[0] - 1), c.clip(0, truth.labels.shape[1] - 1)]


@pytest.fixture(scope="module")
def trained():
    rgb, truth = make_cells_image(200, mpp=0.25, seed=11)
    res = _segment(rgb, 0.25)
    cls = truth.class_at(res.columns["centroid_y_um"], res.columns["centroid_x_um"])
    labels = {}
    for k, name in enumerate(CLASS_NAMES):
        rows = np.flatnonzero(cls == k)[:15]
        labels.update({int(res.columns["id"][r]): name for r in rows})
    return train_classifier(res, labels)


def test_same_classes_at_40x_and_20x(trained):
    rgb, truth = make_cells_image(200, mpp=0.25, seed=12)
    res40 = classify_cells(_segment(rgb, 0.25), classifier=trained)
    res20 = classify_cells(_segment(downsample_rgb(rgb), 0.5), classifier=trained)
    t40, t20 = _truth_ids(res40, truth), _truth_ids(res20, truth)
    # nuclei found once at each magnification, matched by the true nucleus under them
    once40 = {t: i for i, t in enumerate(t40) if t > 0 and (t40 == t).sum() == 1}
    once20 = {t: i for i, t in enumerate(t20) if t > 0 and (t20 == t).sum() == 1}
    common = sorted(set(once40) & set(once20))
    assert len(common) > 0.7 * len(truth.classes)
    c40 = res40.columns["class"][[once40[t] for t in common]]
    c20 = res20.columns["class"][[once20[t] for t in common]]
    agreement = float((c40 == c20).mean())
    assert agreement >= AGREEMENT_40X_20X, agreement
    # and the classes are right for most of them
    true = np.asarray(CLASS_NAMES)[truth.classes[np.array(common) - 1]]
    assert (c40 == true).mean() > 0.85
    assert set(res40.classes) == set(CLASS_NAMES)
    assert (
        (res40.columns["class_probability"] > 0) & (res40.columns["class_probability"] <= 1)
    ).all()
