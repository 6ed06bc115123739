"""Accuracy and speed of the built-in nuclei segmentation against instance ground truth.

Runs the built-in method and InstanSeg (when installed) through the public
``segment_nuclei`` (tiles, per-run preparation and all, as the widget and console run them)
and, as the peer measured in the same run, a ten-line textbook pipeline, on every
``<id>.tif`` / ``<id>_instances.tif`` pair of a folder, and prints per
image F1 at IoU 0.5, AJI, PQ, pixel Dice, nucleus counts and time, then the means and the
throughput (megapixels per second, single thread, at the working resolution).

Usage::

    python benchmarks/nuclei_accuracy.py [--data DIR] [--markdown] [--target-mpp 0.25]
        [--methods builtin,textbook,instanseg]

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
from napari_slidescope.analysis.metrics import instance_scores
from napari_slidescope.analysis.nuclei import BuiltinSegmenter, NucleiParams
from napari_slidescope.segmenters import get_segmenter, missing_reason

#: Pixel size of the MoNuSeg images, from the MoNuSeg XML annotations (MicronsPerPixel).
MONUSEG_MPP = 0.2457

_KEYS = ("f1", "aji", "pq", "dice")


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
