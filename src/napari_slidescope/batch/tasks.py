"""The functions dask.distributed runs on workers: one per slide, one per tile (or a few).

A task carries a slide path, its stamp, the parameters and tile indices, never pixels
or an open file. Each worker process keeps a few slides open and a few prepared nuclei
runs (plan, tissue tiles, prepared segmenter) in small bounded caches, so a slide of
thousands of tiles is opened and prepared once per worker, not once per tile.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_slidescope.batch.params import BatchParams

__all__ = [
    "MAX_OPEN_SLIDES",
    "MAX_PREPARED",
    "WORKER_CACHE_BYTES",
    "SlideInfo",
    "TileOut",
    "ModelOut",
    "TissueGrid",
    "model_task",
    "nuclei_task",
    "post_task",
    "slide_task",
    "summary_of",
    "wkb_polygon",
]

#: Slides a worker process keeps open (least recently used closed first).
MAX_OPEN_SLIDES = 4
#: Prepared nuclei runs (plan + prepared segmenter) a worker process keeps.
MAX_PREPARED = 4
#: Bound of the decoded-tile cache in a worker process: 64 MiB, not the viewer's 256 MiB.
#: A batch reads each tile once (its halo's neighbours soon after), so a larger cache only
#: holds tiles that are never read again: with 256 MiB a worker's memory grew tile after
#: tile over a whole slide (``benchmarks/batch_scaling.py --xl``), with 64 MiB it levels
#: off at the same speed. ``$SLIDESCOPE_CACHE_BYTES`` on the workers overrides it.
WORKER_CACHE_BYTES = 64 * 2**20

_lock = threading.Lock()
_slides: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
_prepared: OrderedDict[tuple[str, int, int, str], Any] = OrderedDict()
_cache_bounded = False


def _bound_tile_cache() -> None:
    """Lower this worker process's decoded-tile cache to :data:`WORKER_CACHE_BYTES`, once.

    Only in a process that another one started (a dask Nanny's worker), and only when
    ``$SLIDESCOPE_CACHE_BYTES`` is unset: a worker thread inside the user's own process
    (``Client(processes=False)``, a viewer's console) leaves that process's cache alone.
    """
    global _cache_bounded
    if _cache_bounded:
        return
    _cache_bounded = True
    from napari_slidescope.slide.cache import CACHE_BYTES_ENV, tile_cache

    if CACHE_BYTES_ENV in os.environ or multiprocessing.parent_process() is None:
        return
    cache = tile_cache()
    if cache.maxbytes > WORKER_CACHE_BYTES:
        cache.resize(WORKER_CACHE_BYTES)


@dataclass(frozen=True)
class TissueGrid:
    """The tissue mask and its grid: all a tile needs of tissue detection (picklable)."""

    mask: np.ndarray
    downsample: tuple[float, float]
    origin: tuple[float, float]


@dataclass
class SlideInfo:
    """What the per-slide task found: the slide, its tissue, the tiles to segment.

    ``grid`` (the tissue mask) goes to tile tasks only; :func:`summary_of` drops it
    before anything reaches the client.
    """

    shape0: tuple[int, int]
    mpp: tuple[float, float] | None
    format: str
    tissue_area_um2: float | None
    tissue_polygons: list[np.ndarray]
    tissue_holes: list[list[np.ndarray]]
    seconds: float
    tiles: list[int] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    grid: TissueGrid | None = None


@dataclass
class TileOut:
    """What a nuclei task returns for one tile: kilobytes, never a label image.

    Attributes
    ----------
    index : int
        The tile's plan index.
    seconds : float
        Time spent on the tile (read, model, post-process, outlines).
    table : dict of str to ndarray
        Measurement columns; ``id`` is local to the tile (``1 .. n``).
    wkb : list of bytes
        Each nucleus's outline, a WKB polygon in level-0 pixel ``(x, y)``.
    """

    index: int
    seconds: float
    table: dict[str, np.ndarray]
    wkb: list[bytes]


@dataclass
class ModelOut:
    """What a model task returns for one tile: the model's raw output, for a post task.

    Attributes
    ----------
    index : int
        The tile's plan index.
    seconds : float
        Time spent reading the tile and running the model.
    raw : ndarray
        The segmenter's ``predict`` output for the tile, in the smallest dtype that holds
        it exactly (integers narrowed to their range; floats kept).
    """

    index: int
    seconds: float
    raw: np.ndarray


def _compact(raw: np.ndarray) -> np.ndarray:
    """``raw`` in the smallest dtype that holds it exactly (integer maps only)."""
    raw = np.asarray(raw)
    if raw.dtype.kind in "iu" and raw.size:
        dtype = np.result_type(np.min_scalar_type(raw.min()), np.min_scalar_type(raw.max()))
        if dtype.itemsize < raw.dtype.itemsize:
            return raw.astype(dtype)
    return np.ascontiguousarray(raw)


def _open(path: str, stamp: tuple[int, int]) -> Any:
    """Return the open slide at ``path`` from this process's cache, checking it is unchanged."""
    from napari_slidescope.slide import open_slide

    st = os.stat(path)
    if (int(st.st_size), int(st.st_mtime_ns)) != tuple(stamp):
        raise RuntimeError(
            f"{path}: the file changed since the batch started (size or modification time); "
            "run it again"
        )
    key = (path, int(stamp[0]), int(stamp[1]))
    with _lock:
        _bound_tile_cache()
        slide = _slides.get(key)
        if slide is not None:
            _slides.move_to_end(key)
            return slide
        slide = open_slide(path)
        _slides[key] = slide
        while len(_slides) > MAX_OPEN_SLIDES:
            # dropped, not closed: a thread may still read it; the file closes with it
            _slides.popitem(last=False)
        return slide


def _make_segmenter(params: BatchParams) -> Any:
    from napari_slidescope.segmenters import AUTO, get_segmenter

    if params.segmenter == AUTO:  # resolved per slide, for its stain, by prepare_nuclei
        return AUTO
    return get_segmenter(params.segmenter)


def _prepare(path: str, stamp: tuple[int, int], params: BatchParams, grid: TissueGrid) -> Any:
    """Return the prepared nuclei run of a slide, made once per worker process."""
    from napari_slidescope.pipeline.nuclei import prepare_nuclei

    key = (path, int(stamp[0]), int(stamp[1]), params.digest())
    with _lock:
        run = _prepared.get(key)
        if run is not None:
            _prepared.move_to_end(key)
            return run
    slide = _open(path, stamp)
    with _lock:
        run = _prepared.get(key)
        if run is None:  # prepared under the lock: two threads never prepare one slide twice
            run = prepare_nuclei(
                slide,
                target_mpp=params.nuclei_mpp,
                tissue=grid,
                segmenter=_make_segmenter(params),
                tile_size_um=params.tile_size_um,
                cell_expansion_um=params.cell_expansion_um,
            )
            _prepared[key] = run
            while len(_prepared) > MAX_PREPARED:
                _prepared.popitem(last=False)
        return run


def slide_task(path: str, stamp: tuple[int, int], params: BatchParams) -> SlideInfo:
    """Find a slide's tissue and, for nuclei, the tiles to segment (the per-slide task)."""
    from napari_slidescope.pipeline.tissue import detect_tissue

    t0 = time.perf_counter()
    slide = _open(path, stamp)
    tissue = detect_tissue(slide, region=(0, 0, *slide.shape0))
    info = SlideInfo(
        shape0=tuple(slide.shape0),
        mpp=None if slide.mpp is None else (float(slide.mpp[0]), float(slide.mpp[1])),
        format=str(getattr(slide, "format", "")),
        tissue_area_um2=tissue.area_um2,
        tissue_polygons=tissue.polygons,
        tissue_holes=tissue.holes,
        seconds=0.0,
    )
    if params.nuclei:
        info.grid = TissueGrid(tissue.mask, tissue.downsample, tissue.origin)
        run = _prepare(path, stamp, params, info.grid)
        plan = run.plan
        info.tiles = [t.index for t in run.tiles]
        info.plan = {
            "mpp": plan.mpp,
            "tile_size_px": plan.tile_size,
            "overlap_px": plan.overlap,
            "grid_shape": list(plan.grid_shape),
            "tiles_in_plan": len(plan.tiles),
            "tiles_with_tissue": len(run.tiles),
            "segmenter": str(getattr(run.segmenter, "name", params.segmenter)),
        }
    info.seconds = time.perf_counter() - t0
    return info


def summary_of(info: SlideInfo) -> SlideInfo:
    """``info`` without the tissue mask: what the client needs."""
    return SlideInfo(**{**info.__dict__, "grid": None})


def nuclei_task(
    path: str,
    stamp: tuple[int, int],
    params: BatchParams,
    info: SlideInfo,
    indices: list[int],
    threads: int = 1,
) -> list[TileOut]:
    """Segment some tiles of a slide; return each tile's owned nuclei as a compact table.

    The tiles go through one staged run (read -> model -> post-process) with ``threads``
    reading and ``threads`` post-processing threads (1 where dask runs one task per
    core). A model on a GPU runs instead as :func:`model_task` then :func:`post_task`.
    """
    if info.grid is None:
        raise ValueError("nuclei_task: the slide task found no tissue grid")
    run = _prepare(path, stamp, params, info.grid)
    out = []
    t0 = time.perf_counter()
    threads = max(1, int(threads))
    for res in run.segment(indices, workers=threads, read_threads=threads):
        out.append(_tile_out(run.plan, res, t0))
        t0 = time.perf_counter()
    return out


def model_task(
    path: str, stamp: tuple[int, int], params: BatchParams, info: SlideInfo, index: int
) -> ModelOut:
    """Read one tile and run the model on it (the task a ``GPU`` worker runs).

    Post-processing is left to :func:`post_task` on a CPU worker, so the model's
    device never waits for it and its memory is free again as soon as ``predict``
    returns.
    """
    if info.grid is None:
        raise ValueError("model_task: the slide task found no tissue grid")
    t0 = time.perf_counter()
    run = _prepare(path, stamp, params, info.grid)
    raw = _compact(run.predict(index))
    return ModelOut(int(index), time.perf_counter() - t0, raw)


def post_task(
    path: str, stamp: tuple[int, int], params: BatchParams, info: SlideInfo, model: ModelOut
) -> list[TileOut]:
    """Post-process a model task's output: the tile's owned nuclei as a compact table.

    Gives exactly what :func:`nuclei_task` gives for the tile; its ``seconds`` add the
    model task's.
    """
    if info.grid is None:
        raise ValueError("post_task: the slide task found no tissue grid")
    t0 = time.perf_counter() - model.seconds
    run = _prepare(path, stamp, params, info.grid)
    return [_tile_out(run.plan, run.postprocess(model.index, model.raw), t0)]


def _tile_out(plan: Any, res: Any, t0: float) -> TileOut:
    """Return a tile's result as a :class:`TileOut` (outlines in level-0 pixels, as WKB)."""
    from napari_slidescope.analysis.geometry import labels_to_polygons

    dy, dx = plan.downsample
    y0, x0 = res.tile.box[:2]
    polys, ids = labels_to_polygons(
        res.labels,
        downsample=plan.downsample,
        origin=(plan.origin[0] + y0 * dy, plan.origin[1] + x0 * dx),
    )
    by_id = dict(zip(ids.tolist(), polys, strict=True))
    table = {k: np.asarray(v) for k, v in res.table.items()}
    wkb = [wkb_polygon(by_id[int(i)]) for i in table["id"]]
    return TileOut(res.tile.index, time.perf_counter() - t0, table, wkb)


def wkb_polygon(ring: np.ndarray) -> bytes:
    """Encode a polygon of one level-0 ``(row, col)`` ring as little-endian WKB in ``(x, y)``.

    The ring is closed (first point repeated) as WKB requires.
    """
    xy = np.asarray(ring, dtype="<f8")[:, ::-1]
    if len(xy) and not np.array_equal(xy[0], xy[-1]):
        xy = np.vstack([xy, xy[:1]])
    return struct.pack("<BIII", 1, 3, 1, len(xy)) + np.ascontiguousarray(xy).tobytes()


def wkb_ring(data: bytes) -> np.ndarray:
    """Decode the exterior ring ``(x, y)`` of a WKB polygon made by :func:`wkb_polygon`."""
    order, kind, rings, n = struct.unpack_from("<BIII", data)
    if order != 1 or kind != 3 or rings < 1:
        raise ValueError("wkb_ring: expected a little-endian WKB polygon")
    return np.frombuffer(data, dtype="<f8", count=2 * n, offset=13).reshape(n, 2)
