"""The "Slide analysis" dock widget: a magicgui view of :class:`~.session.SlideAnalysis`.

Pick a slide layer, a task (tissue or nuclei) and a scope (visible region or whole
slide), press Run: the analysis runs in the background, its tiles stream into
``"<slide> tissue"`` / ``"<slide> nuclei"``, and the widget shows the stage, a progress
bar with tiles done and the time left, then the result (marked partial after Cancel or
an error). All the work and state live in the controller, which the napari console
helpers (:mod:`napari_slidescope._qt.console`) share; this module only wires widgets.

Parameters are remembered between sessions (Qt's settings store, see :func:`settings_store`)
and "Restore defaults" brings back :func:`default_settings`, built from the analysis
packages' documented defaults. Shortcuts (napari key bindings on the viewer):
:data:`RUN_KEY` runs the task on the current view, :data:`CANCEL_KEY` cancels.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from magicgui.types import FileDialogMode
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    Container,
    FileEdit,
    FloatSpinBox,
    Image,
    Label,
    ProgressBar,
    PushButton,
    RadioButtons,
    SpinBox,
    Widget,
)
from qtpy.QtCore import QEvent, QObject, QSettings, Qt
from qtpy.QtWidgets import (
    QBoxLayout,
    QComboBox,
    QFrame,
    QLabel,
    QScrollArea,
    QSizePolicy,
)

from napari_slidescope._napari import jobs
from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._napari.shapes import tissue_export
from napari_slidescope._napari.viewport import camera_of
from napari_slidescope._qt import session
from napari_slidescope._warnings import SlidescopeWarning

__all__ = [
    "CANCEL_KEY",
    "MAX_WIDTH",
    "RUN_KEY",
    "SlideAnalysisWidget",
    "WidgetSettings",
    "default_export_folder",
    "default_settings",
    "settings_store",
]

#: Widest the widget grows (px): long names and messages wrap or elide instead.
MAX_WIDTH = 420
#: napari key binding that runs the chosen task on the current view.
RUN_KEY = "Control-Shift-R"
#: napari key binding that cancels the run in flight.
CANCEL_KEY = "Control-Shift-X"
#: Preview size (px) of the label image and of the macro image.
_LABEL_PX, _MACRO_PX = 150, 230
#: Tallest a preview is shown (px): the row of previews is as tall as the taller one.
_PREVIEW_MAX_H = 120
_SETTINGS_GROUP = "slide_analysis"
#: Least interval (s) between two progress updates of the widget within one stage.
_PROGRESS_S = 0.2


def _key_text(key: str) -> str:
    return key.replace("Control", "Ctrl").replace("-", "+")


@dataclass(frozen=True)
class WidgetSettings:
    """The widget's parameters (physical units), as remembered between sessions.

    Attributes
    ----------
    task : {"tissue", "nuclei"}
    scope : {"visible", "slide"}
    mode : {"add", "replace"}
        What a nuclei run does with the nuclei already found.
    segmenter : str
        Registered segmenter name.
    nuclei_mpp : float
        Nuclei working resolution, µm/px.
    tile_size_um : float
        Tile side, µm.
    min_area_um2, max_area_um2 : float
        Built-in segmenter: nucleus area range, µm².
    workers : int
        Worker threads (0: all cores but one).
    tissue_mpp : float
        Tissue working resolution, µm/px.
    min_tissue_um2, max_hole_um2 : float
        Smallest tissue piece kept and largest hole filled, µm².
    tissue_mode : {"auto", "brightfield", "fluorescence"}
    """

    task: str
    scope: str
    mode: str
    segmenter: str
    nuclei_mpp: float
    tile_size_um: float
    min_area_um2: float
    max_area_um2: float
    workers: int
    tissue_mpp: float
    min_tissue_um2: float
    max_hole_um2: float
    tissue_mode: str


def default_settings() -> WidgetSettings:
    """Return the defaults, taken from the analysis packages' documented constants.

    Nuclei: :class:`~napari_slidescope.analysis.brightfield_nuclei.NucleiParams` (the built-in
    segmenter's resolution and area range) and
    :data:`~napari_slidescope.pipeline.nuclei.DEFAULT_TILE_SIZE_UM`; tissue:
    :data:`~napari_slidescope.pipeline.tissue.DEFAULT_TARGET_MPP` and
    ``DEFAULT_MIN_TISSUE_UM2`` / ``DEFAULT_MAX_HOLE_UM2``.
    """
    from napari_slidescope.analysis.brightfield_nuclei import NucleiParams
    from napari_slidescope.pipeline import nuclei, tissue

    params = NucleiParams()
    return WidgetSettings(
        task="nuclei",
        scope="visible",
        mode="add",
        segmenter="auto",
        nuclei_mpp=0.0,  # "auto": segmenters.working_mpp decides, with the slide's own mpp
        tile_size_um=nuclei.DEFAULT_TILE_SIZE_UM,
        min_area_um2=params.min_area_um2,
        max_area_um2=params.max_area_um2,
        workers=0,
        tissue_mpp=tissue.DEFAULT_TARGET_MPP,
        min_tissue_um2=tissue.DEFAULT_MIN_TISSUE_UM2,
        max_hole_um2=tissue.DEFAULT_MAX_HOLE_UM2,
        tissue_mode="auto",
    )


def settings_error(path: str) -> OSError:
    """Why Qt could not write the settings file `path` (it reports no errno itself)."""
    import errno
    import shutil

    folder = os.path.dirname(path) or "."
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        full = shutil.disk_usage(folder).free == 0
    except OSError:
        full = False
    if full:
        return OSError(
            errno.ENOSPC, f"cannot write {path}: No space left on device (the disk is full)"
        )
    if not os.access(folder, os.W_OK):
        return PermissionError(errno.EACCES, f"cannot write {path}: permission denied")
    return OSError(errno.EIO, f"cannot write {path}: Qt could not save the settings file")


def settings_store() -> QSettings:
    """Qt's per-user settings file of this plugin (INI; tests move it with ``setPath``)."""
    return QSettings(
        QSettings.Format.IniFormat,
        QSettings.Scope.UserScope,
        "napari-slidescope",
        "slide-analysis",
    )


def _wrap(label: Label) -> None:
    """Let a label wrap and never ask for more width than the dock has."""
    native = label.native
    if isinstance(native, QLabel):
        native.setWordWrap(True)
        native.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    native.setMinimumWidth(50)


class _ClickFilter(QObject):
    """Call `callback` when the watched widget is clicked."""

    def __init__(self, callback: Any) -> None:
        super().__init__()
        self._callback = callback

    def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.MouseButtonRelease:
            self._callback()
            return True
        return False


class _FitWidth(QObject):
    """Keep a scroll area as wide as its form needs, with a vertical scroll bar beside it.

    At most :data:`MAX_WIDTH` unless the form cannot be narrower (a large font): the form
    is never cut off at the side. Refitted whenever the form's layout changes.
    """

    def __init__(self, scroll: QScrollArea, inner: Any) -> None:
        super().__init__()
        self._scroll, self._inner = scroll, inner

    def fit(self) -> None:
        bar = self._scroll.verticalScrollBar()
        # what the scroll area takes beside the form: the bar and the frame on both sides
        extent = (bar.sizeHint().width() if bar is not None else 0) + 2 * self._scroll.frameWidth()
        need = self._inner.minimumSizeHint().width() + extent
        widest = max(MAX_WIDTH, need)
        self._scroll.setMinimumWidth(need)
        self._scroll.setMaximumWidth(widest)
        self._inner.setMaximumWidth(widest - extent)

    def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 - Qt's name
        if event.type() in self._REFIT:
            self.fit()
        return False

    # the form's layout changed, or a style sheet (napari's theme) changed the frame or bar
    _REFIT = (QEvent.Type.LayoutRequest, QEvent.Type.StyleChange, QEvent.Type.Polish)


_WIDGETS: weakref.WeakValueDictionary[int, SlideAnalysisWidget] = weakref.WeakValueDictionary()


class SlideAnalysisWidget(Container):
    """Analyse the visible region or the whole slide, in the background.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari when docked from the Plugins menu).
    """

    def __init__(self, napari_viewer: Any) -> None:
        from napari_slidescope.segmenters import available_segmenters

        # scrollable: when the dock is shorter than the form (a small screen, other docks
        # beside it), a scroll bar appears instead of squeezing (clipping) the controls
        super().__init__(name="slide_analysis", labels=True, scrollable=True)
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.controller = session.controller_for(self._viewer)
        self._loading = False  # True while settings are applied (nothing is saved)
        self._settings_failed = False  # the settings file could not be written
        self._thumb_token = 0
        self._shown_stage, self._shown_at = "", 0.0
        self._associated: dict[str, np.ndarray] = {}
        d = default_settings()

        self.image = ComboBox(label="Slide", choices=self._image_choices, nullable=True)
        combo = self.image.native
        if isinstance(combo, QComboBox):  # a long slide name must not widen the dock
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(12)
        self.info = Label(label="", value="")
        self.label_image = Image(label="Label")
        self.macro_image = Image(label="Macro")
        for img in (self.label_image, self.macro_image):
            # magicgui's Image ignores its size hint (0 px tall under a dock's stretch):
            # a fixed height, set when an image is shown, makes the row as tall as it
            img.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            img.native.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.thumbnails = Container(
            widgets=[self.label_image, self.macro_image],
            layout="horizontal",
            labels=False,
            visible=False,
        )
        self._click_filters = []
        for key, img in (("label", self.label_image), ("macro", self.macro_image)):
            filt = _ClickFilter(lambda key=key: self.open_associated(key))
            img.native.installEventFilter(filt)
            img.native.setCursor(Qt.CursorShape.PointingHandCursor)
            img.tooltip = f"The slide's {key} image: click to open it as a layer"
            self._click_filters.append(filt)

        self.task = RadioButtons(
            label="Task",
            choices=[("Detect tissue", "tissue"), ("Segment nuclei", "nuclei")],
        )
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
        # nuclei parameters
        self.mode = ComboBox(
            label="Nuclei layer",
            choices=[("Add (skip duplicates)", "add"), ("Replace", "replace")],
            value=d.mode,
        )
        installed = available_segmenters()
        self.segmenter = ComboBox(label="Segmenter", choices=["auto", *installed])
        self.segmenter.tooltip = (
            "auto: InstanSeg for the stain when installed, else the built-in method; "
            "installed: " + ", ".join(installed)
        )
        # which model "auto" runs on this slide, and which models are installed, in view
        self.models = Label(label="Models", value=_models_text(None, "auto"))
        _wrap(self.models)
        # 0 reads "auto": the segmenter's resolution, never finer than the slide's own
        # (unrounded) pixel size, as segmenters.working_mpp decides for every entry point
        self.nuclei_mpp = _spin("Resolution (µm/px)", d.nuclei_mpp, (0.0, 8.0), 0.05)
        self.nuclei_mpp.native.setSpecialValueText("auto")
        self.channel = ComboBox(label="Nuclear channel", choices=self._channel_choices)
        self.tile_size_um = _spin("Tile size (µm)", d.tile_size_um, (32.0, 8192.0), 64.0)
        self.min_area_um2 = _spin("Nucleus area min (µm²)", d.min_area_um2, (0.0, 1e6), 5.0)
        self.max_area_um2 = _spin("Nucleus area max (µm²)", d.max_area_um2, (0.0, 1e6), 10.0)
        self.workers = SpinBox(label="Workers (0: all)", value=d.workers, min=0, max=256)
        # tissue parameters
        self.tissue_mpp = _spin("Resolution (µm/px)", d.tissue_mpp, (0.5, 128.0), 1.0)
        self.min_tissue_um2 = _spin("Smallest piece (µm²)", d.min_tissue_um2, (0.0, 1e12), 100.0)
        self.max_hole_um2 = _spin("Fill holes below (µm²)", d.max_hole_um2, (0.0, 1e12), 100.0)
        self.tissue_mode = ComboBox(
            label="Stain", choices=["auto", "brightfield", "fluorescence"], value=d.tissue_mode
        )
        self.nuclei_params = Container(
            widgets=[self.mode, self.segmenter, self.models, self.nuclei_mpp, self.tile_size_um],
            labels=True,
        )
        nuclei_advanced: list[Widget] = [
            self.channel,
            self.min_area_um2,
            self.max_area_um2,
            self.workers,
        ]
        self.nuclei_advanced = Container(widgets=nuclei_advanced, labels=True)
        self.tissue_params = Container(widgets=[self.tissue_mpp, self.min_tissue_um2], labels=True)
        tissue_advanced: list[Widget] = [self.tissue_mode, self.max_hole_um2]
        self.tissue_advanced = Container(widgets=tissue_advanced, labels=True)
        self.show_advanced = CheckBox(text="Advanced options", value=False)
        self.advanced = Container(
            widgets=[self.nuclei_advanced, self.tissue_advanced], labels=False, visible=False
        )

        self.run_button = PushButton(text="Run")
        self.cancel_button = PushButton(text="Cancel", enabled=False)
        self.cancel_button.tooltip = f"Stop the run; finished tiles stay ({_key_text(CANCEL_KEY)})"
        self.progress = ProgressBar(value=0, min=0, max=1, visible=False)
        self.status = Label(label="Status", value="Ready")
        self.summary = Label(label="Result", value="–")
        for label in (self.info, self.status, self.summary):
            _wrap(label)
        # its text changes with every tile: it must never change the dock's width
        self.progress.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.export_dir = FileEdit(
            label="Export to", mode=FileDialogMode.EXISTING_DIRECTORY, value=Path.cwd()
        )
        # said when the slide's own folder is read-only and exports go elsewhere
        self.export_note = Label(label="", value="", visible=False)
        _wrap(self.export_note)
        self.export_tissue = PushButton(text="Tissue GeoJSON")
        self.export_nuclei = PushButton(text="Nuclei GeoJSON")
        self.export_csv = PushButton(text="Nuclei CSV")
        self.show_table = PushButton(text="Measurements table")
        self.show_table.tooltip = "One row per nucleus, a range filter and a histogram"
        self.restore_defaults = PushButton(text="Restore defaults")
        self.restore_defaults.tooltip = "Set every parameter back to its documented default"
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
                Container(
                    widgets=[self.show_table, self.restore_defaults],
                    layout="horizontal",
                    labels=False,
                ),
            ]
        )
        self.margins = (4, 4, 4, 4)
        self._fit_scroll_area()

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
        for widget in self._setting_widgets().values():
            widget.changed.connect(self._on_setting_changed)
        self.controller.started.connect(self._on_started)
        self.controller.progress.connect(self._on_progress)
        self.controller.finished.connect(self._on_finished)
        layers_events = self._viewer.layers.events
        layers_events.inserted.connect(self._on_layers_changed)
        layers_events.removed.connect(self._on_layers_changed)
        camera = camera_of(self._viewer)
        camera.events.center.connect(self._update_run_button)
        camera.events.zoom.connect(self._update_run_button)
        self._bind_keys()
        self.load_settings()
        self._on_layers_changed()
        self._on_image(self.image.value)
        self._on_task()

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
        self._width_filter = _FitWidth(scroll, inner)
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

    def _setting_widgets(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(WidgetSettings)}

    def settings(self) -> WidgetSettings:
        """Return the parameters as the widgets show them."""
        d = default_settings()
        values = {}
        for name, widget in self._setting_widgets().items():
            value = widget.value
            values[name] = type(getattr(d, name))(value) if value is not None else getattr(d, name)
        return WidgetSettings(**values)

    def apply_settings(self, settings: WidgetSettings) -> None:
        """Show `settings` in the widgets (values a widget cannot take are left as they are)."""
        self._loading = True
        try:
            for name, widget in self._setting_widgets().items():
                value = getattr(settings, name)
                choices = getattr(widget, "choices", None)
                if choices is not None and value not in choices:
                    continue
                try:
                    widget.value = value
                except (ValueError, TypeError):
                    continue
        finally:
            self._loading = False

    def load_settings(self) -> None:
        """Show the parameters remembered from the last session (defaults where none)."""
        store = settings_store()
        store.beginGroup(_SETTINGS_GROUP)
        d = default_settings()
        values = {}
        for f in dataclasses.fields(WidgetSettings):
            default = getattr(d, f.name)
            raw = store.value(f.name, None)
            try:
                values[f.name] = default if raw is None else type(default)(raw)
            except (TypeError, ValueError):
                values[f.name] = default
        store.endGroup()
        self.apply_settings(WidgetSettings(**values))

    def save_settings(self) -> None:
        """Remember the parameters shown now.

        Raises
        ------
        OSError
            ``cannot write PATH: CAUSE`` when the settings file cannot be written (a full
            disk, no permission); Qt writes it atomically, so the earlier file is kept.
        """
        store = settings_store()
        store.beginGroup(_SETTINGS_GROUP)
        for name, value in dataclasses.asdict(self.settings()).items():
            store.setValue(name, value)
        store.endGroup()
        store.sync()
        if store.status() != QSettings.Status.NoError:
            raise settings_error(store.fileName())

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
        return [(ly.name, ly) for ly in jobs.slide_layers(self._viewer)]

    def _on_layers_changed(self, event: Any = None) -> None:
        before = self.image.value
        self.image.reset_choices()
        if self.image.value is None:
            try:
                self.image.value = jobs.active_slide_layer(self._viewer)
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
            self.models.value = _models_text(None, name or "auto")
            return
        src = jobs.SlideSource.from_layer(layer)
        self.models.value = _models_text(jobs.source_input(src), name or "auto")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlidescopeWarning)  # uncalibrated: said on run
            mpp = jobs.nuclei_mpp(src, {"segmenter": name or "auto"})
        self.nuclei_mpp.tooltip = f"auto: {mpp:.4g} µm/px for {name or 'auto'} on this slide"

    def _channel_choices(self, _widget: Any = None) -> list[str]:
        """``auto`` and the chosen slide's channels (red, green, blue: RGB fluorescence)."""
        layer = getattr(self, "image", None) and self.image.value
        if layer is None:
            return ["auto"]
        src = jobs.SlideSource.from_layer(layer)
        names = list(src.info.get("channel_names") or []) if src.info.get("axes") == "CYX" else []
        if not names and jobs.source_input(src) == "fluorescence":  # RGB-encoded
            names = ["red", "green", "blue"]
        return ["auto", *names]

    def _on_image(self, layer: Any) -> None:
        self._thumb_token += 1
        self._associated = {}
        self.thumbnails.visible = False
        for img in (self.label_image, self.macro_image):
            img.visible = False
        self._update_run_button()
        if layer is None:
            self.info.value = "Open a slide (a 2D RGB image layer)"
            return
        src = jobs.SlideSource.from_layer(layer)
        self.info.value = _describe(src)
        self.channel.reset_choices()
        self.channel.value = "auto"
        self._on_segmenter(self.segmenter.value)
        folder, note = default_export_folder(src.path)
        self.export_dir.value = folder
        self.export_dir.tooltip = note or f"Exports are written to this folder ({folder})"
        self.export_note.value = note
        self.export_note.visible = bool(note)
        if src.path and {"label", "macro"} & set(src.info.get("associated", [])):
            from napari.qt.threading import create_worker

            token = self._thumb_token
            worker = create_worker(_load_associated, src.path, _start_thread=False)
            worker.returned.connect(lambda images: self._show_thumbnails(images, token))
            worker.start()

    def _show_thumbnails(self, images: dict[str, np.ndarray], token: int = -1) -> None:
        if token not in (-1, self._thumb_token):
            return  # the slide changed while they were read
        self._associated = dict(images)
        for key, widget, px in (
            ("label", self.label_image, _LABEL_PX),
            ("macro", self.macro_image, _MACRO_PX),
        ):
            if key in images:
                preview = _preview(images[key], px)
                widget.value = preview
                widget.native.setFixedHeight(min(preview.shape[0], _PREVIEW_MAX_H))
                widget.visible = self.thumbnails.visible = True

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
        """Return the run's keyword arguments, from the widgets (physical units)."""
        tissue = {
            "target_mpp": float(self.tissue_mpp.value),
            "min_tissue_um2": float(self.min_tissue_um2.value),
            "max_hole_um2": float(self.max_hole_um2.value),
            "mode": self.tissue_mode.value,
        }
        segmenter = self.segmenter.value or "auto"
        seg_opts = {}
        if segmenter == "builtin":
            seg_opts = {
                "min_area_um2": float(self.min_area_um2.value),
                "max_area_um2": float(self.max_area_um2.value),
            }
        nuclei = {
            "target_mpp": float(self.nuclei_mpp.value) or None,  # 0: "auto"
            "tile_size_um": float(self.tile_size_um.value),
            "segmenter": segmenter,
            "segmenter_options": seg_opts,
            "channel": None if self.channel.value == "auto" else self.channel.value,
            "workers": int(self.workers.value) or None,
        }
        return {"tissue_options": tissue, "nuclei_options": nuclei}

    def why_not_runnable(self) -> str | None:
        """Why Run is disabled now (None when it can run)."""
        layer = self.image.value
        if layer is None:
            return "Open a slide first (File ▸ Open, or File ▸ Open Sample ▸ Slidescope)"
        if self.controller.busy:
            return f"A run is in progress: Cancel it first ({_key_text(CANCEL_KEY)})"
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
            f"Run the chosen task ({_key_text(RUN_KEY)} runs it on the current view)"
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
            return self.controller.run(
                layer,
                self.task.value,
                scope=cast(jobs.Scope, scope or self.scope.value),
                mode=self.mode.value,
                **self.run_options(),
            )
        except ValueError as exc:  # e.g. nothing of the slide on screen
            self.status.value = f"Not started: {exc}"
            show_warning(f"Slide analysis: {exc}")
            return None

    def run_on_view(self) -> Any:
        """Run the chosen task on the current view (the run shortcut); None if busy."""
        if self.controller.busy:
            return None
        return self.run("visible")

    def cancel(self) -> None:
        """Cancel the run in flight (finished tiles stay; the result is marked partial)."""
        self.controller.cancel()

    def _on_started(self, task: str) -> None:
        self._shown_stage = ""
        self.cancel_button.enabled = True
        self.summary.value = "–"
        self.progress.visible = True
        self._update_run_button()

    def _on_progress(self, prog: session.Progress) -> None:
        now = time.monotonic()
        last = prog.total and prog.done >= prog.total
        if prog.stage == self._shown_stage and now - self._shown_at < _PROGRESS_S and not last:
            return  # a few updates a second are enough to read; each relays out the dock
        self._shown_stage, self._shown_at = prog.stage, now
        bar = self.progress.native
        if prog.total:
            self.progress.max = prog.total
            self.progress.value = prog.done
            eta = f" · about {_duration(prog.eta_s)} left" if prog.eta_s is not None else ""
            bar.setFormat(f"{prog.done:,} / {prog.total:,} tiles")
            self.status.value = f"{prog.words}: {prog.done:,} of {prog.total:,} tiles{eta}"
        else:
            # the count is not known yet; no busy indicator: its animation repaints
            # the dock continuously, which costs the canvas frames
            bar.setRange(0, 1)
            bar.setValue(0)
            bar.setFormat(f"{prog.words}…")
            self.status.value = f"{prog.words}…"

    def _on_finished(self, summary: Any) -> None:
        busy = self.controller.busy
        self.cancel_button.enabled = busy
        self.progress.visible = busy
        self._update_run_button()
        if busy:
            return  # a new run already started
        out = self.controller.outcome
        if out is None:
            self.status.value = "Ready"
            return
        self.status.value = _outcome_words(out)
        if out.task == "tissue":
            self.summary.value = _tissue_words(out.tissue)
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
        target = Path(path) if path else Path(str(self.export_dir.value)) / f"{stem}{suffix[kind]}"
        result: Any = None
        if kind == "tissue":
            name = f"{layer.name} tissue"
            tl = self._viewer.layers[name] if name in self._viewer.layers else None
            result = tissue_export(tl) if tl is not None else None
        else:
            name = f"{layer.name} nuclei"
            nl = self._viewer.layers[name] if name in self._viewer.layers else None
            canvas = canvas_of(nl) if nl is not None else None
            result = canvas.to_result() if canvas is not None else None
        if result is None:
            show_warning(f"Slide analysis: no {kind if kind != 'csv' else 'nuclei'} to export")
            return None
        try:
            if kind == "csv":
                result.to_csv(target)
            else:
                result.to_geojson(target)
        except OSError as exc:  # a full disk: nothing written, an earlier file kept
            show_warning(f"Slide analysis: export failed: {exc}")
            return None
        show_info(f"Slide analysis: wrote {target}")
        return target


def default_export_folder(slide_path: str | None) -> tuple[Path, str]:
    """Return the folder exports go to by default, and a note when it is not the slide's.

    The slide's own folder when a file can be written there (see
    :func:`napari_slidescope._io.is_writable_folder`); else the first writable one of
    the current folder, the home folder and the temporary folder, with a note saying
    so (``""`` when the slide's folder is used).
    """
    from napari_slidescope._io import is_writable_folder

    own = Path(slide_path).parent if slide_path else Path.cwd()
    if is_writable_folder(own):
        return own, ""
    for other in (Path.cwd(), Path.home(), Path(tempfile.gettempdir())):
        if is_writable_folder(other):
            return other, f"{own} is read-only: exports go to {other}"
    return own, f"{own} is read-only: choose a folder to export to"


def _models_text(kind: str | None, name: str) -> str:
    """Say on the "Models" line which model runs, what is missing, what is installed.

    `kind` is the slide's ``"brightfield"`` or ``"fluorescence"`` (None: no slide yet).
    """
    from napari_slidescope.segmenters import registry

    installed = ", ".join(registry.available_segmenters())
    if kind is None:
        return f"installed: {installed}"
    if name != "auto":
        return f"{name} on this {kind} slide; installed: {installed}"
    chosen = registry.resolve_auto(cast(Any, kind), warn=False)
    learned, _builtin = registry.auto_choices(cast(Any, kind))
    if chosen == learned:
        return f"auto runs {chosen} on this {kind} slide; installed: {installed}"
    return (
        f"auto runs {chosen} on this {kind} slide: {learned} is not installed (see the "
        f"README, Segmenters); installed: {installed}"
    )


def _spin(label: str, value: float, limits: tuple[float, float], step: float) -> FloatSpinBox:
    """Return a spin box for one physical parameter (`label` names its unit)."""
    return FloatSpinBox(label=label, value=value, min=limits[0], max=limits[1], step=step)


def _run_shortcut(viewer: Any) -> None:
    widget = _WIDGETS.get(id(getattr(viewer, "__wrapped__", viewer)))
    if widget is not None:
        widget.run_on_view()


def _cancel_shortcut(viewer: Any) -> None:
    session.controller_for(viewer).cancel()


_run_shortcut.__doc__ = "Slide analysis: run the chosen task on the current view"
_cancel_shortcut.__doc__ = "Slide analysis: cancel the run in flight"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def _outcome_words(out: session.Outcome) -> str:
    """Say how a run ended: ``"Cancelled: 37 of 120 tiles"``."""
    tiles = f"{out.tiles_done:,} of {out.tiles_total:,} tiles" if out.tiles_total else ""
    if out.state == "done":
        return f"Done: {tiles}" if tiles else "Done"
    if out.state == "cancelled":
        return f"Cancelled: {tiles}" if tiles else "Cancelled before any tile finished"
    error = (out.error or "").split(" failed: ", 1)[-1][:200]
    return f"Failed after {tiles}: {error}" if tiles else f"Failed: {error}"


def _tissue_words(result: Any) -> str:
    if result is None:
        return "–"
    parts = []
    if result.area_um2 is not None:
        parts.append(f"Tissue {result.area_um2 / 1e6:,.2f} mm²")
    else:
        parts.append(f"Tissue {result.area_px:,.0f} px² (uncalibrated)")
    parts.append(f"{100 * result.fraction:.0f}% of the area analysed")
    return " · ".join(parts)


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


def _preview(img: np.ndarray, px: int) -> np.ndarray:
    """Shrink an RGB image (nearest pixel) so that its longer side is at most `px`."""
    step = max(1, int(np.ceil(max(img.shape[:2]) / px)))
    return np.ascontiguousarray(img[::step, ::step, :3])


def _load_associated(path: str) -> dict[str, np.ndarray]:
    """Read the slide's label and macro images (worker thread)."""
    from napari_slidescope._napari.reader import source_for
    from napari_slidescope.slide import open_slide

    out = {}
    with open_slide(source_for(path)) as slide:
        for key in ("label", "macro"):
            if key in slide.associated:
                out[key] = np.ascontiguousarray(np.asarray(slide.associated[key])[..., :3])
    return out
