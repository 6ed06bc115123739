"""The "Tissue regions" dock: a pixel classifier trained from strokes, previewed live.

QuPath's pixel-classifier workflow on a slide layer of this plugin: a list of classes (name
and colour; an ``Ignore`` class is classified but left out of area percentages), one Shapes
layer of examples whose ``class`` feature says which class each stroke or polygon teaches
(so it round-trips as QuPath classified annotations, and a QuPath GeoJSON of them loads as
examples), a working resolution in µm/px. "Live preview" retrains after the strokes change
and classifies the region in view after the view moves (debounced, on a worker thread; the
status says how long it took). "Run on slide" classifies the tissue of the whole slide on a
worker thread, painting tiles into a class-map Labels layer as they come, with progress and
cancel, then lists area and percentage per class (and per shape of a chosen annotations
layer). The GUI-free work is :func:`~napari_slidescope.train_region_classifier` and
:func:`~napari_slidescope.classify_regions`; this module only wires it to the viewer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtCore import QObject, Qt, QTimer, Signal
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from napari_slidescope._napari.jobs import SlideSource, slide_layers
from napari_slidescope._qt.class_list import ClassList, ClassListOwner, class_icon
from napari_slidescope._qt.lifetime import attach
from napari_slidescope.errors import Cancelled
from napari_slidescope.pipeline.task_table import task

__all__ = ["RegionsWidget"]

#: The classes a new dock starts with (the synthetic regions' names, and Ignore).
DEFAULT_CLASSES: dict[str, tuple[int, int, int]] = {
    "Tumor": (200, 0, 0),
    "Stroma": (60, 190, 110),
    "Necrosis": (150, 100, 50),
    "Fat": (240, 228, 66),
    "Lymphocytes": (0, 114, 178),
    "Ignore": (160, 160, 160),
}
_EXTRA = ((0, 160, 120), (255, 128, 0), (128, 0, 160), (0, 180, 220), (120, 120, 0))
#: Quiet time (ms) after a stroke or a pan before the preview runs.
DEBOUNCE_MS = 400
#: Largest view (working pixels) the live preview classifies; a larger one is cropped to
#: its centre so that an update stays under a second or so.
PREVIEW_MAX_PX = 1024


def _next_colour(_name: str, taken: Mapping[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    """Return the colour of a class added without one: the next of a few distinct ones."""
    return _EXTRA[len(taken) % len(_EXTRA)]


class _Bridge(QObject):
    """Signals a worker thread emits; Qt delivers them on the GUI thread."""

    started = Signal(object)  # the working grid (shape, downsample)
    tile = Signal(object, object)  # (box in the map, labels)
    progress = Signal(int, int)
    trained = Signal(object, object)  # preview: (classifier, the examples' signature)
    preview_map = Signal(object, object)  # preview: the map being filled, boxes already in
    preview_tile = Signal(object, object, object)  # preview: (that map, a box, its classes)
    preview_progress = Signal(int, int)  # preview: tiles in, of those with tissue


class RegionsWidget(ClassListOwner, QWidget):
    """Classes, stroke examples, live preview and whole-slide run of a region classifier.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari when docked from the Plugins menu).
    """

    #: a KeyError (an unknown name) is said in the status line too, as this dock always did
    _REPORTED = (ValueError, OSError, ImportError, KeyError)

    # the live preview's state (set by preview() and its slots)
    _preview_cancel: threading.Event | None = None
    _preview_layer: Any = None
    _preview_shown: Any = None  # the map being filled (or filled last)
    _preview_display: Any = None  # what the layer shows: the previous classes until replaced
    _preview_wired = False

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.classifier: Any = None
        self.regions: Any = None
        self.preview_regions: Any = None
        self.last_preview_s: float | None = None
        self._trained_on: Any = None
        self._signed: tuple | None = None
        self._image: Any = None
        self._shapes: Any = None
        self._preview_worker: Any = None
        self._preview_again = False
        self._run_worker: Any = None
        self._cancel: threading.Event | None = None
        self._run_layer: Any = None
        self._run_labels: np.ndarray | None = None
        self._painted_at = 0.0
        self._bridge = _Bridge()
        self._opened = _OpenSlide()
        self.destroyed.connect(self._opened.close)

        self.layer_box = QComboBox()
        #: The classes' names and colours (the list, its buttons and dialogs).
        self.class_editor = ClassList(
            "Classes (the selected one is what new shapes teach)", _next_colour, height=120
        )
        self.mpp_box = QDoubleSpinBox()
        self.mpp_box.setRange(0.25, 32.0)
        self.mpp_box.setDecimals(2)
        self.mpp_box.setSingleStep(0.5)
        self.mpp_box.setSuffix(" µm/px")
        from napari_slidescope.pipeline.region_classifier import DEFAULT_REGION_MPP

        self.mpp_box.setValue(DEFAULT_REGION_MPP)
        self.mpp_box.setToolTip(
            "Working resolution: features and the class map are computed at this pixel size"
        )
        self.examples_button = QPushButton("Load examples…")
        self.examples_button.setToolTip("Classified annotations of a QuPath GeoJSON as examples")
        self.live = QCheckBox("Live preview (region in view)")
        self.live.setChecked(True)
        self.annotations_box = QComboBox()
        self.annotations_box.setToolTip("Shapes whose area per class the table lists too")
        self.tissue_only = QCheckBox("Tissue only (skip glass)")
        self.tissue_only.setChecked(True)
        from napari_slidescope.pipeline.region_map import TISSUE_ENVELOPE_UM, TISSUE_MAX_HOLE_UM2

        self.tissue_only.setToolTip(
            "On: glass stays unclassified and tiles without tissue are skipped; the tissue "
            "includes pale fat open to the glass at the section's edge (its membranes closed "
            f"over about an adipocyte's radius, {TISSUE_ENVELOPE_UM:g} µm) and holes up to "
            f"{TISSUE_MAX_HOLE_UM2 / 1e6:g} mm². Off: every pixel gets a class, glass too"
        )
        self.run_button = QPushButton("Run on slide")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel("Draw a few strokes of each class on the slide")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Class", "Area (mm²)", "%"])
        header = self.table.verticalHeader()
        if header is not None:
            header.setVisible(False)
        self.table.setMinimumHeight(140)
        self.save_button = QPushButton("Save classifier…")
        self.load_button = QPushButton("Load classifier…")
        self.export_button = QPushButton("Export regions GeoJSON…")

        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(QLabel("Slide"))
        row.addWidget(self.layer_box, 1)
        lay.addLayout(row)
        lay.addWidget(self.class_editor)
        row = QHBoxLayout()
        row.addWidget(QLabel("Resolution"))
        row.addWidget(self.mpp_box, 1)
        row.addWidget(self.examples_button)
        lay.addLayout(row)
        lay.addWidget(self.live)
        lay.addWidget(self.tissue_only)
        row = QHBoxLayout()
        row.addWidget(self.run_button, 1)
        row.addWidget(self.cancel_button)
        lay.addLayout(row)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        row = QHBoxLayout()
        row.addWidget(QLabel("Areas in"))
        row.addWidget(self.annotations_box, 1)
        lay.addLayout(row)
        lay.addWidget(self.table)
        row = QHBoxLayout()
        row.addWidget(self.save_button)
        row.addWidget(self.load_button)
        lay.addLayout(row)
        lay.addWidget(self.export_button)
        lay.addStretch(1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.preview)

        self.class_editor.changed.connect(self._on_class_change)
        self.class_editor.selected.connect(lambda *_: self._on_class_choice())
        self.class_editor.failed.connect(self.status.setText)
        self.examples_button.clicked.connect(self._on_load_examples)
        self.run_button.clicked.connect(lambda: self._report(self.run_on_slide))
        self.cancel_button.clicked.connect(self.cancel)
        self.save_button.clicked.connect(self._on_save)
        self.load_button.clicked.connect(self._on_load)
        self.export_button.clicked.connect(self._on_export)
        self.annotations_box.currentIndexChanged.connect(lambda *_: self._show_areas())
        self.mpp_box.valueChanged.connect(lambda *_: self._examples_changed())
        self.live.toggled.connect(lambda on: self._schedule() if on else None)
        self.tissue_only.toggled.connect(lambda *_: self._schedule())
        self.layer_box.currentIndexChanged.connect(self._on_layer_choice)
        self._bridge.started.connect(self._on_run_started)
        self._bridge.tile.connect(self._on_tile)
        self._bridge.progress.connect(self._on_progress)
        from napari_slidescope._napari.viewport import camera_of

        camera = camera_of(self._viewer)
        attach(
            self,
            [
                (self._viewer.layers.events.inserted, self._refresh_layers),
                (self._viewer.layers.events.removed, self._refresh_layers),
                (camera.events.center, self._on_view),
                (camera.events.zoom, self._on_view),
            ],
        )
        self.class_editor.set_classes(DEFAULT_CLASSES)
        self._refresh_layers()

    # -- layers ---------------------------------------------------------------------------
    @property
    def image(self) -> Any:
        """The slide layer the classifier is trained on and applied to (None without one)."""
        return self._image

    @property
    def shapes(self) -> Any:
        """The Shapes layer of examples (its ``class`` feature names each shape's class)."""
        return self._shapes

    def _refresh_layers(self, _event: Any = None) -> None:
        slides = slide_layers(self._viewer)
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        for ly in slides:
            self.layer_box.addItem(ly.name)
        self.layer_box.blockSignals(False)
        if self._image in slides:
            self.layer_box.setCurrentIndex(slides.index(self._image))
        elif slides:
            self.layer_box.setCurrentIndex(0)
            self._on_layer_choice()
        else:
            self._image = None
        mine = {self._shapes, self._run_layer}
        current = self.annotations_box.currentText()
        names = [
            ly.name
            for ly in self._viewer.layers
            if type(ly).__name__ == "Shapes" and ly not in mine
        ]
        self.annotations_box.blockSignals(True)
        self.annotations_box.clear()
        self.annotations_box.addItem("(whole slide)")
        self.annotations_box.addItems(names)
        if current in names:
            self.annotations_box.setCurrentIndex(names.index(current) + 1)
        self.annotations_box.blockSignals(False)

    def _on_layer_choice(self, _index: int = 0) -> None:
        slides = slide_layers(self._viewer)
        i = self.layer_box.currentIndex()
        image = slides[i] if 0 <= i < len(slides) else None
        if image is self._image:
            return
        self._image = image
        self.classifier = self._trained_on = self.regions = None
        self._shapes = None
        if image is not None:
            self._examples_layer()

    def _examples_layer(self) -> Any:
        """Return the slide's Shapes layer of examples (made, or found by name, when missing)."""
        image = self._image
        if image is None:
            raise ValueError("Tissue regions: open a slide first")
        if self._shapes is not None and self._shapes in self._viewer.layers:
            return self._shapes
        from napari_slidescope._napari.shapes import aligned

        name = f"{image.name} region examples"
        if name in self._viewer.layers:
            layer = self._viewer.layers[name]
        else:
            layer = self._viewer.add_shapes(
                name=name,
                ndim=2,
                features={"class": np.array([], dtype=object)},
                edge_width=self._edge_px(),
                opacity=0.9,
                **aligned(image),
            )
        self._shapes = layer
        # the layer outlives the dock: followed until the dock is gone (connecting a layer
        # found again is a no-op: napari keeps one connection per slot)
        attach(self, [(layer.events.data, self._on_shapes_data)])
        self._on_class_choice()
        self._viewer.layers.selection.active = layer
        self._refresh_layers()
        return layer

    def _edge_px(self) -> float:
        """Return the stroke width the classifier learns (µm) in the slide's level-0 pixels."""
        from napari_slidescope.pipeline.region_classifier import DEFAULT_STROKE_UM

        mpp0 = float(np.mean(np.asarray(self._image.scale, float)[-2:]))
        return DEFAULT_STROKE_UM / mpp0 if mpp0 > 0 else 8.0

    # -- classes ------------------------------------------------------------------------
    def _on_class_change(self, kind: str, old: str | None, new: str | None) -> None:
        """Make the example shapes follow a renamed or removed class; retrain if needed."""
        if kind == "added":
            return  # a class without examples: nothing the classifier learns changed
        layer = self._shapes
        if kind == "renamed" and layer is not None and len(layer.data):
            feats = layer.features.copy()
            feats["class"] = [new if c == old else c for c in feats["class"]]
            layer.features = feats
        if kind == "removed" and layer is not None and len(layer.data):
            drop = {i for i, c in enumerate(layer.features["class"]) if c == old}
            if drop:
                layer.selected_data = drop
                layer.remove_selected()
        if kind != "removed":
            self._on_class_choice()
        self._examples_changed()

    def _on_class_choice(self) -> None:
        layer, name = self._shapes, self.current_class
        if layer is None or name is None:
            return
        layer.feature_defaults = {"class": name}
        rgb = np.array([*(v / 255 for v in self.class_editor.color(name)), 1.0])
        layer.current_edge_color = rgb
        layer.current_face_color = np.array([*rgb[:3], 0.25])

    # -- examples -----------------------------------------------------------------------
    def add_examples(self, examples: dict[str, list[Any]]) -> None:
        """Add shapes to the examples layer: class -> polygons or strokes, level-0 (row, col).

        A ``(2, 2)`` array or a :class:`~napari_slidescope.Stroke` becomes a path (a stroke),
        an ``(N, 2)`` array with N >= 3 a polygon; classes not listed yet join the list.
        """
        from napari_slidescope._napari.shapes import to_layer_coords

        layer = self._examples_layer()
        for name in examples:
            if name not in self.classes:
                self.add_class(name)
        data, kinds, classes = [], [], []
        for name, items in examples.items():
            for item in items:
                verts = np.asarray(getattr(item, "vertices", item), float)
                is_line = hasattr(item, "vertices") or len(verts) == 2
                data.append(to_layer_coords(verts))
                kinds.append("path" if is_line else "polygon")
                classes.append(name)
        if not data:
            return
        with layer.events.data.blocker():
            layer.add(data, shape_type=kinds)
            feats = layer.features.copy()
            feats.loc[feats.index[-len(classes) :], "class"] = classes
            layer.features = feats
        self._on_shapes_data()

    def load_examples(self, path: str | Path) -> int:
        """Load the classified annotations of a QuPath GeoJSON as examples; return how many."""
        from napari_slidescope.pipeline.region_classifier import _from_geojson

        examples, colours = _from_geojson(Path(path))
        for name, rgb in colours.items():
            if name not in self.classes:
                self.add_class(name, rgb)
        self.add_examples(examples)
        n = sum(len(v) for v in examples.values())
        self.status.setText(f"Loaded {n} examples from {Path(path).name}")
        return n

    def examples(self) -> dict[str, list[Any]]:
        """Return the examples drawn: class -> polygons and strokes (level-0), known classes."""
        from napari_slidescope._napari.regions import examples_from_shapes

        if self._shapes is None:
            return {}
        found = examples_from_shapes(self._shapes)
        return {c: found[c] for c in self.classes if c in found}

    def _on_shapes_data(self, event: Any = None) -> None:
        layer = self._shapes
        if layer is None:
            return
        if getattr(event, "action", None) in ("adding", "removing", "changing"):
            return  # the "added" / "removed" / "changed" event follows
        self._recolor()
        self._examples_changed()

    def _recolor(self) -> None:
        layer = self._shapes
        if layer is None or not len(layer.data):
            return
        grey, classes = (128, 128, 128), self.classes
        rgb = np.array([classes.get(str(c), grey) for c in layer.features["class"]]) / 255
        layer.edge_color = np.column_stack([rgb, np.ones(len(rgb))])
        layer.face_color = np.column_stack([rgb, np.full(len(rgb), 0.25)])
        layer.edge_width = [self._edge_px()] * len(layer.data)

    def _signature(self) -> tuple:
        """Return what training depends on: examples, class colours, resolution."""
        parts: list[Any] = [float(self.mpp_box.value()), tuple(self.classes.items())]
        for c, items in self.examples().items():
            for item in items:
                verts = np.asarray(getattr(item, "vertices", item), float)
                parts.append((c, type(item).__name__, verts.round(3).tobytes()))
        return tuple(parts)

    def _examples_changed(self) -> None:
        sig = self._signature()
        if sig == self._signed:
            return  # a colour or width refresh: nothing the classifier learns changed
        self._signed = sig
        self._trained_on = None
        counts = {c: len(v) for c, v in self.examples().items()}
        shown = ", ".join(f"{c} {n}" for c, n in counts.items()) or "none"
        self.status.setText(f"Examples: {shown}")
        self._schedule()

    # -- live preview -------------------------------------------------------------------
    def _on_view(self, _event: Any = None) -> None:
        if self.preview_regions is not None or self._trained_on is not None:
            self._schedule()

    def _schedule(self) -> None:
        if self.live.isChecked() and len(self.examples()) >= 2:
            self._timer.start()

    def _visible_box(self) -> tuple[int, int, int, int]:
        from napari_slidescope._napari.viewport import visible_region

        y0, x0, y1, x1 = visible_region(self._viewer, self._image)
        # at most PREVIEW_MAX_PX working pixels a side: the centre of a larger view
        mpp0 = float(np.mean(np.asarray(self._image.scale, float)[-2:]))
        side = PREVIEW_MAX_PX * self.mpp_box.value() / mpp0
        cy, cx = (y0 + y1) / 2, (x0 + x1) / 2
        if y1 - y0 > side:
            y0, y1 = int(cy - side / 2), int(cy + side / 2)
        if x1 - x0 > side:
            x0, x1 = int(cx - side / 2), int(cx + side / 2)
        return int(y0), int(x0), int(y1), int(x1)

    def preview(self) -> Any:
        """Retrain if the examples changed and classify the view, on a worker thread.

        Features and classes come from the tile caches of
        :class:`~napari_slidescope.pipeline.region_preview.RegionPreview` (one per slide),
        the tiles nearest the view's centre painted first. Returns the worker (None when
        nothing to do); a call while one runs cancels it (what it computed stays cached)
        and queues one more.
        """
        if self._image is None or len(self.examples()) < 2:
            return None
        if self._preview_worker is not None:
            self._preview_again = True
            if self._preview_cancel is not None:
                self._preview_cancel.set()
            return None
        try:
            box = self._visible_box()
        except ValueError as exc:
            self.status.setText(str(exc))
            return None
        from napari.qt.threading import create_worker

        source = SlideSource.from_layer(self._image)
        clf = self.classifier if self._trained_on is not None else None
        examples = self.examples()
        options = self._train_options(examples)
        self._preview_cancel = cancel = threading.Event()
        self._opened.watch("preview", cancel)
        if not self._preview_wired:  # the preview's streaming signals, connected once
            self._preview_wired = True
            self._bridge.trained.connect(self._on_trained)
            self._bridge.preview_map.connect(self._on_preview_map)
            self._bridge.preview_tile.connect(self._on_preview_tile)
            self._bridge.preview_progress.connect(self._on_preview_progress)
        worker = create_worker(
            _preview_work,
            source,
            clf,
            examples,
            options,
            box,
            self._opened,
            self.tissue_only.isChecked(),
            bridge=self._bridge,
            cancel=cancel,
            signature=self._signed,
            _ignore_errors=True,
        )
        worker.returned.connect(self._on_preview)
        worker.errored.connect(self._on_preview_error)
        worker.finished.connect(self._preview_done)
        self._preview_worker = worker
        self.status.setText("Preview updating…")
        worker.start()
        return worker

    def _on_trained(self, clf: Any, signature: Any) -> None:
        if signature == self._signed:  # not when the examples changed meanwhile
            self.classifier, self._trained_on = clf, True

    def _on_preview_map(self, regions: Any, done: list[tuple[int, int, int, int]]) -> None:
        from napari_slidescope._napari.regions import show_regions
        from napari_slidescope.pipeline.region_preview import carry_over

        if self._image is None:
            return
        name = f"{self._image.name} regions preview"
        # the previous classes stay until each tile's new ones replace them (no blank
        # flash at every stroke); only those of this slide layer's last preview
        previous = self._preview_display if name in self._viewer.layers else None
        if previous is not None and previous[0] is not self._image:
            previous = None
        display = carry_over(regions, None if previous is None else previous[1], done)
        self._preview_layer = show_regions(self._viewer, self._image, display, name=name)
        self._preview_shown = regions
        self._preview_display = (self._image, display)
        if self._shapes is not None:  # strokes stay on top and selected for drawing
            self._viewer.layers.selection.active = self._shapes
        self._painted_at = time.perf_counter()

    def _on_preview_tile(
        self, regions: Any, box: tuple[int, int, int, int], labels: np.ndarray
    ) -> None:
        if regions is not self._preview_shown or self._preview_display is None:
            return  # a tile of an update whose map is not shown
        y0, x0, y1, x1 = box
        self._preview_display[1].labels[y0:y1, x0:x1] = labels
        now = time.perf_counter()
        if self._preview_layer is not None and now - self._painted_at > 0.5:
            self._painted_at = now  # repaint twice a second, not per tile (software GL)
            self._preview_layer.refresh()

    def _on_preview_progress(self, done: int, total: int) -> None:
        # until the update is done the overlay may mix previous and new classes: say so
        self.status.setText(f"Preview updating… {done}/{total} tiles")

    def _on_preview_error(self, exc: BaseException) -> None:
        if not isinstance(exc, Cancelled):  # cancelled: a newer view or stroke follows
            self.status.setText(f"Preview: {exc} (the overlay is not up to date)")

    def _train_options(self, examples: dict[str, list[Any]]) -> dict[str, Any]:
        used = [c for c in self.classes if c in examples]
        return {
            "mpp": float(self.mpp_box.value()),
            "classes": used,
            "colors": {c: self.classes[c] for c in used},
            "stains": "slide",  # the same whatever the strokes: a stroke keeps the features
        }

    def _on_preview(self, out: tuple[Any, Any, float, float]) -> None:
        from napari_slidescope._napari.regions import show_regions

        clf, regions, t_train, t_pred = out
        self.preview_regions = regions
        self.last_preview_s = t_train + t_pred
        layer, display = self._preview_layer, self._preview_display
        if (
            regions is self._preview_shown
            and display is not None
            and layer is not None
            and layer in self._viewer.layers
        ):
            np.copyto(display[1].labels, regions.labels)  # exactly the map, every tile in
            layer.refresh()  # shown when its first tiles came: only the last ones to draw
        elif self._image is not None:
            display = dataclasses.replace(regions, labels=regions.labels.copy())
            self._preview_shown, self._preview_display = regions, (self._image, display)
            self._preview_layer = show_regions(
                self._viewer, self._image, display, name=f"{self._image.name} regions preview"
            )
            if self._shapes is not None:  # strokes stay on top and selected for drawing
                self._viewer.layers.selection.active = self._shapes
        h, w = regions.labels.shape
        trained = f"trained in {t_train:.2f} s, " if t_train else ""
        self.status.setText(
            f"Preview {h} x {w} px at {regions.mpp:.2f} µm/px: {trained}"
            f"classified in {t_pred:.2f} s: up to date"
        )

    def _preview_done(self) -> None:
        self._preview_worker = None
        self._preview_cancel = None
        if self._preview_again:
            self._preview_again = False
            self.preview()

    @property
    def busy(self) -> bool:
        """True while a preview or a whole-slide run is in flight."""
        return self._preview_worker is not None or self._run_worker is not None

    # -- whole slide --------------------------------------------------------------------
    def run_on_slide(self) -> Any:
        """Classify the slide's tissue on a worker thread, streaming tiles; return the worker."""
        if self._image is None:
            raise ValueError("Tissue regions: open a slide first")
        if self._run_worker is not None:
            raise ValueError("Tissue regions: a run is in progress")
        examples = self.examples()
        if self.classifier is None and len(examples) < 2:
            raise ValueError("Tissue regions: draw examples of two classes or load a classifier")
        from napari.qt.threading import create_worker

        source = SlideSource.from_layer(self._image)
        clf = self.classifier if (self._trained_on is not None or not examples) else None
        self._cancel = threading.Event()
        self._opened.watch("run", self._cancel)
        worker = create_worker(
            _run_work,
            source,
            clf,
            examples,
            self._train_options(examples),
            self._bridge,
            self._cancel,
            self.tissue_only.isChecked(),
            _ignore_errors=True,  # errors and cancelling: said by _on_run_error
        )
        worker.returned.connect(self._on_run_done)
        worker.errored.connect(self._on_run_error)
        worker.finished.connect(self._run_finished)
        self._run_worker = worker
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.status.setText("Training and finding the tissue…")
        worker.start()
        return worker

    def cancel(self) -> None:
        """Ask the whole-slide run to stop (it stops after the tiles in flight)."""
        if self._cancel is not None:
            self._cancel.set()
            self.status.setText("Cancelling…")

    def _on_run_started(self, grid: tuple[tuple[int, int], tuple[float, float], Any]) -> None:
        from napari.utils.colormaps import DirectLabelColormap

        from napari_slidescope._napari.layers import _units, aligned_transform

        shape, downsample, clf = grid
        self.classifier, self._trained_on = clf, True
        image = self._image
        self._run_labels = np.zeros(shape, np.uint8)
        scale, translate = aligned_transform(image, (0.0, 0.0), downsample)
        mapping: dict[Any, Any] = {None: np.zeros(4)}
        for k, c in enumerate(clf.class_names, start=1):
            mapping[k] = np.array([*(v / 255 for v in clf.colors[c]), 1.0])
        name = task("regions").layer_name(image.name)
        if name in self._viewer.layers:
            self._viewer.layers.remove(name)
        self._run_layer = self._viewer.add_labels(
            self._run_labels,
            name=name,
            scale=scale,
            translate=translate,
            opacity=0.5,
            colormap=DirectLabelColormap(color_dict=mapping),
            **_units(image),
        )
        preview = f"{image.name} regions preview"
        if preview in self._viewer.layers:
            self._viewer.layers[preview].visible = False
        self.status.setText(f"Classifying at {clf.trained_mpp:.2f} µm/px…")

    def _on_tile(self, box: tuple[int, int, int, int], labels: np.ndarray) -> None:
        if self._run_labels is None or self._run_layer is None:
            return
        y0, x0, y1, x1 = box
        self._run_labels[y0:y1, x0:x1] = labels
        now = time.perf_counter()
        if now - self._painted_at > 0.25:  # repaint a few times a second, not per tile
            self._painted_at = now
            self._run_layer.refresh()

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.status.setText(f"Classifying tiles: {done} of {total}")

    def _on_run_done(self, out: tuple[Any, float]) -> None:
        from napari_slidescope._napari.regions import show_regions

        regions, seconds = out
        self.regions = regions
        if self._image is not None:
            self._run_layer = show_regions(self._viewer, self._image, regions)
            if self._shapes is not None:
                self._viewer.layers.selection.active = self._shapes
        self.status.setText(
            f"Slide classified in {seconds:.1f} s ({regions.labels.shape[0]} x "
            f"{regions.labels.shape[1]} px at {regions.mpp:.2f} µm/px)"
        )
        self._show_areas()

    def _on_run_error(self, exc: BaseException) -> None:
        if isinstance(exc, Cancelled):
            self.status.setText("Cancelled: the tiles done so far stay shown")
        else:
            self.status.setText(f"Run on slide: {exc}")

    def _run_finished(self) -> None:
        self._run_worker = None
        self._cancel = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setVisible(False)

    # -- areas --------------------------------------------------------------------------
    def areas(self) -> list[tuple[str, str, float, float | None]]:
        """Rows of the area table: (where, class, area mm², percent or None for ignored)."""
        regions = self.regions
        if regions is None:
            return []
        rows: list[tuple[str, str, float, float | None]] = []

        def add(where: str, areas: dict[str, float]) -> None:
            counted = sum(a for c, a in areas.items() if c not in regions.ignore)
            for c, a in areas.items():
                pct = None if c in regions.ignore else (100 * a / counted if counted else 0.0)
                rows.append((where, c, a / 1e6, pct))

        add("slide", regions.area_um2)
        name = self.annotations_box.currentText()
        if self.annotations_box.currentIndex() > 0 and name in self._viewer.layers:
            from napari_slidescope._napari.shapes import layer_polygons

            rings, holes, index = layer_polygons(self._viewer.layers[name])
            for k, (ring, hole) in enumerate(zip(rings, holes, strict=True)):
                add(f"{name} #{index[k] + 1}", regions.areas_in([ring], [hole]))
        return rows

    def _show_areas(self) -> None:
        rows = self.areas()
        several = len({r[0] for r in rows}) > 1
        self.table.setRowCount(len(rows))
        for i, (where, c, mm2, pct) in enumerate(rows):
            label = f"{where}: {c}" if several else c
            item = QTableWidgetItem(class_icon(self.regions.colors.get(c, (128, 128, 128))), label)
            self.table.setItem(i, 0, item)
            self.table.setItem(i, 1, QTableWidgetItem(f"{mm2:.3f}"))
            self.table.setItem(i, 2, QTableWidgetItem("—" if pct is None else f"{pct:.1f}"))
            for j in (1, 2):
                cell = self.table.item(i, j)
                if cell is not None:
                    cell.setTextAlignment(
                        Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    )
        self.table.resizeColumnsToContents()

    # -- files ---------------------------------------------------------------------------
    def save_classifier(self, path: str | Path) -> Path:
        """Save the trained classifier (plain arrays and JSON: opening it runs no code)."""
        if self.classifier is None:
            raise ValueError("Tissue regions: nothing to save; draw examples of two classes first")
        out = self.classifier.save(path)
        self.status.setText(f"Saved {out.name}")
        return Path(out)

    def load_classifier(self, path: str | Path) -> Any:
        """Load a classifier file: its classes join the list and "Run on slide" applies it."""
        from napari_slidescope.pipeline.region_classifier import load_region_classifier

        clf = load_region_classifier(path)
        self.class_editor.take_colors({c: clf.colors[c] for c in clf.class_names})
        self.classifier = clf
        self._trained_on = True
        self.mpp_box.blockSignals(True)
        self.mpp_box.setValue(clf.mpp)
        self.mpp_box.blockSignals(False)
        self._signed = self._signature()  # the loaded classifier stands until examples change
        self.status.setText(
            f"Loaded {Path(path).name}: {', '.join(clf.class_names)} at {clf.mpp:.2f} µm/px"
        )
        return clf

    def export_geojson(self, path: str | Path) -> Path:
        """Write the whole-slide regions as classified QuPath annotations."""
        if self.regions is None:
            raise ValueError("Tissue regions: nothing to export; run on the slide first")
        out = Path(self.regions.to_geojson(path))
        self.status.setText(f"Exported {out.name}")
        return out

    def _on_load_examples(self) -> None:
        filters = "QuPath GeoJSON (*.geojson *.json *.geojson.gz)"
        self._ask_file(False, "Load examples", filters, self.load_examples)

    def _on_export(self) -> None:
        self._ask_file(True, "Export regions", "QuPath GeoJSON (*.geojson)", self.export_geojson)


def _train(source: SlideSource, slide: Any, examples: Any, options: dict[str, Any]) -> Any:
    from napari_slidescope.pipeline.region_classifier import train_region_classifier

    return train_region_classifier(slide, examples, slide_mpp=source.mpp[0], **options)


class _OpenSlide:
    """The slide the previews read and its tile caches, kept between previews.

    A :class:`~napari_slidescope.pipeline.region_preview.RegionPreview` of the slide: its
    tile cache stays warm and so do its caches of features and classes. Only one preview
    runs at a time, so one serves them in turn; a new source closes the old one. A
    :meth:`close` while a worker uses the slide (the dock destroyed mid-preview) closes it
    once that worker is done, not under its feet, and first sets the workers' cancel flags
    (:meth:`watch`): a dock that is gone no longer wants their work.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._preview: Any = None
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._cancels: dict[str, threading.Event] = {}

    def watch(self, name: str, cancel: threading.Event) -> None:
        """Set `cancel` on :meth:`close` (the latest flag per `name`: preview, run)."""
        with self._lock:
            self._cancels[name] = cancel

    def get(self, source: SlideSource) -> Any:
        """Return the source's RegionPreview (opened on first use)."""
        with self._lock:
            return self._get_locked(source)

    @contextmanager
    def using(self, source: SlideSource) -> Iterator[Any]:
        """Lend the source's RegionPreview to a worker: a close meanwhile waits for its end."""
        with self._lock:
            preview = self._get_locked(source)
            self._users += 1
        try:
            yield preview
        finally:
            with self._lock:
                self._users -= 1
                if self._closing and not self._users:
                    self._closing = False
                    self.close_locked()

    def _get_locked(self, source: SlideSource) -> Any:
        from napari_slidescope.pipeline.region_preview import RegionPreview

        key = (source.name, source.path, id(source.array), source.shape0)
        if self._preview is None or self._key != key:
            self.close_locked()
            slide = source.open()
            try:
                self._preview = RegionPreview(slide, slide_mpp=source.mpp[0])
            except BaseException:
                slide.close()
                raise
            self._key = key
        return self._preview

    def close_locked(self) -> None:
        if self._preview is not None:
            self._preview.slide.close()
        self._preview = self._key = None

    def close(self) -> None:
        with self._lock:
            for cancel in self._cancels.values():
                cancel.set()
            self._cancels.clear()
            if self._users:
                self._closing = True  # the last worker using it closes it
            else:
                self.close_locked()


def _preview_work(
    source: SlideSource,
    clf: Any,
    examples: dict[str, list[Any]],
    options: dict[str, Any],
    box: tuple[int, int, int, int],
    opened: _OpenSlide,
    tissue_only: bool = True,
    *,
    bridge: _Bridge | None = None,
    cancel: threading.Event | None = None,
    signature: Any = None,
) -> tuple[Any, Any, float, float]:
    """Worker: train when `clf` is None, then classify `box` (its tissue, or every pixel).

    Training and classification use the slide's tile caches; with a `bridge`, the new
    classifier and the map being filled (then each tile) are signalled as they come.
    """
    with opened.using(source) as preview:
        t0 = time.perf_counter()
        trained = clf is None
        if clf is None:
            clf = preview.train(examples, **options)
            if bridge is not None:
                bridge.trained.emit(clf, signature)
        t1 = time.perf_counter()
        if bridge is None:
            regions = preview.classify(
                clf, box, tissue=None if tissue_only else False, cancel=cancel
            )
        else:
            shown: list[Any] = []  # the map once started
            before: list[tuple[int, int, int, int]] = []  # tiles in before it started

            def on_start(regions: Any) -> None:
                shown.append(regions)
                bridge.preview_map.emit(regions, before)

            def on_tile(tile: tuple[int, int, int, int], labels: np.ndarray) -> None:
                if shown:
                    bridge.preview_tile.emit(shown[0], tile, labels)
                else:
                    before.append(tile)

            regions = preview.classify(
                clf,
                box,
                tissue=None if tissue_only else False,
                cancel=cancel,
                on_start=on_start,
                on_tile=on_tile,
                progress=lambda p: bridge.preview_progress.emit(int(p.done), int(p.total)),
            )
    t2 = time.perf_counter()
    return clf, regions, (t1 - t0) if trained else 0.0, t2 - t1


def _run_work(
    source: SlideSource,
    clf: Any,
    examples: dict[str, list[Any]],
    options: dict[str, Any],
    bridge: _Bridge,
    cancel: threading.Event,
    tissue_only: bool = True,
) -> tuple[Any, float]:
    """Worker: train when needed, then classify the slide's tissue, emitting each tile."""
    from napari_slidescope.pipeline.region_grid import working_grid
    from napari_slidescope.pipeline.region_map import classify_regions

    t0 = time.perf_counter()
    slide = source.open()
    try:
        if clf is None:
            clf = _train(source, slide, examples, options)
        grid = working_grid(slide, clf.mpp)
        bridge.started.emit((grid.shape, grid.downsample, clf))
        regions = classify_regions(
            slide,
            clf,
            progress=lambda p: bridge.progress.emit(int(p.done), int(p.total)),
            on_tile=lambda box, labels: bridge.tile.emit(box, labels.copy()),
            cancel=cancel,
            tissue=None if tissue_only else False,
            slide_mpp=source.mpp[0],
        )
    finally:
        slide.close()
    return regions, time.perf_counter() - t0
