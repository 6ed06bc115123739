"""How long a cancelled run takes to stop, against the same run left to finish.

The figures that ``tests/pipeline/test_cancel.py``, ``tests/pipeline/test_runner.py`` and
``tests/_qt/test_widget.py`` once asserted as wall-clock bounds (the tests now check
behaviour: what was read and predicted after the cancel). Each stage runs on a slow
synthetic slide (every chunk read sleeps ``--delay`` s) or with a slow model (every
``predict`` sleeps ``--predict`` s); the event is set ``--after`` s into the run. Printed:
the median time from the cancel to ``Cancelled`` (the pipeline promises well under 1 s
plus the work item in flight), and the uncancelled run as the baseline (for the
preparation: the set-up up to the first tile).

Run: ``python benchmarks/cancel_latency.py [--repeats 3]`` (about a minute). The GUI's own
cancel latency is ``benchmarks/gui_latency.py``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings

import dask.array as da
import numpy as np

from napari_slidescope import SlidescopeWarning
from napari_slidescope.pipeline.cancel import Cancelled
from napari_slidescope.pipeline.nuclei import iter_segment_nuclei
from napari_slidescope.pipeline.runner import iter_tiles
from napari_slidescope.pipeline.tiling import make_plan
from napari_slidescope.pipeline.tissue import detect_tissue
from napari_slidescope.slide import ArraySlide


def slow_slide(shape, chunk, delay):
    def fill(block):
        time.sleep(delay)
        out = np.full(block.shape, 235, np.uint8)
        out[block.shape[0] // 4 : block.shape[0] // 2, ..., 1] = 80
        return out

    arr = da.zeros((*shape, 3), np.uint8, chunks=(*chunk, 3)).map_blocks(
        fill, dtype=np.uint8, meta=np.empty((0, 0, 0), np.uint8)
    )
    return ArraySlide(arr, mpp=0.5, name="slow")


class SlowModel:
    target_mpp = 0.5
    min_overlap_um = 0.0

    def __init__(self, delay):
        self.delay = delay

    def prepare(self, sample, *, mpp):
        pass

    def predict(self, tiles, *, mpp):
        time.sleep(self.delay)
        return np.zeros(tiles.shape[:3], np.float32)

    def postprocess(self, raw, *, mpp):
        labels = np.zeros(raw.shape, np.int32)
        labels[10:20, 10:20] = 1
        return labels


def stop_latency(run, after):
    """Seconds from setting the event (`after` s into ``run(cancel)``) to Cancelled."""
    cancel = threading.Event()
    at = []

    def fire():
        at.append(time.perf_counter())
        cancel.set()

    timer = threading.Timer(after, fire)
    timer.start()
    try:
        run(cancel)
    except Cancelled:
        return time.perf_counter() - at[0]
    finally:
        timer.cancel()
    raise RuntimeError("the run finished before the cancel: raise --delay or lower --after")


def uncancelled(run):
    t0 = time.perf_counter()
    run(threading.Event())
    return time.perf_counter() - t0


def first_tile(slide, seg, cancel):
    """Set-up (the stain sample, the segmenter's preparation) up to the first tile."""
    gen = iter_segment_nuclei(slide, tissue=False, segmenter=seg, cancel=cancel)
    try:
        next(gen)
    finally:
        gen.close()


def consume_tiles(slide, seg, cancel):
    for _ in iter_segment_nuclei(
        slide, tissue=False, segmenter=seg, cancel=cancel, tile_size_um=512.0, workers=1
    ):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.25, help="s per chunk read")
    parser.add_argument("--predict", type=float, default=0.5, help="s per predict")
    parser.add_argument("--after", type=float, default=0.3, help="s before the cancel")
    args = parser.parse_args()
    warnings.simplefilter("ignore", SlidescopeWarning)

    tissue_slide = slow_slide((4096, 4096), (128, 4096), args.delay)
    prep_slide = slow_slide((8192, 8192), (2048, 2048), args.delay * 4)
    tile_slide = slow_slide((4096, 4096), (4096, 4096), 0.0)
    stages = {
        "tissue detection": lambda c: detect_tissue(tissue_slide, target_mpp=8.0, cancel=c),
        "segmenter preparation": lambda c: first_tile(prep_slide, SlowModel(0.0), c),
        "tile work": lambda c: consume_tiles(tile_slide, SlowModel(args.predict), c),
    }
    print(f"cancel after {args.after} s; median of {args.repeats}; (shared machine: noisy)")
    print(f"{'stage':24s} {'stop (s)':>9s} {'uncancelled (s)':>16s} {'ratio':>7s}")
    for name, run in stages.items():
        stops = [stop_latency(run, args.after) for _ in range(args.repeats)]
        full = uncancelled(run)
        stop = statistics.median(stops)
        print(f"{name:24s} {stop:9.3f} {full:16.2f} {stop / full:7.3f}")

    # closing a tile generator early: threads joined, the tiles not started never run
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)
    slide = ArraySlide(img, mpp=1.0)
    plan = make_plan(
        (0, 0, 256, 320), slide_mpp=1.0, target_mpp=1.0, tile_size_um=16, min_overlap_um=4.0
    )
    closes = []
    for _ in range(args.repeats):
        seg = SlowModel(0.02)
        seg.target_mpp, seg.min_overlap_um = 1.0, 4.0
        gen = iter_tiles(slide, plan, seg, workers=3, read_threads=2)
        next(gen)
        t0 = time.perf_counter()
        gen.close()
        closes.append(time.perf_counter() - t0)
    print(f"{'runner close()':24s} {statistics.median(closes):9.3f}")


if __name__ == "__main__":
    main()
