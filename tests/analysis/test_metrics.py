"""Metrics on hand-made label images with hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.analysis.metrics import (
    aggregated_jaccard_index,
    f1_at_iou,
    instance_scores,
    match_instances,
    panoptic_quality,
    pixel_dice,
)


def _img(*boxes: tuple[int, int, int, int, int], shape=(8, 12)) -> np.ndarray:
    """Label image from (label, y0, x0, y1, x1) half-open boxes."""
    out = np.zeros(shape, np.int32)
    for lab, y0, x0, y1, x1 in boxes:
        out[y0:y1, x0:x1] = lab
    return out


def test_square_shifted_by_one_pixel():
    true = _img((1, 0, 0, 4, 4))  # 16 px
    pred = _img((1, 0, 1, 4, 5))  # 16 px, overlap 4 x 3 = 12, union 20 -> IoU 0.6
    m = match_instances(true, pred)
    assert (m.tp, m.fp, m.fn) == (1, 0, 0)
    assert m.iou == pytest.approx([0.6])
    assert f1_at_iou(true, pred) == 1.0
    assert aggregated_jaccard_index(true, pred) == pytest.approx(12 / 20)
    assert panoptic_quality(true, pred) == pytest.approx((0.6, 0.6, 1.0))
    assert pixel_dice(true, pred) == pytest.approx(2 * 12 / 32)
    assert f1_at_iou(true, pred, iou_threshold=0.6) == 0.0  # strictly greater


def test_perfect_match_with_other_label_values():
    true = _img((5, 0, 0, 3, 3), (9, 4, 4, 8, 10))
    pred = _img((2, 0, 0, 3, 3), (1, 4, 4, 8, 10))
    s = instance_scores(true, pred)
    assert s["f1"] == s["aji"] == s["pq"] == s["dice"] == 1.0
    m = match_instances(true, pred)
    assert dict(zip(m.true_ids.tolist(), m.pred_ids.tolist(), strict=True)) == {5: 2, 9: 1}


def test_empty_prediction():
    true = _img((1, 0, 0, 4, 4))
    pred = np.zeros_like(true)
    s = instance_scores(true, pred)
    assert (s["f1"], s["aji"], s["pq"], s["dice"]) == (0.0, 0.0, 0.0, 0.0)
    assert (s["tp"], s["fp"], s["fn"]) == (0, 0, 1)


def test_empty_ground_truth():
    pred = _img((3, 0, 0, 4, 4))
    true = np.zeros_like(pred)
    s = instance_scores(true, pred)
    assert (s["f1"], s["aji"], s["pq"], s["dice"]) == (0.0, 0.0, 0.0, 0.0)
    assert (s["tp"], s["fp"], s["fn"]) == (0, 1, 0)


def test_both_empty_is_perfect():
    z = np.zeros((5, 5), np.uint16)
    s = instance_scores(z, z)
    assert (s["f1"], s["aji"], s["pq"], s["dice"]) == (1.0, 1.0, 1.0, 1.0)


def test_split():
    true = _img((1, 0, 0, 4, 8))  # 32 px
    pred = _img((1, 0, 0, 4, 6), (2, 0, 6, 4, 8))  # 24 px (IoU 0.75) + 8 px (IoU 0.25)
    s = instance_scores(true, pred)
    assert (s["tp"], s["fp"], s["fn"]) == (1, 1, 0)
    assert s["f1"] == pytest.approx(2 / 3)
    assert s["pq"] == pytest.approx(0.75 * 1 / 1.5)  # SQ 0.75, DQ 1 / (1 + 0.5)
    assert s["aji"] == pytest.approx(24 / (32 + 8))  # unused pred adds its 8 px to U
    assert s["dice"] == 1.0


def test_merge():
    true = _img((1, 0, 0, 4, 4), (2, 0, 4, 4, 8))  # two 16 px squares
    pred = _img((7, 0, 0, 4, 8))  # one 32 px object: IoU 0.5 with each
    s = instance_scores(true, pred)
    assert (s["tp"], s["fp"], s["fn"]) == (0, 1, 2)
    assert s["f1"] == 0.0
    assert s["pq"] == 0.0
    assert s["aji"] == pytest.approx((16 + 16) / (32 + 32))  # pred reused for both
    # below 0.5 the matching is one-to-one (Hungarian): one pair only
    m = match_instances(true, pred, iou_threshold=0.3)
    assert (m.tp, m.fp, m.fn) == (1, 0, 1)
    assert f1_at_iou(true, pred, iou_threshold=0.3) == pytest.approx(2 / 3)


def test_true_object_without_overlap_counts_in_union():
    true = _img((1, 0, 0, 2, 2), (2, 5, 5, 7, 7))  # 4 px each
    pred = _img((1, 0, 0, 2, 2))
    assert aggregated_jaccard_index(true, pred) == pytest.approx(4 / 8)
    assert f1_at_iou(true, pred) == pytest.approx(2 / 3)


def test_huge_label_values_and_bool():
    true = _img((1, 0, 0, 4, 4)).astype(np.int64) * 4_000_000_000
    pred = _img((1, 0, 1, 4, 5)).astype(bool)
    assert aggregated_jaccard_index(true, pred) == pytest.approx(0.6)


def test_matches_brute_force_on_random_labels():
    rng = np.random.default_rng(1)
    true = np.zeros((60, 60), np.int32)
    pred = np.zeros((60, 60), np.int32)
    for lab in range(1, 25):
        y, x = rng.integers(0, 52, 2)
        true[y : y + rng.integers(3, 9), x : x + rng.integers(3, 9)] = lab
        dy, dx = rng.integers(-2, 3, 2)
        y, x = np.clip([y + dy, x + dx], 0, 52)
        pred[y : y + rng.integers(3, 9), x : x + rng.integers(3, 9)] = lab + 100
    ious = {}
    for t in np.unique(true)[1:]:
        for p in np.unique(pred)[1:]:
            inter = np.sum((true == t) & (pred == p))
            if inter:
                ious[t, p] = inter / np.sum((true == t) | (pred == p))
    expected = sorted((t, p) for (t, p), v in ious.items() if v > 0.5)
    m = match_instances(true, pred)
    assert sorted(zip(m.true_ids.tolist(), m.pred_ids.tolist(), strict=True)) == expected
    # AJI by the definition
    c = u = 0
    used = set()
    for t in np.unique(true)[1:]:
        cands = {p: v for (tt, p), v in ious.items() if tt == t}
        if not cands:
            u += np.sum(true == t)
            continue
        p = max(cands, key=cands.get)
        used.add(p)
        c += np.sum((true == t) & (pred == p))
        u += np.sum((true == t) | (pred == p))
    u += sum(np.sum(pred == p) for p in np.unique(pred)[1:] if p not in used)
    assert aggregated_jaccard_index(true, pred) == pytest.approx(c / u)


@pytest.mark.parametrize(
    ("true", "pred", "match"),
    [
        (np.zeros((3, 3), int), np.zeros((3, 4), int), "same shape"),
        (np.zeros((3, 3), float), np.zeros((3, 3), int), "integer"),
        (-np.ones((3, 3), int), np.zeros((3, 3), int), "negative"),
    ],
)
def test_invalid_input(true, pred, match):
    with pytest.raises(ValueError, match=match):
        instance_scores(true, pred)


def test_invalid_threshold():
    z = np.zeros((2, 2), int)
    with pytest.raises(ValueError, match="iou_threshold"):
        f1_at_iou(z, z, iou_threshold=1.0)
