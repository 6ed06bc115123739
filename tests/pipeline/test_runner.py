import itertools
import threading
import time

import numpy as np
import pytest

from napari_slidescope.pipeline.runner import iter_tiles
from napari_slidescope.pipeline.tiling import make_plan


class RecordingSlide:
    """One-level in-memory RGB slide that counts reads and tiles in flight."""

    def __init__(self, shape=(256, 320)):
        rng = np.random.default_rng(1)
        self.img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        self.downsamples = [(1.0, 1.0)]
        self.shape0 = shape
        self.reads = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def read_region(self, box, *, level=0):
        with self.lock:
            self.reads.append(box)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        y0, x0, y1, x1 = box
        return self.img[y0:y1, x0:x1].copy()

    def consumed(self):
        with self.lock:
            self.in_flight -= 1


class SlowSegmenter:
    """Pure-numpy fake: the model sleeps per batch, post-processing sleeps per tile."""

    target_mpp = 1.0
    min_overlap_um = 4.0

    def __init__(self, model_s=0.05, post_s=0.05, fail_predict=None, fail_post=None):
        self.model_s, self.post_s = model_s, post_s
        self.fail_predict, self.fail_post = fail_predict, fail_post
        self.batches = []

    def predict(self, tiles, *, mpp):
        self.batches.append(len(tiles))
        time.sleep(self.model_s)
        mean = tiles.mean(axis=-1, keepdims=True).astype(np.float32)
        h, w = mean.shape[1:3]
        if (
            self.fail_predict is not None
            and (mean[:, h // 2, w // 2, 0] == self.fail_predict).any()
        ):
            raise RuntimeError("model exploded")
        return mean

    def postprocess(self, raw, *, mpp):
        time.sleep(self.post_s)
        h, w = raw.shape[:2]
        if self.fail_post is not None and raw[h // 2, w // 2, 0] == self.fail_post:
            raise KeyError("post-process exploded")
        lab = np.zeros(raw.shape[:2], np.int32)
        lab[10:14, 10:14] = 1  # one nucleus per tile at a fixed place
        return lab


def plan_for(slide, tile=32):
    return make_plan(
        (0, 0, *slide.shape0), slide_mpp=1.0, target_mpp=1.0, tile_size_um=tile, min_overlap_um=4.0
    )


def events_recorder():
    """A monitor that logs each stage event with its place in one global order (no clock)."""
    log, lock = [], threading.Lock()
    order = itertools.count()

    def monitor(stage, phase, index):
        with lock:
            log.append((stage, phase, index, next(order)))

    return log, monitor


def intervals(log, stage):
    start = {i: t for s, p, i, t in log if s == stage and p == "start"}
    end = {i: t for s, p, i, t in log if s == stage and p == "end"}
    return {i: (start[i], end[i]) for i in start}


class OverlapSegmenter(SlowSegmenter):
    """Post-processing of the first tile waits until the model has started on another tile.

    A pipelined runner starts tile n+1's inference while tile n is post-processed, so the
    wait ends at once; a serial runner never does, and the wait gives up after a generous
    30 s (a hang guard only) and records that the stages did not overlap.
    """

    def __init__(self):
        super().__init__(0.0, 0.0)
        self.lock = threading.Lock()
        self.predicts = 0
        self.second_predict = threading.Event()
        self.overlapped = None

    def predict(self, tiles, *, mpp):
        with self.lock:
            self.predicts += 1
            if self.predicts >= 2:
                self.second_predict.set()
        return super().predict(tiles, mpp=mpp)

    def postprocess(self, raw, *, mpp):
        with self.lock:
            first = self.overlapped is None
            if first:
                self.overlapped = False
        if first:
            self.overlapped = self.second_predict.wait(timeout=30)
        return super().postprocess(raw, mpp=mpp)


def test_stages_overlap_order_and_coverage():
    slide = RecordingSlide()
    plan = plan_for(slide, tile=80)
    assert len(plan) == 16
    log, monitor = events_recorder()
    seg = OverlapSegmenter()
    results = []
    for res in iter_tiles(slide, plan, seg, workers=2, monitor=monitor):
        results.append(res)
        slide.consumed()
    assert [r.tile.index for r in results] == [t.index for t in plan.tiles]
    counts = [r.count for r in results]
    assert [r.offset for r in results] == list(np.cumsum([0, *counts[:-1]]))
    assert sum(counts) >= 9  # one per tile, except edge tiles whose box is shifted inwards
    assert all(r.labels.max() == (r.offset + 1 if r.count else 0) for r in results)
    model, post = intervals(log, "model"), intervals(log, "post")
    assert set(model) == set(post) == {t.index for t in plan.tiles}
    # model inference of another tile ran while the first tile was post-processed
    assert seg.overlapped is True
    first_post = post[0]
    # (a serial runner starts no other tile's inference before the first post-processing ends;
    # whether that inference also ends inside it depends on the queue's fill, not asserted)
    assert any(model[n][0] < first_post[1] for n in model if n != 0)
    # and each tile goes read -> model -> post (in the one order of the logged events)
    read = intervals(log, "read")
    for i in model:
        assert read[i][1] <= model[i][0], i
        assert model[i][1] <= post[i][0], i


@pytest.mark.parametrize("bound,batch", [(2, 1), (3, 2), (6, 4)])
def test_tiles_in_flight_never_exceed_bound(bound, batch):
    slide = RecordingSlide((160, 200))
    plan = plan_for(slide, tile=32)
    seg = SlowSegmenter(model_s=0.005, post_s=0.01)
    n = 0
    for _ in iter_tiles(
        slide,
        plan,
        seg,
        workers=3,
        batch_size=batch,
        max_in_flight=bound,
        read_threads=2,
        queue_size=1,
    ):
        time.sleep(0.005)  # slow consumer
        slide.consumed()
        n += 1
    assert n == len(plan) == len(slide.reads)
    assert 1 <= slide.max_in_flight <= bound
    assert max(seg.batches) <= batch


def test_only_given_tiles_are_read():
    slide = RecordingSlide()
    plan = plan_for(slide)
    chosen = plan.tiles[1::3]
    got = [r.tile for r in iter_tiles(slide, plan, SlowSegmenter(0, 0), tiles=chosen, workers=1)]
    assert got == list(chosen)
    assert len(slide.reads) == len(chosen)
    for t in chosen:  # read with a small margin for resampling, clipped to the slide
        assert any(
            r[0] <= t.box0[0] <= r[0] + 2
            and r[1] <= t.box0[1] <= r[1] + 2
            and r[2] - 2 <= t.box0[2] <= r[2]
            and r[3] - 2 <= t.box0[3] <= r[3]
            for r in slide.reads
        )


@pytest.mark.parametrize("stage", ["model", "post", "read"])
def test_stage_errors_surface_with_the_tile_named(stage):
    slide = RecordingSlide()
    plan = plan_for(slide)
    bad = plan.tiles[4]
    y0, x0, y1, x1 = bad.box0
    kw = {}
    if stage == "model":
        slide.img[y0:y1, x0:x1] = (6, 7, 9)  # mean 7.333..
        marker = np.float32(np.mean([6, 7, 9], dtype=np.float32))
        seg, exc = SlowSegmenter(0.001, 0.001, fail_predict=marker), RuntimeError
        kw["batch_size"] = 2  # the note names every tile of the failing batch
    elif stage == "post":
        slide.img[y0:y1, x0:x1] = (6, 7, 9)
        marker = np.float32(np.mean([6, 7, 9], dtype=np.float32))
        seg, exc = SlowSegmenter(0.001, 0.001, fail_post=marker), KeyError
    else:
        seg, exc = SlowSegmenter(0.001, 0.001), OSError

        def reader(tile):
            if tile.index == bad.index:
                raise OSError("disk on fire")
            return slide.read_region(tile.box0)

        kw["reader"] = reader
    baseline = threading.active_count()
    with pytest.raises(exc) as info:
        for _ in iter_tiles(slide, plan, seg, workers=2, **kw):
            pass
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert f"tile {bad.index} " in notes
    assert str(bad.box0) in notes
    assert threading.active_count() == baseline


def test_closing_early_joins_all_threads():
    slide = RecordingSlide()
    plan = plan_for(slide, tile=16)
    baseline = threading.active_count()
    seg = SlowSegmenter(0.02, 0.02)
    gen = iter_tiles(slide, plan, seg, workers=3, read_threads=2)
    first = next(gen)
    assert first.tile.index == 0
    assert threading.active_count() > baseline
    gen.close()
    # close() stops the run: its threads are joined, and the tiles not yet started never are
    assert threading.active_count() == baseline
    assert len(slide.reads) < len(plan)
    assert sum(seg.batches) < len(plan)


def test_empty_tile_list_and_bad_predict_output():
    slide = RecordingSlide()
    plan = plan_for(slide)
    assert list(iter_tiles(slide, plan, SlowSegmenter(0, 0), tiles=[])) == []

    class Wrong(SlowSegmenter):
        def predict(self, tiles, *, mpp):
            return np.zeros((len(tiles) + 1, 4, 4, 1), np.float32)

    with pytest.raises(ValueError, match="predict: expected 1 outputs"):
        list(iter_tiles(slide, plan, Wrong(0, 0), workers=1))


class PairedSegmenter(SlowSegmenter):
    """The first two ``predict`` calls meet at a barrier: they pass only if they run at once.

    A runner that calls ``predict`` from one thread at a time never brings the second call
    while the first waits, and the barrier breaks after a generous 30 s (a hang guard),
    failing the run.
    """

    def __init__(self):
        super().__init__(0.0, 0.0)
        self.barrier = threading.Barrier(2, timeout=30)
        self.lock = threading.Lock()
        self.calls = 0
        self.met = 0

    def predict(self, tiles, *, mpp):
        with self.lock:
            self.calls += 1
            waits = self.calls <= 2
        if waits:
            self.barrier.wait()
            with self.lock:
                self.met += 1
        return super().predict(tiles, mpp=mpp)


@pytest.mark.parametrize("model_threads", [None, 3])
def test_parallel_predict_for_cpu_segmenters(model_threads):
    slide = RecordingSlide()
    plan = plan_for(slide, tile=64)
    seg = PairedSegmenter()
    seg.parallel_predict = True  # CPU-only predict: one model thread per worker by default
    baseline = threading.active_count()
    got = [
        r.tile.index for r in iter_tiles(slide, plan, seg, workers=3, model_threads=model_threads)
    ]
    assert got == [t.index for t in plan.tiles]
    assert seg.met == 2  # two predict calls were in flight together
    assert threading.active_count() == baseline
