"""The functions dask.distributed runs on workers: one per slide, one per tile (or a few).

A task carries a slide path or URL, its stamp, the parameters (with the storage options
of URLs) and tile indices, never pixels or an open file: a worker opens the slide
itself. Each worker process keeps a few slides open and a few prepared nuclei runs
(plan, tissue tiles, prepared segmenter) in small bounded caches, so a slide of thousands
of tiles is opened and prepared once per worker, not once per tile.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import struct
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from napari_slidescope._io import one_line
from napari_slidescope.batch.params import BatchParams

if TYPE_CHECKING:
    from napari_slidescope.pipeline.nuclei import PreparedNuclei
    from napari_slidescope.pipeline.runner import TileResult
    from napari_slidescope.pipeline.tiling import TilePlan
    from napari_slidescope.slide import Slide

__all__ = [
    "MAX_OPEN_SLIDES",
    "MAX_PREPARED",
    "WORKER_CACHE_BYTES",
    "ModelMismatchError",
    "SlideInfo",
    "TaskFailed",
    "TileOut",
    "ModelOut",
    "TissueGrid",
    "model_identity",
    "model_task",
    "nuclei_task",
    "post_task",
    "RegionsOut",
    "TilesOut",
    "regions_task",
    "tiles_task",
    "slide_task",
    "summary_of",
    "wkb_polygon",
    "wkb_polygons",
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
#: What a worker checks of a slide before reading it (``SlideStamp.key``).
Stamp = tuple[int | str, ...]

_slides: OrderedDict[tuple[str | int, ...], Slide] = OrderedDict()
_prepared: OrderedDict[tuple[str | int, ...], PreparedNuclei] = OrderedDict()  # + model
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


class ModelMismatchError(RuntimeError):
    """A worker would segment a slide's tiles with another model than its plan recorded."""


@dataclass(frozen=True)
class TaskFailed:
    """What a task returns, instead of raising, for an error that a retry would repeat.

    dask.distributed re-runs a task that raised (``retries``); an unreadable slide, a
    missing model or bad parameters fail the same way each time, so the task returns
    this and its slide fails at once, without a retry and without dask's log of it.

    Attributes
    ----------
    message : str
        One line: the exception's type and message.
    traceback : str
        The formatted traceback (kept in the slide's manifest).
    """

    message: str
    traceback: str


#: Errors a retry would repeat (see :class:`TaskFailed`): a slide that cannot be read
#: (``SlideError`` is a ValueError), bad parameters, a missing model or file.
_PERMANENT: tuple[type[BaseException], ...] = (
    ValueError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)

_F = TypeVar("_F", bound=Callable[..., Any])


def _no_retry(func: _F) -> _F:
    """Return :class:`TaskFailed` for the errors a retry would repeat; raise the others."""

    @wraps(func)
    def task(*args: Any, **kwargs: Any) -> Any:
        from napari_slidescope.segmenters import SegmenterUnavailableError

        for a in args:  # a failed slide task or model task: pass its failure on
            if isinstance(a, TaskFailed):
                return a
        permanent: tuple[type[BaseException], ...] = (*_PERMANENT, SegmenterUnavailableError)
        try:
            return func(*args, **kwargs)
        except permanent as exc:
            return TaskFailed(one_line(exc, typed=True), "".join(traceback.format_exception(exc)))

    return task  # type: ignore[return-value]


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
    #: What ran, every default resolved: tissue mode and resolution and, with nuclei,
    #: ``PreparedNuclei.parameters`` (segmenter, model, version, weights' SHA-256,
    #: working resolution, stain mode, nuclear channel).
    resolved: dict[str, Any] = field(default_factory=dict)
    #: What ``segmenter="auto"`` has to say (the built-in method ran), said once per run.
    note: str | None = None


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
    cell_wkb : list of bytes or None
        Each nucleus's cell outline (``cell_expansion_um``), else None.
    """

    index: int
    seconds: float
    table: dict[str, np.ndarray]
    wkb: list[bytes]
    cell_wkb: list[bytes] | None = None


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


def _open(path: str, stamp: Stamp, options: dict[str, Any] | None = None) -> Slide:
    """Return the open slide at ``path`` from this process's cache, checking it is unchanged.

    A local file is checked (size, modification time) at every call; a URL (the stamp's
    third item is the hash of what the store says about the object's version) when it
    is opened, with `options` as its fsspec storage options.
    """
    from napari_slidescope.slide import open_slide
    from napari_slidescope.slide.source import is_url, redact

    remote = is_url(path)
    if not remote:
        from napari_slidescope.batch.params import local_size_mtime

        if local_size_mtime(path) != tuple(stamp):
            raise RuntimeError(
                f"{path}: the file changed since the batch started (size or modification "
                "time); run it again"
            )
    key = (path, *stamp)
    with _lock:
        _bound_tile_cache()
        slide = _slides.get(key)
        if slide is not None:
            _slides.move_to_end(key)
            return slide
        if not remote:
            slide = open_slide(path)
            _keep(key, slide)
            return slide
    # a URL is opened outside the lock: its round trips must not hold other threads
    from napari_slidescope.batch.params import remote_identity

    slide = open_slide(path, storage_options=options)
    now = getattr(slide, "remote_stamp", None)
    if now is None:  # a backend that does not keep it: ask the store
        from napari_slidescope.slide.remote import stat_remote
        from napari_slidescope.slide.source import resolve

        now = stat_remote(resolve(path, options))
    if (int(now.get("size", -1)), 0, remote_identity(now)) != tuple(stamp):
        slide.close()
        raise RuntimeError(
            f"{redact(path)}: the object changed since the batch started (size, ETag, "
            "version or modification time); run it again"
        )
    with _lock:
        other = _slides.get(key)
        if other is not None:  # another thread opened it meanwhile
            slide.close()
            return other
        _keep(key, slide)
        return slide


def _keep(key: tuple[str | int, ...], slide: Slide) -> None:
    """Add an open slide to this process's cache (lock held)."""
    _slides[key] = slide
    while len(_slides) > MAX_OPEN_SLIDES:
        # dropped, not closed: a thread may still read it; the file closes with it
        _slides.popitem(last=False)


def _resolve(params: BatchParams, slide: Slide) -> tuple[BatchParams, str | None]:
    """`params` with ``"auto"`` resolved for the slide's stain, and what auto has to say.

    Resolved here, without a warning, once per slide: the tile tasks run the name the
    slide task chose, and the engine says the note once per run (not once per worker).
    """
    from napari_slidescope.segmenters import AUTO, auto_note, image_kind, resolve_auto

    if not params.nuclei or params.nuclei_options.segmenter != AUTO:
        return params, None
    kind = image_kind(slide)
    name = resolve_auto(kind.input, warn=False)
    return _with_segmenter(params, name), auto_note(kind.input)


def _with_segmenter(params: BatchParams, name: str) -> BatchParams:
    """`params` with the nuclei options' segmenter set to `name`."""
    return dataclasses.replace(params, nuclei_options=params.nuclei_options.replace(segmenter=name))


def _tile_params(params: BatchParams, info: SlideInfo) -> BatchParams:
    """Return the parameters the slide task ran with (``"auto"`` as it resolved there)."""
    name = info.resolved.get("segmenter")
    if params.nuclei and name and params.nuclei_options.segmenter != name:
        return _with_segmenter(params, str(name))
    return params


def _check_model(run: PreparedNuclei, info: SlideInfo) -> None:
    """Raise :class:`ModelMismatchError` when this worker's model is not the slide's."""
    from napari_slidescope.segmenters import IDENTITY_KEYS

    got = {k: run.parameters.get(k) for k in IDENTITY_KEYS}
    want = {k: info.resolved.get(k) for k in IDENTITY_KEYS}
    if got != want:
        raise ModelMismatchError(
            f"this worker's segmenter is {got}, the slide was planned with {want}: "
            "install the same model on every worker"
        )


def model_identity(segmenter: str, stain_mode: str) -> dict[str, Any]:
    """Return the identity of what `segmenter` resolves to for `stain_mode`, here.

    What the engine compares with a finished slide's record on ``resume``.
    """
    from napari_slidescope.segmenters import AUTO, resolve_auto, segmenter_identity

    name = resolve_auto(stain_mode, warn=False) if segmenter == AUTO else segmenter  # type: ignore[arg-type]
    return segmenter_identity(name)


def _prepare(path: str, stamp: Stamp, params: BatchParams, grid: TissueGrid) -> PreparedNuclei:
    """Return the prepared nuclei run of a slide, made once per worker process."""
    from napari_slidescope.pipeline.nuclei import prepare_nuclei
    from napari_slidescope.segmenters import AUTO, segmenter_identity

    # the model as installed now is part of the key: a worker that outlives a batch never
    # runs a model it loaded before the model changed
    name = params.nuclei_options.segmenter
    model = "" if name == AUTO else repr(segmenter_identity(name))
    key = (path, *stamp, params.digest() + model)
    with _lock:
        run = _prepared.get(key)
        if run is not None:
            _prepared.move_to_end(key)
            return run
    slide = _open(path, stamp, params.storage_options)
    with _lock:
        run = _prepared.get(key)
        if run is None:  # prepared under the lock: two threads never prepare one slide twice
            # "auto" is resolved per slide, for its stain, by prepare_nuclei
            run = prepare_nuclei(slide, tissue=grid, options=params.nuclei_options)
            _prepared[key] = run
            while len(_prepared) > MAX_PREPARED:
                _prepared.popitem(last=False)
        return run


@_no_retry
def slide_task(path: str, stamp: Stamp, params: BatchParams) -> SlideInfo:
    """Find a slide's tissue and, for nuclei, the tiles to segment (the per-slide task).

    Returns :class:`TaskFailed` instead of raising for errors a retry would repeat.
    """
    from napari_slidescope.pipeline.tissue import detect_tissue

    t0 = time.perf_counter()
    slide = _open(path, stamp, params.storage_options)
    tissue = detect_tissue(slide, region=(0, 0, *slide.shape0), options=params.tissue_options)
    params, note = _resolve(params, slide)
    info = SlideInfo(
        shape0=(int(slide.shape0[0]), int(slide.shape0[1])),
        mpp=None if slide.mpp is None else (float(slide.mpp[0]), float(slide.mpp[1])),
        format=str(getattr(slide, "format", "")),
        tissue_area_um2=tissue.area_um2,
        tissue_polygons=tissue.polygons,
        tissue_holes=tissue.holes,
        seconds=0.0,
        resolved={"tissue_mode": tissue.mode, "tissue_mpp": tissue.mpp},
        note=note,
    )
    if params.nuclei:
        info.grid = TissueGrid(tissue.mask, tissue.downsample, tissue.origin)
        run = _prepare(path, stamp, params, info.grid)
        _check_rules(params, run)
        plan = run.plan
        info.tiles = [t.index for t in run.tiles]
        info.plan = {
            "mpp": plan.mpp,
            "tile_size_px": plan.tile_size,
            "overlap_px": plan.overlap,
            "grid_shape": list(plan.grid_shape),
            "tiles_in_plan": len(plan.tiles),
            "tiles_with_tissue": len(run.tiles),
            "segmenter": str(getattr(run.segmenter, "name", params.nuclei_options.segmenter)),
        }
        info.resolved.update(run.parameters)
    elif params.regions or params.has("tiles"):  # those tasks are gated by this tissue
        info.grid = TissueGrid(tissue.mask, tissue.downsample, tissue.origin)
    info.seconds = time.perf_counter() - t0
    return info


@dataclass
class RegionsOut:
    """What the regions task returns: the slide's class map and the time it took.

    Attributes
    ----------
    regions : RegionMap
        The class map at the classifier's working resolution (one byte per working pixel:
        a 100 000 x 100 000 px slide at 0.25 µm/px is 12 500 x 12 500 at 2 µm/px, 156 MB).
    seconds : float
        Time spent (reading, features, prediction).
    """

    regions: Any
    seconds: float


@_no_retry
def regions_task(
    path: str, stamp: Stamp, params: BatchParams, info: SlideInfo | None = None
) -> RegionsOut:
    """Classify a slide's tissue into regions (the task table's ``"regions"`` step).

    Gated by the regions' own tissue
    (:func:`~napari_slidescope.pipeline.region_map.regions_tissue`, with the batch's tissue
    options and the regions options' ``envelope_um``), as the API and the dock gate: the
    slide task's mask (`info`, unused here) leaves out the fat open to the glass at a
    section's edge and the large holes that are fat or lumens, which are regions to
    classify. (Tissue detection reads the slide at 8 µm/px: a second one costs little
    beside the classification at 2 µm/px; measured in benchmarks/RESULTS.md.)
    The classifier file must still be the one the parameters hashed: a file changed since
    the batch started fails the slide rather than giving regions of another classifier.
    """
    from napari_slidescope.options import RegionsOptions
    from napari_slidescope.pipeline.region_map import regions_tissue
    from napari_slidescope.pipeline.task_table import task

    t0 = time.perf_counter()
    options = params.regions_options
    if options is None:
        raise ValueError("regions_task: the parameters name no region classifier")
    now = RegionsOptions.of_file(options.classifier)
    if now.classifier_sha256 != options.classifier_sha256:
        raise ValueError(
            f"{options.classifier}: the region classifier changed since the batch started "
            "(its SHA-256 differs); run it again"
        )
    slide = _open(path, stamp, params.storage_options)
    tissue = regions_tissue(slide, envelope_um=options.envelope_um, options=params.tissue_options)
    classify_regions = task("regions").function()
    regions = classify_regions(slide, options.classifier, tissue=tissue, workers=1)
    return RegionsOut(regions, time.perf_counter() - t0)


@dataclass
class TilesOut:
    """What the tiles task returns: the slide's tile table, its embeddings, their cost.

    Attributes
    ----------
    tiles : TileTable
        The tissue tiles (level-0 boxes, level read, µm/px delivered, tissue fraction).
    embeddings : AnnData or None
        Tiles x features of :func:`~napari_slidescope.tiles.embed_tiles` (None without a
        model).
    record : dict
        What the manifest keeps: tile count, features, seconds, tiles per second, the
        model's wait on reading, the tissue the tiles were gated by.
    """

    tiles: Any
    embeddings: Any
    record: dict[str, Any]


@_no_retry
def tiles_task(
    path: str, stamp: Stamp, params: BatchParams, info: SlideInfo | None = None
) -> TilesOut:
    """Cut a slide into tissue tiles and embed them (the task table's ``"tiles"`` step).

    Gated by the slide task's tissue (`info`'s grid: the tissue found once serves the
    nuclei, the regions and the tiles); without `info` (a slide whose other outputs are
    kept and only its tiles redone) the tissue is found here with the same options. The
    model file must still be the one the parameters hashed: a file changed since the batch
    started fails the slide rather than giving embeddings of another model.
    """
    from napari_slidescope.tiles.embed import embed_tiles, load_model
    from napari_slidescope.tiles.tiling import tile_slide

    t0 = time.perf_counter()
    options = params.tiles_options
    if options is None:
        raise ValueError("tiles_task: the parameters hold no tiles options")
    if options.model_changed():
        raise ValueError(
            f"{options.model}: the model file changed since the batch started "
            "(its SHA-256 differs, or it is gone); run it again"
        )
    slide = _open(path, stamp, params.storage_options)
    grid = None if info is None else info.grid
    gate = "slide task"
    if grid is None:
        from napari_slidescope.pipeline.tissue import detect_tissue

        tissue = detect_tissue(slide, region=(0, 0, *slide.shape0), options=params.tissue_options)
        grid = TissueGrid(tissue.mask, tissue.downsample, tissue.origin)
        gate = "tiles task"
    tiles = tile_slide(
        slide,
        tile_um=options.tile_um,
        mpp=options.mpp,
        overlap_um=options.overlap_um,
        tissue=grid,
        min_tissue_fraction=options.min_tissue,
    )
    record: dict[str, Any] = {"tiles": len(tiles), "tile_px": int(tiles.tile_px), "tissue": gate}
    adata = None
    if options.model:
        try:
            runner = load_model(options.model)
        except (OSError, RuntimeError) as exc:  # the runtime's own errors name no file
            raise ValueError(f"{options.model}: cannot load the model ({one_line(exc)})") from exc
        adata = embed_tiles(slide, tiles, runner, batch_size=options.embed_batch, read_threads=2)
        runtime = dict(adata.uns["slidescope_tiles"]["runtime"])
        record.update(
            features=int(adata.n_vars),
            tiles_per_s=runtime.get("tiles_per_s"),
            model_wait_s=runtime.get("model_wait_s"),
            device=runtime.get("device"),
        )
    seconds = time.perf_counter() - t0
    record["seconds"] = seconds
    if not options.model:
        record["tiles_per_s"] = len(tiles) / seconds if seconds > 0 else None
    return TilesOut(tiles, adata, record)


def _check_rules(params: BatchParams, run: PreparedNuclei) -> None:
    """Refuse rules that name a marker (or compartment) this slide's table will not have.

    Runs in the slide task, before any tile is segmented.
    """
    if params.classify is None:
        return
    import json

    descriptor = json.loads(params.classify)
    if descriptor.get("kind") != "rules":
        return
    from napari_slidescope.pipeline.cell_classes import PhenotypeRules, check_rules

    rules = PhenotypeRules.from_dict(descriptor["rules"], where="--classify rules")
    columns = run.columns()
    if columns:
        check_rules(rules, {c: np.zeros(0) for c in columns})


def summary_of(info: SlideInfo | TaskFailed) -> SlideInfo | TaskFailed:
    """``info`` without the tissue mask: what the client needs."""
    if isinstance(info, TaskFailed):
        return info
    return SlideInfo(**{**info.__dict__, "grid": None})


@_no_retry
def nuclei_task(
    path: str,
    stamp: Stamp,
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
    run = _prepare(path, stamp, _tile_params(params, info), info.grid)
    _check_model(run, info)
    out = []
    t0 = time.perf_counter()
    threads = max(1, int(threads))
    for res in run.segment(indices, workers=threads, read_threads=threads):
        out.append(_tile_out(run.plan, res, t0))
        t0 = time.perf_counter()
    return out


@_no_retry
def model_task(
    path: str, stamp: Stamp, params: BatchParams, info: SlideInfo, index: int
) -> ModelOut:
    """Read one tile and run the model on it (the task a ``GPU`` worker runs).

    Post-processing is left to :func:`post_task` on a CPU worker, so the model's
    device never waits for it and its memory is free again as soon as ``predict``
    returns.
    """
    if info.grid is None:
        raise ValueError("model_task: the slide task found no tissue grid")
    t0 = time.perf_counter()
    run = _prepare(path, stamp, _tile_params(params, info), info.grid)
    _check_model(run, info)
    raw = _compact(run.predict(index))
    return ModelOut(int(index), time.perf_counter() - t0, raw)


@_no_retry
def post_task(
    path: str, stamp: Stamp, params: BatchParams, info: SlideInfo, model: ModelOut
) -> list[TileOut]:
    """Post-process a model task's output: the tile's owned nuclei as a compact table.

    Gives exactly what :func:`nuclei_task` gives for the tile; its ``seconds`` add the
    model task's.
    """
    if info.grid is None:
        raise ValueError("post_task: the slide task found no tissue grid")
    t0 = time.perf_counter() - model.seconds
    run = _prepare(path, stamp, _tile_params(params, info), info.grid)
    _check_model(run, info)
    return [_tile_out(run.plan, run.postprocess(model.index, model.raw), t0)]


def _tile_out(plan: TilePlan, res: TileResult, t0: float) -> TileOut:
    """Return a tile's result as a :class:`TileOut` (outlines in level-0 pixels, as WKB)."""
    dy, dx = plan.downsample
    y0, x0 = res.tile.box[:2]
    origin = (plan.origin[0] + y0 * dy, plan.origin[1] + x0 * dx)
    table = {k: np.asarray(v) for k, v in res.table.items()}
    wkb = _outlines_wkb(res.labels, table["id"], plan.downsample, origin)
    cell_wkb = None
    if res.cells is not None:
        cell_wkb = _outlines_wkb(res.cells, table["id"], plan.downsample, origin)
    return TileOut(res.tile.index, time.perf_counter() - t0, table, wkb, cell_wkb)


def _outlines_wkb(
    labels: np.ndarray,
    ids: np.ndarray,
    downsample: tuple[float, float],
    origin: tuple[float, float],
) -> list[bytes]:
    """Return the outline of each of ``ids`` in ``labels`` as WKB, in that order."""
    from napari_slidescope.analysis.geometry import labels_to_rings

    coords, offsets, found = labels_to_rings(labels, downsample=downsample, origin=origin)
    ids = np.asarray(ids, np.int64)
    if not np.array_equal(found, ids):  # the table's order, each id outlined once
        at = np.searchsorted(found, ids)
        if ids.size and (int(np.max(at)) >= found.size or not np.array_equal(found[at], ids)):
            raise ValueError("outlines: a nucleus of the table has no pixels in the labels")
        starts, ends = offsets[at], offsets[at + 1]
        take = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)])
        coords = coords[take] if take.size else coords[:0]
        offsets = np.concatenate([[0], np.cumsum(ends - starts)])
    return wkb_polygons(coords, offsets)


def wkb_polygons(coords: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    """Encode many one-ring polygons as :func:`wkb_polygon` does, all at once.

    Parameters
    ----------
    coords : (V, 2) ndarray of float
        Level-0 ``(row, col)`` vertices of all rings, ring after ring, open (as
        :func:`~napari_slidescope.analysis.geometry.labels_to_rings` gives them).
    offsets : (K + 1,) ndarray of int
        Ring ``k`` is ``coords[offsets[k]:offsets[k + 1]]``.

    Returns
    -------
    list of bytes
        ``K`` little-endian WKB polygons in ``(x, y)``, each ring closed.
    """
    offsets = np.asarray(offsets, np.int64)
    sizes = np.diff(offsets)
    k = sizes.size
    if k == 0:
        return []
    coords = np.asarray(coords, np.float64)
    # close each ring (its first vertex again after its last), then (row, col) -> (x, y)
    closed = np.insert(coords, offsets[1:], coords[offsets[:-1]], axis=0)[:, ::-1]
    points = sizes + 1
    lengths = 13 + 16 * points
    ends = np.cumsum(lengths)
    starts = ends - lengths
    header = np.zeros(k, np.dtype([("o", "u1"), ("t", "<u4"), ("r", "<u4"), ("n", "<u4")]))
    header["o"], header["t"], header["r"], header["n"] = 1, 3, 1, points
    buf = np.empty(int(ends[-1]), np.uint8)
    buf[starts[:, None] + np.arange(13)] = header.view(np.uint8).reshape(k, 13)
    first_point = np.repeat(np.cumsum(points) - points, points)
    at = np.repeat(starts + 13, points) + 16 * (np.arange(closed.shape[0]) - first_point)
    xy = np.ascontiguousarray(closed, dtype="<f8").view(np.uint8).reshape(-1, 16)
    buf[at[:, None] + np.arange(16)] = xy
    data = buf.tobytes()
    return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


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
