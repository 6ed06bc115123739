"""The "Slide analysis" dock widget: a magicgui view of :class:`~.session.SlideAnalysis`.

Pick a slide layer, a scope (visible region or whole slide) and a task, press Run:
the analysis runs in the background and its tiles stream into ``"<slide> tissue"`` /
``"<slide> nuclei"``. All the work and state live in the controller, which the napari
console helpers (:mod:`napari_slidescope._napari.console`, re-exported as :mod:`napari_slidescope.viewer`) share; this module only wires widgets.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import numpy as np
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    Container,
    FileEdit,
    FloatSpinBox,
    Image,
    Label,
    PushButton,
    RadioButtons,
    SpinBox,
)

from napari_slidescope._napari import jobs, session
from napari_slidescope._napari.layers import canvas_of

__all__ = ["SlideAnalysisWidget"]

_THUMB_PX = 160


def _defaults() -> dict[str, Any]:
    """Defaults of the analysis functions, read from their signatures (never copied)."""
    from napari_slidescope.analysis.nuclei import NucleiParams
    from napari_slidescope.pipeline.nuclei import segment_nuclei
    from napari_slidescope.pipeline.tissue import detect_tissue

    tissue = {k: p.default for k, p in inspect.signature(detect_tissue).parameters.items()}
    nuclei = {k: p.default for k, p in inspect.signature(segment_nuclei).parameters.items()}
    params = NucleiParams()
    return {
        "tissue_mpp": float(tissue["target_mpp"]),
        "min_tissue_um2": float(tissue["min_tissue_um2"]),
        "max_hole_um2": float(tissue["max_hole_um2"]),
        "tile_size_um": float(nuclei["tile_size_um"]),
        "nuclei_mpp": float(params.target_mpp),
        "min_area_um2": float(params.min_area_um2),
        "max_area_um2": float(params.max_area_um2),
    }


class SlideAnalysisWidget(Container):
    """Analyse the visible region or the whole slide, in the background.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari when docked from the Plugins menu).
    """

    def __init__(self, napari_viewer: Any) -> None:
        from napari_slidescope.pipeline.models import available_segmenters

        super().__init__(name="slide_analysis", labels=True)
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.controller = session.controller_for(self._viewer)
        d = _defaults()
        self.image = ComboBox(label="Slide", choices=self._image_choices, nullable=True)
        self.info = Label(label="", value="")
        self.info.native.setWordWrap(True)  # Qt: magicgui's Label has no wrap option
        self.label_image, self.macro_image = Image(label="Label"), Image(label="Macro")
        self.thumbnails = Container(
            widgets=[self.label_image, self.macro_image], layout="horizontal", visible=False
        )
        self.task = RadioButtons(
            label="Task",
            choices=[("Detect tissue", "tissue"), ("Segment nuclei", "nuclei")],
            value="nuclei",
        )
        self.scope = RadioButtons(
            label="Scope",
            choices=[("Visible region", "visible"), ("Whole slide (tissue only)", "slide")],
            value="visible",
        )
        self.mode = ComboBox(
            label="Nuclei layer",
            choices=[("Add (skip duplicates)", "add"), ("Replace", "replace")],
            value="add",
        )
        um2 = {"min": 0.0, "max": 1e12, "step": 10.0}
        self.nuclei_mpp = FloatSpinBox(
            label="Nuclei resolution (µm/px)", value=d["nuclei_mpp"], min=0.05, max=8, step=0.05
        )
        self.tile_size_um = FloatSpinBox(
            label="Tile size (µm)", value=d["tile_size_um"], min=32, max=8192, step=64
        )
        self.tissue_mpp = FloatSpinBox(
            label="Tissue resolution (µm/px)", value=d["tissue_mpp"], min=0.5, max=128, step=1
        )
        self.min_tissue_um2 = FloatSpinBox(
            label="Smallest tissue piece (µm²)", value=d["min_tissue_um2"], **um2
        )
        self.show_advanced = CheckBox(text="Advanced", value=False)
        self.segmenter = ComboBox(label="Segmenter", choices=available_segmenters() or ["builtin"])
        self.min_area_um2 = FloatSpinBox(
            label="Nucleus area min (µm²)", value=d["min_area_um2"], **um2
        )
        self.max_area_um2 = FloatSpinBox(
            label="Nucleus area max (µm²)", value=d["max_area_um2"], **um2
        )
        self.max_hole_um2 = FloatSpinBox(
            label="Fill tissue holes below (µm²)", value=d["max_hole_um2"], **um2
        )
        self.tissue_mode = ComboBox(
            label="Tissue mode", choices=["auto", "brightfield", "fluorescence"], value="auto"
        )
        self.workers = SpinBox(label="Workers (0: all cores)", value=0, min=0, max=256)
        self.advanced = Container(
            widgets=[
                self.segmenter,
                self.min_area_um2,
                self.max_area_um2,
                self.tissue_mode,
                self.max_hole_um2,
                self.workers,
            ],
            visible=False,
            labels=True,
        )
        self.run_button = PushButton(text="Run")
        self.cancel_button = PushButton(text="Cancel", enabled=False)
        self.status = Label(label="Status", value="Ready")
        self.summary = Label(label="Nuclei", value="–")
        self.export_dir = FileEdit(label="Export to", mode="d", value=Path.cwd())
        self.export_tissue = PushButton(text="Tissue GeoJSON")
        self.export_nuclei = PushButton(text="Nuclei GeoJSON")
        self.export_csv = PushButton(text="Nuclei CSV")
        self.extend(
            [
                self.image,
                self.info,
                self.thumbnails,
                self.task,
                self.scope,
                self.mode,
                self.nuclei_mpp,
                self.tile_size_um,
                self.tissue_mpp,
                self.min_tissue_um2,
                self.show_advanced,
                self.advanced,
                Container(widgets=[self.run_button, self.cancel_button], layout="horizontal"),
                self.status,
                self.summary,
                self.export_dir,
                Container(
                    widgets=[self.export_tissue, self.export_nuclei, self.export_csv],
                    layout="horizontal",
                ),
            ]
        )
        self.show_advanced.changed.connect(lambda v: setattr(self.advanced, "visible", bool(v)))
        self.image.changed.connect(self._on_image)
        self.segmenter.changed.connect(self._on_segmenter)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.controller.cancel)
        self.export_tissue.clicked.connect(lambda: self.export("tissue"))
        self.export_nuclei.clicked.connect(lambda: self.export("nuclei"))
        self.export_csv.clicked.connect(lambda: self.export("csv"))
        self.controller.started.connect(self._on_started)
        self.controller.finished.connect(self._on_finished)
        self.controller.failed.connect(self._on_failed)
        layers_events = self._viewer.layers.events
        layers_events.inserted.connect(self._on_layers_changed)
        layers_events.removed.connect(self._on_layers_changed)
        self._on_layers_changed()
        self._on_image(self.image.value)

    # -- choices and slide info -------------------------------------------------------------

    def _image_choices(self, _widget: Any = None) -> list[tuple[str, Any]]:
        return [(ly.name, ly) for ly in jobs.slide_layers(self._viewer)]

    def _on_layers_changed(self, event: Any = None) -> None:
        self.image.reset_choices()
        if self.image.value is None:
            try:
                self.image.value = jobs.active_slide_layer(self._viewer)
            except ValueError:
                pass

    def _on_segmenter(self, name: str) -> None:
        """Show the chosen segmenter's own working resolution (a model's training scale)."""
        from napari_slidescope.pipeline.models import segmenter_target_mpp

        mpp = segmenter_target_mpp(name) if name else None
        if mpp is not None:
            self.nuclei_mpp.value = max(mpp, self._slide_mpp())

    def _slide_mpp(self) -> float:
        """Return the chosen slide's finest pixel size in µm/px (0 if unknown or uncalibrated)."""
        layer = self.image.value
        if layer is None:
            return 0.0
        mpp = jobs.SlideSource.from_layer(layer).info.get("mpp")
        return float(min(mpp)) if mpp else 0.0

    def _on_image(self, layer: Any) -> None:
        self.thumbnails.visible = False
        for img in (self.label_image, self.macro_image):
            img.visible = False
        if layer is None:
            self.info.value = "Open a slide (a 2D RGB image layer)"
            return
        src = jobs.SlideSource.from_layer(layer)
        self.info.value = _describe(src)
        self._on_segmenter(self.segmenter.value)  # not finer than this slide's pixels
        folder = Path(src.path).parent if src.path else Path.cwd()
        self.export_dir.value = folder if os.access(folder, os.W_OK) else Path.cwd()
        if src.path and {"label", "macro"} & set(src.info.get("associated", [])):
            from napari.qt.threading import create_worker

            worker = create_worker(_load_thumbnails, src.path, _start_thread=False)
            worker.returned.connect(self._show_thumbnails)
            worker.start()

    def _show_thumbnails(self, images: dict[str, np.ndarray]) -> None:
        for key, widget in (("label", self.label_image), ("macro", self.macro_image)):
            if key in images:
                widget.value = images[key]
                widget.visible = self.thumbnails.visible = True

    # -- running -------------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        """Return the run's keyword arguments, from the widgets (physical units)."""
        tissue = {
            "target_mpp": float(self.tissue_mpp.value),
            "min_tissue_um2": float(self.min_tissue_um2.value),
            "max_hole_um2": float(self.max_hole_um2.value),
            "mode": self.tissue_mode.value,
        }
        segmenter = self.segmenter.value or "builtin"
        seg_opts = {}
        if segmenter == "builtin":
            seg_opts = {
                "min_area_um2": float(self.min_area_um2.value),
                "max_area_um2": float(self.max_area_um2.value),
            }
        nuclei = {
            "target_mpp": float(self.nuclei_mpp.value),
            "tile_size_um": float(self.tile_size_um.value),
            "segmenter": segmenter,
            "segmenter_options": seg_opts,
            "workers": int(self.workers.value) or None,
        }
        return {"tissue_options": tissue, "nuclei_options": nuclei}

    def run(self) -> Any:
        """Start the chosen task on the chosen scope (cancelling a run in flight).

        Returns the worker, or None when nothing could be started (the reason is
        shown as a notification and in the status line).
        """
        from napari.utils.notifications import show_warning

        layer = self.image.value
        if layer is None:
            show_warning("Slide analysis: open a slide first")
            return None
        task = self.task.value
        try:
            return self.controller.run(
                layer,
                task,
                scope=self.scope.value,
                mode=self.mode.value,
                **self.options(),
            )
        except ValueError as exc:  # e.g. nothing of the slide on screen
            self.status.value = f"Not started: {exc}"
            show_warning(f"Slide analysis: {exc}")
            return None

    def _on_started(self, task: str) -> None:
        self.cancel_button.enabled = True
        self.status.value = "Detecting tissue…" if task == "tissue" else "Segmenting nuclei…"

    def _on_finished(self, summary: Any) -> None:
        self.cancel_button.enabled = self.controller.busy
        if not self.controller.busy:
            if not self.status.value.startswith("Failed"):
                self.status.value = "Ready"
        if summary is not None:
            self.summary.value = str(summary)

    def _on_failed(self, message: str) -> None:
        self.status.value = "Failed: " + message.split(" failed: ", 1)[-1][:200]

    # -- export ----------------------------------------------------------------------------------

    def export(self, kind: str, path: str | os.PathLike[str] | None = None) -> Path | None:
        """Write ``"tissue"`` (GeoJSON), ``"nuclei"`` (GeoJSON) or ``"csv"`` (nuclei table).

        Uses the analysis functions' writers; default file names follow the slide in
        the export folder. Returns the path written, or None (with a notification).
        """
        from napari.utils.notifications import show_info, show_warning

        layer = self.image.value
        if layer is None:
            show_warning("Slide analysis: nothing to export")
            return None
        stem = Path(layer.name).stem
        suffix = {"tissue": "_tissue.geojson", "nuclei": "_nuclei.geojson", "csv": "_nuclei.csv"}
        target = Path(path) if path else Path(self.export_dir.value) / f"{stem}{suffix[kind]}"
        if kind == "tissue":
            name = f"{layer.name} tissue"
            tl = self._viewer.layers[name] if name in self._viewer.layers else None
            result = tl.metadata.get("slidescope_tissue") if tl is not None else None
        else:
            name = f"{layer.name} nuclei"
            nl = self._viewer.layers[name] if name in self._viewer.layers else None
            canvas = canvas_of(nl) if nl is not None else None
            result = canvas.to_result() if canvas is not None else None
        if result is None:
            show_warning(f"Slide analysis: no {kind if kind != 'csv' else 'nuclei'} to export")
            return None
        if kind == "csv":
            result.to_csv(target)
        else:
            result.to_geojson(target)
        show_info(f"Slide analysis: wrote {target}")
        return target


def _describe(src: jobs.SlideSource) -> str:
    info = src.info
    h, w = src.shape0
    parts = [str(info.get("format", "?")), f"{h:,} × {w:,} px"]
    mpp = info.get("mpp")
    if mpp:
        how = info.get("calibration_source")
        parts.append(f"{float(mpp[1]):.4g} µm/px" + (f" ({how})" if how else ""))
    else:
        parts.append("uncalibrated")
    if info.get("magnification"):
        parts.append(f"{float(info['magnification']):g}×")
    return " · ".join(parts)


def _load_thumbnails(path: str) -> dict[str, np.ndarray]:
    """Read the slide's label and macro images, small (worker thread)."""
    from napari_slidescope.slide import open_slide

    out = {}
    with open_slide(path) as slide:
        for key in ("label", "macro"):
            if key in slide.associated:
                img = np.asarray(slide.associated[key])
                step = max(1, int(np.ceil(max(img.shape[:2]) / _THUMB_PX)))
                out[key] = np.ascontiguousarray(img[::step, ::step, :3])
    return out
