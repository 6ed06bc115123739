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

import ctypes
import os
import queue
import sys
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from napari_slidescope.pipeline.cancel import Cancelled, check_cancel
from napari_slidescope.pipeline.tiling import (
    Tile,
    TilePlan,
    owned_labels,
    read_tile,
)
from napari_slidescope.segmenters.base import Segmenter, as_segmenter
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser

__all__ = ["TileResult", "cell_outlines", "iter_tiles", "postprocess_tile", "release_freed_memory"]

_POLL = 0.02  # seconds between checks of the stop flag while blocked
_CANCEL_POLL = 0.1  # seconds between checks of the cancel flag while waiting for a tile


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
    cells : (M, N) ndarray of int32 or None
        The owned nuclei's cells (same ids as ``labels``) when the run grows cells
        (``segment_nuclei(cell_expansion_um=...)``), else None.
    """

    tile: Tile
    labels: np.ndarray
    count: int
    offset: int
    table: dict[str, np.ndarray] = field(default_factory=dict)
    cells: np.ndarray | None = None


class _Stop(Exception):
    """Raised inside a stage when the run is being shut down."""


@dataclass
class _Item:
    tile: Tile
    rgb: np.ndarray
    raw: np.ndarray | None = None


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """Return glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _libc_malloc_trim()


def release_freed_memory() -> None:
    """Hand the memory freed since the last call back to the system (glibc; else nothing).

    A tile's arrays are allocated and freed by several threads, each with its own glibc
    arena; freed chunks below the mmap threshold stay in those arenas, so the process's
    resident memory crept up over a long run (hundreds of MB past what was in use, more
    the more tiles) and a run's peak grew with the slide. Called once per finished tile:
    ``malloc_trim`` costs well under 1 ms there and never changes what is computed.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            q.put(item, timeout=_POLL)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue[Any], stop: threading.Event) -> Any:
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
    segmenter: Segmenter | Any,
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
    cancel: threading.Event | None = None,
) -> Generator[TileResult, None, None]:
    """Segment tiles in a read -> model -> post-process pipeline, yielding per tile.

    Parameters
    ----------
    slide : Slide-like
        Source of pixels (``read_region``, ``downsamples``); unused when ``reader``
        is given.
    plan : TilePlan
        The tile plan.
    segmenter : Segmenter or object
        A :class:`~napari_slidescope.segmenters.base.Segmenter`, or any object with
        ``predict(tiles, *, mpp)`` and ``postprocess(raw, *, mpp)`` (given the protocol's
        defaults by :func:`~napari_slidescope.segmenters.base.as_segmenter`).
    tiles : sequence of Tile, optional
        Tiles to process (e.g. those with tissue), default all of ``plan``.
    level : int, optional
        Pyramid level to read, default the coarsest level not coarser than the plan's
        working resolution
        (:func:`~napari_slidescope.slide.level_choice.coarsest_level_not_coarser`).
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
    cancel : threading.Event, optional
        Once set, the run raises :class:`~napari_slidescope.pipeline.cancel.Cancelled`
        within ``_POLL`` seconds, without waiting for the tiles in progress (their
        threads finish the call they are in, then stop; their output is dropped).
        Tiles already yielded are the caller's.

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
    run = _StagedRun(
        slide,
        plan,
        as_segmenter(segmenter),
        tiles=tiles,
        level=level,
        workers=workers,
        read_threads=read_threads,
        batch_size=batch_size,
        queue_size=queue_size,
        max_in_flight=max_in_flight,
        model_threads=model_threads,
        measure=measure,
        reader=reader,
        monitor=monitor,
    )
    run.start()
    try:
        yield from run.results(cancel)
    except Cancelled:
        run.close(wait=False)
        raise
    finally:
        run.close()


class _StagedRun:
    """One run of :func:`iter_tiles`: its configuration, queues and the three stages.

    Each stage is a method run by its own threads; :meth:`results` is the consumer that
    reorders finished tiles into plan order; :meth:`close` stops and joins every thread.
    """

    def __init__(
        self,
        slide: Any,
        plan: TilePlan,
        segmenter: Segmenter,
        *,
        tiles: Sequence[Tile] | None,
        level: int | None,
        workers: int | None,
        read_threads: int,
        batch_size: int,
        queue_size: int,
        max_in_flight: int | None,
        model_threads: int | None,
        measure: Callable[[np.ndarray, np.ndarray, Tile], dict[str, np.ndarray]] | None,
        reader: Callable[[Tile], np.ndarray] | None,
        monitor: Callable[[str, str, int], None] | None,
    ) -> None:
        self.todo = list(plan.tiles if tiles is None else tiles)
        self.segmenter = segmenter
        self.measure = measure
        self.mpp = plan.mpp
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.batch_size, self.read_threads = max(1, int(batch_size)), max(1, int(read_threads))
        if model_threads is None:
            model_threads = self.workers if segmenter.parallel_predict else 1
        self.n_model = max(1, int(model_threads))
        q = max(1, int(queue_size))
        bound = max_in_flight or (
            self.read_threads + 2 * self.batch_size * self.n_model + self.workers + 2 * q
        )
        if bound < self.batch_size:
            raise ValueError(
                f"max_in_flight: expected >= batch_size ({self.batch_size}), got {bound}"
            )
        if reader is None:
            lvl = (
                coarsest_level_not_coarser(slide.downsamples, plan.downsample)
                if level is None
                else level
            )
            self.read: Callable[[Tile], np.ndarray] = lambda t: read_tile(
                slide, t, plan, level=int(lvl)
            )
        else:
            self.read = reader
        self.note = monitor or (lambda stage, phase, index: None)

        self.stop = threading.Event()
        self.slots = threading.Semaphore(bound)
        self.take_lock = threading.Lock()
        self.next_todo = iter(range(len(self.todo)))
        self.q_read: queue.Queue[Any] = queue.Queue(maxsize=q)
        self.q_post: queue.Queue[Any] = queue.Queue(maxsize=q)
        self.q_out: queue.Queue[Any] = queue.Queue()  # bounded by `slots`
        self.readers_left, self.models_left = self.read_threads, self.n_model
        self.done = object()  # end-of-stream marker passed down the queues
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the stage threads."""
        stages = [
            ("read", self.read_stage, self.read_threads),
            ("model", self.model_stage, self.n_model),
            ("post", self.post_stage, self.workers),
        ]
        for name, target, n in stages:
            self.threads += [
                threading.Thread(target=target, name=f"slidescope-{name}-{i}", daemon=True)
                for i in range(n)
            ]
        for t in self.threads:
            t.start()

    def close(self, *, wait: bool = True) -> None:
        """Stop every stage; join its threads (all, or with ``wait=False`` none).

        Without waiting, a thread inside ``predict`` or ``postprocess`` finishes that call
        and then sees the stop flag; it is a daemon thread and holds no lock.
        """
        self.stop.set()
        if not wait:
            self.threads = []
        for t in self.threads:
            t.join()

    def _fail(self, exc: BaseException, stage: str, tiles: Sequence[Tile | None]) -> None:
        self.q_out.put(("error", _named(exc, stage, [t for t in tiles if t is not None])))
        self.stop.set()

    def _last_of(self, counter: str) -> bool:
        """Count down ``counter`` under the lock; True for the thread that ends it."""
        with self.take_lock:
            left = int(getattr(self, counter)) - 1
            setattr(self, counter, left)
            return left == 0

    def _take(self) -> int | None:
        """Wait for an in-flight slot and take the next tile's position (None when done)."""
        while not self.slots.acquire(timeout=_POLL):
            if self.stop.is_set():
                raise _Stop
        with self.take_lock:
            k = next(self.next_todo, None)
        if k is None:
            self.slots.release()
        return k

    def read_stage(self) -> None:
        """Stage 1: read tiles into the model queue."""
        tile = None
        try:
            while (k := self._take()) is not None:
                tile = self.todo[k]
                self.note("read", "start", tile.index)
                rgb = self.read(tile)
                self.note("read", "end", tile.index)
                _put(self.q_read, (k, _Item(tile, rgb)), self.stop)
                tile = None
                del rgb  # not held while waiting for a slot
            if self._last_of("readers_left"):
                _put(self.q_read, self.done, self.stop)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - surfaced in the consumer
            self._fail(exc, "read", [tile])

    def _next_batch(self) -> tuple[list[tuple[int, _Item]], bool]:
        """Up to ``batch_size`` read tiles (waiting for the first); True once reading ended."""
        entry = _get(self.q_read, self.stop)
        if entry is self.done:
            _put(self.q_read, self.done, self.stop)  # for the other model threads
            return [], True
        batch = [entry]
        while len(batch) < self.batch_size:
            try:
                entry = self.q_read.get_nowait()
            except queue.Empty:
                break
            if entry is self.done:
                _put(self.q_read, self.done, self.stop)
                return batch, True
            batch.append(entry)
        return batch, False

    def model_stage(self) -> None:
        """Stage 2: ``segmenter.predict`` on batches of tiles."""
        batch: list[tuple[int, _Item]] = []
        try:
            finished = False
            while not finished:
                batch, finished = self._next_batch()
                if not batch:
                    break
                for _, it in batch:
                    self.note("model", "start", it.tile.index)
                stack = np.stack([it.rgb for _, it in batch])
                raw = np.asarray(self.segmenter.predict(stack, mpp=self.mpp))
                if raw.shape[0] != len(batch):
                    raise ValueError(
                        f"predict: expected {len(batch)} outputs, got shape {raw.shape}"
                    )
                for j, (k, it) in enumerate(batch):
                    self.note("model", "end", it.tile.index)
                    it.raw = raw[j]
                    _put(self.q_post, (k, it), self.stop)
                # Drop this batch's pixels and model output before waiting for the next
                # one: held here, each model thread kept a tile's output (the largest
                # array of a tile) alive through the next predict, past its post-process.
                batch = []
                del stack, raw, it
            if self._last_of("models_left"):
                for _ in range(self.workers):
                    _put(self.q_post, self.done, self.stop)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001
            self._fail(exc, "model", [it.tile for _, it in batch])

    def _postprocess(
        self, it: _Item
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Labels the tile owns, their measurements and their cells."""
        assert it.raw is not None  # set by the model stage
        return postprocess_tile(
            self.segmenter,
            it.raw,
            it.rgb,
            it.tile,
            mpp=self.mpp,
            measure=self.measure,
            with_cells=True,
        )

    def post_stage(self) -> None:
        """Stage 3: post-process, keep the owned nuclei, measure."""
        tile = None
        try:
            while (entry := _get(self.q_post, self.stop)) is not self.done:
                k, it = entry
                tile = it.tile
                self.note("post", "start", tile.index)
                owned, table, cells = self._postprocess(it)
                del entry, it  # the tile's pixels and model output: not kept past here
                self.note("post", "end", tile.index)
                self.q_out.put(("ok", k, owned, table, cells))
                tile = None
                del owned, table, cells
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001
            self._fail(exc, "post-process", [tile])

    def results(self, cancel: threading.Event | None = None) -> Generator[TileResult, None, None]:
        """Yield finished tiles in plan order with region-unique ids."""
        pending: dict[int, tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]] = {}
        offset = 0
        for k in range(len(self.todo)):
            check_cancel(cancel, f"tile {k + 1} of {len(self.todo)}")
            while k not in pending:
                check_cancel(cancel, f"tile {k + 1} of {len(self.todo)}")
                try:  # without a cancel flag, block: nothing to look at meanwhile
                    msg = self.q_out.get(timeout=None if cancel is None else _CANCEL_POLL)
                except queue.Empty:
                    continue
                if msg[0] == "error":
                    raise msg[1]
                pending[msg[1]] = (msg[2], msg[3], msg[4])
            owned, table, cells = pending.pop(k)
            yield _global_ids(self.todo[k], owned, table, offset, cells)
            offset += int(owned.max()) if owned.size else 0
            del owned, table, cells
            self.slots.release()
            release_freed_memory()


_Table = dict[str, np.ndarray]


@overload
def postprocess_tile(
    segmenter: Segmenter,
    raw: np.ndarray,
    rgb: np.ndarray,
    tile: Tile,
    *,
    mpp: float,
    measure: Callable[..., _Table] | None = None,
    with_cells: Literal[False] = False,
) -> tuple[np.ndarray, _Table]: ...


@overload
def postprocess_tile(
    segmenter: Segmenter,
    raw: np.ndarray,
    rgb: np.ndarray,
    tile: Tile,
    *,
    mpp: float,
    measure: Callable[..., _Table] | None = None,
    with_cells: Literal[True],
) -> tuple[np.ndarray, _Table, np.ndarray | None]: ...


def postprocess_tile(
    segmenter: Segmenter,
    raw: np.ndarray,
    rgb: np.ndarray,
    tile: Tile,
    *,
    mpp: float,
    measure: Callable[..., _Table] | None = None,
    with_cells: bool = False,
) -> tuple[np.ndarray, _Table] | tuple[np.ndarray, _Table, np.ndarray | None]:
    """Post-process one tile: the labels it owns and their measurements.

    A ``measure`` with a ``cell_distance_px`` attribute > 0 also grows the owned nuclei
    into cells among all the tile's nuclei
    (:func:`~napari_slidescope.analysis.cells.owned_cells`) and is called as
    ``measure(owned, rgb, tile, cells)``. A segmenter with ``cells_from_model`` set (see
    :func:`cell_outlines`) gives its own cells (``postprocess_cells(raw, *, mpp)``), which
    bound them (:func:`~napari_slidescope.analysis.cells.model_cells`).

    Parameters
    ----------
    segmenter : object
        Has ``postprocess(raw, *, mpp)``.
    raw : ndarray
        ``segmenter.predict`` output for this tile (one item of the batch).
    rgb : (M, N, C) ndarray
        The tile's pixels as given to ``predict``.
    tile : Tile
        The tile.
    mpp : float
        Working resolution, µm/px.
    measure : callable, optional
        As in :func:`iter_tiles`.
    with_cells : bool
        Return the cells too (a third item, None when no cells are grown).

    Returns
    -------
    owned : (M, N) ndarray of int32
        The nuclei the tile owns, local ids ``1 .. count``.
    table : dict of str to ndarray
        Their measurements (empty without ``measure``).
    cells : (M, N) ndarray of int32 or None
        Only with ``with_cells``: the owned nuclei's cells.
    """
    labels = np.asarray(segmenter.postprocess(raw, mpp=mpp))
    h, w = tile.shape
    if labels.shape[0] >= h and labels.shape[1] >= w:
        labels = labels[:h, :w]  # segmenters may pad tiles (e.g. to a multiple of 16)
    owned = owned_labels(labels, tile)
    distance = float(getattr(measure, "cell_distance_px", 0) or 0)
    cells = None
    if distance > 0:
        from napari_slidescope.analysis.cells import owned_cells

        model = None
        if getattr(segmenter, "cells_from_model", False):  # the model's own cell outlines
            own: Any = segmenter
            model = np.asarray(own.postprocess_cells(raw, mpp=mpp))[:h, :w]
        cells = owned_cells(labels, owned, distance, model)
        table = measure(owned, rgb, tile, cells) if measure is not None else {}
    else:
        table = measure(owned, rgb, tile) if measure is not None else {}
    return (owned, table, cells) if with_cells else (owned, table)


def _global_ids(
    tile: Tile,
    owned: np.ndarray,
    table: dict[str, np.ndarray],
    offset: int,
    cells: np.ndarray | None = None,
) -> TileResult:
    """Shift a tile's local nucleus (and cell) ids by the count of the tiles before it."""
    count = int(owned.max()) if owned.size else 0
    labels = owned
    if offset and count:
        labels = np.where(owned > 0, owned + np.int32(offset), 0).astype(np.int32)
        if cells is not None:
            cells = np.where(cells > 0, cells + np.int32(offset), 0).astype(np.int32)
    if "id" in table:
        table = {**table, "id": np.asarray(table["id"]) + offset}
    return TileResult(
        tile=tile, labels=labels, count=count, offset=offset, table=table, cells=cells
    )


def cell_outlines(segmenter: Any, cell_expansion_um: float | None) -> tuple[Any, str | None]:
    """Which cells a run makes, and the segmenter that makes them.

    With ``cell_expansion_um`` and a segmenter whose model outlines cells itself
    (``makes_cells``: InstanSeg's ``fluorescence_nuclei_and_cells``), a copy of it with
    ``cells_from_model`` set: it reads every channel and returns its cells too, and each
    cell is the model's, kept within ``cell_expansion_um`` of its nucleus and out of its
    neighbours (:func:`~napari_slidescope.analysis.cells.model_cells`). Other segmenters'
    cells are the nuclei's expansion.

    Returns
    -------
    segmenter : object
        The segmenter to run (the one given, or that copy).
    outlines : {"model", "expansion"} or None
        What the cells are (``result.parameters["cell_outlines"]``); None without cells.
    """
    if not cell_expansion_um:
        return segmenter, None
    if getattr(segmenter, "makes_cells", False):
        import copy

        segmenter = copy.copy(segmenter)
        segmenter.cells_from_model = True
        return segmenter, "model"
    return segmenter, "expansion"
