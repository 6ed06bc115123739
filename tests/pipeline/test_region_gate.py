"""The tissue gate of region classification keeps fat open to the glass (issue 35).

Fat at the edge of a section (thin membranes round empty vacuoles, open to the glass) is too
pale for tissue detection and is no hole to fill: gated by the tissue mask alone it is never
classified. :func:`regions_tissue` adds it with a membrane envelope; glass stays out.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import classify_regions, train_region_classifier
from napari_slidescope.analysis.tissue import pale_tissue_envelope, tissue_mask
from napari_slidescope.pipeline.region_map import TISSUE_ENVELOPE_UM, regions_tissue
from napari_slidescope.sample_regions import TRUTH_MPP, RegionTruth, render_regions

pytest.importorskip("sklearn")

MPP = 0.5
#: 1024 x 1024 µm: truth pixels of 8 µm.
SIDE = 2048
STROMA, FAT = 2, 4


@pytest.fixture(scope="module")
def edge_fat():
    """Stroma on the left, fat beside it open to the glass above, below and to the right.

    Truth columns (8 µm each): stroma 8-56, fat 56-96, glass 96-128; rows 16-112 are
    tissue, the rest glass.
    """
    n = int(SIDE * MPP / TRUTH_MPP)
    labels = np.zeros((n, n), np.uint8)
    labels[16:112, 8:56] = STROMA
    labels[16:112, 56:96] = FAT
    truth = RegionTruth(labels, MPP, (SIDE, SIDE), 5)
    rgb = render_regions(truth, (0, 0, SIDE, SIDE))
    return rgb, truth


def _classifier(rgb):
    px = TRUTH_MPP / MPP
    lines = {
        name: [np.array([[r * px, c0 * px], [r * px, (c0 + 6) * px]]) for r in (40, 64, 88)]
        for name, c0 in (("Stroma", 24), ("Fat", 70))
    }
    return train_region_classifier(rgb, lines, slide_mpp=MPP, n_estimators=8)


def _truth_on(rm, truth):
    return truth.grid(rm.downsample[0], rm.labels.shape, rm.origin)


def test_fat_open_to_glass_is_classified_glass_stays_out(edge_fat):
    rgb, truth = edge_fat
    clf = _classifier(rgb)
    # the gate of before (tissue mask, holes filled, no envelope): no fat pixel classified
    before = classify_regions(
        rgb, clf, tissue=regions_tissue(rgb, envelope_um=0, slide_mpp=MPP), slide_mpp=MPP
    )
    after = classify_regions(rgb, clf, slide_mpp=MPP)
    want = _truth_on(after, truth)
    fat = want == FAT
    assert (before.labels[fat] == 0).mean() > 0.95
    fat_k = after.classes.index("Fat") + 1
    assert (after.labels[fat] > 0).mean() > 0.9
    assert (after.labels[fat] == fat_k).mean() > 0.8
    # glass more than 100 µm (50 working px) from any tissue stays unclassified
    from scipy import ndimage

    far = ndimage.distance_transform_edt(want == 0) > 100 / after.mpp
    assert far.sum() > 1000
    assert (after.labels[far] == 0).all()
    # the stroma is classified either way
    assert (before.labels[want == STROMA] > 0).mean() > 0.95
    # which gate ran is recorded
    assert after.parameters["tissue_gate"]["envelope_um"] == TISSUE_ENVELOPE_UM
    assert before.parameters["tissue_gate"]["envelope_um"] == 0.0
    assert (
        classify_regions(rgb, clf, slide_mpp=MPP, tissue=False).parameters["tissue_gate"] is False
    )


def test_envelope_skips_glass_steps_and_is_off_by_default():
    """Brightness steps on the glass (scan-tile seams) are no membranes; fat membranes are."""
    rgb = np.full((96, 96, 3), 235, np.uint8)
    rgb[:, 48:] = 222  # a seam between two scan tiles, beside the tissue
    rgb[30:66, 10:40] = (190, 100, 150)  # tissue
    mask, _ = tissue_mask(rgb, mpp=8.0, min_tissue_um2=0)
    assert mask[40:56, 15:35].all()
    out = pale_tissue_envelope(rgb, mask, mpp=8.0, radius_um=64)
    assert not out[:, 44:].any()
    assert (out == mask).all()
    # fat membranes beside the tissue, open to the glass, join it
    fat = rgb.copy()
    fat[30:66:8, 40:72] = fat[30:66, 40:72:8] = (205, 160, 190)
    with_fat, _ = tissue_mask(fat, mpp=8.0, min_tissue_um2=0, envelope_um=64)
    plain, _ = tissue_mask(fat, mpp=8.0, min_tissue_um2=0)
    assert with_fat[45, 60] and not plain[45, 60]
    assert not with_fat[:20].any() and not with_fat[80:].any()
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="envelope_um"):
            tissue_mask(fat, mpp=8.0, envelope_um=bad)


def test_detect_tissue_takes_numpy_radii_and_refuses_bad_ones_before_reading():
    from napari_slidescope import detect_tissue

    rgb = np.full((96, 96, 3), 235, np.uint8)
    rgb[30:66, 10:40] = (190, 100, 150)
    a = detect_tissue(rgb, mpp=8.0, envelope_um=np.float32(64), target_mpp=8.0)
    b = detect_tissue(rgb, mpp=8.0, envelope_um=64, target_mpp=8.0)
    assert a.parameters == b.parameters
    assert type(a.parameters["envelope_um"]) is float
    assert (a.mask == b.mask).all()
    for bad in (True, "64", -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^envelope_um: expected a radius >= 0 µm"):
            detect_tissue(rgb, mpp=8.0, envelope_um=bad)


def test_batch_digest_records_the_gate(tmp_path):
    from napari_slidescope.options import RegionsOptions

    f = tmp_path / "clf.npz"
    f.write_bytes(b"x")
    a = RegionsOptions.of_file(f)
    assert a.envelope_um == TISSUE_ENVELOPE_UM
    assert a.digest() != a.replace(envelope_um=0.0).digest()


def test_batch_regions_task_gates_as_the_api(edge_fat, tmp_path):
    """``slidescope batch --regions`` classifies the fat at the edge too (the same gate)."""
    from napari_slidescope.batch.params import BatchParams, stamp_slide
    from napari_slidescope.batch.tasks import regions_task
    from napari_slidescope.options import RegionsOptions
    from napari_slidescope.sample_data import _pyramid, _write_svs

    rgb, truth = edge_fat
    path = tmp_path / "edge_fat.svs"
    _write_svs(path, _pyramid(rgb, 256), mpp=MPP, quality=90, name="edge fat")
    clf = _classifier(rgb).save(tmp_path / "clf.npz")
    params = BatchParams(tasks=("regions",), regions_options=RegionsOptions.of_file(clf))
    out = regions_task(str(path), stamp_slide(path).key, params)
    rm = out.regions
    want = _truth_on(rm, truth)
    assert (rm.labels[want == FAT] > 0).mean() > 0.9
    assert rm.parameters["tissue_gate"]["envelope_um"] == TISSUE_ENVELOPE_UM


def test_a_view_of_fat_alone_is_gated_with_the_tissue_around_it(edge_fat, monkeypatch):
    """A region (a viewport) showing only the edge fat: its gate sees the stroma beyond it."""
    from napari_slidescope.pipeline import region_map

    rgb, truth = edge_fat
    clf = _classifier(rgb)
    px = int(TRUTH_MPP / MPP)
    box = (24 * px, 64 * px, 104 * px, SIDE)  # fat (and glass right of it), no stroma
    rm = classify_regions(rgb, clf, region=box, slide_mpp=MPP)
    want = _truth_on(rm, truth)
    assert (want == STROMA).sum() == 0 and (want == FAT).sum() > 1000
    assert (rm.labels[want == FAT] > 0).mean() > 0.9
    assert rm.parameters["tissue_gate"]["box"][1] < box[1]  # the gate looked beyond it
    monkeypatch.setattr(region_map, "GATE_MARGIN_UM", 0.0)
    alone = classify_regions(rgb, clf, region=box, slide_mpp=MPP)
    assert (alone.labels[want == FAT] > 0).mean() < 0.5
