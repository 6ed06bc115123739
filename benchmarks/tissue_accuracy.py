"""Tissue detection: accuracy on synthetic slides, whole-slide speed, real-slide overlays.

Prints
  1. IoU with the ground-truth tissue mask of ``write_sample_slide`` slides (several
     seeds and sizes), at the working resolution;
  2. whole-slide detection on a 40k x 40k synthetic SVS (``make_svs.py`` content, whose
     tissue field is recomputed for an IoU): first call, median of warm calls, peak
     traced memory, and a peer measured in the same run (OpenSlide reads the same
     level, then a textbook grayscale Otsu), with ratios;
  3. the real shared slides: mode, level, mask shape, tissue fraction, time; an overlay
     (thumbnail with the mask outline in green) per slide in ``benchmarks/figures``.

Usage::

    python benchmarks/tissue_accuracy.py [--seeds 0 1 2] [--sizes 4096x4096 6144x8192]
        [--skip-big] [--skip-real] [--repeat 5]

Synthetic slides are cached in ``~/.cache/napari-slidescope/bench/tissue``; the big
slide is ``~/.cache/napari-slidescope/bench/svs_40k.svs`` (written by
``$SLIDESCOPE_TOOLS/make_svs.py --width 40000 --height 40000 --seed 0`` if absent,
~4 min on 2 cores). Real slides come from ``$SLIDESCOPE_TESTDATA``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

from napari_slidescope.analysis.tissue import block_mean
from napari_slidescope.pipeline.tissue import TissueResult, detect_tissue
from napari_slidescope.sample_data import TRUTH_DOWNSAMPLE, write_sample_slide
from napari_slidescope.slide import open_slide

BENCH = Path.home() / ".cache" / "napari-slidescope" / "bench"
BIG = BENCH / "svs_40k.svs"
SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared beside the repository
TOOLS = Path(os.environ.get("SLIDESCOPE_TOOLS", SHARED / "tools"))
TESTDATA = Path(os.environ.get("SLIDESCOPE_TESTDATA", SHARED / "testdata"))
FIGURES = Path(__file__).resolve().parent / "figures"
REAL = [
    "CMU-1-Small-Region.svs",
    "TCGA-CR-7395-01A-01-TS1.svs",
    "openslide-python_small.svs",
    "test3-DAPI-2-387.ndpi",
    "test3-TRITC-2-560.ndpi",
    "small_vectra.qptiff",
]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = int((a | b).sum())
    return float((a & b).sum()) / union if union else 1.0


def truth_at(result: TissueResult, truth: np.ndarray, truth_ds: float) -> np.ndarray:
    """Ground truth (level-0 origin, `truth_ds` px per pixel) on the result's mask grid."""
    factor = result.downsample[0] / truth_ds
    if abs(factor - round(factor)) > 1e-6 or result.origin != (0.0, 0.0):
        raise ValueError("benchmark expects a whole-slide result on a multiple of the truth grid")
    t = block_mean(truth.astype(np.float32), int(round(factor))) >= 0.5
    h, w = result.mask.shape
    out = np.zeros((h, w), bool)
    out[: min(h, t.shape[0]), : min(w, t.shape[1])] = t[:h, :w]
    return out


def synthetic(sizes: list[tuple[int, int]], seeds: list[int]) -> None:
    cache = BENCH / "tissue"
    cache.mkdir(parents=True, exist_ok=True)
    print("== IoU on write_sample_slide slides (0.25 um/px), at the working resolution")
    print(f"{'size':>11} {'seed':>4} {'mask':>9} {'IoU':>7} {'thr':>6} {'time s':>7}")
    scores = []
    for h, w in sizes:
        for seed in seeds:
            path = cache / f"sample_{h}x{w}_s{seed}.svs"
            tpath = path.with_suffix(".truth.npy")
            if not (path.exists() and tpath.exists()):
                truth = write_sample_slide(path, shape=(h, w), seed=seed)
                np.save(tpath, truth.tissue_mask)
            tmask = np.load(tpath)
            t0 = time.perf_counter()
            res = detect_tissue(path)
            dt = time.perf_counter() - t0
            score = iou(res.mask, truth_at(res, tmask, TRUTH_DOWNSAMPLE))
            scores.append(score)
            shape = f"{res.mask.shape[0]}x{res.mask.shape[1]}"
            print(f"{h}x{w:<6} {seed:>4} {shape:>9} {score:7.4f} {res.threshold:6.3f} {dt:7.3f}")
    print(f"IoU min {min(scores):.4f}  median {statistics.median(scores):.4f}  (goal >= 0.95)")


def _make_svs_truth(height: int, width: int, seed: int) -> np.ndarray:
    """Tissue of make_svs.py content at 1/16: its tissue field > 0.5 at block centres."""
    spec = importlib.util.spec_from_file_location("make_svs", TOOLS / "make_svs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t, _ = mod.lowres_fields(height, width, np.random.default_rng(seed))
    # level-0 pixel y samples the field at (y + 0.5) / 16; a block's centre is y = 16 i + 7.5
    f = 8.0 / 16.0
    ty = (1 - f) * t[:-1] + f * t[1:]
    txy = (1 - f) * ty[:, :-1] + f * ty[:, 1:]
    return txy[: -(-height // 16), : -(-width // 16)] > 0.5


def _peer_openslide(path: Path, level: int) -> tuple[float, np.ndarray] | None:
    """OpenSlide reads the whole level, then grayscale Otsu (the textbook recipe)."""
    try:
        import openslide
    except ImportError:
        return None
    from skimage.filters import threshold_otsu

    t0 = time.perf_counter()
    with openslide.OpenSlide(str(path)) as osr:
        w, h = osr.level_dimensions[level]
        img = np.asarray(osr.read_region((0, 0), level, (w, h)).convert("RGB"))
    gray = img.mean(axis=-1)
    mask = gray < threshold_otsu(gray)
    return time.perf_counter() - t0, mask


def big(repeat: int) -> None:
    print(f"\n== whole-slide detection on {BIG}")
    if not BIG.exists():
        BENCH.mkdir(parents=True, exist_ok=True)
        part = BIG.with_name("svs_40k.partial.svs")
        print(f"writing it with {TOOLS / 'make_svs.py'} (a few minutes) ...", flush=True)
        cmd = [sys.executable, str(TOOLS / "make_svs.py"), str(part)]
        cmd += ["--width", "40000", "--height", "40000", "--seed", "0"]
        subprocess.run(cmd, check=True)
        part.rename(BIG)
    with open_slide(BIG) as slide:
        t0 = time.perf_counter()
        first = detect_tissue(slide)
        t_first = time.perf_counter() - t0
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            res = detect_tissue(slide)
            times.append(time.perf_counter() - t0)
        tracemalloc.start()
        detect_tissue(slide)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        shape0, ds_level = slide.shape0, slide.downsamples[first.level]
    med = statistics.median(times)
    print(
        f"level {res.level} (downsample {ds_level[0]:g}), mask {res.mask.shape}, "
        f"{res.mpp:g} um/px, {len(res.polygons)} pieces, fraction {res.fraction:.3f}"
    )
    print(
        f"first call {t_first:.3f} s; warm median {med:.3f} s over {repeat} "
        f"(min {min(times):.3f}); peak traced memory {peak:.0f} MiB"
    )
    truth = _make_svs_truth(shape0[0], shape0[1], 0)
    print(f"IoU vs make_svs tissue field (> 0.5): {iou(res.mask, truth_at(res, truth, 16)):.4f}")
    peer = _peer_openslide(BIG, first.level)
    if peer is None:
        print("peer: openslide not installed")
        return
    t_peer, peer_mask = peer
    factor = int(round(res.downsample[0] / ds_level[0]))
    peer_work = block_mean(peer_mask.astype(np.float32), factor) >= 0.5
    peer_iou = iou(peer_work, truth_at(res, truth, 16))
    print(
        f"peer (OpenSlide read of level {first.level} + gray Otsu): {t_peer:.3f} s, "
        f"IoU {peer_iou:.4f}; detect_tissue / peer time = {med / t_peer:.2f}"
    )


def _overlay(path: Path, res: TissueResult, out: Path) -> None:
    from skimage.segmentation import find_boundaries

    with open_slide(path) as slide:
        img = slide.read_region(res.region, level=res.level)
        if slide.axes == "CYX":
            img = np.moveaxis(img, 0, -1)
        dy = slide.downsamples[res.level][0]
    img = block_mean(img, max(1, int(round(res.downsample[0] / dy))))
    if img.ndim == 2:
        img = img[..., None]
    if res.mode == "fluorescence":  # contrast-stretch, first three channels as RGB
        f = img.astype(np.float32)
        f = f / max(float(np.percentile(f, 99.5)), 1e-6)
        img = (np.clip(f, 0, 1) * 255).astype(np.uint8)
    if img.shape[-1] == 1:
        img = np.repeat(img, 3, axis=-1)
    img = np.ascontiguousarray(img[..., :3])
    h, w = res.mask.shape
    img = img[:h, :w]
    zoom = max(1, 600 // max(h, w, 1))
    big_img = np.repeat(np.repeat(img, zoom, 0), zoom, 1)
    big_mask = np.repeat(np.repeat(res.mask[: img.shape[0], : img.shape[1]], zoom, 0), zoom, 1)
    edge = find_boundaries(big_mask, mode="inner")
    if zoom >= 3:
        from scipy import ndimage as ndi

        edge = ndi.binary_dilation(edge)
    big_img[edge] = (0, 255, 0)
    out.parent.mkdir(parents=True, exist_ok=True)
    import imageio.v3 as iio

    iio.imwrite(out, big_img)


def real() -> None:
    print(f"\n== real slides in {TESTDATA} (overlays in {FIGURES})")
    print(
        f"{'slide':<30} {'mode':<12} {'lvl':>3} {'mask':>9} {'um/px':>6} {'frac':>6} "
        f"{'pieces':>6} {'time s':>6}"
    )
    for name in REAL:
        path = TESTDATA / name
        if not path.exists():
            print(f"{name:<30} missing")
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            res = detect_tissue(path)
            dt = time.perf_counter() - t0
        mpp = f"{res.mpp:.2f}" if res.mpp else "px"
        shape = f"{res.mask.shape[0]}x{res.mask.shape[1]}"
        print(
            f"{name:<30} {res.mode:<12} {res.level:>3} {shape:>9} {mpp:>6} "
            f"{res.fraction:6.3f} {len(res.polygons):>6} {dt:6.3f}"
            + "".join(f"\n    warning: {w.message}" for w in caught)
        )
        _overlay(path, res, FIGURES / f"tissue_{path.stem}.png")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sizes", nargs="+", default=["4096x4096", "6144x8192"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-real", action="store_true")
    args = ap.parse_args(argv)
    sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.sizes]
    synthetic(sizes, args.seeds)  # type: ignore[arg-type]
    if not args.skip_big:
        big(args.repeat)
    if not args.skip_real:
        real()


if __name__ == "__main__":
    main()
