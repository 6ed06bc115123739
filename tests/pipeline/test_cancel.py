"""Cancel: a set event stops tissue detection, segmenter preparation and tile work quickly.

The slides and the segmenter here are deliberately slow (every chunk read or tile
predicted sleeps), so that an uncancelled run takes many seconds; the bound each test
asserts is several times the 1 s the pipeline promises, and several times shorter than
the run it cancels.
"""

import threading
import time

import dask.array as da
import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.pipeline.cancel import Cancelled
from napari_slidescope.pipeline.nuclei import iter_segment_nuclei, segment_nuclei
from napari_slidescope.pipeline.tissue import detect_tissue
from napari_slidescope.slide import ArraySlide

BOUND_S = 3.0  # generous: the runs cancelled below take >= 8 s uncancelled


def _slow_slide(shape, chunk, delay):
    def fill(block):
        time.sleep(delay)
        out = np.full(block.shape, 235, np.uint8)
        out[block.shape[0] // 4 : block.shape[0] // 2, ..., 1] = 80  # some "tissue"
        return out

    arr = da.zeros((*shape, 3), np.uint8, chunks=(*chunk, 3)).map_blocks(fill, dtype=np.uint8)
    return ArraySlide(arr, mpp=0.5, name="slow")


class SlowSegmenter:
    target_mpp = 0.5
    min_overlap_um = 0.0

    def __init__(self, delay):
        self.delay = delay
        self.prepared = False

    def prepare(self, sample, *, mpp):
        self.prepared = True

    def predict(self, tiles, *, mpp):
        time.sleep(self.delay)
        return np.zeros(tiles.shape[:3], np.float32)

    def postprocess(self, raw, *, mpp):
        labels = np.zeros(raw.shape, np.int32)
        labels[10:20, 10:20] = 1
        return labels


def _cancel_after(event, seconds):
    timer = threading.Timer(seconds, event.set)
    timer.start()
    return timer


def _time_to_stop(fn, event, after):
    timer = _cancel_after(event, after)
    t0 = time.perf_counter()
    try:
        with pytest.raises(Cancelled):
            fn()
    finally:
        timer.cancel()
    return time.perf_counter() - t0 - after


def test_uncancelled_tissue_detection_is_slow_enough_to_need_cancel():
    slide = _slow_slide((4096, 4096), (128, 4096), 0.5)
    t0 = time.perf_counter()
    detect_tissue(slide, target_mpp=8.0, cancel=threading.Event())  # never set
    assert time.perf_counter() - t0 > 2 * BOUND_S


def test_cancel_stops_tissue_detection():
    slide = _slow_slide((4096, 4096), (128, 4096), 0.5)  # 32 chunks of 0.5 s
    cancel = threading.Event()
    late = _time_to_stop(lambda: detect_tissue(slide, target_mpp=8.0, cancel=cancel), cancel, 0.3)
    assert late < BOUND_S


def test_cancel_stops_segmenter_preparation():
    # the stain sample reads 8 crops, each inside one 1024 px tile core, so inside one
    # 2048 px chunk: each read sleeps 1 s
    slide = _slow_slide((8192, 8192), (2048, 2048), 1.0)
    seg = SlowSegmenter(0.0)
    cancel = threading.Event()
    late = _time_to_stop(
        lambda: segment_nuclei(slide, tissue=False, segmenter=seg, cancel=cancel), cancel, 0.3
    )
    assert late < BOUND_S
    assert not seg.prepared


def test_cancel_stops_tile_work_and_keeps_finished_tiles():
    slide = _slow_slide((4096, 4096), (4096, 4096), 0.0)
    seg = SlowSegmenter(2.0)  # 16 tiles x 2 s, one model thread
    cancel = threading.Event()
    steps = []
    gen = iter_segment_nuclei(
        slide, tissue=False, segmenter=seg, cancel=cancel, tile_size_um=512.0, workers=1
    )
    # one flat colour on glass: the stains for the measurements fall back, and say so
    with pytest.warns(SlidescopeWarning, match="fell back"), pytest.raises(Cancelled):
        for step in gen:
            steps.append(step)
            if len(steps) == 1:
                cancel.set()
                t0 = time.perf_counter()
    assert time.perf_counter() - t0 < BOUND_S  # the next tile's 2 s predict is not awaited
    assert len(steps) == 1
    assert steps[0].total == 16
    assert steps[0].result.labels.max() == 1  # the finished tile is whole
