"""Tissue regions on synthetic slides with known regions: accuracy, resolution, seams, speed.

Usage: python benchmarks/regions_accuracy.py [--data DIR] [--draws 5]

DIR (default $SLIDESCOPE_BENCH_DATA/regions, else ./bench-data-regions) receives the same
synthetic tissue (napari_slidescope.sample_regions, 2 x 2 mm, seed 7) written at 40x
(0.25 µm/px) and 20x (0.5 µm/px). Strokes (40 µm lines, 20 µm wide) are drawn from the truth
in the LEFT half only; every figure is measured on the held-out RIGHT half (all its tissue
pixels at the working resolution, centre inside the true region map).

Prints, as medians over `--draws` stroke draws:
1. per-class IoU and pixel accuracy by strokes per class (2, 5, 10), trained at 40x and
   applied at 40x and (the same classifier) at 20x (default features);
2. feature sets and working resolutions (5 strokes per class): accuracy and prediction
   throughput (working Mpx/s, features + forest, tissue-gating off);
3. seams (default features): a 128-px-tiled run vs a one-tile run (pixels that differ)
   and accuracy within 4 px of the tile borders vs the interior;
4. the tissue gate (5 strokes/class, 40x, right half): tissue-gated runs with the gate of
   before (``regions_tissue(envelope_um=0)``) and of now (64 µm), scored on every truth
   tissue pixel (unclassified counts as wrong), with the share of truth glass classified.

``--sections 4`` runs only the fourth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from napari_slidescope import classify_regions, regions_tissue, train_region_classifier
from napari_slidescope.analysis.region_features import FEATURE_KINDS
from napari_slidescope.sample_regions import REGION_CLASSES, make_region_truth, write_region_slide

SIDE_UM = 2048.0
SEED = 7


def slides(data: Path) -> dict[str, tuple[Path, object]]:
    data.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, mpp in (("40x", 0.25), ("20x", 0.5)):
        n = int(SIDE_UM / mpp)
        path = data / f"accuracy_{name}.svs"
        if path.exists():
            truth = make_region_truth((n, n), mpp=mpp, seed=SEED, region_um=300.0)
        else:
            truth = write_region_slide(path, shape=(n, n), mpp=mpp, seed=SEED, region_um=300.0)
        out[name] = (path, truth)
    return out


def strokes(truth, n: int, draw: int) -> dict[str, list[np.ndarray]]:
    """n lines per class with their whole length in the left half."""
    lines = truth.example_lines(per_class=200, seed=100 + draw)
    half = truth.shape[1] / 2
    return {c: [v for v in vs if v[:, 1].max() < half - 80][:n] for c, vs in lines.items()}


def score(rm, truth) -> tuple[float, dict[str, float]]:
    want = truth.grid(rm.downsample[0], rm.labels.shape, rm.origin)
    ok = want > 0
    acc = float((rm.labels[ok] == want[ok]).mean())
    iou = {}
    for k, c in enumerate(REGION_CLASSES, start=1):
        a, b = (rm.labels == k) & ok, (want == k) & ok
        iou[c] = float((a & b).sum() / max((a | b).sum(), 1))
    return acc, iou


def right_half(truth) -> tuple[int, int, int, int]:
    h, w = truth.shape
    return (0, w // 2, h, w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    root = os.environ.get("SLIDESCOPE_BENCH_DATA")
    ap.add_argument("--data", default=str(Path(root) / "regions") if root else "bench-data-regions")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--sections", default="1,2,3,4", help="sections to run, e.g. 4 (1-3 run together)")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    s = slides(Path(a.data))
    p40, t40 = s["40x"]
    p20, t20 = s["20x"]
    run = {int(v) for v in a.sections.split(",")}
    if 1 in run or 2 in run or 3 in run:
        accuracy(a, p40, t40, p20, t20)
    if 4 in run:
        gate(a, p40, t40)
    print(f"load average at end: {os.getloadavg()}")


def gate(a, p40, t40) -> None:
    print("\n## 4. the tissue gate (5 strokes/class, 40x, right half, tissue-gated)")
    print("| gate | pixel accuracy | " + " | ".join(REGION_CLASSES) + " | glass classified |")
    print("|---|---|" + "---|" * len(REGION_CLASSES) + "---|")
    box = right_half(t40)
    gates = {e: regions_tissue(p40, region=box, envelope_um=e) for e in (0.0, 64.0)}
    res: dict[float, list[tuple[float, dict[str, float], float]]] = {e: [] for e in gates}
    for d in range(a.draws):
        clf = train_region_classifier(p40, strokes(t40, 5, d))
        for e, tissue in gates.items():
            rm = classify_regions(p40, clf, region=box, tissue=tissue)
            acc, iou = score(rm, t40)
            want = t40.grid(rm.downsample[0], rm.labels.shape, rm.origin)
            res[e].append((acc, iou, float((rm.labels[want == 0] > 0).mean())))
    for e, rows in res.items():
        label = "before (envelope 0)" if e == 0 else f"now (envelope {e:g} µm)"
        acc = statistics.median(r[0] for r in rows)
        ious = [statistics.median(r[1][c] for r in rows) for c in REGION_CLASSES]
        glass = statistics.median(r[2] for r in rows)
        print(
            f"| {label} | {acc:.3f} | "
            + " | ".join(f"{v:.3f}" for v in ious)
            + f" | {glass:.4f} |",
            flush=True,
        )


def accuracy(a, p40, t40, p20, t20) -> None:
    print("## 1. strokes per class (trained at 40x; held-out right half)")
    print("| strokes/class | applied at | pixel accuracy | " + " | ".join(REGION_CLASSES) + " |")
    print("|---|---|---|" + "---|" * len(REGION_CLASSES))
    for n in (2, 5, 10):
        res: dict[str, list[tuple[float, dict[str, float]]]] = {"40x": [], "20x": []}
        for d in range(a.draws):
            clf = train_region_classifier(p40, strokes(t40, n, d))
            res["40x"].append(
                score(classify_regions(p40, clf, region=right_half(t40), tissue=False), t40)
            )
            res["20x"].append(
                score(classify_regions(p20, clf, region=right_half(t20), tissue=False), t20)
            )
        for where, rows in res.items():
            acc = statistics.median(r[0] for r in rows)
            ious = [statistics.median(r[1][c] for r in rows) for c in REGION_CLASSES]
            print(
                f"| {n} | {where} | {acc:.3f} | " + " | ".join(f"{v:.3f}" for v in ious) + " |",
                flush=True,
            )

    print("\n## 2. feature sets and working resolution (5 strokes/class, 40x)")
    print("| features | mpp | features/px | pixel accuracy | min IoU | Mpx/s |")
    print("|---|---|---|---|---|---|")
    every = dict(kinds=FEATURE_KINDS)
    configs = [
        ("RGB + H + E, all 7 kinds, 1-8 µm", every),
        ("H + E only", dict(channels=("hematoxylin", "eosin"), **every)),
        ("RGB only", dict(channels=("red", "green", "blue"), **every)),
        ("Gaussian + gradient + LoG (the default)", dict(kinds=("gaussian", "log", "gradient"))),
        ("scales 2, 8 µm", dict(scales_um=(2.0, 8.0), **every)),
        ("1 µm/px", dict(mpp=1.0, **every)),
        ("4 µm/px", dict(mpp=4.0, **every)),
    ]
    for label, opts in configs:
        rows, speed, nf, mpp = [], [], 0, opts.get("mpp", 2.0)
        for d in range(a.draws):
            clf = train_region_classifier(p40, strokes(t40, 5, d), **opts)
            nf = len(clf.features)
            t0 = time.perf_counter()
            rm = classify_regions(p40, clf, region=right_half(t40), tissue=False)
            dt = time.perf_counter() - t0
            speed.append(rm.labels.size / dt / 1e6)
            rows.append(score(rm, t40))
        acc = statistics.median(r[0] for r in rows)
        miou = statistics.median(min(r[1].values()) for r in rows)
        print(
            f"| {label} | {mpp} | {nf} | {acc:.3f} | {miou:.3f} | {statistics.median(speed):.3f} |",
            flush=True,
        )

    print("\n## 3. seams (5 strokes/class, 40x, right half)")
    clf = train_region_classifier(p40, strokes(t40, 5, 0))
    tiled = classify_regions(p40, clf, region=right_half(t40), tissue=False, tile_px=128)
    whole = classify_regions(p40, clf, region=right_half(t40), tissue=False, tile_px=8192)
    want = t40.grid(tiled.downsample[0], tiled.labels.shape, tiled.origin)
    rr, cc = np.mgrid[: want.shape[0], : want.shape[1]]
    band = (np.minimum(rr % 128, 127 - rr % 128) < 4) | (np.minimum(cc % 128, 127 - cc % 128) < 4)
    ok = want > 0
    acc_band = (tiled.labels[ok & band] == want[ok & band]).mean()
    acc_in = (tiled.labels[ok & ~band] == want[ok & ~band]).mean()
    differ = int((tiled.labels != whole.labels).sum())
    print(f"pixels differing tiled (128 px) vs untiled: {differ} of {tiled.labels.size}")
    n_band = int((ok & band).sum())
    print(
        f"accuracy within 4 px of tile borders: {acc_band:.4f} ({n_band} px); "
        f"interior: {acc_in:.4f}"
    )


if __name__ == "__main__":
    main()
