"""Accuracy and speed of the built-in nuclei segmentation against instance ground truth.

Runs the built-in method and InstanSeg (when installed) through the public
``segment_nuclei`` (tiles, per-run preparation and all, as the widget and console run them)
and, as the peer measured in the same run, a ten-line textbook pipeline, on every
``<id>.tif`` / ``<id>_instances.tif`` pair of a folder, and prints per
image F1 at IoU 0.5, AJI, PQ, pixel Dice, nucleus counts and time, then the means and the
throughput (megapixels per second, single thread, at the working resolution).

``--cv`` reports held-out figures instead: leave-one-organ-out cross-validation over the
organs of the images (TCGA tissue-source-site codes, see :data:`ORGANS`). For every held-out
organ the built-in method's setting is chosen among :data:`BUILTIN_GRID` (defaults first) by
mean F1 on the other organs, then scored on the held-out one; the textbook pipeline and
InstanSeg have nothing tuned on these images, so each image is held out for them already.
One table: means over all images of the held-out scores.

Usage::

    python benchmarks/nuclei_accuracy.py [--data DIR] [--markdown] [--target-mpp 0.25]
        [--methods builtin,textbook,instanseg] [--cv]

``DIR`` defaults to ``$SLIDESCOPE_TESTDATA/nuclei_gt/monuseg_train`` (MoNuSeg 2018 training
crops, CC BY-NC-SA 4.0: local use only, never copied into the repository).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tifffile
from scipy import ndimage as ndi
from skimage import color, feature, filters, measure, morphology, segmentation

from napari_slidescope import NucleiResult, segment_nuclei
from napari_slidescope.analysis.brightfield_nuclei import BuiltinSegmenter, NucleiParams
from napari_slidescope.analysis.metrics import instance_scores
from napari_slidescope.segmenters import get_segmenter, missing_reason

#: Pixel size of the MoNuSeg images, from the MoNuSeg XML annotations (MicronsPerPixel).
MONUSEG_MPP = 0.2457

_KEYS = ("f1", "aji", "pq", "dice")

#: Organ of a MoNuSeg image by its TCGA tissue source site (the second field of its id).
ORGANS = {
    "21": "lung",
    "50": "lung",
    "A7": "breast",
    "AR": "breast",
    "E2": "breast",
    "B0": "kidney",
    "CH": "prostate",
    "G9": "prostate",
    "NH": "colon",
}

#: Built-in settings the cross-validation chooses among (the defaults first): outline
#: dilation, per-nucleus threshold range, least contrast (kept small: 13 images x settings
#: through the whole pipeline on a shared 2-core machine).
BUILTIN_GRID: tuple[dict[str, object], ...] = (
    {},
    {"outline_dilation_um": 0.0},
    {"threshold_range": (0.8, 1.4)},
    {"min_contrast": 0.05},
)


def textbook_baseline(rgb: np.ndarray, *, mpp: float) -> np.ndarray:
    """Ten-line textbook pipeline: deconvolution, Gaussian, Otsu, opening, watershed."""
    h = filters.gaussian(color.rgb2hed(rgb)[..., 0], sigma=1)
    mask = ndi.binary_opening(h > filters.threshold_otsu(h), morphology.disk(2))
    mask = morphology.remove_small_objects(mask, max_size=int(round(10.0 / mpp**2)) - 1)
    mask = ndi.binary_fill_holes(mask)
    dist = ndi.distance_transform_edt(mask)
    peaks = feature.peak_local_max(
        dist, min_distance=int(round(2.5 / mpp)), labels=measure.label(mask), exclude_border=False
    )
    markers = np.zeros(mask.shape, np.int32)
    markers[tuple(peaks.T)] = np.arange(1, len(peaks) + 1)
    return segmentation.watershed(-dist, markers, mask=mask).astype(np.int32)


def _labels(result: NucleiResult) -> np.ndarray:
    assert result.labels is not None  # array sources always get labels
    return result.labels


def _pairs(data: Path) -> list[tuple[str, Path, Path]]:
    out = []
    for gt in sorted(data.glob("*_instances.tif")):
        image = gt.with_name(gt.name.removesuffix("_instances.tif") + ".tif")
        if not image.is_file():
            raise FileNotFoundError(f"{gt} has no image {image.name} next to it")
        out.append((image.stem, image, gt))
    if not out:
        raise FileNotFoundError(f"no '<id>_instances.tif' files in {data}")
    return out


def _run(
    name: str, fn: Callable[[np.ndarray], np.ndarray], items: list, *, quiet: bool
) -> dict[str, float]:
    rows = []
    for ident, rgb, gt in items:
        with warnings.catch_warnings():  # warm caches / imports outside the timing
            warnings.simplefilter("ignore")
            fn(rgb[:64, :64])
        t0 = time.perf_counter()
        labels = fn(rgb)
        dt = time.perf_counter() - t0
        s = instance_scores(gt, labels)
        s["time"] = dt
        s["mpx_s"] = rgb.shape[0] * rgb.shape[1] / 1e6 / dt
        rows.append(s)
        if not quiet:
            print(
                f"{name:9s} {ident:26s} F1={s['f1']:.3f} AJI={s['aji']:.3f} PQ={s['pq']:.3f} "
                f"Dice={s['dice']:.3f} n={s['n_pred']:4d}/{s['n_true']:4d} t={dt:.2f}s"
            )
    mean = {k: float(np.mean([r[k] for r in rows])) for k in (*_KEYS, "time")}
    mean["mpx_s"] = float(np.median([r["mpx_s"] for r in rows]))
    return mean


def _scores(fn: Callable[[np.ndarray], np.ndarray], items: list) -> list[dict[str, float]]:
    """Per-image scores (and seconds) of one method on every image."""
    rows = []
    for _, rgb, gt in items:
        t0 = time.perf_counter()
        labels = fn(rgb)
        s = instance_scores(gt, labels)
        s["time"] = time.perf_counter() - t0
        rows.append(s)
    return rows


def _organ(ident: str) -> str:
    site = ident.split("-")[1]
    return ORGANS.get(site, site)


def cross_validate(
    items: list, mpp: float, methods: list[str], fns: dict, *, quiet: bool, markdown: bool
) -> None:
    """Leave-one-organ-out held-out figures of every method, in one table."""
    organs = [_organ(ident) for ident, _, _ in items]
    grid_rows = []
    if "builtin" in methods:
        for setting in BUILTIN_GRID:
            params = NucleiParams(**setting)  # type: ignore[arg-type]

            def run(x: np.ndarray, params: NucleiParams = params) -> np.ndarray:
                res = segment_nuclei(x, mpp=mpp, segmenter=BuiltinSegmenter(params), tissue=False)
                return _labels(res)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grid_rows.append(_scores(run, items))
            if not quiet:
                f1 = np.mean([r["f1"] for r in grid_rows[-1]])
                print(f"builtin {setting or 'defaults'}: mean F1 on all images {f1:.3f}")
    held: dict[str, list[dict[str, float]]] = {}
    if grid_rows:
        held["builtin (setting chosen on the other organs)"] = [{}] * len(items)
        held["builtin defaults"] = grid_rows[0]
        for organ in sorted(set(organs)):
            train = [i for i, o in enumerate(organs) if o != organ]
            test = [i for i, o in enumerate(organs) if o == organ]
            best = max(
                range(len(BUILTIN_GRID)),
                key=lambda g: np.mean([grid_rows[g][i]["f1"] for i in train]),
            )
            for i in test:
                held["builtin (setting chosen on the other organs)"][i] = grid_rows[best][i]
            chosen = BUILTIN_GRID[best] or "defaults"
            print(f"held out {organ:8s} ({len(test)} images): chose {chosen}")
    for name in ("textbook", "instanseg"):
        if name in methods and name in fns:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                held[name] = _scores(fns[name], items)
    counts = {o: organs.count(o) for o in sorted(set(organs))}
    print(f"\n{len(items)} images, organs {counts}; means of held-out per-image scores")
    if markdown:
        print("\n| method | F1@0.5 | AJI | PQ | pixel Dice | s/image |")
        print("|---|---|---|---|---|---|")
    for name, rows in held.items():
        m = {k: float(np.mean([r[k] for r in rows])) for k in (*_KEYS, "time")}
        if markdown:
            print(
                f"| {name} | {m['f1']:.3f} | {m['aji']:.3f} | {m['pq']:.3f} | "
                f"{m['dice']:.3f} | {m['time']:.2f} |"
            )
        else:
            print(
                f"{name:48s} F1={m['f1']:.3f} AJI={m['aji']:.3f} PQ={m['pq']:.3f} "
                f"Dice={m['dice']:.3f} t={m['time']:.2f}s/image"
            )
    print("\nper held-out organ: F1 / AJI / PQ")
    for name, rows in held.items():
        cells = []
        for organ in sorted(set(organs)):
            sub = [r for r, o in zip(rows, organs, strict=True) if o == organ]
            f1, aji, pq = (float(np.mean([r[k] for r in sub])) for k in ("f1", "aji", "pq"))
            cells.append(f"{organ} {f1:.3f}/{aji:.3f}/{pq:.3f}")
        print(f"{name}: " + "; ".join(cells))
    if hasattr(os, "getloadavg"):
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"load average (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")


def _stage_throughput(items: list, params: NucleiParams, mpp: float) -> float:
    """Median Mpx/s of the two per-tile stages, without the per-slide preparation."""
    if abs(mpp / params.target_mpp - 1) > 0.05:
        return float("nan")  # the stages run on resampled tiles; see the end-to-end figure
    rates = []
    for _, rgb, _ in items:
        seg = BuiltinSegmenter(params)
        seg.prepare(rgb, mpp=mpp)
        t0 = time.perf_counter()
        seg.postprocess(seg.predict(rgb[np.newaxis], mpp=mpp)[0], mpp=mpp)
        rates.append(rgb.shape[0] * rgb.shape[1] / 1e6 / (time.perf_counter() - t0))
    return float(np.median(rates))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", "")) / "nuclei_gt" / "monuseg_train"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=default, help="folder of image/GT pairs")
    parser.add_argument("--mpp", type=float, default=MONUSEG_MPP, help="pixel size (µm/px)")
    parser.add_argument("--target-mpp", type=float, default=None, help="working resolution")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="means only")
    parser.add_argument(
        "--cv", action="store_true", help="held-out figures: leave-one-organ-out cross-validation"
    )
    parser.add_argument(
        "--methods",
        default="builtin,textbook,instanseg",
        help="comma list of builtin, textbook, instanseg (instanseg runs when torch and its "
        "model are installed, see napari_slidescope.segmenters.instanseg)",
    )
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data {args.data} is not a folder (set SLIDESCOPE_TESTDATA or --data)")
    try:  # single thread, so that Mpx/s is per core
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass
    params = NucleiParams() if args.target_mpp is None else NucleiParams(target_mpp=args.target_mpp)
    items = [(i, tifffile.imread(im), tifffile.imread(gt)) for i, im, gt in _pairs(args.data)]
    mpp = args.mpp
    methods = [m for m in args.methods.split(",") if m]
    fns: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        # through the public API, tiles and all, as the widget and console run it
        "builtin": lambda x: _labels(
            segment_nuclei(x, mpp=mpp, segmenter=BuiltinSegmenter(params), tissue=False)
        ),
        "textbook": lambda x: textbook_baseline(x, mpp=mpp),
    }
    work_mpp = {"builtin": params.target_mpp}
    if "instanseg" in methods:
        reason = missing_reason("instanseg")
        if reason is None:
            seg = get_segmenter("instanseg")
            work_mpp["instanseg"] = seg.target_mpp
            fns["instanseg"] = lambda x: (
                segment_nuclei(x, mpp=mpp, segmenter=seg, tissue=False).labels
            )
        else:
            print(f"instanseg skipped: {reason}")
    if args.cv:
        cross_validate(items, mpp, methods, fns, quiet=args.quiet, markdown=args.markdown)
        return 0
    results = {m: _run(m, fns[m], items, quiet=args.quiet) for m in methods if m in fns}
    print(
        f"\n{len(items)} images from {args.data} at {mpp} µm/px; working resolution "
        + ", ".join(f"{k} {v} µm/px" for k, v in work_mpp.items())
    )
    if args.markdown:
        print("\n| method | F1@0.5 | AJI | PQ | Dice | s/image | Mpx/s (input) | Mpx/s (working) |")
        print("|---|---|---|---|---|---|---|---|")
    for name, m in results.items():
        w = work_mpp.get(name, mpp)
        work = m["mpx_s"] * ((mpp / w) ** 2 if abs(mpp / w - 1) > 0.05 else 1.0)
        if args.markdown:
            print(
                f"| {name} | {m['f1']:.3f} | {m['aji']:.3f} | {m['pq']:.3f} | {m['dice']:.3f} | "
                f"{m['time']:.2f} | {m['mpx_s']:.2f} | {work:.2f} |"
            )
        else:
            print(
                f"MEAN {name:9s} F1={m['f1']:.3f} AJI={m['aji']:.3f} PQ={m['pq']:.3f} "
                f"Dice={m['dice']:.3f} t={m['time']:.2f}s/image {m['mpx_s']:.2f} Mpx/s input "
                f"({work:.2f} Mpx/s working)"
            )
    stage = _stage_throughput(items, params, mpp) if "builtin" in results else float("nan")
    print(
        f"builtin predict+postprocess only (stains and threshold prepared once per slide): "
        f"{stage:.2f} Mpx/s, median over images, single thread"
    )
    if hasattr(os, "getloadavg"):  # shared machines: timings depend on what else runs
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"load average (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")
    if "builtin" in results and "textbook" in results:
        b, t = results["builtin"], results["textbook"]
        ratios = " ".join(f"{k.upper()}={b[k] / t[k]:.2f}" for k in _KEYS)
        print(f"ratio builtin/textbook: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
