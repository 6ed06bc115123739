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

import logging
import os
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
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
    stamp_slide,
)
from napari_slidescope.batch.tasks import SlideInfo, TileOut, nuclei_task, slide_task, summary_of

__all__ = ["BatchProgress", "analyze_slides"]

log = logging.getLogger(__name__)

#: Seconds between two writes of a running slide's manifest (parts are written at once).
MANIFEST_EVERY_S = 5.0


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
    """

    slides_total: int
    slides_done: int = 0
    slides_failed: int = 0
    tiles_total: int = 0
    tiles_done: int = 0
    finished: dict[str, Any] | None = None


@dataclass
class _Slide:
    index: int
    path: Path
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


def analyze_slides(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tasks: Sequence[str] = TASKS,
    segmenter: str = "builtin",
    nuclei_mpp: float | None = None,
    tile_size_um: float = 512.0,
    client: Any = None,
    workers: int | None = None,
    resume: bool = False,
    retries: int = 1,
    tiles_per_task: int | None = None,
    gpu: bool = False,
    progress: Callable[[BatchProgress], None] | None = None,
) -> list[dict[str, Any]]:
    """Analyse slides on a dask.distributed cluster; write one folder of results per slide.

    Parameters
    ----------
    paths : path or iterable of paths
        Slide files and folders (searched recursively for the slide formats).
    out : str or PathLike
        Output folder: ``OUT/<slide file name>/`` per slide and ``OUT/summary.csv``.
    tasks : sequence of {"tissue", "nuclei"}
        What to compute; nuclei are segmented only in tiles with tissue.
    segmenter : str
        A registered segmenter (see ``available_segmenters()``).
    nuclei_mpp : float, optional
        Working resolution of the segmentation, µm/px; default the segmenter's, never
        finer than the slide (as :func:`~napari_slidescope.segment_nuclei`).
    tile_size_um : float
        Size of the part of each tile it owns, µm (tiles add the segmenter's overlap).
    client : distributed.Client, optional
        Run on this client's cluster; default a local cluster of ``workers`` processes,
        closed at the end.
    workers : int, optional
        Worker processes of the local cluster; default one per core.
    resume : bool
        Keep what an earlier run into ``out`` finished with the same slide file (size,
        modification time, hash of its first MiB) and the same parameters; redo the rest.
        Without it every slide is redone.
    retries : int
        Times dask re-runs a task that raised before its slide counts as failed (a task
        on a worker that died is re-run by dask whatever this says).
    tiles_per_task : int, optional
        Tiles per nuclei task (more tiles per task: fewer tasks for the scheduler);
        default 1, or 8 with ``gpu``.
    gpu : bool
        Run nuclei tasks only on workers with a ``GPU`` resource (one task per GPU at a
        time), each task's tiles in one staged run with 2 reading and 2 post-processing
        threads so the model does not wait for the CPU; a local cluster then gives each
        worker ``{"GPU": 1}``.
    progress : callable, optional
        ``progress(BatchProgress)`` after each finished task and slide.

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
    params = BatchParams(tuple(tasks), segmenter, nuclei_mpp, float(tile_size_um))
    if params.nuclei:
        from napari_slidescope.segmenters import missing_reason

        reason = missing_reason(segmenter)  # KeyError for unknown names
        if reason is not None:
            raise ValueError(f"segmenter {segmenter!r} is not available: {reason}")
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    slides = find_slides(paths)
    if not slides:
        raise ValueError(f"no slides found in {[str(p) for p in paths]}")
    names = output_names(slides)
    out = Path(out)
    check_writable(out)
    if tiles_per_task is None:
        tiles_per_task = 8 if gpu else 1
    if int(tiles_per_task) < 1:
        raise ValueError(f"tiles_per_task: expected >= 1, got {tiles_per_task!r}")
    cluster = None
    if client is None:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            resources={"GPU": 1} if gpu else None,
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
        self.digest = params.digest()
        self.resume, self.retries, self.per_task, self.gpu = resume, retries, tiles_per_task, gpu
        self.report = progress or (lambda p: None)
        self.state = BatchProgress(slides_total=len(slides))
        self.meta: dict[Any, tuple[str, _Slide, list[int]]] = {}
        self.token = uuid.uuid4().hex[:8]
        self.tiles_in_flight = 0

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
                future = next(self.ac)
                self._handle(future)
        finally:
            for s in self.slides:
                if s.futures:
                    self.client.cancel(list(s.futures))
            self._write_summary()
        return [s.row for s in self.slides]

    def _handle(self, future: Any) -> None:
        kind, s, chunk = self.meta.pop(future)
        s.futures.discard(future)
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
            s.stamp = stamp_slide(s.path)
        except OSError as exc:
            s.folder.mkdir(parents=True, exist_ok=True)
            self._fail(s, exc, write_manifest=True)
            return False
        s.folder.mkdir(parents=True, exist_ok=True)
        old = outputs.read_manifest(s.folder)
        same = (
            self.resume
            and old is not None
            and old.get("parameters_sha256") == self.digest
            and old.get("slide_stamp") == self._stamp_dict(s)
        )
        kept = [s.folder / "tissue.geojson"]
        if self.params.nuclei:
            kept += [s.folder / "nuclei.parquet", s.folder / "nuclei.geojson.gz"]
        if (
            same
            and old is not None
            and old.get("status") == "done"
            and all(p.is_file() for p in kept)
        ):
            s.status, s.row, s.manifest = "done", dict(old.get("summary", {})), old
            s.row.update(slide=s.name, path=str(s.path))
            self.state.slides_done += 1
            n = len(old.get("tiles", {}))
            self.state.tiles_total += n
            self.state.tiles_done += n
            self.state.finished = s.row
            self.report(self.state)
            self.state.finished = None
            return False
        if same:
            s.done = outputs.finished_parts(s.folder, self.digest)
        else:
            outputs.clear_slide(s.folder)
        s.status = "running"
        s.manifest = {
            "slide": s.name,
            "path": str(s.path.resolve()),
            "slide_stamp": self._stamp_dict(s),
            "parameters": self.params.as_dict(),
            "parameters_sha256": self.digest,
            "status": "running",
            "error": None,
        }
        s.row = self._row(s)
        outputs.write_manifest(s.folder, s.manifest)
        return True

    def _stamp_dict(self, s: _Slide) -> dict[str, Any]:
        assert s.stamp is not None
        return {
            "size": s.stamp.size,
            "mtime_ns": s.stamp.mtime_ns,
            "head_sha256": s.stamp.head_sha256,
        }

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
        self.ac.add(future)

    def _submit_tiles(self, active: list[_Slide], cap: int) -> None:
        assert all(s.stamp is not None for s in active)
        for s in active:
            while s.todo and self.tiles_in_flight < cap:
                chunk = s.todo.popleft()
                fut = self.client.submit(
                    nuclei_task,
                    str(s.path),
                    s.stamp.key,  # type: ignore[union-attr]
                    self.params,
                    s.prep,
                    chunk,
                    2 if self.gpu else 1,
                    key=f"slidescope-nuclei-{s.index}-{chunk[0]}-{self.token}",
                    retries=self.retries,
                    resources={"GPU": 1} if self.gpu else None,
                    priority=-s.index,
                )
                self._track(fut, "tiles", s, chunk)
                self.tiles_in_flight += 1

    def _planned(self, s: _Slide, info: SlideInfo) -> None:
        s.info = info
        outputs.write_tissue(s.folder, info.tissue_polygons, info.tissue_holes)
        area = None if info.tissue_area_um2 is None else info.tissue_area_um2 / 1e6
        s.manifest.update(
            slide_info={"shape0": list(info.shape0), "mpp": info.mpp, "format": info.format},
            tissue_area_mm2=area,
            slide_task_seconds=info.seconds,
        )
        if not self.params.nuclei:
            self._finish(s)
            return
        s.tiles = list(info.tiles)
        s.done = {i: t for i, t in s.done.items() if i in set(s.tiles)}
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
            outputs.write_part(s.folder, tile, self.digest)
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
        if self.params.nuclei:
            from napari_slidescope import __version__
            from napari_slidescope.analysis.measure import COLUMNS

            summary = outputs.write_nuclei(
                s.folder,
                s.tiles,
                file_metadata={
                    "slide": s.name,
                    "path": str(s.path.resolve()),
                    "slide_stamp": self._stamp_dict(s),
                    "mpp": s.info.mpp,
                    "shape0": list(s.info.shape0),
                    "software": f"napari-slidescope {__version__}",
                    "parameters": self.params.as_dict(),
                    "parameters_sha256": self.digest,
                    "plan": s.info.plan,
                    "columns": {**outputs.NUCLEI_COLUMNS, **COLUMNS},
                },
                units={k: v for k, v in COLUMNS.items() if k != "id"},
                feature_ns=f"{s.name}/{s.stamp.head_sha256}/{self.digest}",
            )
        s.status = "done"
        s.row = self._row(s, summary)
        s.manifest.update(status="done", error=None, summary=s.row)
        self._write_manifest(s, force=True)
        outputs.remove_parts(s.folder)
        self._release(s)
        self.state.slides_done += 1
        self._announce(s)

    def _fail(self, s: _Slide, exc: BaseException, *, write_manifest: bool = True) -> None:
        s.status, s.error = "failed", _message(exc)
        s.todo.clear()
        if s.futures:
            self.client.cancel(list(s.futures))
        s.row = self._row(s)
        s.manifest.update(
            status="failed",
            error=s.error,
            traceback="".join(traceback.format_exception(exc)),
        )
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
            "path": str(s.path),
        }
        if summary is not None:
            row["nuclei"] = summary.nuclei
            row["nuclei_per_mm2"] = summary.nuclei / area if area else None
            row["mean_nucleus_area_um2"] = summary.mean_area_um2
        return row

    def _write_summary(self) -> None:
        rows = [
            s.row or {"slide": s.name, "status": s.status, "path": str(s.path)} for s in self.slides
        ]
        outputs.write_summary(self.out / "summary.csv", rows)
