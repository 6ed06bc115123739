"""The analysis session behind the dock widget and the console helpers.

:class:`AnalysisSession` runs tissue detection and nuclei segmentation for one viewer
in the background: a napari generator worker opens the slide and reads its pixels on
worker threads, yields per finished tile, and the main thread paints each tile into a
Labels layer (throttled) and advances a napari progress bar. One run at a time: a new
run cancels the one in flight; cancelling stops within one tile and keeps what was
painted; an exception becomes a napari notification. Scripts and the napari console
use it through :mod:`napari_slidescope._qt.console`; the dock widget is a thin view of it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from psygnal import Signal

from napari_slidescope._io import one_line
from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.jobs import (
    JOB_STEPS,
    Failed,
    JobSpec,
    NucleiRun,
    Scope,
    SlideSource,
    Stage,
    Task,
    TileDone,
    TissueDone,
    active_slide_layer,
    as_tissue_options,
    nuclei_mpp,
    run_job,
    slide_layers,
    source_input,
)
from napari_slidescope._napari.viewport import visible_region
from napari_slidescope._qt.nuclei_canvas import resolve_nuclei_run, set_up_nuclei
from napari_slidescope._qt.task_fields import dock_task
from napari_slidescope._types import Box
from napari_slidescope.options import NucleiOptions, TissueOptions

_PAINT_INTERVAL_MS = 100
_PAINT_BUDGET_S = 0.03
_FEATURES_INTERVAL_S = 1.0

__all__ = [
    "Outcome",
    "Progress",
    "Scope",
    "AnalysisSession",
    "SlideSource",
    "Summary",
    "session_for",
    "slide_layers",
]

#: The stages of a run, in words for the user.
STAGE_WORDS = {
    "starting": "Starting",
    "tissue": "Finding tissue",
    "preparing": "Preparing",
    "segmenting": "Segmenting nuclei",
}


# -- the session: main thread -----------------------------------------------------------------


@dataclass
class Summary:
    """Nuclei count, their density per mm² of tissue, and their mean area.

    ``partial`` is True when the last run on the slide stopped early (cancelled or
    failed): then count, tissue area and density cover only the tiles that finished,
    ``tiles_done`` of ``tiles_total``.
    """

    count: int
    tissue_mm2: float | None
    density_per_mm2: float | None
    mean_area_um2: float | None
    partial: bool = False
    tiles_done: int | None = None
    tiles_total: int | None = None

    def __str__(self) -> str:
        parts = [f"{self.count:,} nuclei"]
        if self.density_per_mm2 is not None:
            parts.append(f"{self.density_per_mm2:,.0f} /mm² of tissue")
        if self.mean_area_um2 is not None:
            parts.append(f"mean area {self.mean_area_um2:.1f} µm²")
        text = " · ".join(parts)
        if self.partial:
            of = (
                f" {self.tiles_done:,} of {self.tiles_total:,} tiles"
                if self.tiles_total is not None
                else ""
            )
            text = f"Partial ({of.strip() or 'stopped early'}): {text}"
        return text


@dataclass
class Progress:
    """Where a run is: its stage, tiles done of total (0: not known yet), seconds left."""

    task: Task
    stage: str
    done: int = 0
    total: int = 0
    eta_s: float | None = None

    @property
    def words(self) -> str:
        """The stage in words (``"Segmenting nuclei"``)."""
        return STAGE_WORDS.get(self.stage, self.stage)


@dataclass
class Outcome:
    """How the last run ended: ``state`` is ``"done"``, ``"cancelled"`` or ``"failed"``.

    ``tiles_done``/``tiles_total`` count nuclei tiles (0/0 for tissue runs or a run
    stopped before its tiles were planned); ``tissue`` is the tissue result of a
    tissue run; ``error`` the failure message.
    """

    task: Task
    state: Literal["done", "cancelled", "failed"]
    tiles_done: int = 0
    tiles_total: int = 0
    summary: Summary | None = None
    tissue: Any = None
    error: str | None = None


def tissue_area_um2(tissue: Any, areas: list[Any]) -> float | None:
    """Tissue area (µm²) inside the union of level-0 `areas` (boxes and polygon rings).

    The one definition every entry point uses:
    :func:`napari_slidescope.pipeline.summary.tissue_area_um2`.
    """
    from napari_slidescope.pipeline.summary import tissue_area_um2 as area_in

    return area_in(tissue, areas) if areas else None


def _core_area(run: Any, core: Box) -> Any:
    """Return what a finished tile of `run` analysed: its core, inside the run's polygon if any.

    A tile wholly outside the polygon gives an empty box, so each finished tile keeps
    one entry in the canvas's regions.
    """
    from napari_slidescope.pipeline.regions import clip_area

    if run.polygon is None:
        return core
    clipped = clip_area(run.polygon, core)
    return clipped if clipped is not None else (core[0], core[1], core[0], core[1])


def _check_task(task: str, scope: str) -> None:
    """Refuse a task or scope the session does not know (before anything starts)."""
    if task not in JOB_STEPS:  # the tasks a job runs (the task table's, with a job step)
        raise ValueError(f"task: expected {' or '.join(map(repr, JOB_STEPS))}, got {task!r}")
    if scope not in ("visible", "slide", "shape"):
        raise ValueError(f"scope: expected 'visible', 'slide' or 'shape', got {scope!r}")


def _nuclei_run_keyword(nuclei_run: Any, nuclei_options: Any) -> Any:
    """Return `nuclei_run`, or what the old keyword ``nuclei_options`` gave (with a warning).

    ``nuclei_options`` carried a :class:`~napari_slidescope._napari.jobs.NucleiRun` (options,
    segmenter object, worker threads), not a ``NucleiOptions``: the keyword is
    ``nuclei_run`` now. Console scripts may still pass the old one.
    """
    if nuclei_options is None:
        return nuclei_run
    if nuclei_run is not None:
        raise TypeError("run() got both nuclei_run and nuclei_options (its old name)")
    import warnings

    warnings.warn(
        "run(nuclei_options=...) is now run(nuclei_run=...): it carries a NucleiRun "
        "(options, segmenter, workers)",
        DeprecationWarning,
        stacklevel=3,
    )
    return nuclei_options


def _new_run(image: Any, task: Task, scope: Scope) -> _Run:
    """Return a run of `task` not started yet, with its napari progress bar."""
    from napari.utils import progress

    run = _Run(
        image,
        task,
        scope,
        threading.Event(),
        progress(total=0, desc=f"Slide analysis: {STAGE_WORDS['starting'].lower()}"),
    )
    run.progress = Progress(task, "starting")
    return run


@dataclass(eq=False)
class _Run:
    image: Any
    task: Task
    scope: Scope
    cancel: threading.Event
    pbar: Any
    layer: Any = None
    cells_layer: Any = None  # "<slide> cells" of a run with cell_expansion_um
    canvas: _layers.ResultCanvas | _layers.PyramidCanvas | None = None
    region_index: int | None = None
    worker: Any = None
    timer: Any = None
    pending: deque = field(default_factory=deque)
    failed: BaseException | None = None
    features_at: float = 0.0
    ended: bool = False
    outcome: Outcome | None = None
    progress: Progress | None = None
    cores: list[Box] = field(default_factory=list)
    polygon: np.ndarray | None = None  # the run's polygon region (level-0 (row, col) ring)
    tissue: Any = None
    segmenting_since: float | None = None


class AnalysisSession:
    """Background analysis for one viewer (shared by the dock widget and the console).

    Signals: ``started(task)``, ``progress(Progress)``, ``finished(summary_or_None)``
    (after every run, cancelled and failed ones too; :attr:`outcome` says how it
    ended), ``failed(message)``.
    """

    started = Signal(str)
    progress = Signal(object)
    finished = Signal(object)
    failed = Signal(str)

    def __init__(self, viewer: Any) -> None:
        self._viewer = weakref.ref(viewer)  # the registry is keyed by the viewer
        self._run: _Run | None = None
        self._tissue: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._partial: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
        self.outcome: Outcome | None = None

    @property
    def viewer(self) -> Any:
        """The viewer (raises ReferenceError once it is gone)."""
        viewer = self._viewer()
        if viewer is None:
            raise ReferenceError("the viewer of this AnalysisSession was closed")
        return viewer

    @property
    def busy(self) -> bool:
        """True while a run is in flight."""
        return self._run is not None

    @property
    def current_progress(self) -> Progress | None:
        """Progress of the run in flight (None when idle)."""
        return self._run.progress if self._run is not None else None

    # -- the slides in the viewer (what the widget shows) -------------------------------------

    def slide_layers(self) -> list[Any]:
        """Return the viewer's slide layers (2D RGB images), this plugin's slides first."""
        return slide_layers(self.viewer)

    def active_slide(self) -> Any:
        """Return the selected slide layer, else the last one; ValueError if there is none."""
        return active_slide_layer(self.viewer)

    def source(self, image: Any) -> SlideSource:
        """Describe the slide `image` shows (path, pixel size, metadata)."""
        return SlideSource.from_layer(image)

    def slide_kind(self, image: Any) -> Literal["brightfield", "fluorescence"]:
        """``"brightfield"`` or ``"fluorescence"``: what the slide's metadata say it is."""
        return source_input(SlideSource.from_layer(image))

    def auto_mpp(self, image: Any, segmenter: str = "auto") -> float:
        """Return the working resolution (µm/px) a nuclei run with `segmenter` takes on `image`."""
        return nuclei_mpp(SlideSource.from_layer(image), NucleiOptions(segmenter=segmenter))

    def channel_names(self, image: Any) -> list[str]:
        """Return the nuclear channels of `image` (red, green, blue for RGB fluorescence)."""
        src = SlideSource.from_layer(image)
        names = list(src.info.get("channel_names") or []) if src.info.get("axes") == "CYX" else []
        if not names and source_input(src) == "fluorescence":  # RGB-encoded
            names = ["red", "green", "blue"]
        return names

    # -- runs ---------------------------------------------------------------------------------

    def run(
        self,
        image: Any,
        task: Task,
        *,
        scope: Scope = "visible",
        region: Box | Any = None,
        mode: Literal["add", "replace"] = "add",
        tissue_options: TissueOptions | Mapping[str, Any] | None = None,
        nuclei_run: NucleiRun | NucleiOptions | Mapping[str, Any] | None = None,
        nuclei_options: NucleiRun | NucleiOptions | Mapping[str, Any] | None = None,
    ) -> Any:
        """Start analysing `image` in the background (cancelling a run in flight).

        Parameters
        ----------
        image : napari.layers.Image
            A 2D RGB image layer.
        task : {"tissue", "nuclei"}
        scope : {"visible", "slide", "shape"}
            The visible region (computed now from the camera), the whole slide, or the
            selected shape (only nuclei whose centroid lies inside it; tissue clipped).
        region : box or polygon, optional
            A level-0 box, or polygon of ``(row, col)`` vertices, instead of `scope`.
        mode : {"add", "replace"}
            Nuclei: add to ``"<name> nuclei"`` (no duplicates) or replace it.
        tissue_options : TissueOptions or mapping, optional
            Tissue detection's options, or the keywords of ``detect_tissue``.
        nuclei_run : NucleiRun, NucleiOptions or mapping, optional
            Nuclei segmentation's options (with the segmenter object and worker threads
            in a :class:`~napari_slidescope._napari.jobs.NucleiRun`), or the keywords of
            ``iter_segment_nuclei`` (option names, ``workers``, ``segmenter`` as a name
            or an object).
        nuclei_options : optional
            The old name of `nuclei_run` (a DeprecationWarning).

        Raises
        ------
        ValueError
            For a bad task, scope or option (before anything starts).

        Returns
        -------
        worker : napari.qt.threading.GeneratorWorker
        """
        _check_task(task, scope)
        tissue = as_tissue_options(tissue_options)
        nuclei = NucleiRun.of(_nuclei_run_keyword(nuclei_run, nuclei_options))
        source = SlideSource.from_layer(image)
        region = self._region_of(image, scope, region)
        self.cancel()
        spec = JobSpec(source, task, region, tissue, nuclei)
        spec.tissue = self._tissue.get(image) if task == "nuclei" else None
        run = _new_run(image, task, scope)
        if task == "nuclei":
            spec.nuclei, identity = resolve_nuclei_run(source, nuclei)
            mode = self._add_mode(image, mode, identity)
            placed = set_up_nuclei(self.viewer, image, spec, region, mode, identity)
            run.layer, run.cells_layer, run.canvas = placed.layer, placed.cells_layer, placed.canvas
            run.region_index, run.polygon = placed.region_index, placed.polygon
            self._partial.pop(image, None)
        self._start(run, spec)
        self.started.emit(task)
        self.progress.emit(run.progress)
        return run.worker

    def _region_of(self, image: Any, scope: Scope, region: Box | Any) -> Box | Any:
        """Return the run's region: `region`, else the visible region or the selected shape."""
        if region is None and scope == "visible":
            region = visible_region(self.viewer, image)
        if region is None and scope == "shape":
            from napari_slidescope._napari.shapes import selected_polygon

            region = selected_polygon(self.viewer, image)
        return region

    def _start(self, run: _Run, spec: JobSpec) -> None:
        """Start the run's worker and its paint timer; the run is the one in flight."""
        from napari.qt.threading import create_worker
        from qtpy.QtCore import QTimer

        run.worker = create_worker(run_job, spec, run.cancel, _start_thread=False)
        run.worker.yielded.connect(lambda item, run=run: self._guard(run, self._on_yielded, item))
        run.worker.finished.connect(lambda run=run: self._guard(run, self._on_finished))
        run.timer = QTimer()
        run.timer.setInterval(_PAINT_INTERVAL_MS)
        run.timer.timeout.connect(lambda run=run: self._guard(run, self._paint, _PAINT_BUDGET_S))
        self._run = run
        run.timer.start()
        run.worker.start()

    def _add_mode(
        self, image: Any, mode: Literal["add", "replace"], identity: dict[str, Any]
    ) -> Literal["add", "replace"]:
        """``"replace"`` when "add" would mix nuclei of another segmenter, model or setting.

        "Add (skip duplicates)" skips the areas analysed before; nuclei found there with
        another model (``"auto"`` resolving differently since a model was installed,
        another working resolution...) would then stay beside the new ones. Such a run
        replaces the layer instead, and says so.
        """
        name = dock_task("nuclei").layer_name(image.name)
        layer = self.viewer.layers[name] if name in self.viewer.layers else None
        canvas = _layers.canvas_of(layer) if layer is not None else None
        if mode != "add" or canvas is None or canvas.identity in (None, identity):
            return mode
        from napari.utils.notifications import show_info

        old, new = canvas.identity, identity
        changed = ", ".join(
            f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in new if old.get(k) != new.get(k)
        )
        show_info(
            f"{name}: the earlier nuclei were found differently ({changed}); "
            "replaced instead of added to, so that one layer never mixes two methods"
        )
        return "replace"

    def cancel(self) -> None:
        """Stop the run in flight; every tile finished so far stays painted.

        The run ends at once: tiles still in flight are dropped, the summary covers the
        finished tiles only (marked partial) and :attr:`outcome` says ``"cancelled"``.
        """
        run = self._run
        if run is not None:
            # no progress-bar update first: napari's bar processes Qt events when its text
            # changes, which could deliver the worker's "finished" before the cancel counts
            run.cancel.set()
            self._end(run, "cancelled")

    def wait(self, timeout: float | None = None) -> bool:
        """Process events until the run finishes (GUI stays live); False on timeout."""
        from qtpy.QtCore import QCoreApplication

        end = None if timeout is None else time.monotonic() + timeout
        while self.busy and (end is None or time.monotonic() < end):
            QCoreApplication.processEvents()
            time.sleep(0.005)
        return not self.busy

    def summary(self, image: Any) -> Summary | None:
        """Count, density and mean area of the nuclei found on `image` so far.

        After a run that stopped early the summary is marked partial and covers the
        finished tiles only: nuclei of those tiles over the tissue inside them.
        """
        name = dock_task("nuclei").layer_name(image.name)
        layer = self.viewer.layers[name] if name in self.viewer.layers else None
        canvas = _layers.canvas_of(layer) if layer is not None else None
        if canvas is None:
            return None
        from napari_slidescope.pipeline.summary import nuclei_figures

        table = canvas.table()
        count = int(table["id"].size)
        area = tissue_area_um2(self._tissue.get(image), canvas.regions)
        # the one definition of the figures, as the batch's summary.csv has them
        fig = nuclei_figures(count, area, float(np.nansum(table["area_um2"])))
        partial = self._partial.get(image)
        return Summary(
            fig.count,
            fig.tissue_mm2,
            fig.density_per_mm2,
            fig.mean_area_um2,
            partial=partial is not None,
            tiles_done=None if partial is None else partial[0],
            tiles_total=None if partial is None else partial[1],
        )

    def tissue_result(self, image: Any) -> Any:
        """Return the last whole-slide tissue result of `image`, or None."""
        return self._tissue.get(image)

    # -- slots (main thread) ------------------------------------------------------------------

    def _guard(self, run: _Run, slot: Any, *args: Any) -> None:
        """Call a slot; an exception fails the run instead of reaching Qt (which aborts)."""
        try:
            slot(run, *args)
        except Exception as exc:  # noqa: BLE001
            run.failed = run.failed or exc
            run.cancel.set()
            if slot == self._on_finished:  # never leave the session busy
                if run.worker is not None:
                    _release(run)
                if run.outcome is None:
                    self._end(run, "failed")

    def _on_yielded(self, run: _Run, item: Any) -> None:
        if run.outcome is not None:  # cancelled: what is still in flight is dropped ...
            if isinstance(item, TileDone) and isinstance(run.canvas, _layers.PyramidCanvas):
                self._late_tile(run, item)  # ... unless the worker already wrote it to disk
            return
        prog = run.progress or Progress(run.task, "starting")
        if isinstance(item, Failed):
            run.failed = item.error
            return
        if isinstance(item, Stage):
            prog.stage = item.name
            if item.name == "segmenting":
                run.segmenting_since = time.monotonic()
        elif isinstance(item, TissueDone):
            run.tissue = item.result
            if item.whole:
                self._tissue[run.image] = item.result
            if run.task == "tissue" or run.scope == "slide":
                _layers.show_tissue(self.viewer, run.image, item.result)
            return
        elif isinstance(item, TileDone):
            # book-keeping first: napari's progress bar may process events (finished too)
            if item.patch is not None and run.canvas is not None:
                run.pending.append(item.patch)
            run.cores.append(tuple(int(v) for v in item.core0))  # type: ignore[arg-type]
            prog.stage, prog.done, prog.total = "segmenting", len(run.cores), item.total
            if run.segmenting_since is not None and prog.done:
                rate = prog.done / max(time.monotonic() - run.segmenting_since, 1e-6)
                prog.eta_s = (prog.total - prog.done) / rate
        else:
            return
        if run.ended:
            return
        self.progress.emit(prog)  # before the progress bar, which may process events
        if run.outcome is not None:
            return
        if run.pbar.total != prog.total:
            run.pbar.total = prog.total
        if isinstance(item, Stage):
            run.pbar.set_description(f"Slide analysis: {prog.words.lower()}")
        if isinstance(item, TileDone):
            run.pbar.update(1)

    def _paint(self, run: _Run, budget: float | None) -> None:
        start = time.perf_counter()
        if run.canvas is None or run.layer is None:
            run.pending.clear()
            return
        if run.layer not in self.viewer.layers or _layers.canvas_of(run.layer) is not run.canvas:
            run.pending.clear()  # the layer was deleted or a newer run replaced its data
            return
        cells = run.cells_layer
        if cells is not None and (
            cells not in self.viewer.layers or _layers.cells_canvas_of(cells) is not run.canvas
        ):
            cells = run.cells_layer = None  # deleted, or a newer run shows other cells
        changed = False
        while run.pending and (budget is None or time.perf_counter() - start < budget):
            patch = run.pending.popleft()
            _layers.paint_patch(run.layer, run.canvas, patch)
            if cells is not None:
                changed = _layers.paint_cells(run.canvas, patch) or changed
        if changed:  # one upload of the outlines for every patch painted now
            cells.refresh()
        now = time.monotonic()
        if budget is None or now - run.features_at > _FEATURES_INTERVAL_S:
            run.features_at = now
            _layers.set_features(run.layer, run.canvas)

    def _on_finished(self, run: _Run) -> None:
        run.ended = True
        if run.outcome is None:
            state: Literal["done", "cancelled"] = "cancelled" if run.cancel.is_set() else "done"
            self._end(run, "failed" if run.failed is not None else state)
        _release(run)

    def _end(self, run: _Run, state: Literal["done", "cancelled", "failed"]) -> None:
        """Paint what finished, record how the run ended, emit ``finished`` (once per run)."""
        if run.outcome is not None:
            return
        run.outcome = Outcome(run.task, state)
        if self._run is run:
            self._run = None
        if run.timer is not None:
            run.timer.stop()
        try:
            self._paint(run, None)  # every tile that arrived
        except Exception as exc:  # noqa: BLE001 - reported below like any failure
            run.failed, state = run.failed or exc, "failed"
        prog = run.progress or Progress(run.task, "starting")
        total = prog.total if run.task == "nuclei" else 0
        done = len(run.cores)
        complete = state == "done" or (total and done >= total and run.failed is None)
        if run.task == "nuclei" and not complete and run.canvas is not None:
            if run.region_index is not None and run.region_index < len(run.canvas.regions):
                # the density's tissue area is that of the finished tiles only
                run.canvas.regions[run.region_index : run.region_index + 1] = [
                    _core_area(run, core) for core in run.cores
                ]
            self._partial[run.image] = (done, total)
        run.pbar.close()
        summary = self.summary(run.image)
        run.outcome = Outcome(
            run.task,
            state,
            done,
            total,
            summary,
            run.tissue if run.task == "tissue" else None,
        )
        self.outcome = run.outcome
        if run.failed is not None:
            run.outcome.error = self._notify(run, run.failed)
        self.finished.emit(summary)

    def _late_tile(self, run: _Run, item: TileDone) -> None:
        """Count a tile that finished after Cancel but is on disk already (pyramid canvas).

        Its labels cannot be taken back, so its table, its area and its count join the
        result, and ``finished`` is emitted again with the updated partial summary.
        """
        out, canvas = run.outcome, run.canvas
        if out is None or canvas is None or self._run is not None or out.state == "done":
            return  # a newer run owns the layer now
        if item.patch is not None:
            run.pending.append(item.patch)
            self._paint(run, None)
        y0, x0, y1, x1 = (int(v) for v in item.core0)
        if run.region_index is not None:
            canvas.regions.insert(
                run.region_index + len(run.cores), _core_area(run, (y0, x0, y1, x1))
            )
        run.cores.append((y0, x0, y1, x1))
        out.tiles_done = len(run.cores)
        if out.tiles_total and out.tiles_done >= out.tiles_total:
            self._partial.pop(run.image, None)
        else:
            self._partial[run.image] = (out.tiles_done, out.tiles_total)
        out.summary = self.summary(run.image)
        self.finished.emit(out.summary)

    def _notify(self, run: _Run, err: BaseException) -> str:
        from napari.utils.notifications import show_error

        msg = f"Slide analysis ({run.task}) of {run.image.name!r} failed: "
        msg += one_line(err, typed=True)
        show_error(msg)
        self.failed.emit(msg)
        return msg


def _release(run: _Run) -> None:
    """Drop the Qt connections that keep a finished run (and its canvas) alive.

    PyQt references a slot's closure from C++, where the garbage collector cannot see it.
    """
    if run.worker is None:
        return
    for signal in (run.worker.yielded, run.worker.finished, run.timer.timeout):
        try:
            signal.disconnect()
        except (TypeError, RuntimeError):  # already disconnected or deleted
            pass
    run.timer.stop()
    run.timer.deleteLater()
    run.worker = run.timer = None
    run.pending.clear()


_SESSIONS: weakref.WeakKeyDictionary[Any, AnalysisSession] = weakref.WeakKeyDictionary()


def session_for(viewer: Any) -> AnalysisSession:
    """Return the :class:`AnalysisSession` of `viewer` (one per viewer, shared)."""
    viewer = getattr(viewer, "__wrapped__", viewer)
    if viewer not in _SESSIONS:
        _SESSIONS[viewer] = AnalysisSession(viewer)
    return _SESSIONS[viewer]
