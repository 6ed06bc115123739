"""Throughput of the tiled nuclei pipeline, and the overlap of its stages.

Prints:
1. whole-pipeline throughput (Mpx/s at the working resolution) of ``segment_nuclei`` on a
   synthetic SVS-like slide, with workers=1 and workers=2 (median of ``--repeat`` runs);
2. a demonstration with a fake, deliberately slow model (sleeps per batch) and a slow
   post-process (sleeps per tile): the serial sum of stage times vs the pipelined wall time.

Usage::

    python benchmarks/nuclei_throughput.py [--size 4096] [--repeat 3] [--segmenter builtin]
    python benchmarks/nuclei_throughput.py --segmenter instanseg --runtimes torch,onnxruntime

``--slide PATH``: a real slide instead of the synthetic one.
``--runtimes`` (InstanSeg): instead of 1. and 2., the whole pipeline with each runtime of
InstanSeg's network, interleaved (torch first: the baseline of the same run), the median
throughput of each, its ratio to torch, and whether its labels equal torch's (else F1 / AJI
against them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope.analysis.stains import RUIFROK_HE
from napari_slidescope.pipeline.nuclei import segment_nuclei
from napari_slidescope.pipeline.runner import iter_tiles
from napari_slidescope.pipeline.tiling import make_plan
from napari_slidescope.segmenters import available_segmenters, get_segmenter


class ThresholdSegmenter:
    """Stand-in when the built-in segmenter is missing: OD threshold + watershed-free labels."""

    name = "threshold"
    target_mpp = 0.5
    min_overlap_um = 16.0
    stains = RUIFROK_HE

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        return (255.0 - tiles.mean(axis=-1, keepdims=True)).astype(np.float32) / 255.0

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        mask = ndi.binary_opening(raw[..., 0] > 0.45, iterations=1)
        return ndi.label(mask)[0].astype(np.int32)


class SleepySegmenter:
    """Fake model: ``model_s`` per batch; fake post-process: ``post_s`` per tile."""

    target_mpp, min_overlap_um = 1.0, 4.0

    def __init__(self, model_s: float, post_s: float) -> None:
        self.model_s, self.post_s = model_s, post_s

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        time.sleep(self.model_s)
        return tiles[..., :1].astype(np.float32)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        time.sleep(self.post_s)
        return np.zeros(raw.shape[:2], np.int32)


class _MemSlide:
    downsamples = [(1.0, 1.0)]

    def __init__(self, shape: tuple[int, int]) -> None:
        self.img = np.full((*shape, 3), 200, np.uint8)
        self.shape0 = shape

    def read_region(self, box, *, level=0):
        return self.img[box[0] : box[2], box[1] : box[3]]


def make_slide(size: int, folder: Path) -> Path:
    from napari_slidescope.sample_data import write_sample_slide

    path = folder / f"sample_{size}.svs"
    if not path.exists():
        write_sample_slide(path, shape=(size, size), mpp=0.25, seed=0)
    return path


def throughput(
    path: Path, segmenter_name: str, workers: int, repeat: int, model_threads: int = 1
) -> None:
    from napari_slidescope.slide import open_slide

    times, cpus, res = [], [], None
    with open_slide(path) as slide:
        for _ in range(repeat):
            seg = (
                ThresholdSegmenter()
                if segmenter_name == "threshold"
                else get_segmenter(segmenter_name)
            )
            t0, c0 = time.perf_counter(), time.process_time()
            res = segment_nuclei(
                slide, segmenter=seg, workers=workers, tissue="auto", model_threads=model_threads
            )
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    assert res is not None
    mpx = res.labels.size / 1e6
    med, cpu = statistics.median(times), statistics.median(cpus)
    print(
        f"  workers={workers}, model_threads={model_threads}: region {res.labels.shape} "
        f"working px at {res.mpp} µm/px, "
        f"{res.count} nuclei, median {med:.2f} s -> {mpx / med:.2f} Mpx/s "
        f"(runs: {', '.join(f'{t:.2f}' for t in times)}); "
        f"CPU {cpu:.2f} s -> {mpx / cpu:.2f} Mpx per CPU-second, "
        f"{cpu / med:.2f} cores busy; load {_load()}"
    )


def _load() -> str:
    """The 1, 5 and 15 min load averages (other work on the machine skews the timings)."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def overlap_demo(n_tiles: int = 12, model_s: float = 0.05, post_s: float = 0.05) -> None:
    slide = _MemSlide((64, 64 * n_tiles))
    plan = make_plan(
        (0, 0, *slide.shape0), slide_mpp=1.0, target_mpp=1.0, tile_size_um=64, min_overlap_um=0.0
    )
    for workers in (1, 2):
        t0 = time.perf_counter()
        n = sum(
            1 for _ in iter_tiles(slide, plan, SleepySegmenter(model_s, post_s), workers=workers)
        )
        wall = time.perf_counter() - t0
        serial = n * (model_s + post_s)
        print(
            f"  workers={workers}: {n} tiles, serial sum {serial:.2f} s, pipelined {wall:.2f} s "
            f"(ratio {serial / wall:.2f}x)"
        )


def compare_runtimes(path: Path, runtimes: list[str], repeat: int) -> None:
    from napari_slidescope.analysis.metrics import instance_scores
    from napari_slidescope.segmenters.instanseg import InstanSegSegmenter
    from napari_slidescope.slide import open_slide

    segs = {r: InstanSegSegmenter(runtime=r) for r in runtimes}  # loaded outside the timing
    times: dict[str, list[float]] = {r: [] for r in runtimes}
    cpus: dict[str, list[float]] = {r: [] for r in runtimes}
    labels: dict[str, np.ndarray] = {}
    mpx = 0.0
    with open_slide(path) as slide:
        for _ in range(repeat):
            for r, seg in segs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                res = segment_nuclei(slide, segmenter=seg, workers=2, tissue="auto")
                times[r].append(time.perf_counter() - t0)
                cpus[r].append(time.process_time() - c0)
                assert res.labels is not None
                labels[r], mpx = res.labels, res.labels.size / 1e6
                print(
                    f"  {r}: {times[r][-1]:.1f} s ({cpus[r][-1]:.1f} CPU-s), {res.count} nuclei; "
                    f"load {_load()}",
                    flush=True,
                )
    base = statistics.median(times[runtimes[0]])
    base_cpu = statistics.median(cpus[runtimes[0]])
    for r in runtimes:
        med, cpu = statistics.median(times[r]), statistics.median(cpus[r])
        same = np.array_equal(labels[r], labels[runtimes[0]])
        diff = "labels equal" if same else ""
        if not same:
            s = instance_scores(labels[runtimes[0]], labels[r])
            diff = f"labels differ: F1 {s['f1']:.4f}, AJI {s['aji']:.4f} against {runtimes[0]}"
        print(
            f"{r}: median {med:.1f} s -> {mpx / med:.3f} Mpx/s, {base / med:.2f}x "
            f"{runtimes[0]}; CPU {cpu:.1f} s, {base_cpu / cpu:.2f}x; {diff}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="level-0 side of the synthetic slide")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--segmenter", default=None, help="registry name, or 'threshold'")
    ap.add_argument("--runtimes", default=None, help="InstanSeg runtimes to compare")
    ap.add_argument("--slide", type=Path, default=None, help="a real slide instead")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "slidescope-bench")
    args = ap.parse_args()
    name = args.segmenter or ("builtin" if "builtin" in available_segmenters() else "threshold")
    args.cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    path = args.slide or make_slide(args.size, args.cache)
    what = "" if args.slide else f" ({args.size} x {args.size} px at 0.25 µm/px)"
    print(
        f"slide {path}{what}, ready in {time.perf_counter() - t0:.1f} s; segmenter: {name}; "
        f"{os.cpu_count()} CPUs, load average {_load()}"
    )
    if args.runtimes:
        print("InstanSeg, whole pipeline, workers=2, by runtime of its network:")
        compare_runtimes(path, args.runtimes.split(","), args.repeat)
        return
    print("whole pipeline (read + model + post-process + measure + stitch):")
    for workers, model_threads in ((1, 1), (2, 1), (2, 2)):
        throughput(path, name, workers, args.repeat, model_threads)
    print("overlap of stages with a fake slow model (50 ms/batch) and post-process (50 ms/tile):")
    overlap_demo()


if __name__ == "__main__":
    main()
