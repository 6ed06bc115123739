"""The staged tile runner: read -> model -> post-process, with bounded queues.

Stage 1 (``read_threads`` threads) reads each tile's pixels from the slide at a
pyramid level and resamples them to the working resolution
(:func:`~napari_slidescope.pipeline.tiling.read_tile`).
Stage 2 (one thread by default) runs ``segmenter.predict`` on batches of tiles; this
is where a GPU is used by models that support one. A CPU-only segmenter may set
``parallel_predict = True`` to get ``workers`` model threads instead. Stage 3
(``workers`` threads) runs ``segmenter.postprocess``, keeps the nuclei each tile owns
and measures them; numpy, scipy and scikit-image release the GIL, so threads run in
parallel.

Queues between stages are small and at most ``max_in_flight`` tiles are between
"read started" and "handed to the consumer", so memory is bounded by tile size
times tiles in flight, never by region size. Model inference of tile n+1 overlaps
post-processing of tile n. Results are yielded in plan order, which makes the
global nucleus ids deterministic whatever the thread timing.

Closing the generator (or an exception in any stage) stops all stages and joins
their threads before control returns. A stage's exception is re-raised in the
consumer as the original exception object with a note naming the tile.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from napari_slidescope.pipeline.tiling import (
    Tile,
    TilePlan,
    choose_level,
    owned_labels,
    read_tile,
)

__all__ = ["TileResult", "iter_tiles"]

_POLL = 0.02  # seconds between checks of the stop flag while blocked


class _Segmenter(Protocol):
    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray: ...

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray: ...


@dataclass
class TileResult:
    """What the runner yields for one tile.

    Attributes
    ----------
    tile : Tile
        The tile.
    labels : (M, N) ndarray of int32
        The nuclei the tile owns over ``tile.box`` (whole, including parts outside
        the core), with region-unique ids ``offset + 1 .. offset + count``; 0 elsewhere.
    count : int
        Number of owned nuclei.
    offset : int
        Number of nuclei in the tiles yielded before this one.
    table : dict of str to ndarray
        Measurement columns for the owned nuclei (empty when no ``measure`` given).
    """

    tile: Tile
    labels: np.ndarray
    count: int
    offset: int
    table: dict[str, np.ndarray] = field(default_factory=dict)


class _Stop(Exception):
    """Raised inside a stage when the run is being shut down."""


@dataclass
class _Item:
    tile: Tile
    rgb: np.ndarray
    raw: np.ndarray | None = None


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            q.put(item, timeout=_POLL)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue, stop: threading.Event) -> Any:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            return q.get(timeout=_POLL)
        except queue.Empty:
            continue


def _named(exc: BaseException, stage: str, tiles: Sequence[Tile]) -> BaseException:
    """Add a note naming the stage and the tile(s) to an exception; return it."""
    where = "; ".join(
        f"tile {t.index} (grid {t.grid}, level-0 box {t.box0}"
        + (f", slide {t.path})" if t.path else ")")
        for t in tiles
    )
    exc.add_note(f"napari-slidescope: raised in the {stage} stage for {where or 'no tile'}")
    return exc


def iter_tiles(
    slide: Any,
    plan: TilePlan,
    segmenter: _Segmenter,
    *,
    tiles: Sequence[Tile] | None = None,
    level: int | None = None,
    workers: int | None = None,
    read_threads: int = 2,
    batch_size: int = 1,
    queue_size: int = 2,
    max_in_flight: int | None = None,
    model_threads: int | None = None,
    measure: Callable[[np.ndarray, np.ndarray, Tile], dict[str, np.ndarray]] | None = None,
    reader: Callable[[Tile], np.ndarray] | None = None,
    monitor: Callable[[str, str, int], None] | None = None,
) -> Generator[TileResult, None, None]:
    """Segment tiles in a read -> model -> post-process pipeline, yielding per tile.

    Parameters
    ----------
    slide : Slide-like
        Source of pixels (``read_region``, ``downsamples``); unused when ``reader``
        is given.
    plan : TilePlan
        The tile plan.
    segmenter : object
        Has ``predict(tiles, *, mpp)`` and ``postprocess(raw, *, mpp)``.
    tiles : sequence of Tile, optional
        Tiles to process (e.g. those with tissue), default all of ``plan``.
    level : int, optional
        Pyramid level to read, default :func:`choose_level`.
    workers : int, optional
        Post-processing threads, default ``os.cpu_count()``.
    read_threads : int
        Reading threads.
    batch_size : int
        Tiles per ``predict`` call.
    queue_size : int
        Capacity of each queue between stages.
    max_in_flight : int, optional
        Most tiles between "read started" and "consumed"; default
        ``read_threads + 2 * batch_size * model_threads + workers + 2 * queue_size``.
    model_threads : int, optional
        Threads calling ``predict``. Default 1 (one model, one device), or ``workers``
        when the segmenter sets ``parallel_predict = True`` (a CPU-only ``predict``
        that releases the GIL, where one thread would be the bottleneck).
    measure : callable, optional
        ``measure(owned_labels, rgb, tile) -> dict of columns`` run in the
        post-processing stage on local ids; an ``"id"`` column is shifted to global ids.
    reader : callable, optional
        ``reader(tile) -> (M, N, 3) uint8``, replaces :func:`read_tile`.
    monitor : callable, optional
        ``monitor(stage, phase, tile_index)`` called at ``"start"``/``"end"`` of each
        stage (``"read"``, ``"model"``, ``"post"``) per tile, from the stage's thread.

    Yields
    ------
    result : TileResult
        In plan order. The slot of a tile is released when the consumer asks for
        the next result.

    Raises
    ------
    Exception
        The original exception of a failing stage, with a note naming the tile.
    """
    todo = list(plan.tiles if tiles is None else tiles)
    workers = max(1, int(workers or os.cpu_count() or 1))
    batch_size, read_threads = max(1, int(batch_size)), max(1, int(read_threads))
    if model_threads is None:
        model_threads = workers if getattr(segmenter, "parallel_predict", False) else 1
    n_model = max(1, int(model_threads))
    q = max(1, int(queue_size))
    bound = max_in_flight or read_threads + 2 * batch_size * n_model + workers + 2 * q
    if bound < batch_size:
        raise ValueError(f"max_in_flight: expected >= batch_size ({batch_size}), got {bound}")
    if level is None and reader is None:
        level = choose_level(slide.downsamples, plan.downsample)
    read = reader or (lambda t: read_tile(slide, t, plan, level=int(level)))  # type: ignore[arg-type]
    note = monitor or (lambda stage, phase, index: None)
    mpp = plan.mpp

    stop = threading.Event()
    slots = threading.Semaphore(bound)
    take_lock = threading.Lock()
    next_todo = iter(range(len(todo)))
    q_read: queue.Queue = queue.Queue(maxsize=q)
    q_post: queue.Queue = queue.Queue(maxsize=q)
    q_out: queue.Queue = queue.Queue()  # bounded by `slots`
    readers_left, models_left = [read_threads], [n_model]
    done_reading = object()

    def fail(exc: BaseException, stage: str, tiles: Sequence[Tile | None]) -> None:
        q_out.put(("error", _named(exc, stage, [t for t in tiles if t is not None])))
        stop.set()

    def read_stage() -> None:
        tile = None
        try:
            while True:
                while not slots.acquire(timeout=_POLL):
                    if stop.is_set():
                        raise _Stop
                with take_lock:
                    k = next(next_todo, None)
                if k is None:
                    slots.release()
                    break
                tile = todo[k]
                note("read", "start", tile.index)
                rgb = read(tile)
                note("read", "end", tile.index)
                _put(q_read, (k, _Item(tile, rgb)), stop)
                tile = None
            with take_lock:
                readers_left[0] -= 1
                last = readers_left[0] == 0
            if last:
                _put(q_read, done_reading, stop)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - surfaced in the consumer
            fail(exc, "read", [tile])

    def model_stage() -> None:
        batch: list[tuple[int, _Item]] = []
        try:
            finished = False
            while not finished:
                entry = _get(q_read, stop)
                if entry is done_reading:
                    _put(q_read, done_reading, stop)  # for the other model threads
                    break
                batch = [entry]
                while len(batch) < batch_size:
                    try:
                        entry = q_read.get_nowait()
                    except queue.Empty:
                        break
                    if entry is done_reading:
                        _put(q_read, done_reading, stop)
                        finished = True
                        break
                    batch.append(entry)
                for _, it in batch:
                    note("model", "start", it.tile.index)
                raw = np.asarray(segmenter.predict(np.stack([it.rgb for _, it in batch]), mpp=mpp))
                if raw.shape[0] != len(batch):
                    raise ValueError(
                        f"predict: expected {len(batch)} outputs, got shape {raw.shape}"
                    )
                for j, (k, it) in enumerate(batch):
                    note("model", "end", it.tile.index)
                    it.raw = raw[j]
                    _put(q_post, (k, it), stop)
                batch = []
            with take_lock:
                models_left[0] -= 1
                last = models_left[0] == 0
            for _ in range(workers if last else 0):
                _put(q_post, done_reading, stop)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001
            fail(exc, "model", [it.tile for _, it in batch])

    def post_stage() -> None:
        tile = None
        try:
            while True:
                entry = _get(q_post, stop)
                if entry is done_reading:
                    return
                k, it = entry
                tile = it.tile
                note("post", "start", tile.index)
                labels = np.asarray(segmenter.postprocess(it.raw, mpp=mpp))
                h, w = tile.shape
                if labels.shape[0] >= h and labels.shape[1] >= w:
                    labels = labels[:h, :w]  # segmenters may pad tiles (e.g. to a multiple of 16)
                owned = owned_labels(labels, tile)
                table = measure(owned, it.rgb, tile) if measure is not None else {}
                note("post", "end", tile.index)
                q_out.put(("ok", k, owned, table))
                tile = None
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001
            fail(exc, "post-process", [tile])

    threads = [
        threading.Thread(target=read_stage, name=f"slidescope-read-{i}", daemon=True)
        for i in range(read_threads)
    ]
    threads += [
        threading.Thread(target=model_stage, name=f"slidescope-model-{i}", daemon=True)
        for i in range(n_model)
    ]
    threads += [
        threading.Thread(target=post_stage, name=f"slidescope-post-{i}", daemon=True)
        for i in range(workers)
    ]
    for t in threads:
        t.start()
    try:
        pending: dict[int, tuple[np.ndarray, dict]] = {}
        offset = 0
        for k in range(len(todo)):
            while k not in pending:
                msg = q_out.get()
                if msg[0] == "error":
                    raise msg[1]
                pending[msg[1]] = (msg[2], msg[3])
            owned, table = pending.pop(k)
            count = int(owned.max()) if owned.size else 0
            labels = owned
            if offset and count:
                labels = np.where(owned > 0, owned + np.int32(offset), 0).astype(np.int32)
            if "id" in table:
                table = {**table, "id": np.asarray(table["id"]) + offset}
            yield TileResult(tile=todo[k], labels=labels, count=count, offset=offset, table=table)
            offset += count
            slots.release()
    finally:
        stop.set()
        for t in threads:
            t.join()
