"""Cell classifier: accuracy from few examples, and train/predict time and memory at scale.

Accuracy: synthetic H&E with three populations of known class
(:mod:`napari_slidescope.sample_cell_types`: lymphocytes, vesicular tumour nuclei, spindle
nuclei). Nuclei are found by the built-in segmenter ("segmented") and, to separate the
classifier from the segmenter, also taken from the rendering's own outlines ("true
outlines", measured by the same ``measure_nuclei``). N examples per class (5, 10, 25, 50)
are drawn from the training images, the forest trained, and the balanced accuracy measured
on other images; each N is repeated over several random draws (median, min-max). The peer
in the same run: the same forest on the nucleus's own measurements only (no neighbourhood
features).

Scale: a table of 10^5 and 10^6 nuclei made by tiling the segmented test nuclei side by
side (realistic densities and values); times to compute features, to predict, and to train
from 500 examples; memory of the feature matrix.

    python benchmarks/cell_classifier.py [--quick]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
import warnings

import numpy as np
from sklearn.ensemble import RandomForestClassifier

from napari_slidescope.analysis.cell_features import cell_features, default_features
from napari_slidescope.analysis.measure import measure_nuclei
from napari_slidescope.analysis.stains import estimate_stains
from napari_slidescope.pipeline.cell_forest import train_classifier
from napari_slidescope.pipeline.nuclei import segment_nuclei
from napari_slidescope.sample_cell_types import CLASS_NAMES, make_cells_image

MPP = 0.5
SIZE_UM = 400.0


def _images(seeds):
    out = []
    for seed in seeds:
        rgb, truth = make_cells_image(SIZE_UM, mpp=MPP, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seg = segment_nuclei(rgb, mpp=MPP, tissue=False, segmenter="builtin", workers=1)
        seg_cls = truth.class_at(seg.columns["centroid_y_um"], seg.columns["centroid_x_um"])
        od = estimate_stains(rgb).separate(rgb)
        true_t = measure_nuclei(truth.labels, mpp=MPP, od=od)
        true_cls = truth.classes[true_t["id"] - 1]
        out.append({"segmented": (seg.columns, seg_cls), "true outlines": (true_t, true_cls)})
    return out


def _balanced(pred, truth):
    return float(np.mean([np.mean(pred[truth == k] == k) for k in np.unique(truth)]))


def accuracy(train_imgs, test_imgs, repeats):
    rows = []
    for kind in ("segmented", "true outlines"):
        for feats in ("all", "own"):
            for n in (5, 10, 25, 50):
                scores = []
                for rep in range(repeats):
                    rng = np.random.default_rng(rep)
                    k = rng.integers(len(train_imgs))
                    # examples from one training image (as a user marks them on one slide)
                    table, cls = train_imgs[k][kind]
                    labels = {}
                    for c in range(3):
                        rows_c = np.flatnonzero(cls == c)
                        pick = rng.choice(rows_c, min(n, rows_c.size), replace=False)
                        labels.update({int(table["id"][r]): CLASS_NAMES[c] for r in pick})
                    f = default_features(table, radius_um=None if feats == "own" else 25.0)
                    clf = train_classifier(table, labels, features=f, classes=CLASS_NAMES)
                    preds, truths = [], []
                    for img in test_imgs:
                        t, c = img[kind]
                        names, _, _ = clf.predict_classes(t)
                        keep = c >= 0
                        idx = {name: i for i, name in enumerate(CLASS_NAMES)}
                        preds.append(np.array([idx[x] for x in names[keep]]))
                        truths.append(c[keep])
                    scores.append(_balanced(np.concatenate(preds), np.concatenate(truths)))
                rows.append((kind, feats, n, np.median(scores), min(scores), max(scores)))
                print(
                    f"| {kind} | {feats} | {n} | {np.median(scores):.3f} "
                    f"({min(scores):.3f}-{max(scores):.3f}) |",
                    flush=True,
                )
    return rows


def tiled(table, cls, n):
    """A table of `n` nuclei: copies of `table` side by side (offset by the image size)."""
    reps = -(-n // len(table["id"]))
    side = int(np.ceil(np.sqrt(reps)))
    out = {k: [] for k in table}
    for r in range(reps):
        dy, dx = (r // side) * SIZE_UM, (r % side) * SIZE_UM
        for k, v in table.items():
            v = np.asarray(v)
            if k == "centroid_y_um":
                v = v + dy
            elif k == "centroid_x_um":
                v = v + dx
            elif k == "id":
                v = np.arange(len(v)) + r * len(v) + 1
            out[k].append(v)
    big = {k: np.concatenate(v)[:n] for k, v in out.items()}
    return big, np.tile(cls, reps)[:n]


def scale(test_img, sizes):
    table, cls = test_img["segmented"]
    for n in sizes:
        big, bcls = tiled(table, cls, n)
        rng = np.random.default_rng(0)
        labels = {}
        for c in range(3):
            pick = rng.choice(np.flatnonzero(bcls == c), 167, replace=True)
            labels.update({int(big["id"][r]): CLASS_NAMES[c] for r in pick})
        (clf, t_train, c_train) = _timed(train_classifier, big, labels)
        rows = np.array([i - 1 for i in labels], np.intp)  # ids are row + 1 in the tiled table
        _, x500 = cell_features(big, clf.features, rows=rows)
        y = np.array([CLASS_NAMES.index(c) for c in labels.values()])
        forest = RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=1)
        _, t_fit, c_fit = _timed(forest.fit, x500, y)
        tracemalloc.start()
        (_, x), t_feat, c_feat = _timed(cell_features, big, clf.features)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        _, t_pred, c_pred = _timed(clf.predict_proba, x)
        print(
            f"| {n:,} | {len(labels)} | {t_train:.2f} ({c_train:.2f}) | {t_fit:.2f} ({c_fit:.2f}) "
            f"| {t_feat:.2f} ({c_feat:.2f}) | {t_pred:.2f} ({c_pred:.2f}) | "
            f"{(t_feat + t_pred) / n * 1e5:.2f} ({(c_feat + c_pred) / n * 1e5:.2f}) | "
            f"{x.nbytes / 2**20:.0f} ({x.shape[1]} features) | {peak / 2**20:.0f} |",
            flush=True,
        )


def _timed(fn, *args):
    """Return (result, wall s, CPU s of this process, all threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer images, draws and sizes")
    ap.add_argument("--scale-only", action="store_true", help="only the time and memory part")
    args = ap.parse_args()
    t0 = time.perf_counter()
    train_seeds, test_seeds = ((100,), (200,)) if args.quick else ((100, 101, 102), (200, 201))
    test_imgs = _images(test_seeds)
    if args.scale_only:
        _scale_table(test_imgs, args.quick)
        return
    train_imgs = _images(train_seeds)
    for kind in ("segmented", "true outlines"):
        counts = np.bincount(np.concatenate([i[kind][1] for i in test_imgs]) + 1, minlength=4)
        print(
            f"test nuclei, {kind}: "
            + ", ".join(
                f"{n} {c}" for n, c in zip(("unmatched", *CLASS_NAMES), counts, strict=True)
            )
        )
    print("\n| nuclei | features | N per class | balanced accuracy, median (min-max) |")
    print("|---|---|---|---|")
    accuracy(train_imgs, test_imgs, repeats=3 if args.quick else 5)
    _scale_table(test_imgs, args.quick)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


def _scale_table(test_imgs, quick):
    print(
        "\n| nuclei | examples | train_classifier s | forest fit s | features s | predict s |"
        " features + predict per 10^5 s | feature matrix MiB | feature peak MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    scale(test_imgs[0], (100_000,) if quick else (100_000, 1_000_000))


if __name__ == "__main__":
    main()
