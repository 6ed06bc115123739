"""Accuracy metrics for instance segmentation (nuclei).

All metrics start from one contingency table of the two label images (pixel counts of every
pair of overlapping objects), built in linear time with :func:`numpy.bincount`, so scoring a
1000 x 1000 image with ~500 objects takes a few tens of milliseconds.

Conventions
-----------
* Label images are integer arrays of the same shape; ``0`` is background and every other
  value is one object. Labels need not be consecutive.
* Two objects *match* when their IoU is **strictly greater** than ``iou_threshold``. For
  thresholds >= 0.5 a match is necessarily unique (two objects cannot both overlap a third by
  more than half of their union); for lower thresholds the one-to-one assignment maximising the
  total IoU is used (Hungarian algorithm).
* When both images are empty every score is 1.0 (perfect agreement); when exactly one is empty
  every score is 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment

__all__ = [
    "InstanceMatch",
    "aggregated_jaccard_index",
    "f1_at_iou",
    "instance_scores",
    "match_instances",
    "panoptic_quality",
    "pixel_dice",
]

_DENSE_TABLE_LIMIT = 20_000_000  # cells; above this the contingency table is built sparsely


@dataclass(frozen=True)
class InstanceMatch:
    """One-to-one matching between true and predicted objects.

    Attributes
    ----------
    true_ids, pred_ids : (M,) ndarray of int64
        Labels of the matched pairs (``true_ids[k]`` matches ``pred_ids[k]``).
    iou : (M,) ndarray of float64
        IoU of each matched pair.
    n_true, n_pred : int
        Number of objects in the true and predicted label images.
    """

    true_ids: np.ndarray
    pred_ids: np.ndarray
    iou: np.ndarray
    n_true: int
    n_pred: int

    @property
    def tp(self) -> int:
        """Number of matched pairs (true positives)."""
        return int(self.iou.size)

    @property
    def fp(self) -> int:
        """Predicted objects without a match (false positives)."""
        return self.n_pred - self.tp

    @property
    def fn(self) -> int:
        """True objects without a match (false negatives)."""
        return self.n_true - self.tp


@dataclass(frozen=True)
class _Overlap:
    """Contingency table of two label images (background excluded)."""

    true_ids: np.ndarray  # (n_t,) original labels
    pred_ids: np.ndarray  # (n_p,)
    true_area: np.ndarray  # (n_t,) int64
    pred_area: np.ndarray  # (n_p,) int64
    rows: np.ndarray  # (nnz,) index into true_ids
    cols: np.ndarray  # (nnz,) index into pred_ids
    inter: np.ndarray  # (nnz,) int64 intersection areas

    @property
    def iou(self) -> np.ndarray:
        union = self.true_area[self.rows] + self.pred_area[self.cols] - self.inter
        iou: np.ndarray = self.inter / union
        return iou


def _compact(labels: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map labels to 0..n (0 = background); return (index image, original ids, areas)."""
    flat = labels.ravel()
    if flat.size and flat.min() < 0:
        raise ValueError(f"{name} must not contain negative labels; got minimum {flat.min()}")
    top = int(flat.max()) if flat.size else 0
    if top <= 4 * flat.size + 1024:
        counts = np.bincount(flat, minlength=top + 1) if flat.size else np.zeros(1, np.int64)
        ids = np.flatnonzero(counts[1:]) + 1
        lut = np.zeros(top + 1, dtype=np.int64)
        lut[ids] = np.arange(1, ids.size + 1)
        return lut[flat], ids.astype(np.int64), counts[ids].astype(np.int64)
    uniq, inv, counts = np.unique(flat, return_inverse=True, return_counts=True)
    if uniq[0] != 0:  # no background pixel: shift so that index 0 stays background
        return inv + 1, uniq.astype(np.int64), counts.astype(np.int64)
    return inv, uniq[1:].astype(np.int64), counts[1:].astype(np.int64)


def _check(true: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    true = np.asarray(true)
    pred = np.asarray(pred)
    for name, arr in (("true", true), ("pred", pred)):
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
            raise ValueError(f"{name} must be an integer label image; got dtype {arr.dtype}")
    if true.shape != pred.shape:
        raise ValueError(
            f"true and pred must have the same shape; got {true.shape} and {pred.shape}"
        )
    return true, pred


def _overlap(true: np.ndarray, pred: np.ndarray) -> _Overlap:
    true, pred = _check(true, pred)
    t_idx, t_ids, t_area = _compact(true.astype(np.int64, copy=False), "true")
    p_idx, p_ids, p_area = _compact(pred.astype(np.int64, copy=False), "pred")
    n_t, n_p = t_ids.size, p_ids.size
    width = n_p + 1
    keys = t_idx * width + p_idx
    if (n_t + 1) * width <= _DENSE_TABLE_LIMIT:
        table = np.bincount(keys, minlength=(n_t + 1) * width)
        keys = np.flatnonzero(table)
        counts = table[keys]
    else:
        keys, counts = np.unique(keys, return_counts=True)
    rows, cols = np.divmod(keys, width)
    keep = (rows > 0) & (cols > 0)
    return _Overlap(
        true_ids=t_ids,
        pred_ids=p_ids,
        true_area=t_area,
        pred_area=p_area,
        rows=rows[keep] - 1,
        cols=cols[keep] - 1,
        inter=counts[keep].astype(np.int64),
    )


def _match(ov: _Overlap, iou_threshold: float) -> InstanceMatch:
    if not 0.0 <= iou_threshold < 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1); got {iou_threshold!r}")
    iou = ov.iou
    cand = iou > iou_threshold
    rows, cols, vals = ov.rows[cand], ov.cols[cand], iou[cand]
    if iou_threshold < 0.5 and vals.size:
        # candidates may conflict: maximise the total IoU with the Hungarian algorithm
        ur, r = np.unique(rows, return_inverse=True)
        uc, c = np.unique(cols, return_inverse=True)
        cost = sparse.coo_matrix((vals, (r, c)), shape=(ur.size, uc.size)).toarray()
        ri, ci = linear_sum_assignment(cost, maximize=True)
        ok = cost[ri, ci] > iou_threshold
        rows, cols, vals = ur[ri[ok]], uc[ci[ok]], cost[ri[ok], ci[ok]]
    order = np.argsort(rows, kind="stable")
    return InstanceMatch(
        true_ids=ov.true_ids[rows[order]],
        pred_ids=ov.pred_ids[cols[order]],
        iou=vals[order].astype(np.float64),
        n_true=int(ov.true_ids.size),
        n_pred=int(ov.pred_ids.size),
    )


def match_instances(
    true: np.ndarray, pred: np.ndarray, *, iou_threshold: float = 0.5
) -> InstanceMatch:
    """Match true and predicted objects one-to-one by IoU.

    Parameters
    ----------
    true, pred : (M, N) ndarray of int
        Label images (0 = background) of the same shape.
    iou_threshold : float, optional
        A pair matches when its IoU is strictly greater than this value, in [0, 1).

    Returns
    -------
    InstanceMatch
        Matched label pairs, their IoU, and the object counts.

    Raises
    ------
    ValueError
        If the shapes differ, a label image is not integer, has negative labels, or the
        threshold is outside [0, 1).

    Examples
    --------
    >>> a = np.zeros((4, 4), int); a[:2, :2] = 1
    >>> match_instances(a, a).tp
    1
    """
    return _match(_overlap(true, pred), iou_threshold)


def _f1(m: InstanceMatch) -> float:
    if m.n_true == 0 and m.n_pred == 0:
        return 1.0
    return 2.0 * m.tp / (m.n_true + m.n_pred)


def f1_at_iou(true: np.ndarray, pred: np.ndarray, *, iou_threshold: float = 0.5) -> float:
    """Compute the object F1 score ``2 TP / (2 TP + FP + FN)``, matching at IoU > threshold.

    Parameters
    ----------
    true, pred : (M, N) ndarray of int
        Label images (0 = background).
    iou_threshold : float, optional
        Matching threshold, see :func:`match_instances`.

    Returns
    -------
    float
        F1 in [0, 1]; 1.0 when both images are empty.
    """
    return _f1(match_instances(true, pred, iou_threshold=iou_threshold))


def _aji(ov: _Overlap) -> float:
    n_t, n_p = ov.true_ids.size, ov.pred_ids.size
    if n_t == 0 and n_p == 0:
        return 1.0
    inter_total = 0
    union_total = int(ov.true_area.sum())  # every true object counts at least its own area
    used = np.zeros(n_p, dtype=bool)
    if ov.inter.size:
        iou = ov.iou
        # by row, then IoU ascending, ties: larger label first, so the last is the smallest
        order = np.lexsort((-ov.cols, iou, ov.rows))
        last = np.r_[ov.rows[order][1:] != ov.rows[order][:-1], True]
        best = order[last]  # per true object: its predicted object of largest IoU
        inter = ov.inter[best]
        inter_total = int(inter.sum())
        union_total += int((ov.pred_area[ov.cols[best]] - inter).sum())
        used[ov.cols[best]] = True
    union_total += int(ov.pred_area[~used].sum())
    return inter_total / union_total if union_total else 0.0


def aggregated_jaccard_index(true: np.ndarray, pred: np.ndarray) -> float:
    """Compute the Aggregated Jaccard Index (AJI) of Kumar et al. (IEEE TMI 2017).

    Every true object ``G_i`` is paired with the predicted object ``S_j`` of largest IoU
    (the smallest label among ties; a predicted object may serve several true objects);
    ``C`` sums ``|G_i ∩ S_j|`` and ``U`` sums ``|G_i ∪ S_j|`` (``|G_i|`` when nothing
    overlaps ``G_i``); the areas of predicted objects paired with no true object are added
    to ``U``. ``AJI = C / U``.

    Parameters
    ----------
    true, pred : (M, N) ndarray of int
        Label images (0 = background).

    Returns
    -------
    float
        AJI in [0, 1]; 1.0 when both images are empty.
    """
    return _aji(_overlap(true, pred))


def _pq(m: InstanceMatch) -> tuple[float, float, float]:
    if m.n_true == 0 and m.n_pred == 0:
        return 1.0, 1.0, 1.0
    dq = m.tp / (m.tp + 0.5 * m.fp + 0.5 * m.fn)
    sq = float(m.iou.mean()) if m.tp else 0.0
    return sq * dq, sq, dq


def panoptic_quality(
    true: np.ndarray, pred: np.ndarray, *, iou_threshold: float = 0.5
) -> tuple[float, float, float]:
    """Compute the panoptic quality of Kirillov et al. (CVPR 2019), as used for nuclei by HoVer-Net.

    ``DQ = TP / (TP + FP/2 + FN/2)`` (the F1 score), ``SQ`` = mean IoU of the matched pairs,
    ``PQ = SQ * DQ``.

    Parameters
    ----------
    true, pred, iou_threshold
        As for :func:`f1_at_iou`.

    Returns
    -------
    tuple of float
        ``(PQ, SQ, DQ)``; all 1.0 when both images are empty, SQ = 0 when nothing matches.
    """
    return _pq(match_instances(true, pred, iou_threshold=iou_threshold))


def pixel_dice(true: np.ndarray, pred: np.ndarray) -> float:
    """Compute the Dice coefficient of the foreground masks (``label > 0``).

    Parameters
    ----------
    true, pred : (M, N) ndarray of int or bool
        Label images or masks.

    Returns
    -------
    float
        ``2 |T ∩ P| / (|T| + |P|)``; 1.0 when both are empty.
    """
    true, pred = _check(true, pred)
    t, p = true > 0, pred > 0
    denom = int(t.sum()) + int(p.sum())
    return 1.0 if denom == 0 else 2.0 * int(np.count_nonzero(t & p)) / denom


def instance_scores(
    true: np.ndarray, pred: np.ndarray, *, iou_threshold: float = 0.5
) -> dict[str, float]:
    """Compute all metrics of this module from one contingency table.

    Parameters
    ----------
    true, pred : (M, N) ndarray of int
        Label images (0 = background).
    iou_threshold : float, optional
        Matching threshold for F1 and PQ.

    Returns
    -------
    dict
        Keys ``f1``, ``aji``, ``pq``, ``sq``, ``dq``, ``dice``, ``tp``, ``fp``, ``fn``,
        ``n_true``, ``n_pred``.
    """
    ov = _overlap(true, pred)
    m = _match(ov, iou_threshold)
    pq, sq, dq = _pq(m)
    return {
        "f1": _f1(m),
        "aji": _aji(ov),
        "pq": pq,
        "sq": sq,
        "dq": dq,
        "dice": pixel_dice(true, pred),
        "tp": m.tp,
        "fp": m.fp,
        "fn": m.fn,
        "n_true": m.n_true,
        "n_pred": m.n_pred,
    }
