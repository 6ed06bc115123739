"""The batch engine: many slides, or one huge one, on a dask.distributed cluster.

dask.distributed schedules, retries and replaces dead workers; this module only
decides what to submit and writes what comes back. Per slide, one task finds the
tissue and plans the tiles (:func:`~napari_slidescope.batch.tasks.slide_task`); then
one task per tile with tissue segments it
(:func:`~napari_slidescope.batch.tasks.nuclei_task`). Results are written as they
arrive (a part per tile), so an interrupted run loses only the tiles in flight and
``resume=True`` picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from napari_slidescope.batch import outputs
from napari_slidescope.batch.params import (
    TASKS,
    BatchParams,
    SlideStamp,
    check_writable,
    find_slides,
    output_names,
    shown_path,
    stamp_slide,
)
from napari_slidescope.batch.tasks import (
    SlideInfo,
    TaskFailed,
    TileOut,
    model_identity,
    model_task,
    nuclei_task,
    post_task,
    slide_task,
    summary_of,
)
from napari_slidescope.options import NucleiOptions, TissueOptions
from napari_slidescope.slide.source import redact, scrub

__all__ = ["WORKER_UNSET_ENV", "BatchProgress", "analyze_slides", "local_cluster"]

log = logging.getLogger(__name__)

#: Seconds between two writes of a running slide's manifest (parts are written at once).
MANIFEST_EVERY_S = 5.0

#: Variables dask's Nanny sets for its workers that the engine's local cluster leaves
#: unset. ``MALLOC_TRIM_THRESHOLD_=65536`` (dask's ``distributed.nanny.pre-spawn-environ``)
#: switches off glibc's dynamic mmap threshold: every temporary array above 128 KiB is
#: then mmap'd and unmapped again and its pages fault in anew, a quarter more CPU time on
#: the tile tasks. With glibc's defaults the tile tasks' arrays are reused from the heap
#: tile after tile and the worker's memory stays flat over a run
#: (``benchmarks/batch_malloc.py``).
WORKER_UNSET_ENV = ("MALLOC_TRIM_THRESHOLD_",)


@dataclass
class BatchProgress:
    """Where a batch stands, handed to the ``progress`` callback after each event.

    Attributes
    ----------
    slides_total, slides_done, slides_failed : int
        Slides in the batch, finished (ok or failed), failed.
    tiles_total, tiles_done : int
        Tiles with tissue found so far (grows as slides are planned) and tiles finished
        (including those a resumed run found finished).
    finished : dict or None
        The summary row of the slide that has just finished, else None.
    kept : bool
        True when that slide was not run but kept from an earlier run (``resume``).
    """

    slides_total: int
    slides_done: int = 0
    slides_failed: int = 0
    tiles_total: int = 0
    tiles_done: int = 0
    finished: dict[str, Any] | None = None
    kept: bool = False


@dataclass
class _Slide:
    index: int
    path: Path | str  # a str is a URL (it may carry credentials: show `shown` instead)
    name: str
    folder: Path
    stamp: SlideStamp | None = None
    status: str = "pending"
    error: str | None = None
    info: SlideInfo | None = None
    prep: Any = None  # the slide task's future (its tissue mask feeds the tile tasks)
    tiles: list[int] = field(default_factory=list)
    todo: deque[list[int]] = field(default_factory=deque)
    done: dict[int, float] = field(default_factory=dict)
    futures: set[Any] = field(default_factory=set)
    manifest: dict[str, Any] = field(default_factory=dict)
    written_at: float = 0.0
    row: dict[str, Any] = field(default_factory=dict)
    #: Parts of an interrupted earlier run with the same request may be kept (by digest).
    keep_parts: bool = False
    #: What ran on this slide (``SlideInfo.resolved``) and its digest (``run_digest``).
    resolved: dict[str, Any] = field(default_factory=dict)
    digest: str = ""

    @property
    def shown(self) -> str:
        """The absolute path, or the URL without credentials."""
        return shown_path(self.path)


def analyze_slides(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tasks: Sequence[str] = TASKS,
    tissue_options: TissueOptions | None = None,
    nuclei_options: NucleiOptions | None = None,
    segmenter: str | None = None,
    nuclei_mpp: float | None = None,
    tile_size_um: float | None = None,
    cell_expansion_um: float | None = None,
    classify: str | os.PathLike[str] | None = None,
    anndata: bool = False,
    client: Any = None,
    workers: int | None = None,
    resume: bool = False,
    retries: int = 1,
    tiles_per_task: int | None = None,
    gpu: bool = False,
    progress: Callable[[BatchProgress], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Analyse slides on a dask.distributed cluster; write one folder of results per slide.

    Parameters
    ----------
    paths : path or iterable of paths
        Slide files and folders (searched recursively for the slide formats), slide
        URLs (``https://``, ``s3://``... any fsspec URL) and URL prefixes ending in ``/``
        (listed recursively). Workers open the URLs themselves: no shared disk needed.
    out : str or PathLike
        Output folder: ``OUT/<slide file name>/`` per slide and ``OUT/summary.csv``.
    tasks : sequence of {"tissue", "nuclei"}
        What to compute; nuclei are segmented only in tiles with tissue.
    tissue_options : TissueOptions, optional
        Options of each slide's tissue detection (default: ``TissueOptions()``).
    nuclei_options : NucleiOptions, optional
        Options of the nuclei segmentation (default: ``NucleiOptions()``): segmenter
        (``"auto"``: per slide, the learned model for its stain when installed, else
        the built-in method), working resolution, tile size, stain, nuclear channel,
        cell expansion, segmenter options, as :func:`~napari_slidescope.segment_nuclei`.
    segmenter, tile_size_um, cell_expansion_um : optional
        The :class:`~napari_slidescope.options.NucleiOptions` fields of these names;
        when given (not None) they replace those of `nuclei_options`.
    nuclei_mpp : float, optional
        ``NucleiOptions.target_mpp``, the working resolution of the segmentation in
        µm/px; when given, it replaces that of `nuclei_options`.
    classify : str or PathLike, optional
        A phenotype rules JSON file (``"kind": "slidescope-phenotype-rules"``) or a
        learned classifier's file: once a slide's tiles are all in, its cells are
        classified (thresholds see the whole slide), ``nuclei.parquet`` gains ``class``
        and the positivity columns, the GeoJSON features their class and colour, and
        ``summary.csv`` the counts per class and the IHC figures. The rules' content is
        hashed into the parameters.
    anndata : bool
        Also write ``cells.h5ad`` per slide (cells x markers, as ``result.to_anndata()``;
        needs the ``scverse`` extra).
    client : distributed.Client, optional
        Run on this client's cluster; default a local cluster of ``workers`` processes,
        closed at the end.
    workers : int, optional
        Worker processes of the local cluster; default one per core.
    resume : bool
        Keep what an earlier run into ``out`` finished with the same slide file (size,
        modification time, hash of its first MiB), the same parameters and the same
        model: what ``segmenter`` (``"auto"`` included) resolves to on the cluster now
        (name, model, version, weights' SHA-256) must be what the earlier run recorded,
        so a slide finished before a model was installed or changed is redone, never
        kept beside slides of the new model. Redo the rest. Without it every slide is
        redone.
    retries : int
        Times dask re-runs a task that raised before its slide counts as failed (a task
        on a worker that died is re-run by dask whatever this says).
    tiles_per_task : int, optional
        Tiles per nuclei task (more tiles per task: fewer tasks for the scheduler, and
        one staged run per task overlaps reading, model and post-processing of its
        tiles); default 1. Not used with ``gpu``.
    gpu : bool
        Split each tile into a model task (read + ``predict``) that runs only on workers
        with a ``GPU`` resource, one at a time per GPU, and a post-processing task
        (``postprocess``, ownership, measurements, outlines) that runs on workers without
        one while there are any; at most a few model outputs per worker thread wait for
        post-processing. A local cluster then gives each worker ``{"GPU": 1}``.
    progress : callable, optional
        ``progress(BatchProgress)`` after each finished task and slide.
    storage_options : dict, optional
        fsspec storage options for the URLs (credentials, endpoint); sent to the workers
        with the tasks, never written to a manifest, a summary or a log. Resume
        recognises an object by its size and what its store says of its version (ETag,
        version id, last-modified).

    Warns
    -----
    SegmenterInfoWarning
        Once per run (not once per worker) when ``"auto"`` ran a built-in method because
        the learned model is not installed.

    Returns
    -------
    list of dict
        One row per slide, in input order, with the columns of ``summary.csv``
        (:data:`~napari_slidescope.batch.outputs.SUMMARY_COLUMNS`); ``status`` is
        ``"done"`` or ``"failed"`` (then ``error`` says why).

    Raises
    ------
    ValueError
        Bad parameters, no slides found, or two slides with the same file name.
    FileNotFoundError
        If an input path does not exist.
    OSError
        If ``out`` cannot be created or written.

    Examples
    --------
    >>> rows = analyze_slides("cohort/", "results/", workers=8)  # doctest: +SKIP
    >>> [r["nuclei"] for r in rows if r["status"] == "done"]  # doctest: +SKIP
    """
    nuclei_options = _nuclei_options(
        nuclei_options,
        segmenter=segmenter,
        target_mpp=nuclei_mpp,
        tile_size_um=tile_size_um,
        cell_expansion_um=cell_expansion_um,
    )
    descriptor = None
    if classify is not None:
        from napari_slidescope.pipeline.classify import load_classification

        descriptor = json.dumps(load_classification(classify)[1], sort_keys=True)
    params = BatchParams(
        tuple(tasks),
        TissueOptions() if tissue_options is None else tissue_options,
        nuclei_options,
        descriptor,
        bool(anndata),
        storage_options=storage_options,
    )
    if anndata:
        try:
            import anndata as _anndata  # noqa: F401
        except ImportError as e:
            raise ValueError(
                'anndata=True needs anndata: pip install "napari-slidescope[scverse]"'
            ) from e
    if params.nuclei:
        from napari_slidescope.segmenters import missing_reason

        name = nuclei_options.segmenter
        reason = missing_reason(name)  # KeyError for unknown names
        if reason is not None:
            raise ValueError(f"segmenter {name!r} is not available: {reason}")
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    slides = find_slides(paths, storage_options)
    if not slides:
        raise ValueError(f"no slides found in {[redact(str(p)) for p in paths]}")
    names = output_names(slides)
    out = Path(out)
    check_writable(out)
    if tiles_per_task is None or gpu:
        tiles_per_task = 1
    if int(tiles_per_task) < 1:
        raise ValueError(f"tiles_per_task: expected >= 1, got {tiles_per_task!r}")
    cluster = None
    if client is None:
        from distributed import Client

        cluster = local_cluster(
            workers or os.cpu_count() or 1, resources={"GPU": 1} if gpu else None
        )
        client = Client(cluster)
    try:
        batch = _Batch(
            client,
            params,
            out,
            [_Slide(i, p, n, out / n) for i, (p, n) in enumerate(zip(slides, names, strict=True))],
            resume=resume,
            retries=int(retries),
            tiles_per_task=int(tiles_per_task),
            gpu=gpu,
            progress=progress,
        )
        return batch.run()
    finally:
        if cluster is not None:
            client.close()
            cluster.close()


def _nuclei_options(options: NucleiOptions | None, **fields: Any) -> NucleiOptions:
    """`options` (default ``NucleiOptions()``) with the fields given (not None) replaced."""
    options = NucleiOptions() if options is None else options
    if not isinstance(options, NucleiOptions):
        raise ValueError(f"nuclei_options: expected a NucleiOptions, got {options!r}")
    changes = {k: v for k, v in fields.items() if v is not None}
    return options.replace(**changes) if changes else options


def local_cluster(n_workers: int, *, dashboard: bool = False, **kwargs: Any) -> Any:
    """Start a ``LocalCluster`` of single-thread worker processes for the batch engine.

    Its workers start without :data:`WORKER_UNSET_ENV` (dask sets
    ``MALLOC_TRIM_THRESHOLD_=65536``), so glibc's malloc keeps its heap. Its scheduler's
    HTTP server listens on a free port of 127.0.0.1 (dask's default, 8787, may be taken
    by another cluster: dask would then warn "Port 8787 is already in use").

    Parameters
    ----------
    n_workers : int
        Worker processes.
    dashboard : bool
        Serve dask's dashboard (on that free port: ``client.dashboard_link``).
    **kwargs
        Passed to ``distributed.LocalCluster`` (e.g. ``resources``).

    Returns
    -------
    distributed.LocalCluster
        Close it when done.
    """
    import dask
    from distributed import LocalCluster

    kwargs = {
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": "127.0.0.1:0",
        **kwargs,
    }
    if not dashboard:
        kwargs["scheduler_kwargs"] = {"dashboard": False, **kwargs.get("scheduler_kwargs", {})}
    # a worker process inherits this process's environment plus the nanny's pre-spawn
    # variables (config; a variable already in os.environ wins): an earlier dask cluster
    # in this process leaves them in os.environ, so they are out of it while ours spawn
    saved = {k: os.environ.pop(k, None) for k in WORKER_UNSET_ENV}
    try:
        with dask.config.set(
            {f"distributed.nanny.pre-spawn-environ.{k}": None for k in WORKER_UNSET_ENV}
        ):
            return LocalCluster(n_workers=int(n_workers), **kwargs)
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


def _cpu_workers(client: Any) -> list[str]:
    """Addresses of the workers without a ``GPU`` resource (where post tasks go)."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return sorted(a for a, w in workers.items() if not (w.get("resources") or {}).get("GPU"))


def _message(exc: BaseException) -> str:
    """One line: the exception's type, message and notes."""
    text = " ".join([f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", [])]).replace(
        "\n", " "
    )
    return text.strip()


class _Batch:
    def __init__(
        self,
        client: Any,
        params: BatchParams,
        out: Path,
        slides: list[_Slide],
        *,
        resume: bool,
        retries: int,
        tiles_per_task: int,
        gpu: bool,
        progress: Callable[[BatchProgress], None] | None,
    ) -> None:
        self.client, self.params, self.out, self.slides = client, params, out, slides
        self.resume, self.retries, self.per_task, self.gpu = resume, retries, tiles_per_task, gpu
        self.report = progress or (lambda p: None)
        self.state = BatchProgress(slides_total=len(slides))
        self.meta: dict[Any, tuple[str, _Slide, list[int]]] = {}
        self.token = uuid.uuid4().hex[:8]
        self.tiles_in_flight = 0
        self.cpu_workers: list[str] = []
        self.request = params.digest()
        self.expected: dict[str, dict[str, Any]] = {}  # stain mode -> model identity now
        self.noted: set[str] = set()
        # post task -> its model task, arguments and the workers it may run on
        self.posts: dict[Any, tuple[Any, tuple[Any, ...], str, list[str]]] = {}

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        from distributed import as_completed

        queue = deque(s for s in self.slides if self._start(s))
        self._write_summary()
        self.ac = as_completed()
        active: list[_Slide] = []
        try:
            nthreads, asked = 1, -1.0
            while True:
                if time.monotonic() - asked > 2.0:  # workers come and go: ask now and then
                    nthreads = max(1, sum(self.client.nthreads().values()))
                    if self.gpu:
                        self._rehome_posts(_cpu_workers(self.client))
                    asked = time.monotonic()
                active = [s for s in active if s.status == "running"]
                while queue and len(active) < 2 * nthreads + 1:
                    s = queue.popleft()
                    self._submit_slide(s)
                    active.append(s)
                self._submit_tiles(active, cap=4 * nthreads)
                if not self.meta:
                    if queue:
                        continue
                    break
                future = self._next()
                if future is not None:
                    self._handle(future)
        finally:
            for s in self.slides:
                if s.futures:
                    self.client.cancel(list(s.futures))
            self._write_summary()
        return [s.row for s in self.slides]

    def _next(self) -> Any:
        """Return the next finished future; with ``gpu``, None after 2 s without one.

        With ``gpu`` the loop must come back now and then: a post task whose workers
        have all gone waits for :meth:`_rehome_posts`.
        """
        if not self.gpu:
            return next(self.ac)
        import distributed.client
        from distributed import wait

        cancelled = getattr(distributed.client, "FuturesCancelledError", CancelledError)
        for f in self.meta:  # finished or cancelled already (wait raises for cancelled)
            if f.status != "pending":
                return f
        try:
            done, _ = wait(list(self.meta), timeout=2.0, return_when="FIRST_COMPLETED")
        except (TimeoutError, cancelled):  # one cancelled meanwhile: the scan finds it
            return None
        return next(iter(done))

    def _handle(self, future: Any) -> None:
        if future not in self.meta:  # a post task moved to other workers
            return
        kind, s, chunk = self.meta.pop(future)
        s.futures.discard(future)
        self.posts.pop(future, None)
        if kind == "tiles":
            self.tiles_in_flight -= 1
        if s.status != "running":  # failed already; cancelled futures land here
            return
        try:
            result = future.result()
        except BaseException as exc:  # noqa: BLE001 - the slide fails, the batch goes on
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._fail(s, exc)
            return
        if isinstance(result, TaskFailed):  # an error a retry would repeat: not retried
            self._fail(s, result)
            return
        try:
            if kind == "slide":
                self._planned(s, result)
            else:
                self._tiles_done(s, result)
        except Exception as exc:  # noqa: BLE001 - e.g. an output that cannot be written
            self._fail(s, exc)

    # -- per slide -------------------------------------------------------------------------

    def _start(self, s: _Slide) -> bool:
        """Stamp the slide and decide what an earlier run left; False when nothing to do."""
        try:
            s.stamp = stamp_slide(s.path, self.params.storage_options)
        except (OSError, ValueError) as exc:  # ValueError: a SlideError for a URL
            s.folder.mkdir(parents=True, exist_ok=True)
            self._fail(s, exc, write_manifest=True)
            return False
        s.folder.mkdir(parents=True, exist_ok=True)
        old = outputs.read_manifest(s.folder)
        same = (
            self.resume
            and old is not None
            and old.get("requested_sha256") == self.request
            and old.get("slide_stamp") == self._stamp_dict(s)
        )
        kept = [s.folder / "tissue.geojson"]
        if self.params.nuclei:
            kept += [s.folder / "nuclei.parquet", s.folder / "nuclei.geojson.gz"]
            if self.params.anndata:
                kept.append(s.folder / "cells.h5ad")
        if (
            same
            and old is not None
            and old.get("status") == "done"
            and all(p.is_file() for p in kept)
        ):
            if self._same_model(old):
                s.status, s.row, s.manifest = "done", dict(old.get("summary", {})), old
                s.row.update(slide=s.name, path=s.shown)
                self.state.slides_done += 1
                n = len(old.get("tiles", {}))
                self.state.tiles_total += n
                self.state.tiles_done += n
                self.state.finished, self.state.kept = s.row, True
                self.report(self.state)
                self.state.finished, self.state.kept = None, False
                return False
            same = False  # another model now: redone from scratch, never mixed
        if same:
            s.keep_parts = True  # parts of this run's model are kept once it is known
        else:
            outputs.clear_slide(s.folder)
        s.status = "running"
        s.manifest = {
            "slide": s.name,
            "path": shown_path(s.path),
            "slide_stamp": self._stamp_dict(s),
            "parameters": self.params.as_dict(),
            "requested_sha256": self.request,
            "resolved": None,  # what ran, once the slide task has resolved it
            "parameters_sha256": None,
            "status": "running",
            "error": None,
        }
        s.row = self._row(s)
        outputs.write_manifest(s.folder, s.manifest)
        return True

    def _same_model(self, old: dict[str, Any]) -> bool:
        """Whether a finished slide's record names the model that would run on it now."""
        if not self.params.nuclei:
            return True
        from napari_slidescope.segmenters import IDENTITY_KEYS

        resolved = old.get("resolved") or {}
        mode = resolved.get("stain_mode")
        if mode is None or old.get("parameters_sha256") != self.params.run_digest(resolved):
            return False
        if mode not in self.expected:  # asked of the cluster: the model its workers have
            self.expected[mode] = self.client.submit(
                model_identity, self.params.nuclei_options.segmenter, mode, pure=False
            ).result()
        now = self.expected[mode]
        return all(resolved.get(k) == now.get(k) for k in IDENTITY_KEYS)

    def _stamp_dict(self, s: _Slide) -> dict[str, Any]:
        assert s.stamp is not None
        stamp = {
            "size": s.stamp.size,
            "mtime_ns": s.stamp.mtime_ns,
            "head_sha256": s.stamp.head_sha256,
        }
        if s.stamp.remote is not None:  # what the store said: ETag, version, last-modified
            stamp.update({k: v for k, v in s.stamp.remote.items() if k != "size"})
        return stamp

    def _submit_slide(self, s: _Slide) -> None:
        assert s.stamp is not None
        s.prep = self.client.submit(
            slide_task,
            str(s.path),
            s.stamp.key,
            self.params,
            key=f"slidescope-slide-{s.index}-{self.token}",
            retries=self.retries,
            priority=1,
        )
        light = self.client.submit(
            summary_of, s.prep, key=f"slidescope-summary-{s.index}-{self.token}", priority=1
        )
        self._track(light, "slide", s, [])

    def _track(self, future: Any, kind: str, s: _Slide, chunk: list[int]) -> None:
        self.meta[future] = (kind, s, chunk)
        s.futures.add(future)
        if not self.gpu:
            self.ac.add(future)

    def _submit_tiles(self, active: list[_Slide], cap: int) -> None:
        assert all(s.stamp is not None for s in active)
        for s in active:
            while s.todo and self.tiles_in_flight < cap:
                chunk = s.todo.popleft()
                args = (str(s.path), s.stamp.key, self.params, s.prep)  # type: ignore[union-attr]
                name = f"{s.index}-{chunk[0]}-{self.token}"
                if self.gpu:  # the post task holds the model future; dask frees its output
                    model = self.client.submit(
                        model_task,
                        *args,
                        chunk[0],
                        key=f"slidescope-model-{name}",
                        retries=self.retries,
                        resources={"GPU": 1},
                        priority=-s.index,
                    )
                    fut = self._submit_post(s, model, args, name)
                else:
                    fut = self.client.submit(
                        nuclei_task,
                        *args,
                        chunk,
                        key=f"slidescope-nuclei-{name}",
                        retries=self.retries,
                        priority=-s.index,
                    )
                self._track(fut, "tiles", s, chunk)
                self.tiles_in_flight += 1

    def _submit_post(self, s: _Slide, model: Any, args: tuple[Any, ...], name: str) -> Any:
        """Submit the post task of a model task, restricted to the workers without a GPU.

        A strict restriction: a loose one lets an idle GPU worker steal post tasks.
        """
        fut = self.client.submit(
            post_task,
            *args,
            model,
            key=f"slidescope-post-{name}-{uuid.uuid4().hex[:6]}",
            retries=self.retries,
            workers=self.cpu_workers or None,
            priority=-s.index,
        )
        self.posts[fut] = (model, args, name, list(self.cpu_workers))
        return fut

    def _rehome_posts(self, cpu_workers: list[str]) -> None:
        """Resubmit the post tasks none of whose allowed workers is left.

        A restarted worker comes back under a new address; the post tasks go to the
        workers without a GPU there are now.
        """
        self.cpu_workers = cpu_workers
        for fut, (model, args, name, allowed) in list(self.posts.items()):
            if not allowed or set(allowed) & set(cpu_workers):
                continue
            kind, s, chunk = self.meta.pop(fut)
            s.futures.discard(fut)
            del self.posts[fut]
            self.client.cancel([fut])
            self._track(self._submit_post(s, model, args, name), kind, s, chunk)

    def _planned(self, s: _Slide, info: SlideInfo) -> None:
        s.info = info
        s.resolved = dict(info.resolved)
        s.digest = self.params.run_digest(s.resolved)
        if info.note is not None and info.note not in self.noted:  # once per run
            from napari_slidescope.segmenters import SegmenterInfoWarning

            self.noted.add(info.note)
            warnings.warn(info.note, SegmenterInfoWarning, stacklevel=2)
        outputs.write_tissue(s.folder, info.tissue_polygons, info.tissue_holes)
        area = None if info.tissue_area_um2 is None else info.tissue_area_um2 / 1e6
        s.manifest.update(
            slide_info={"shape0": list(info.shape0), "mpp": info.mpp, "format": info.format},
            tissue_area_mm2=area,
            slide_task_seconds=info.seconds,
            resolved=s.resolved,
            parameters_sha256=s.digest,
        )
        if not self.params.nuclei:
            self._finish(s)
            return
        s.tiles = list(info.tiles)
        # parts an interrupted run wrote with this very model and plan (same digest)
        found = outputs.finished_parts(s.folder, s.digest) if s.keep_parts else {}
        s.done = {i: t for i, t in found.items() if i in set(s.tiles)}
        todo = [i for i in s.tiles if i not in s.done]
        s.todo = deque(todo[k : k + self.per_task] for k in range(0, len(todo), self.per_task))
        s.manifest["plan"] = info.plan
        self.state.tiles_total += len(s.tiles)
        self.state.tiles_done += len(s.done)
        self._write_manifest(s, force=True)
        if not todo:
            self._finish(s)
        else:
            self.report(self.state)

    def _tiles_done(self, s: _Slide, results: list[TileOut]) -> None:
        for tile in results:
            outputs.write_part(s.folder, tile, s.digest)
            s.done[tile.index] = tile.seconds
            self.state.tiles_done += 1
        if len(s.done) == len(s.tiles):
            self._finish(s)
        else:
            self._write_manifest(s)
            self.report(self.state)

    def _finish(self, s: _Slide) -> None:
        assert s.info is not None and s.stamp is not None
        summary = None
        classes = None
        if self.params.nuclei:
            from napari_slidescope import __version__
            from napari_slidescope.analysis.measure import COLUMNS

            if self.params.classify is not None:
                area = s.info.tissue_area_um2
                classes = outputs.classify_parts(
                    s.folder,
                    s.tiles,
                    json.loads(self.params.classify),
                    None if area is None else area / 1e6,
                )
            summary = outputs.write_nuclei(
                s.folder,
                s.tiles,
                classes=classes,
                file_metadata={
                    "slide": s.name,
                    "path": shown_path(s.path),
                    "slide_stamp": self._stamp_dict(s),
                    "mpp": s.info.mpp,
                    "shape0": list(s.info.shape0),
                    "software": f"napari-slidescope {__version__}",
                    "parameters": self.params.as_dict(),
                    "requested_sha256": self.request,
                    "resolved": s.resolved,
                    "parameters_sha256": s.digest,
                    "plan": s.info.plan,
                    "columns": {**outputs.NUCLEI_COLUMNS, **COLUMNS},
                },
                units={k: v for k, v in COLUMNS.items() if k != "id"},
                feature_ns=f"{s.name}/{s.stamp.head_sha256}/{s.digest}",
            )
        if self.params.nuclei and self.params.anndata:
            outputs.write_anndata(
                s.folder,
                s.tiles,
                slide=s.name,
                mpp=s.info.mpp or 1.0,
                classes=classes,
            )
        s.status = "done"
        s.row = self._row(s, summary)
        if self.params.nuclei and classes is not None:
            s.row.update(classes.row())
        s.manifest.update(status="done", error=None, summary=s.row)
        self._write_manifest(s, force=True)
        outputs.remove_parts(s.folder)
        self._release(s)
        self.state.slides_done += 1
        self._announce(s)

    def _fail(
        self, s: _Slide, exc: BaseException | TaskFailed, *, write_manifest: bool = True
    ) -> None:
        secrets = self.params.storage_options
        if isinstance(exc, TaskFailed):
            s.error, tb = exc.message, exc.traceback
        else:
            s.error, tb = _message(exc), "".join(traceback.format_exception(exc))
        s.error, tb = scrub(s.error, secrets), scrub(tb, secrets)
        s.status = "failed"
        s.todo.clear()
        if s.futures:
            self.client.cancel(list(s.futures))
        s.row = self._row(s)
        s.manifest.update(status="failed", error=s.error, traceback=tb)
        if write_manifest:
            try:
                self._write_manifest(s, force=True)
            except OSError:
                log.exception("cannot write the manifest of %s", s.name)
        self._release(s)
        self.state.slides_done += 1
        self.state.slides_failed += 1
        self._announce(s)

    def _release(self, s: _Slide) -> None:
        s.prep = None  # dask frees the tissue mask on the workers

    def _announce(self, s: _Slide) -> None:
        self._write_summary()
        self.state.finished = s.row
        self.report(self.state)
        self.state.finished = None

    def _write_manifest(self, s: _Slide, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - s.written_at < MANIFEST_EVERY_S:
            return
        if s.tiles:
            s.manifest["tiles"] = {
                str(i): (
                    {"status": "done", "seconds": round(s.done[i], 4)}
                    if i in s.done
                    else {"status": "pending" if s.status == "running" else s.status}
                )
                for i in s.tiles
            }
        outputs.write_manifest(s.folder, s.manifest)
        s.written_at = now

    def _row(self, s: _Slide, summary: outputs.SlideSummary | None = None) -> dict[str, Any]:
        info = s.info
        area = None
        if info is not None and info.tissue_area_um2 is not None:
            area = info.tissue_area_um2 / 1e6
        seconds = None
        if info is not None:
            seconds = info.seconds + sum(s.done.values())
        row: dict[str, Any] = {
            "slide": s.name,
            "status": s.status,
            "error": s.error,
            "tissue_area_mm2": area,
            "nuclei": None,
            "nuclei_per_mm2": None,
            "mean_nucleus_area_um2": None,
            "seconds": seconds,
            "path": s.shown,
        }
        if summary is not None:  # the one definition of the figures (pipeline.summary)
            from napari_slidescope.pipeline.summary import nuclei_figures

            tissue = None if info is None else info.tissue_area_um2
            fig = nuclei_figures(summary.nuclei, tissue, summary.area_um2_sum)
            row["nuclei"] = fig.count
            row["nuclei_per_mm2"] = fig.density_per_mm2
            row["mean_nucleus_area_um2"] = fig.mean_area_um2
        return row

    def _write_summary(self) -> None:
        rows = [
            s.row or {"slide": s.name, "status": s.status, "path": s.shown} for s in self.slides
        ]
        outputs.write_summary(self.out / "summary.csv", rows)
