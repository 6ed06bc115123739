"""Live preview of tissue regions on a full screen: tile caches against today's direct path.

The "Tissue regions" dock classifies the view (at most 1024 x 1024 working pixels, its
``PREVIEW_MAX_PX``) after every pan, zoom and stroke. Two ways of doing that, GUI-free and
interleaved in one process on the same slide and views:

- direct (the dock before the caches, the baseline): ``train_region_classifier`` after a
  stroke (stains from the examples), ``classify_regions`` on the view (tissue-gated, the
  dock's default), the slide kept open between updates;
- cached: one :class:`~napari_slidescope.pipeline.region_preview.RegionPreview` for the
  slide (features and classes cached per 128-px tile, stains from the slide), its
  ``train`` and ``classify``; also the time until the first tile is ready.

Each run visits a view never seen before (the slide is cut into 1280 x 1280 working-px
cells, one per run) and times, in order: "new view" (the first look at it: nothing cached),
"pan" (a quarter screen to the right), "zoom in" (2x, the centre half), "zoom out" (back to
the full screen), "stroke" (one stroke more of a class, drawn in the view: retrain, then
classify the view). The two ways alternate which goes first. Medians over the runs, ratio
direct / cached, and the pixel accuracy of each way's last stroke map against the truth.

    python benchmarks/regions_preview_cache.py SLIDE.svs [--runs 5] [--view-px 1024]

SLIDE is a synthetic region slide with ``SLIDE.truth.npz`` beside it
(``benchmarks/regions_data.py``), e.g. the 24000 x 30000 one; its level-0 µm/px is read
from the slide.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _strokes_in(truth, box, per_class: int, seed: int, length_um: float = 40.0):
    """Short horizontal lines (level-0 (row, col)) inside each class within a level-0 box."""
    from scipy import ndimage

    from napari_slidescope.sample_regions import REGION_CLASSES, TRUTH_MPP

    rng = np.random.default_rng(seed)
    px = TRUTH_MPP / truth.mpp
    half = length_um / 2 / truth.mpp
    y0, x0, y1, x1 = (int(v / px) for v in box)
    out = {}
    for k, name in enumerate(REGION_CLASSES, start=1):
        sub = truth.labels[y0:y1, x0:x1] == k
        inner = ndimage.binary_erosion(sub, iterations=4)
        ys, xs = np.nonzero(inner if inner.any() else sub)
        if not len(ys):
            continue
        pick = rng.choice(len(ys), per_class, replace=len(ys) < per_class)
        out[name] = [
            np.array(
                [
                    [(y0 + ys[i] + 0.5) * px, (x0 + xs[i] + 0.5) * px - half],
                    [(y0 + ys[i] + 0.5) * px, (x0 + xs[i] + 0.5) * px + half],
                ]
            )
            for i in pick
        ]
    return out


def _now() -> float:
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slide")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--view-px", type=int, default=1024, help="view side, working px")
    parser.add_argument("--mpp", type=float, default=2.0, help="working µm/px")
    args = parser.parse_args()
    from napari_slidescope import classify_regions, open_slide, train_region_classifier
    from napari_slidescope.pipeline.region_preview import RegionPreview
    from regions_data import load_truth

    truth = load_truth(args.slide)
    slide = open_slide(args.slide)
    mpp0 = float(slide.mpp[0])
    side = round(args.view_px * args.mpp / mpp0)  # level-0 px of the view
    cell = round(side * 1.25)
    h0, w0 = slide.shape0
    cells = [(y, x) for y in range(0, h0 - cell + 1, cell) for x in range(0, w0 - cell + 1, cell)]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(cells))[: args.runs]
    if len(order) < args.runs:
        raise SystemExit(f"{args.slide}: room for {len(order)} runs of {cell} px cells")
    # the strokes so far: five per class inside the first view (drawn where the user looks)
    cy, cx = cells[order[0]]
    examples = _strokes_in(truth, (cy, cx, cy + side, cx + side), 5, seed=0)
    opts = {"mpp": args.mpp, "classes": list(examples)}
    preview = RegionPreview(slide)
    old_clf = train_region_classifier(slide, examples, **opts)
    new_clf = preview.train(examples, **opts)
    times: dict[str, dict[str, list[float]]] = {}
    first: dict[str, list[float]] = {}
    acc: dict[str, list[float]] = {"direct": [], "cached": []}

    def note(op: str, way: str, s: float) -> None:
        times.setdefault(op, {}).setdefault(way, []).append(s)

    for k, idx in enumerate(order):
        y, x = cells[idx]
        views = {
            "new view": (y, x, y + side, x + side),
            "pan": (y, x + side // 4, y + side, x + side // 4 + side),
        }
        py, px_, q = views["pan"][0], views["pan"][1], side // 4
        views["zoom in"] = (py + q, px_ + q, py + side - q, px_ + side - q)
        views["zoom out"] = views["pan"]
        for op, box in views.items():
            for way in ("direct", "cached") if k % 2 == 0 else ("cached", "direct"):
                t0 = time.perf_counter()
                if way == "direct":
                    classify_regions(slide, old_clf, region=box)
                else:
                    ticks: list[float] = []
                    preview.classify(new_clf, box, on_tile=lambda *_, t=ticks: t.append(_now()))
                    first.setdefault(op, []).append((ticks[0] if ticks else _now()) - t0)
                note(op, way, time.perf_counter() - t0)
        # one stroke more, of the class the seed picks, inside the view
        box = views["zoom out"]
        more = _strokes_in(truth, box, 1, seed=100 + k)
        name = list(more)[k % len(more)]
        examples.setdefault(name, []).append(more[name][0])
        opts["classes"] = list(examples)
        for way in ("direct", "cached") if k % 2 == 0 else ("cached", "direct"):
            t0 = time.perf_counter()
            if way == "direct":
                old_clf = train_region_classifier(slide, examples, **opts)
                regions = classify_regions(slide, old_clf, region=box)
            else:
                ticks = []
                new_clf = preview.train(examples, **opts)
                regions = preview.classify(
                    new_clf, box, on_tile=lambda *_, t=ticks: t.append(_now())
                )
                first.setdefault("stroke", []).append(ticks[0] - t0)
            note("stroke", way, time.perf_counter() - t0)
            want = truth.grid(regions.downsample[0], regions.labels.shape, regions.origin)
            on = (regions.labels > 0) & (want > 0)
            acc[way].append(float((regions.labels[on] == want[on]).mean()))
    print(f"load average at the end: {os.getloadavg()}")
    print(
        f"slide {Path(args.slide).name} {slide.shape0}, view {args.view_px} x {args.view_px} "
        f"working px at {args.mpp} µm/px ({side} level-0 px), {args.runs} runs, "
        f"{sum(len(v) for v in examples.values())} strokes at the end; "
        f"cache {preview.cached_bytes / 2**20:.0f} MiB in {preview.cached_tiles} tiles"
    )
    print(f"{'update':<10}{'direct s':>10}{'cached s':>10}{'first tile s':>14}{'x faster':>10}")
    for op, ways in times.items():
        d, c = statistics.median(ways["direct"]), statistics.median(ways["cached"])
        f = statistics.median(first[op])
        print(f"{op:<10}{d:>10.3f}{c:>10.3f}{f:>14.3f}{d / c:>10.2f}")
    for way, a in acc.items():
        print(f"pixel accuracy after each stroke ({way}): " + " ".join(f"{v:.3f}" for v in a))
    preview.close()
    slide.close()


if __name__ == "__main__":
    main()
