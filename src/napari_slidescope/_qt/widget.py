"""The "Slide analysis" dock widget: a magicgui view of :class:`~.session.AnalysisSession`.

Pick a slide layer, a task (tissue or nuclei) and a scope (visible region or whole
slide), press Run: the analysis runs in the background, its tiles stream into
``"<slide> tissue"`` / ``"<slide> nuclei"``, and the widget shows the stage, a progress
bar with tiles done and the time left, then the result (marked partial after Cancel or
an error). All the work and state live in the session, which the napari console
helpers (:mod:`napari_slidescope._qt.console`) share; this module only wires widgets.

Parameters are remembered between sessions (Qt's settings store, see :func:`settings_store`)
and "Restore defaults" brings back :func:`default_settings`, built from the analysis
packages' documented defaults. Shortcuts (napari key bindings on the viewer):
:data:`RUN_KEY` runs the task on the current view, :data:`CANCEL_KEY` cancels.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, cast

from magicgui.types import FileDialogMode
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    Container,
    FileEdit,
    FloatSpinBox,
    Label,
    ProgressBar,
    PushButton,
    RadioButtons,
    SpinBox,
    Widget,
)
from qtpy.QtCore import QTimer
from qtpy.QtWidgets import QBoxLayout, QComboBox, QFrame, QScrollArea, QSizePolicy

from napari_slidescope._napari.export import (
    ExportKind,
    default_export_folder,
    default_export_path,
    export_folder,
    export_source,
    export_words,
    write_export,
)
from napari_slidescope._napari.viewport import camera_of
from napari_slidescope._qt import session
from napari_slidescope._qt.fields import field_value, option_widgets, set_field_value
from napari_slidescope._qt.layout import MAX_WIDTH, FitWidth, wrap
from napari_slidescope._qt.lifetime import attach
from napari_slidescope._qt.model_install import ModelInstaller
from napari_slidescope._qt.settings import (
    WidgetSettings,
    builtin_defaults,
    default_settings,
    read_settings,
    settings_store,
    write_settings,
)
from napari_slidescope._qt.task_fields import DOCK_TASKS, dock_task
from napari_slidescope._qt.texts import (
    describe,
    duration,
    key_text,
    models_text,
    outcome_words,
    tissue_words,
)
from napari_slidescope._qt.thumbnails import Thumbnails
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.options import NucleiOptions, OptionInfo, TissueOptions, option_fields

__all__ = ["CANCEL_KEY", "RUN_KEY", "SlideAnalysisWidget"]

#: napari key binding that runs the chosen task on the current view.
RUN_KEY = "Control-Shift-R"
#: napari key binding that cancels the run in flight.
CANCEL_KEY = "Control-Shift-X"
#: Least interval (s) between two progress updates of the widget within one stage.
_PROGRESS_S = 0.2


_WIDGETS: weakref.WeakValueDictionary[int, SlideAnalysisWidget] = weakref.WeakValueDictionary()


class SlideAnalysisWidget(Container):
    """Analyse the visible region or the whole slide, in the background.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari when docked from the Plugins menu).
    """

    def __init__(self, napari_viewer: Any) -> None:
        # scrollable: when the dock is shorter than the form (a small screen, other docks
        # beside it), a scroll bar appears instead of squeezing (clipping) the controls
        super().__init__(name="slide_analysis", labels=True, scrollable=True)
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.session = session.session_for(self._viewer)
        self._loading = False  # True while settings are applied (nothing is saved)
        self._settings_failed = False  # the settings file could not be written
        self._shown_stage, self._shown_at = "", 0.0
        # the latest update held back by the throttle, shown when its interval is over (the
        # timer is the dock's child: it goes with the dock and never fires after it)
        self._held_progress: session.Progress | None = None
        self._progress_timer = QTimer(self.native)
        self._progress_timer.setSingleShot(True)
        self._progress_timer.timeout.connect(self._show_held_progress)
        self._export: _Export | None = None
        d = default_settings()
        self._build_slide_rows()
        self._build_task_rows(d)
        self._build_option_fields(d)
        self._build_run_rows()
        self._build_export_rows()
        self._lay_out()
        self._connect()
        self._bind_keys()
        self.load_settings()
        self._on_layers_changed()
        self._on_image(self.image.value)
        self._on_task()

    # -- building the dock, step by step -----------------------------------------------------

    def _build_slide_rows(self) -> None:
        """Build the slide menu, what the slide is, and its label and macro thumbnails."""
        self.image = ComboBox(label="Slide", choices=self._image_choices, nullable=True)
        combo = self.image.native
        if isinstance(combo, QComboBox):  # a long slide name must not widen the dock
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(12)
        self.info = Label(label="", value="")
        self.thumbnails = Thumbnails(on_click=self.open_associated)
        self.label_image = self.thumbnails.label_image
        self.macro_image = self.thumbnails.macro_image

    def _build_task_rows(self, d: WidgetSettings) -> None:
        """Build the task buttons (one per task of the dock's task table) and the scope."""
        self.task = RadioButtons(label="Task", choices=[(t.action, t.name) for t in DOCK_TASKS])
        self.task.value = d.task
        self.scope = RadioButtons(
            label="Scope",
            choices=[
                ("Visible region", "visible"),
                ("Whole slide (tissue only)", "slide"),
                ("Selected shape", "shape"),
            ],
        )
        self.scope.value = d.scope

    def _build_option_fields(self, d: WidgetSettings) -> None:
        """Build one field per option of each task: those shown at once, and advanced."""
        from napari_slidescope.segmenters import available_segmenters

        self.mode = ComboBox(
            label="Nuclei layer",
            choices=[("Add (skip duplicates)", "add"), ("Replace", "replace")],
            value=d.mode,
        )
        self._installed = available_segmenters()
        # one field per option of the options model: label, unit, bounds, doc from there
        self.tissue_fields = option_widgets(TissueOptions)
        self.nuclei_fields = option_widgets(
            NucleiOptions, choices={"segmenter": ["auto", *self._installed]}
        )
        self.segmenter = self.nuclei_fields["segmenter"]
        self._segmenter_doc = self.segmenter.tooltip
        self.segmenter.tooltip = f"{self._segmenter_doc}; installed: {', '.join(self._installed)}"
        self._build_models_row()
        # "auto": the segmenter's resolution, never finer than the slide's own (unrounded)
        # pixel size, as segmenters.working_mpp decides for every entry point
        self.nuclei_mpp = self.nuclei_fields["target_mpp"]
        self.tile_size_um = self.nuclei_fields["tile_size_um"]
        self.stain = self.nuclei_fields["stain"]
        self.cell_expansion_um = self.nuclei_fields["cell_expansion_um"]
        self.channel = ComboBox(label="Nuclear channel", choices=self._channel_choices)
        # the built-in segmenter's own options (its segmenter_options when it runs)
        area = builtin_defaults()
        self.min_area_um2 = _spin("Nucleus area min", area["min_area_um2"], 5.0)
        self.max_area_um2 = _spin("Nucleus area max", area["max_area_um2"], 10.0)
        self.workers = SpinBox(label="Workers (0: all)", value=d.workers, min=0, max=256)
        self.tissue_mpp = self.tissue_fields["target_mpp"]
        self.min_tissue_um2 = self.tissue_fields["min_tissue_um2"]
        self.max_hole_um2 = self.tissue_fields["max_hole_um2"]
        self.tissue_mode = self.tissue_fields["mode"]
        nuclei_main = dock_task("nuclei").main
        self.nuclei_params = Container(
            widgets=[
                self.mode,
                self.segmenter,
                self.models,
                self.model_installer,
                *(self.nuclei_fields[n] for n in nuclei_main if n != "segmenter"),
            ],
            labels=True,
        )
        nuclei_advanced: list[Widget] = [
            self.channel,
            *(w for n, w in self.nuclei_fields.items() if n not in nuclei_main),
            self.min_area_um2,
            self.max_area_um2,
            self.workers,
        ]
        self.nuclei_advanced = Container(widgets=nuclei_advanced, labels=True)
        tissue_main = dock_task("tissue").main
        self.tissue_params = Container(
            widgets=[self.tissue_fields[n] for n in tissue_main], labels=True
        )
        tissue_advanced: list[Widget] = [
            w for n, w in self.tissue_fields.items() if n not in tissue_main
        ]
        self.tissue_advanced = Container(widgets=tissue_advanced, labels=True)
        self.show_advanced = CheckBox(text="Advanced options", value=False)
        self.advanced = Container(
            widgets=[self.nuclei_advanced, self.tissue_advanced], labels=False, visible=False
        )

    def _build_models_row(self) -> None:
        """Build the "Models" line: which model "auto" runs here, and those installed."""
        # which model "auto" runs on this slide, and which models are installed, in view
        self.models = Label(label="Models", value=models_text(None, "auto"))
        wrap(self.models)
        # below it while InstanSeg's models are missing: installs them in the background
        self.model_installer = ModelInstaller(on_installed=self._on_models_installed)
        self.model_installer.label = ""

    def _build_run_rows(self) -> None:
        """Build Run and Cancel, the progress bar, the status and the result."""
        self.run_button = PushButton(text="Run")
        self.cancel_button = PushButton(text="Cancel", enabled=False)
        self.cancel_button.tooltip = f"Stop the run; finished tiles stay ({key_text(CANCEL_KEY)})"
        self.progress = ProgressBar(value=0, min=0, max=1, visible=False)
        self.status = Label(label="Status", value="Ready")
        self.summary = Label(label="Result", value="–")
        for label in (self.info, self.status, self.summary):
            wrap(label)
        # its text changes with every tile: it must never change the dock's width
        self.progress.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

    def _build_export_rows(self) -> None:
        """Build the export folder and buttons, the export's progress, table and defaults."""
        self.export_dir = FileEdit(
            label="Export to", mode=FileDialogMode.EXISTING_DIRECTORY, value=Path.cwd()
        )
        # said when the slide's own folder is read-only and exports go elsewhere
        self.export_note = Label(label="", value="", visible=False)
        wrap(self.export_note)
        self.export_tissue = PushButton(text="Tissue GeoJSON")
        self.export_nuclei = PushButton(text="Nuclei GeoJSON")
        self.export_csv = PushButton(text="Nuclei CSV")
        self.export_parquet = PushButton(text="Nuclei GeoParquet")
        self.export_parquet.tooltip = "GeoParquet (WKB outlines), as slidescope batch writes"
        # an export runs on a worker thread: its progress and how it ended show here
        self.export_progress = ProgressBar(value=0, min=0, max=1, visible=False)
        self.export_progress.native.setSizePolicy(
            QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed
        )
        self.export_status = Label(label="", value="", visible=False)
        wrap(self.export_status)
        self.show_table = PushButton(text="Measurements table")
        self.show_table.tooltip = "One row per nucleus, a range filter and a histogram"
        self.restore_defaults = PushButton(text="Restore defaults")
        self.restore_defaults.tooltip = "Set every parameter back to its documented default"

    def _lay_out(self) -> None:
        """Put the rows into the dock, top to bottom."""
        self.extend(
            [
                self.image,
                self.info,
                self.thumbnails,
                self.task,
                self.scope,
                self.nuclei_params,
                self.tissue_params,
                self.show_advanced,
                self.advanced,
                Container(
                    widgets=[self.run_button, self.cancel_button], layout="horizontal", labels=False
                ),
                self.progress,
                self.status,
                self.summary,
                self.export_dir,
                self.export_note,
                Container(
                    widgets=[self.export_tissue, self.export_nuclei, self.export_csv],
                    layout="horizontal",
                    labels=False,
                ),
                # its own row: the dock keeps its width (the canvas its visible region)
                Container(widgets=[self.export_parquet], layout="horizontal", labels=False),
                self.export_progress,
                self.export_status,
                Container(
                    widgets=[self.show_table, self.restore_defaults],
                    layout="horizontal",
                    labels=False,
                ),
            ]
        )
        self.margins = (4, 4, 4, 4)
        self._fit_scroll_area()

    def _connect(self) -> None:
        """Connect the widgets', the session's and the viewer's signals to their slots."""
        self.show_advanced.changed.connect(self._on_task)
        self.task.changed.connect(self._on_task)
        self.scope.changed.connect(self._update_run_button)
        self.image.changed.connect(self._on_image)
        self.segmenter.changed.connect(self._on_segmenter)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.restore_defaults.clicked.connect(self.reset_settings)
        self.show_table.clicked.connect(self.open_table)
        self.export_tissue.clicked.connect(self._on_export_tissue)
        self.export_nuclei.clicked.connect(self._on_export_nuclei)
        self.export_csv.clicked.connect(self._on_export_csv)
        self.export_parquet.clicked.connect(self._on_export_parquet)
        for widget in self._setting_widgets():
            widget.changed.connect(self._on_setting_changed)
        camera = camera_of(self._viewer)
        layers_events = self._viewer.layers.events
        # the session and the viewer outlive the dock: once its Qt widgets are gone it no
        # longer follows them (a slot would touch deleted widgets)
        attach(
            self.native,
            [
                (self.session.started, self._on_started),
                (self.session.progress, self._on_progress),
                (self.session.finished, self._on_finished),
                (layers_events.inserted, self._on_layers_changed),
                (layers_events.removed, self._on_layers_changed),
                (camera.events.center, self._update_run_button),
                (camera.events.zoom, self._update_run_button),
            ],
        )

    def _fit_scroll_area(self) -> None:
        """Bound the width, keep the controls at the top, and never clip them sideways."""
        scroll = self.native
        inner = scroll.widget() if isinstance(scroll, QScrollArea) else None
        if inner is None:
            self.native.setMaximumWidth(MAX_WIDTH)
            return
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        layout = inner.layout()
        if isinstance(layout, QBoxLayout):
            layout.addStretch(1)  # spare height goes below the controls
        # the form's least width changes as parameters show and hide: follow it
        self._width_filter = FitWidth(scroll, inner)
        inner.installEventFilter(self._width_filter)
        scroll.installEventFilter(self._width_filter)
        self._width_filter.fit()

    @property
    def native(self) -> Any:
        """The dock's Qt widget: a scroll area around the form.

        napari docks ``native``; magicgui's ``native`` of a scrollable container is the
        form inside the scroll area, which would leave the scroll area out.
        """
        return self.root_native_widget

    # -- settings ---------------------------------------------------------------------------

    def _setting_widgets(self) -> list[Any]:
        """Every widget whose value is a setting (a change is saved)."""
        return [
            self.task,
            self.scope,
            self.mode,
            self.workers,
            self.min_area_um2,
            self.max_area_um2,
            *self.tissue_fields.values(),
            *self.nuclei_fields.values(),
        ]

    def settings(self) -> WidgetSettings:
        """Return the parameters as the widgets show them."""
        tissue = {
            name: field_value(self.tissue_fields[name], info)
            for name, _default, info in option_fields(TissueOptions)
        }
        nuclei: dict[str, object] = {
            name: field_value(self.nuclei_fields[name], info)
            for name, _default, info in option_fields(NucleiOptions)
        }
        nuclei["segmenter"] = self.segmenter.value or "auto"
        nuclei["segmenter_options"] = {
            "min_area_um2": float(self.min_area_um2.value),
            "max_area_um2": float(self.max_area_um2.value),
        }
        return WidgetSettings(
            task=str(self.task.value),
            scope=str(self.scope.value),
            mode=str(self.mode.value),
            workers=int(self.workers.value),
            tissue=TissueOptions.from_mapping(tissue),
            nuclei=NucleiOptions.from_mapping(nuclei),
        )

    def apply_settings(self, settings: WidgetSettings) -> None:
        """Show `settings` in the widgets (values a widget cannot take are left as they are)."""
        values: list[tuple[Any, Any, OptionInfo | None]] = [
            (self.task, settings.task, None),
            (self.scope, settings.scope, None),
            (self.mode, settings.mode, None),
            (self.workers, settings.workers, None),
        ]
        for cls, options, fields in (
            (TissueOptions, settings.tissue, self.tissue_fields),
            (NucleiOptions, settings.nuclei, self.nuclei_fields),
        ):
            for name, _default, info in option_fields(cls):
                values.append((fields[name], getattr(options, name), info))
        area = settings.nuclei.segmenter_options
        for name, widget in (
            ("min_area_um2", self.min_area_um2),
            ("max_area_um2", self.max_area_um2),
        ):
            if name in area:
                values.append((widget, area[name], None))
        self._loading = True
        try:
            for shown, value, about in values:
                choices = getattr(shown, "choices", None)
                if choices is not None and value not in choices:
                    continue
                try:
                    if about is not None:
                        set_field_value(shown, about, value)
                    else:
                        shown.value = value
                except (ValueError, TypeError):
                    continue
        finally:
            self._loading = False

    def load_settings(self) -> None:
        """Show the parameters remembered from the last session (defaults where none)."""
        self.apply_settings(read_settings(settings_store()))

    def save_settings(self) -> None:
        """Remember the parameters shown now.

        Raises
        ------
        OSError
            ``cannot write PATH: CAUSE`` when the settings file cannot be written (a full
            disk, no permission); Qt writes it atomically, so the earlier file is kept.
        """
        write_settings(settings_store(), self.settings())

    def reset_settings(self) -> None:
        """Show the documented defaults (clamped to the slide's pixels) and remember them."""
        self.apply_settings(default_settings())
        self._on_segmenter(self.segmenter.value)
        self.save_settings()

    def _on_setting_changed(self, _value: Any = None) -> None:
        if not self._loading:
            try:
                self.save_settings()
            except OSError as exc:  # the run can go on; say once why nothing is remembered
                from napari.utils.notifications import show_warning

                if not self._settings_failed:
                    self._settings_failed = True
                    show_warning(f"{exc}; parameters are not remembered")

    # -- shortcuts ----------------------------------------------------------------------------

    def _bind_keys(self) -> None:
        """Register the run and cancel shortcuts as napari key bindings of the viewer."""
        _WIDGETS[id(self._viewer)] = self
        self._viewer.bind_key(RUN_KEY, _run_shortcut, overwrite=True)
        self._viewer.bind_key(CANCEL_KEY, _cancel_shortcut, overwrite=True)

    # -- choices and slide info -------------------------------------------------------------

    def _image_choices(self, _widget: Any = None) -> list[tuple[str, Any]]:
        return [(ly.name, ly) for ly in self.session.slide_layers()]

    def _on_layers_changed(self, event: Any = None) -> None:
        before = self.image.value
        self.image.reset_choices()
        if self.image.value is None:
            try:
                self.image.value = self.session.active_slide()
            except ValueError:
                pass
        if self.image.value is None and before is not None:
            self._on_image(None)  # the slide went away: drop its previews
        self._update_run_button()

    def _on_task(self, _value: Any = None) -> None:
        nuclei = self.task.value == "nuclei"
        self.nuclei_params.visible = nuclei
        self.tissue_params.visible = not nuclei
        self.nuclei_advanced.visible = nuclei
        self.tissue_advanced.visible = not nuclei
        self.advanced.visible = bool(self.show_advanced.value)
        self._update_run_button()

    def _on_segmenter(self, name: Any) -> None:
        """Say which model and resolution "auto" stand for on this slide."""
        layer = self.image.value
        if layer is None:
            self.models.value = models_text(None, name or "auto")
            return
        self.models.value = models_text(self.session.slide_kind(layer), name or "auto")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlidescopeWarning)  # uncalibrated: said on run
            mpp = self.session.auto_mpp(layer, name or "auto")
        self.nuclei_mpp.tooltip = f"auto: {mpp:.4g} µm/px for {name or 'auto'} on this slide"

    def _on_models_installed(self) -> None:
        """Offer the models just installed, and say what "auto" runs now."""
        from napari_slidescope.segmenters import available_segmenters

        installed = self._installed = available_segmenters()
        combo = cast(ComboBox, self.segmenter)
        value = combo.value
        combo.choices = ["auto", *installed]
        if value in combo.choices:
            combo.value = value
        self.segmenter.tooltip = f"{self._segmenter_doc}; installed: {', '.join(installed)}"
        self._on_segmenter(self.segmenter.value)

    def _channel_choices(self, _widget: Any = None) -> list[str]:
        """``auto`` and the chosen slide's channels (red, green, blue: RGB fluorescence)."""
        layer = getattr(self, "image", None) and self.image.value
        if layer is None:
            return ["auto"]
        return ["auto", *self.session.channel_names(layer)]

    def _on_image(self, layer: Any) -> None:
        self.thumbnails.clear()
        self._update_run_button()
        if layer is None:
            self.info.value = "Open a slide (a 2D RGB image layer)"
            return
        src = self.session.source(layer)
        self.info.value = describe(src)
        self.channel.reset_choices()
        self.channel.value = "auto"
        self._on_segmenter(self.segmenter.value)
        # a proposal only: nothing is written into the slide's folder until an export
        # goes there (export() decides the folder for real)
        folder, note = default_export_folder(src.path, probe=False)
        self.export_dir.value = folder
        self.export_dir.tooltip = note or f"Exports are written to this folder ({folder})"
        self.export_note.value = note
        self.export_note.visible = bool(note)
        if src.path and {"label", "macro"} & set(src.info.get("associated", [])):
            self.thumbnails.load(src.path)

    @property
    def _associated(self) -> dict[str, Any]:
        """The slide's label and macro images shown as previews (full size), by key."""
        return self.thumbnails.images

    def _show_thumbnails(self, images: dict[str, Any], token: int = -1) -> None:
        self.thumbnails.show_images(images, token)

    def open_associated(self, key: str) -> Any:
        """Open the slide's ``"label"`` or ``"macro"`` image as its own image layer."""
        img = self._associated.get(key)
        layer = self.image.value
        if img is None or layer is None:
            return None
        name = f"{layer.name} {key}"
        if name in self._viewer.layers:
            self._viewer.layers.selection.active = self._viewer.layers[name]
            return self._viewer.layers[name]
        return self._viewer.add_image(img, name=name, rgb=img.ndim == 3)

    # -- running -------------------------------------------------------------------------------

    def run_options(self) -> dict[str, Any]:
        """Return the run's options, from the widgets.

        ``tissue_options``: a :class:`~napari_slidescope.options.TissueOptions`;
        ``nuclei_run``: a :class:`~napari_slidescope._napari.jobs.NucleiRun` (the
        options with the chosen nuclear channel, and the worker threads).
        """
        settings = self.settings()
        run = settings.nuclei_run()
        channel = None if self.channel.value == "auto" else self.channel.value
        run = dataclasses.replace(run, options=run.options.replace(channel=channel))
        return {"tissue_options": settings.tissue, "nuclei_run": run}

    def why_not_runnable(self) -> str | None:
        """Why Run is disabled now (None when it can run)."""
        layer = self.image.value
        if layer is None:
            return "Open a slide first (File ▸ Open, or File ▸ Open Sample ▸ Slidescope)"
        if self.session.busy:
            return f"A run is in progress: Cancel it first ({key_text(CANCEL_KEY)})"
        if self.scope.value == "visible":
            from napari_slidescope._napari.viewport import visible_region

            try:
                visible_region(self._viewer, layer)
            except ValueError:
                return "None of the slide is in view: pan or zoom to it, or choose Whole slide"
            except RuntimeError:
                pass  # no canvas size yet: run() says what is wrong
        return None

    def _update_run_button(self, _event: Any = None) -> None:
        reason = self.why_not_runnable()
        self.run_button.enabled = reason is None
        self.run_button.tooltip = reason or (
            f"Run the chosen task ({key_text(RUN_KEY)} runs it on the current view)"
        )

    def run(self, scope: str | None = None) -> Any:
        """Start the chosen task on the chosen scope (or `scope`).

        Returns the worker, or None when nothing could be started (the reason is
        shown as a notification and in the status line).
        """
        from napari.utils.notifications import show_warning

        layer = self.image.value
        if layer is None:
            show_warning("Slide analysis: open a slide first")
            return None
        try:
            return self.session.run(
                layer,
                self.task.value,
                scope=cast(session.Scope, scope or self.scope.value),
                mode=self.mode.value,
                **self.run_options(),
            )
        except ValueError as exc:  # e.g. nothing of the slide on screen
            self.status.value = f"Not started: {exc}"
            show_warning(f"Slide analysis: {exc}")
            return None

    def run_on_view(self) -> Any:
        """Run the chosen task on the current view (the run shortcut); None if busy."""
        if self.session.busy:
            return None
        return self.run("visible")

    def cancel(self) -> None:
        """Cancel the run in flight (finished tiles stay; the result is marked partial)."""
        self.session.cancel()

    def _on_started(self, task: str) -> None:
        self._shown_stage = ""
        self._drop_held_progress()
        self.cancel_button.enabled = True
        self.summary.value = "–"
        self.progress.visible = True
        self._update_run_button()

    def _on_progress(self, prog: session.Progress) -> None:
        now = time.monotonic()
        last = prog.total and prog.done >= prog.total
        wait = _PROGRESS_S - (now - self._shown_at)
        if prog.stage == self._shown_stage and wait > 0 and not last:
            # a few updates a second are enough to read (each relays out the dock); the
            # latest is shown when the interval is over, not only with the next update
            # (a burst of finished tiles, then a slow one, would leave the bar behind)
            self._held_progress = prog
            if not self._progress_timer.isActive():
                self._progress_timer.start(max(1, int(wait * 1000) + 1))
            return
        self._drop_held_progress()
        self._shown_stage, self._shown_at = prog.stage, now
        bar = self.progress.native
        if prog.total:
            self.progress.max = prog.total
            self.progress.value = prog.done
            eta = f" · about {duration(prog.eta_s)} left" if prog.eta_s is not None else ""
            bar.setFormat(f"{prog.done:,} / {prog.total:,} tiles")
            self.status.value = f"{prog.words}: {prog.done:,} of {prog.total:,} tiles{eta}"
        else:
            # the count is not known yet; no busy indicator: its animation repaints
            # the dock continuously, which costs the canvas frames
            bar.setRange(0, 1)
            bar.setValue(0)
            bar.setFormat(f"{prog.words}…")
            self.status.value = f"{prog.words}…"

    def _show_held_progress(self) -> None:
        prog, self._held_progress = self._held_progress, None
        if prog is not None and self.session.busy:
            self._on_progress(prog)

    def _drop_held_progress(self) -> None:
        self._held_progress = None
        self._progress_timer.stop()

    def _on_finished(self, summary: Any) -> None:
        self._drop_held_progress()
        busy = self.session.busy
        self.cancel_button.enabled = busy
        self.progress.visible = busy
        self._update_run_button()
        if busy:
            return  # a new run already started
        out = self.session.outcome
        if out is None:
            self.status.value = "Ready"
            return
        self.status.value = outcome_words(out)
        if out.task == "tissue":
            self.summary.value = tissue_words(out.tissue)
        elif summary is not None:
            self.summary.value = str(summary)
        for label in (self.status, self.summary):  # a wrapped label may need more lines
            label.native.updateGeometry()

    def open_table(self) -> Any:
        """Dock the "Nuclei measurements" table (once per viewer) and return it."""
        _, table = self._viewer.window.add_plugin_dock_widget(
            "napari-slidescope", "Nuclei measurements", tabify=True
        )
        table.refresh()
        return table

    # -- export ----------------------------------------------------------------------------------

    def _on_export_tissue(self) -> None:
        self.export("tissue")

    def _on_export_nuclei(self) -> None:
        self.export("nuclei")

    def _on_export_csv(self) -> None:
        self.export("csv")

    def _on_export_parquet(self) -> None:
        self.export("geoparquet")

    @property
    def exporting(self) -> bool:
        """True while an export is being written."""
        return self._export is not None

    def export(self, kind: ExportKind, path: str | os.PathLike[str] | None = None) -> Any:
        """Write the chosen slide's tissue or nuclei to a file, in the background.

        `kind` is ``"tissue"`` (GeoJSON), or for the nuclei ``"nuclei"`` (GeoJSON),
        ``"csv"`` (their table) or ``"geoparquet"``. The nuclei written are those the runs
        found, with their own outlines
        (:func:`~napari_slidescope._napari.export.export_source`); the file is written on
        a worker thread (the GUI stays responsive) with a progress bar, and a
        notification and :attr:`export_status` say where it went or why it failed.
        The folder is decided now: the export folder when a file can be created there,
        else a writable fallback (said in the note). Default file names follow the slide.

        Returns
        -------
        worker or None
            The worker writing the file (its ``returned`` signal carries the path), or
            None when nothing was started (a notification says why).
        """
        from napari.qt.threading import create_worker
        from napari.utils.notifications import show_warning

        layer = self.image.value
        if layer is None:
            show_warning("Slide analysis: nothing to export")
            return None
        if self._export is not None:
            show_warning("Slide analysis: an export is being written; wait for it to finish")
            return None
        source = export_source(self._viewer, layer, kind)
        if source is None:
            what = "tissue" if kind == "tissue" else "nuclei"
            show_warning(f"Slide analysis: no {what} to export")
            return None
        if path:
            target = Path(path)
        else:
            folder, note = export_folder(str(self.export_dir.value))
            if note:
                self.export_dir.value = folder
                self.export_note.value = note
                self.export_note.visible = True
            target = default_export_path(layer, kind, folder)
        job = _Export(kind, target)
        job.worker = create_worker(
            write_export, source, kind, target, progress=job.report,
            _start_thread=False, _ignore_errors=True,  # errored: said by _on_export_failed
        )  # fmt: skip
        job.worker.returned.connect(lambda written, job=job: self._on_export_done(job, written))
        job.worker.errored.connect(lambda exc, job=job: self._on_export_failed(job, exc))
        job.worker.finished.connect(lambda job=job: self._on_export_finished(job))
        job.timer = QTimer()
        job.timer.setInterval(100)
        job.timer.timeout.connect(lambda job=job: self._show_export_progress(job))
        self._export = job
        for button in self._export_buttons:
            button.enabled = False
        self.export_progress.visible = True
        self.export_status.visible = True
        self.export_status.value = f"Writing {export_words(kind)} to {target}…"
        self._show_export_progress(job)
        job.timer.start()
        job.worker.start()
        return job.worker

    @property
    def _export_buttons(self) -> list[PushButton]:
        return [self.export_tissue, self.export_nuclei, self.export_csv, self.export_parquet]

    def _show_export_progress(self, job: _Export) -> None:
        done, total = job.done, job.total
        bar = self.export_progress
        if total:
            bar.max, bar.value = total, done
            bar.native.setFormat(f"{export_words(job.kind)}: {done:,} / {total:,}")
        else:
            bar.native.setRange(0, 1)
            bar.native.setValue(0)
            bar.native.setFormat(f"{export_words(job.kind)}…")

    def _on_export_done(self, job: _Export, written: Any) -> None:
        from napari.utils.notifications import show_info

        seconds = time.monotonic() - job.started
        self.export_status.value = f"Wrote {written} ({duration(seconds)})"
        show_info(f"Slide analysis: wrote {written}")

    def _on_export_failed(self, job: _Export, exc: BaseException) -> None:
        from napari.utils.notifications import show_warning

        from napari_slidescope._io import one_line

        self.export_status.value = f"Export failed: {one_line(exc)}"
        show_warning(f"Slide analysis: export failed: {one_line(exc)}")

    def _on_export_finished(self, job: _Export) -> None:
        """Clean up after every export, written or failed (``finished`` always comes)."""
        if job.timer is not None:
            job.timer.stop()
            job.timer.deleteLater()
        if job.worker is not None:
            for signal in (job.worker.returned, job.worker.errored, job.worker.finished):
                try:
                    signal.disconnect()
                except (TypeError, RuntimeError):
                    pass
        job.worker = job.timer = None
        if self._export is job:
            self._export = None
        self.export_progress.visible = False
        for button in self._export_buttons:
            button.enabled = True


class _Export:
    """One export being written: its kind, target, worker and progress (set by the worker)."""

    def __init__(self, kind: ExportKind, target: Path) -> None:
        self.kind, self.target = kind, target
        self.done = self.total = 0
        self.started = time.monotonic()
        self.worker: Any = None
        self.timer: Any = None

    def report(self, done: int, total: int) -> None:
        """Progress from the worker thread: read by the main thread's timer."""
        self.done, self.total = done, total


def _spin(label: str, value: float, step: float) -> FloatSpinBox:
    """Return a spin box for an area (µm²) of the built-in segmenter."""
    spin = FloatSpinBox(label=label, value=value, min=0.0, max=1e6, step=step)
    spin.native.setSuffix(" µm²")
    return spin


def _run_shortcut(viewer: Any) -> None:
    widget = _WIDGETS.get(id(getattr(viewer, "__wrapped__", viewer)))
    if widget is not None:
        widget.run_on_view()


def _cancel_shortcut(viewer: Any) -> None:
    session.session_for(viewer).cancel()


_run_shortcut.__doc__ = "Slide analysis: run the chosen task on the current view"
_cancel_shortcut.__doc__ = "Slide analysis: cancel the run in flight"
