"""Recall and precision of nuclei detection on the real 20x slide CMU-1-Small-Region.

CMU-1 has no published annotations; ``data/cmu1_nuclei_centroids.json`` holds 275 centroids
of plainly visible dark nuclei in three regions, marked semi-automatically and checked by
eye (how: benchmarks/RESULTS.md, "InstanSeg on a real 20x slide"). Each segmenter runs
through ``segment_nuclei(path, region=box +- 40 px, tissue=False)``; a marked nucleus is
found when it lies in (1 px tolerance) a detected object, one object finding at most one.
Precision counts the detected objects of the regions listed in ``precision_regions`` (where
the faint nuclei are few) whose centroid is 5 px or more inside the box; it is a lower bound
(an unmarked faint nucleus counts against it).

Usage::

    python benchmarks/cmu1_recall.py [--segmenters builtin,instanseg]
        [--options '{"instanseg": {"min_area_um2": 10}}']
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope import segment_nuclei
from napari_slidescope.analysis.resample import resample_nearest
from napari_slidescope.segmenters import get_segmenter

_MARGIN = 40
_BORDER = 5


def _score(labels: np.ndarray, points: np.ndarray) -> tuple[int, int, int]:
    labels = ndi.grey_dilation(labels, size=3)
    hit = {int(labels[y, x]) for y, x in points if labels[y, x] > 0}
    tp, fn = len(hit), len(points) - len(hit)
    ids = np.arange(1, int(labels.max()) + 1)
    with np.errstate(invalid="ignore", divide="ignore"):  # ids with no pixel left: nan
        centres = ndi.center_of_mass(labels > 0, labels, ids) if ids.size else []
    h, w = labels.shape
    fp = sum(
        1
        for i, (cy, cx) in zip(ids, centres, strict=True)
        if not np.isnan(cy)
        and _BORDER <= cy < h - _BORDER
        and _BORDER <= cx < w - _BORDER
        and int(i) not in hit
    )
    return tp, fn, fp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = Path(os.environ.get("SLIDESCOPE_TESTDATA", "../shared/testdata"))
    ap.add_argument("--slide", type=Path, default=data / "CMU-1-Small-Region.svs")
    ap.add_argument(
        "--marks", type=Path, default=Path(__file__).parent / "data" / "cmu1_nuclei_centroids.json"
    )
    ap.add_argument("--segmenters", default="builtin,instanseg")
    ap.add_argument("--options", default="{}", help="JSON: segmenter name -> its options")
    args = ap.parse_args()
    marks = json.loads(args.marks.read_text())
    options = json.loads(args.options)
    print(f"{args.slide.name}; load {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name in args.segmenters.split(","):
        seg = get_segmenter(name, **options.get(name, {}))
        t0 = time.perf_counter()
        tot = np.zeros(3, int)
        cells = []
        for key, region in marks["regions"].items():
            y0, x0, y1, x1 = region["box"]
            box = (y0 - _MARGIN, x0 - _MARGIN, y1 + _MARGIN, x1 + _MARGIN)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = segment_nuclei(args.slide, region=box, segmenter=seg, tissue=False)
            got = resample_nearest(
                res.labels,
                src_origin=res.origin,
                src_downsample=res.downsample,
                dst_origin=(y0, x0),
                dst_downsample=(1.0, 1.0),
                dst_shape=(y1 - y0, x1 - x0),
            )
            labels = np.zeros((y1 - y0, x1 - x0), np.int32)
            if got is not None:
                (a, b, c, d), values = got
                labels[a:c, b:d] = values
            pts = np.asarray(region["centroids"]) - (y0, x0)
            tp, fn, fp = _score(labels, pts)
            if key not in marks["precision_regions"]:
                fp = 0
            tot += (tp, fn, fp)
            cells.append(f"{key}: {tp} found, {fn} missed, {fp} unmarked")
        tp, fn, fp = tot
        prec_tp = sum(
            int(c.split(": ")[1].split()[0])
            for c, k in zip(cells, marks["regions"], strict=True)
            if k in marks["precision_regions"]
        )
        print(
            f"{name} {options.get(name, {})}: recall {tp / (tp + fn):.3f}, precision "
            f"({'+'.join(marks['precision_regions'])}) {prec_tp / max(1, prec_tp + fp):.3f}; "
            f"{'; '.join(cells)} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
