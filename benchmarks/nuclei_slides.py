"""Crops vs whole slides: annotated H&E images laid on glass, segmented as a user would.

The images of a ground-truth folder (``<id>.tif`` + ``<id>_instances.tif``, MoNuSeg 40x
crops by default) are laid out on glass with ``--gap`` px between them
(:mod:`napari_slidescope.glass_slides`) and written as a tiled pyramidal SVS (JPEG Q90
tiles, like a scanner's) at 40x, and again downsampled 2x to a 20x SVS with the ground
truth resampled. ``segment_nuclei(path)`` runs on each whole slide (tissue detection, one
preparation per slide, tiles, seams), each image's area is scored, and the same images are
scored as crops (``segment_nuclei(crop, mpp=...)``) at the same magnification, in the
same run.

InstanSeg runs with its fragment filter off (``min_area_um2=0``); the filter is applied
afterwards at each of ``--min-areas`` (µm²), so one run of the network gives the curve. A
threshold is chosen on the tuning organs (``--tune``) by mean F1 over both slides and
reported on the other organs.

Usage::

    python benchmarks/nuclei_slides.py [--data DIR] [--methods instanseg,builtin]
        [--min-areas 0,2.5,5,10] [--tune lung,breast] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import tifffile

from napari_slidescope import segment_nuclei
from napari_slidescope.analysis.metrics import instance_scores
from napari_slidescope.glass_slides import downsample, lay_on_glass, score_areas, write_svs

sys.path.insert(0, str(Path(__file__).parent))
from nuclei_accuracy import MONUSEG_MPP, ORGANS  # noqa: E402


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def _drop_small(labels: np.ndarray, min_area_um2: float, mpp: float) -> np.ndarray:
    if min_area_um2 <= 0:
        return labels
    area = np.bincount(labels.ravel()) * mpp * mpp
    small = area < min_area_um2
    small[0] = False
    return np.where(small[labels], 0, labels)


def _segmenter(method: str):
    if method == "instanseg":
        from napari_slidescope.segmenters import get_segmenter

        return get_segmenter("instanseg", min_area_um2=0.0)
    return method


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", "../shared/testdata"))
    ap.add_argument("--data", type=Path, default=default / "nuclei_gt" / "monuseg_train")
    ap.add_argument("--methods", default="instanseg")
    ap.add_argument("--min-areas", default="0,2.5,5,10")
    ap.add_argument("--tune", default="lung,breast", help="organs the threshold is chosen on")
    ap.add_argument("--gap", type=int, default=300)
    ap.add_argument("--limit", type=int, default=0, help="first N images only (quick look)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "slidescope-glass")
    args = ap.parse_args()
    areas = [float(a) for a in args.min_areas.split(",")]
    tune = set(args.tune.split(","))
    ids = sorted(p.name.removesuffix("_instances.tif") for p in args.data.glob("*_instances.tif"))
    if args.limit:
        ids = ids[: args.limit]
    images = [tifffile.imread(args.data / f"{i}.tif")[..., :3] for i in ids]
    truths = [tifffile.imread(args.data / f"{i}_instances.tif") for i in ids]
    args.out.mkdir(parents=True, exist_ok=True)
    rgb40, truth40, lay40 = lay_on_glass(images, truths, mpp=MONUSEG_MPP, gap=args.gap)
    rgb20, truth20, lay20 = downsample(rgb40, truth40, lay40, 2)
    slides = {
        "40x": (write_svs(args.out / "glass_40x.svs", rgb40, mpp=lay40.mpp), rgb40, truth40, lay40),
        "20x": (write_svs(args.out / "glass_20x.svs", rgb20, mpp=lay20.mpp), rgb20, truth20, lay20),
    }
    organ = [ORGANS.get(i.split("-")[1], "?") for i in ids]
    print(
        f"{len(ids)} images; slides {lay40.shape} at {lay40.mpp} µm/px and {lay20.shape} at "
        f"{lay20.mpp:.4f} µm/px (JPEG Q90, gap {args.gap} px); tuning organs {sorted(tune)}; "
        f"{os.cpu_count()} CPUs, load {_load()}",
        flush=True,
    )
    # rows[(method, mag, kind, min_area)] = list of per-image score dicts
    rows: dict[tuple[str, str, str, float], list[dict[str, float]]] = {}
    for method in args.methods.split(","):
        method_areas = areas if method == "instanseg" else [0.0]
        for mag, (path, rgb, truth, lay) in slides.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                res = segment_nuclei(path, segmenter=_segmenter(method))
                t_slide = time.perf_counter() - t0
                crops = []
                t0 = time.perf_counter()
                for y0, x0, y1, x1 in lay.boxes:
                    crops.append(
                        segment_nuclei(
                            rgb[y0:y1, x0:x1], mpp=lay.mpp, segmenter=_segmenter(method)
                        ).labels
                    )
                t_crops = time.perf_counter() - t0
            print(
                f"{method} {mag}: slide {t_slide:.0f} s, crops {t_crops:.0f} s, load {_load()}",
                flush=True,
            )
            for a in method_areas:
                res_a = res
                if a > 0:
                    res_a = _Result(_drop_small(res.labels, a, res.mpp), res)
                rows[(method, mag, "slide", a)] = score_areas(res_a, truth, lay)
                rows[(method, mag, "crop", a)] = [
                    instance_scores(truth[y0:y1, x0:x1], _drop_small(c, a, lay.mpp))
                    for (y0, x0, y1, x1), c in zip(lay.boxes, crops, strict=True)
                ]
    _report(rows, ids, organ, tune)


class _Result:
    """A NucleiResult with other labels (same grid)."""

    def __init__(self, labels: np.ndarray, like: object) -> None:
        self.labels = labels
        self.origin = like.origin  # type: ignore[attr-defined]
        self.downsample = like.downsample  # type: ignore[attr-defined]


def _mean(scores: list[dict[str, float]], keep: list[bool], key: str) -> float:
    values = [s[key] for s, k in zip(scores, keep, strict=True) if k]
    return statistics.fmean(values) if values else float("nan")


def _report(rows, ids, organ, tune) -> None:
    held = [o not in tune for o in organ]
    tuned = [o in tune for o in organ]
    print("\nmeans (F1@0.5 / AJI): tuning images | held-out images | all")
    print(
        "method   mag  min_area  crop tune    slide tune   crop held    slide held   "
        "slide-crop held (F1, AJI)"
    )
    for (method, mag, kind, a), scores in sorted(rows.items()):
        if kind != "slide":
            continue
        crop = rows[(method, mag, "crop", a)]
        cells = []
        for keep in (tuned, held):
            for sc in (crop, scores):
                cells.append(f"{_mean(sc, keep, 'f1'):.3f}/{_mean(sc, keep, 'aji'):.3f}")
        df = _mean(scores, held, "f1") - _mean(crop, held, "f1")
        da = _mean(scores, held, "aji") - _mean(crop, held, "aji")
        print(f"{method:9s}{mag:4s} {a:6.1f}    " + "  ".join(cells) + f"  {df:+.3f}, {da:+.3f}")
    for method in sorted({k[0] for k in rows}):
        cand = sorted({k[3] for k in rows if k[0] == method})
        if len(cand) < 2:
            continue
        best = max(
            cand,
            key=lambda a: statistics.fmean(
                _mean(rows[(method, m, "slide", a)], tuned, "f1") for m in ("40x", "20x")
            ),
        )
        print(f"{method}: min_area_um2 chosen on the tuning organs: {best:g}")
    print("\nper image (slide F1 / AJI at the first min_area):")
    for i, ident in enumerate(ids):
        cells = [
            f"{k[0]} {k[1]} {k[2]} {rows[k][i]['f1']:.3f}/{rows[k][i]['aji']:.3f}"
            for k in sorted(rows)
            if k[3] == min(a for (mm, _, _, a) in rows if mm == k[0])
        ]
        print(f"  {ident} ({organ[i]}): " + "; ".join(cells))


if __name__ == "__main__":
    main()
