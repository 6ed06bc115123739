"""The analysis model behind the dock widget and the console helpers.

:class:`SlideAnalysis` runs tissue detection and nuclei segmentation for one viewer
in the background: a napari generator worker opens the slide and reads its pixels on
worker threads, yields per finished tile, and the main thread paints each tile into a
Labels layer (throttled) and advances a napari progress bar. One run at a time: a new
run cancels the one in flight; cancelling stops within one tile and keeps what was
painted; an exception becomes a napari notification. Scripts and the napari console
use it through :mod:`napari_slidescope._napari.console`; the dock widget is a thin view of it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from psygnal import Signal

from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.jobs import (
    DEFAULT_NUCLEI_MPP,
    Failed,
    JobSpec,
    Scope,
    SlideSource,
    Task,
    TissueDone,
    run_job,
    slide_layers,
)
from napari_slidescope._napari.viewport import Box, visible_region

_PAINT_INTERVAL_MS = 100
_PAINT_BUDGET_S = 0.03
_FEATURES_INTERVAL_S = 1.0

__all__ = ["SlideAnalysis", "SlideSource", "Summary", "controller_for", "slide_layers"]


# -- the controller: main thread --------------------------------------------------------------


@dataclass
class Summary:
    """Nuclei count, their density per mm² of tissue, and their mean area."""

    count: int
    tissue_mm2: float | None
    density_per_mm2: float | None
    mean_area_um2: float | None

    def __str__(self) -> str:
        parts = [f"{self.count:,} nuclei"]
        if self.density_per_mm2 is not None:
            parts.append(f"{self.density_per_mm2:,.0f} /mm² of tissue")
        if self.mean_area_um2 is not None:
            parts.append(f"mean area {self.mean_area_um2:.1f} µm²")
        return " · ".join(parts)


def tissue_area_um2(tissue: Any, boxes: list[Box]) -> float | None:
    """Tissue area (µm²) inside the union of level-0 `boxes` (mask pixel centres)."""
    if tissue is None or tissue.mpp is None or not boxes:
        return None
    mask = np.asarray(tissue.mask, bool)
    inside = np.zeros(mask.shape, bool)
    (oy, ox), (dy, dx) = tissue.origin, tissue.downsample
    cy = oy + (np.arange(mask.shape[0]) + 0.5) * dy
    cx = ox + (np.arange(mask.shape[1]) + 0.5) * dx
    for y0, x0, y1, x1 in boxes:
        inside |= ((cy >= y0) & (cy < y1))[:, None] & ((cx >= x0) & (cx < x1))[None, :]
    return float((mask & inside).sum()) * float(tissue.mpp) ** 2


@dataclass(eq=False)
class _Run:
    image: Any
    task: Task
    scope: Scope
    cancel: threading.Event
    pbar: Any
    layer: Any = None
    canvas: _layers.ResultCanvas | _layers.PyramidCanvas | None = None
    worker: Any = None
    timer: Any = None
    pending: deque = field(default_factory=deque)
    failed: BaseException | None = None
    features_at: float = 0.0
    ended: bool = False


class SlideAnalysis:
    """Background analysis for one viewer (shared by the dock widget and the console).

    Signals: ``started(task)``, ``finished(summary_or_None)``, ``failed(message)``.
    """

    started = Signal(str)
    finished = Signal(object)
    failed = Signal(str)

    def __init__(self, viewer: Any) -> None:
        self._viewer = weakref.ref(viewer)  # the registry is keyed by the viewer
        self._run: _Run | None = None
        self._tissue: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    @property
    def viewer(self) -> Any:
        """The viewer (raises ReferenceError once it is gone)."""
        viewer = self._viewer()
        if viewer is None:
            raise ReferenceError("the viewer of this SlideAnalysis was closed")
        return viewer

    @property
    def busy(self) -> bool:
        """True while a run is in flight."""
        return self._run is not None

    def run(
        self,
        image: Any,
        task: Task,
        *,
        scope: Scope = "visible",
        region: Box | None = None,
        mode: Literal["add", "replace"] = "add",
        tissue_options: dict[str, Any] | None = None,
        nuclei_options: dict[str, Any] | None = None,
    ) -> Any:
        """Start analysing `image` in the background (cancelling a run in flight).

        Parameters
        ----------
        image : napari.layers.Image
            A 2D RGB image layer.
        task : {"tissue", "nuclei"}
        scope : {"visible", "slide"}
            The visible region (computed now from the camera), or the whole slide.
        region : box, optional
            A level-0 box instead of `scope`.
        mode : {"add", "replace"}
            Nuclei: add to ``"<name> nuclei"`` (no duplicates) or replace it.
        tissue_options, nuclei_options : dict, optional
            Keyword arguments of ``detect_tissue`` and of ``iter_segment_nuclei``
            (``target_mpp``, ``tile_size_um``, ``workers``, ``segmenter``, and
            ``segmenter_options`` for its constructor).

        Returns
        -------
        worker : napari.qt.threading.GeneratorWorker
        """
        from napari.qt.threading import create_worker
        from napari.utils import progress
        from qtpy.QtCore import QTimer

        if task not in ("tissue", "nuclei"):
            raise ValueError(f"task: expected 'tissue' or 'nuclei', got {task!r}")
        if scope not in ("visible", "slide"):
            raise ValueError(f"scope: expected 'visible' or 'slide', got {scope!r}")
        source = SlideSource.from_layer(image)
        if region is None and scope == "visible":
            region = visible_region(self.viewer, image)
        self.cancel()
        nuclei_options = dict(nuclei_options or {})
        spec = JobSpec(source, task, region, dict(tissue_options or {}), nuclei_options)
        spec.tissue = self._tissue.get(image) if task == "nuclei" else None
        run = _Run(
            image, task, scope, threading.Event(), progress(total=0, desc=f"{task}: starting")
        )
        if task == "nuclei":
            target = nuclei_options.get("target_mpp") or DEFAULT_NUCLEI_MPP
            nuclei_options["target_mpp"] = target
            ds = (target / source.mpp[0], target / source.mpp[1])
            box = region or (0, 0, *source.shape0)
            run.layer, run.canvas, covered, offset = _layers.prepare_nuclei_layer(
                self.viewer, image, box, ds, mode=mode, pyramid=True if region is None else None
            )
            spec.grid = (run.canvas.origin, run.canvas.downsample, run.canvas.shape)
            if isinstance(run.canvas, _layers.PyramidCanvas):
                spec.pyramid = run.canvas.pyramid
            spec.covered, spec.id_offset = tuple(covered), offset
        run.worker = create_worker(run_job, spec, run.cancel, _start_thread=False)
        run.worker.yielded.connect(lambda item, run=run: self._guard(run, self._on_yielded, item))
        run.worker.finished.connect(lambda run=run: self._guard(run, self._on_finished))
        run.timer = QTimer()
        run.timer.setInterval(_PAINT_INTERVAL_MS)
        run.timer.timeout.connect(lambda run=run: self._guard(run, self._paint, _PAINT_BUDGET_S))
        self._run = run
        run.timer.start()
        run.worker.start()
        self.started.emit(task)
        return run.worker

    def cancel(self) -> None:
        """Stop the run in flight after its current tile; finished tiles stay painted."""
        run = self._run
        if run is not None:
            run.cancel.set()
            run.pbar.set_description(f"{run.task}: cancelling")
            self._run = None
            self.finished.emit(self.summary(run.image))

    def wait(self, timeout: float | None = None) -> bool:
        """Process events until the run finishes (GUI stays live); False on timeout."""
        from qtpy.QtCore import QCoreApplication

        end = None if timeout is None else time.monotonic() + timeout
        while self.busy and (end is None or time.monotonic() < end):
            QCoreApplication.processEvents()
            time.sleep(0.005)
        return not self.busy

    def summary(self, image: Any) -> Summary | None:
        """Count, density and mean area of the nuclei found on `image` so far."""
        name = f"{image.name} nuclei"
        layer = self.viewer.layers[name] if name in self.viewer.layers else None
        canvas = _layers.canvas_of(layer) if layer is not None else None
        if canvas is None:
            return None
        table = canvas.table()
        count = int(table["id"].size)
        area = tissue_area_um2(self._tissue.get(image), canvas.regions)
        mean = float(np.mean(table["area_um2"])) if count else None
        density = count / (area / 1e6) if area else None
        return Summary(count, None if area is None else area / 1e6, density, mean)

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
            if slot == self._on_finished:  # never leave the controller busy
                run.failed, err = None, exc
                if run.worker is not None:
                    _release(run)
                if self._run is run:
                    self._run = None
                    self.finished.emit(None)
                self._notify(run, err)

    def _on_yielded(self, run: _Run, item: Any) -> None:
        if isinstance(item, Failed):
            run.failed = item.error
            return
        if isinstance(item, TissueDone):
            if item.whole:
                self._tissue[run.image] = item.result
            if run.task == "tissue" or run.scope == "slide":
                _layers.show_tissue(self.viewer, run.image, item.result)
            return
        if isinstance(item, _layers.Patch) and run.canvas is not None:
            run.pending.append(item)
        if run.ended:  # napari's progress bar processes events: finished can come first
            self._paint(run, None)
            return
        total = item.total if isinstance(item, _layers.Patch) else item[1]
        if run.pbar.total != total:
            run.pbar.total = total
            run.pbar.set_description(f"{run.task}: tiles")
        run.pbar.update(1)

    def _paint(self, run: _Run, budget: float | None) -> None:
        start = time.perf_counter()
        if run.canvas is None or run.layer is None:
            run.pending.clear()
            return
        if run.layer not in self.viewer.layers or _layers.canvas_of(run.layer) is not run.canvas:
            run.pending.clear()  # the layer was deleted or a newer run replaced its data
            return
        while run.pending and (budget is None or time.perf_counter() - start < budget):
            _layers.paint_patch(run.layer, run.canvas, run.pending.popleft())
        now = time.monotonic()
        if budget is None or now - run.features_at > _FEATURES_INTERVAL_S:
            run.features_at = now
            _layers.set_features(run.layer, run.canvas)

    def _on_finished(self, run: _Run) -> None:
        run.ended = True
        run.timer.stop()
        current = self._run is run
        if current or run.cancel.is_set():
            self._paint(run, None)
        run.pbar.close()
        _release(run)
        if current:
            self._run = None
        if run.failed is not None:
            self._notify(run, run.failed)
        if current:
            self.finished.emit(self.summary(run.image))

    def _notify(self, run: _Run, err: BaseException) -> None:
        from napari.utils.notifications import show_error

        notes = " ".join(getattr(err, "__notes__", []))
        msg = f"Slide analysis ({run.task}) of {run.image.name!r} failed: "
        msg += f"{type(err).__name__}: {err}" + (f" ({notes})" if notes else "")
        show_error(msg)
        self.failed.emit(msg)


def _release(run: _Run) -> None:
    """Drop the Qt connections that keep a finished run (and its canvas) alive.

    PyQt references a slot's closure from C++, where the garbage collector cannot see it.
    """
    for signal in (run.worker.yielded, run.worker.finished, run.timer.timeout):
        try:
            signal.disconnect()
        except (TypeError, RuntimeError):  # already disconnected or deleted
            pass
    run.timer.deleteLater()
    run.worker = run.timer = None
    run.pending.clear()


_CONTROLLERS: weakref.WeakKeyDictionary[Any, SlideAnalysis] = weakref.WeakKeyDictionary()


def controller_for(viewer: Any) -> SlideAnalysis:
    """Return the :class:`SlideAnalysis` of `viewer` (one per viewer, shared)."""
    viewer = getattr(viewer, "__wrapped__", viewer)
    if viewer not in _CONTROLLERS:
        _CONTROLLERS[viewer] = SlideAnalysis(viewer)
    return _CONTROLLERS[viewer]
