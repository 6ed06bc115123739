"""Cancel: a set event stops tissue detection, segmenter preparation and tile work.

No clock: the slides count the chunks they read and set the cancel event from inside a
read, at a known point of the run; the tests check that the run raises ``Cancelled`` and
how much work it did after that point (an uncancelled run does all of it). The tile test
blocks the model on an event the test releases only after the run has stopped, so a run
that waited for the tile in flight would be seen to.
"""

import threading

import dask.array as da
import numpy as np
import pytest
from tests.fakes import GatedSegmenter

from napari_slidescope import SlidescopeWarning
from napari_slidescope.pipeline.cancel import Cancelled
from napari_slidescope.pipeline.nuclei import iter_segment_nuclei, segment_nuclei
from napari_slidescope.pipeline.tissue import detect_tissue
from napari_slidescope.slide import ArraySlide


class CountingSlide(ArraySlide):
    """A dask-backed slide that records its chunk reads and may set `cancel` at read n."""

    def __init__(self, shape, chunk, cancel=None, cancel_at=None):
        self.lock = threading.Lock()
        self.reads = 0
        self.chunks_read = set()  # block indices
        self.cancel, self.cancel_at = cancel, cancel_at
        arr = da.zeros((*shape, 3), np.uint8, chunks=(*chunk, 3)).map_blocks(
            self._fill, dtype=np.uint8, meta=np.empty((0, 0, 0), np.uint8)
        )  # meta given: dask never calls _fill to guess it, so every call is a chunk read
        self.chunks = arr.npartitions
        super().__init__(arr, mpp=0.5, name="counting")

    def _fill(self, block, block_info=None):
        with self.lock:
            self.reads += 1
            self.chunks_read.add(tuple(block_info[None]["chunk-location"]))
            if self.cancel is not None and self.reads == self.cancel_at:
                self.cancel.set()
        out = np.full(block.shape, 235, np.uint8)
        out[block.shape[0] // 4 : block.shape[0] // 2, ..., 1] = 80  # some "tissue"
        return out


class SquareSegmenter:
    """One 10 x 10 px nucleus per tile, whatever the pixels; records its preparation."""

    name = "square"
    target_mpp = 0.5
    min_overlap_um = 0.0

    def __init__(self):
        self.prepared = False

    def prepare(self, sample, *, mpp):
        self.prepared = True

    def predict(self, tiles, *, mpp):
        return np.zeros(tiles.shape[:3], np.float32)

    def postprocess(self, raw, *, mpp):
        labels = np.zeros(raw.shape, np.int32)
        labels[10:20, 10:20] = 1
        return labels


def _blocking():
    """Every tile waits until the test opens the gate."""
    return GatedSegmenter(SquareSegmenter(), free=0, timeout=60)


def test_uncancelled_tissue_detection_reads_every_chunk():
    slide = CountingSlide((4096, 4096), (128, 4096))
    assert slide.chunks == 32
    detect_tissue(slide, target_mpp=8.0, cancel=threading.Event())  # never set
    assert len(slide.chunks_read) == 32


def test_cancel_stops_tissue_detection():
    cancel = threading.Event()
    slide = CountingSlide((4096, 4096), (128, 4096), cancel=cancel, cancel_at=1)
    with pytest.raises(Cancelled, match="tissue detection"):
        detect_tissue(slide, target_mpp=8.0, cancel=cancel)
    # cancelled during the first read: the strip being read finishes (a strip of at most
    # 8 MiB is 682 rows of 4096 RGB pixels: 7 chunks of 128 rows), no further strip starts
    assert 1 <= len(slide.chunks_read) <= 7


def test_cancel_stops_segmenter_preparation():
    # the stain sample reads 8 crops, each inside one 1024 px tile core, so inside one
    # 2048 px chunk; the event is set while the first is read
    cancel = threading.Event()
    slide = CountingSlide((8192, 8192), (2048, 2048), cancel=cancel, cancel_at=1)
    seg = _blocking()
    with pytest.raises(Cancelled):
        segment_nuclei(slide, tissue=False, segmenter=seg, cancel=cancel)
    assert slide.reads == 1  # no second crop is read
    assert not seg.inner.prepared
    assert seg.seen == 0


def test_uncancelled_preparation_reads_its_sample_and_prepares():
    slide = CountingSlide((8192, 8192), (2048, 2048))
    seg = _blocking()
    seg.gate.set()
    gen = iter_segment_nuclei(slide, tissue=False, segmenter=seg, tile_size_um=1024.0)
    with pytest.warns(SlidescopeWarning, match="fell back"):
        first = next(gen)
    gen.close()
    assert seg.inner.prepared
    assert first.total == 16
    assert slide.reads >= 2  # the sample reads more than the one crop a cancel allows


def test_cancel_stops_tile_work_and_keeps_finished_tiles():
    slide = CountingSlide((4096, 4096), (4096, 4096))
    # 16 tiles read in plan order, one per predict: the first passes, every later one waits
    # at the gate. (A gate closed only once the first step arrived raced the run: the 9
    # tiles it may have in flight could all be predicted by then, leaving none to wait.)
    seg = GatedSegmenter(SquareSegmenter(), free=1, timeout=60)
    cancel = threading.Event()
    steps = []
    gen = iter_segment_nuclei(
        slide,
        tissue=False,
        segmenter=seg,
        cancel=cancel,
        tile_size_um=512.0,
        workers=1,
        read_threads=1,
        batch_size=1,
    )
    try:
        # one flat colour on glass: the stains for the measurements fall back, and say so
        with pytest.warns(SlidescopeWarning, match="fell back"), pytest.raises(Cancelled):
            for step in gen:
                steps.append(step)
                if len(steps) == 1:
                    assert seg.held.wait(timeout=30)  # a tile is in flight (a hang guard)
                    cancel.set()
        # the run stopped while any tile predicted after the cancel was still blocked
        assert seg.late == 0
    finally:
        seg.gate.set()
    assert len(steps) == 1
    assert steps[0].total == 16
    assert steps[0].result.labels.max() == 1  # the finished tile is whole
