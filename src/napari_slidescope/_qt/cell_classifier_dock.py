"""The "Cell classifier" dock: teach cell types by clicking a few nuclei of each class.

The pathologist's workflow from QuPath's object classifier, on a nuclei layer of this plugin:
a list of classes (name and colour), "Mark examples" on, the class selected, a click on a
nucleus makes it an example of that class (a second click with the same class unmarks it).
Examples show as a Points layer coloured by class. With examples of two classes or more, a
random forest (:func:`~napari_slidescope.pipeline.cell_forest.train_classifier`) is
retrained after every click (well under a second for a few hundred examples) and the nuclei
in view are recoloured by their predicted class ("live preview"); "Classify all" applies it
to every nucleus of the layer (through :func:`napari_slidescope._qt.cell_classes_dock.classify`: the
class columns join the layer's features and the "Cell classes" legend dock opens). The dock's
own legend counts the nuclei per class of the preview, the whole layer or a selected shape
(with densities per mm²); the classifier saves to a file that ``slidescope batch --classify``
applies to a cohort.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._qt.class_list import ClassList, ClassListOwner
from napari_slidescope._qt.lifetime import attach
from napari_slidescope.errors import SlidescopeWarning

__all__ = ["CellClassifierWidget"]

#: Colour of nuclei without a predicted class while classes are shown (RGBA 0-1).
_UNCLASSIFIED = (0.6, 0.6, 0.6, 0.35)
#: Most nuclei in view the live preview classifies (about 0.1 s of features and trees).
PREVIEW_MAX = 50_000


def _colour(name: str, taken: Mapping[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    """Return the registry's colour of a new class `name` beside the classes `taken`."""
    from napari_slidescope.analysis.class_colors import class_colors

    return class_colors([*taken, name], given=dict(taken))[name]


class _Predicted:
    """A classifier that returns predictions made already (on a worker thread)."""

    def __init__(self, out: tuple) -> None:
        self._out = out

    def predict_classes(self, result: Any) -> tuple:
        return self._out


class _SlideFrame:
    """The slide image's world transform, recovered from a nuclei layer over it."""

    def __init__(self, layer: Any, canvas: Any) -> None:
        o, d = np.asarray(canvas.origin, float), np.asarray(canvas.downsample, float)
        self.scale = np.asarray(layer.scale, float)[-2:] / d
        self.translate = np.asarray(layer.translate, float)[-2:] - self.scale * (o + d / 2 - 0.5)


class CellClassifierWidget(ClassListOwner, QWidget):
    """Classes, examples, live training and preview of a cell classifier.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari when docked from the Plugins menu).
    """

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.examples: dict[int, str] = {}
        self.classifier: Any = None
        self.last_counts: dict[str, int] = {}
        self._layer: Any = None
        self._points: Any = None
        self._plain_colormap: Any = None
        self._worker: Any = None

        self.layer_box = QComboBox()
        #: The classes' names and colours (the list, its buttons and dialogs).
        self.class_editor = ClassList("Classes", _colour, height=90)
        self.mark_button = QPushButton("Mark examples")
        self.mark_button.setCheckable(True)
        self.mark_button.setToolTip(
            "On: a click on a nucleus makes it an example of the selected class "
            "(click again to unmark)"
        )
        self.live = QCheckBox("Live preview (nuclei in view)")
        self.live.setChecked(True)
        self.status = QLabel("Mark a few nuclei of each class")
        self.status.setWordWrap(True)
        self.legend = QLabel("")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.classify_button = QPushButton("Classify all")
        self.shape_button = QPushButton("In shape")
        self.shape_button.setToolTip("Classify the nuclei inside the selected shape")
        self.save_button = QPushButton("Save classifier…")
        self.load_button = QPushButton("Load classifier…")

        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(QLabel("Nuclei layer"))
        row.addWidget(self.layer_box, 1)
        lay.addLayout(row)
        lay.addWidget(self.class_editor)
        lay.addWidget(self.mark_button)
        lay.addWidget(self.live)
        lay.addWidget(self.status)
        lay.addWidget(self.legend)
        row = QHBoxLayout()
        for b in (self.classify_button, self.shape_button, self.save_button, self.load_button):
            row.addWidget(b)
        lay.addLayout(row)
        lay.addStretch(1)

        self.class_editor.changed.connect(self._on_class_change)
        self.class_editor.failed.connect(self.status.setText)
        self.classify_button.clicked.connect(self._on_classify_all)
        self.shape_button.clicked.connect(self._on_shape)
        self.save_button.clicked.connect(self._on_save)
        self.load_button.clicked.connect(self._on_load)
        self.layer_box.currentIndexChanged.connect(self._on_layer_choice)
        attach(
            self,
            [
                (self._viewer.layers.events.inserted, self._refresh_layers),
                (self._viewer.layers.events.removed, self._refresh_layers),
            ],
            callbacks=[(self._viewer.mouse_drag_callbacks, self._on_viewer_click)],
        )
        #: The classes last set from the slide (None: the user changed them since).
        self._defaults: dict[str, tuple[int, int, int]] | None = None
        self._set_default_classes()
        self._refresh_layers()

    # -- layers ---------------------------------------------------------------------------
    def _nuclei_layers(self) -> list[Any]:
        return [
            ly
            for ly in self._viewer.layers
            if type(ly).__name__ == "Labels" and canvas_of(ly) is not None
        ]

    def _refresh_layers(self, _event: Any = None) -> None:
        layers = self._nuclei_layers()
        current = self._layer
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        for ly in layers:
            self.layer_box.addItem(ly.name)
        self.layer_box.blockSignals(False)
        if current in layers:
            self.layer_box.setCurrentIndex(layers.index(current))
        elif layers:
            self.layer_box.setCurrentIndex(len(layers) - 1)
            self._on_layer_choice()
        else:
            self._layer = None

    def _on_layer_choice(self, _index: int = 0) -> None:
        layers = self._nuclei_layers()
        i = self.layer_box.currentIndex()
        layer = layers[i] if 0 <= i < len(layers) else None
        if layer is not self._layer:
            self._layer = layer
            self._plain_colormap = None if layer is None else layer.colormap
            self.examples.clear()
            self.classifier = None
            self._set_default_classes()
            self._draw_examples()

    def _set_default_classes(self) -> None:
        """Start from the classes the layer's slide suggests, unless the user set their own.

        The layer's last classification (whatever dock or console made it), else one class
        per marker on a fluorescence slide, else tumour / lymphocyte / stroma
        (:func:`~napari_slidescope.pipeline.cell_classes.default_classes`); colours from the
        one registry, so the legend and the exports show the same.
        """
        from napari_slidescope.pipeline.cell_classes import default_classes

        if self._defaults is not None and self.classes != self._defaults:
            return  # the user added, renamed or recoloured classes: keep them
        canvas = canvas_of(self._layer) if self._layer is not None else None
        table = canvas.table() if canvas is not None else {}
        last = None if self._layer is None else self._layer.metadata.get("slidescope_classes")
        wanted = default_classes(table, last)
        if wanted == self.classes:
            self._defaults = dict(wanted)
            return
        self.class_editor.set_classes(wanted)
        self._defaults = dict(self.classes)

    @property
    def layer(self) -> Any:
        """The nuclei layer being classified (None when there is none)."""
        return self._layer

    def _table(self) -> dict[str, np.ndarray]:
        canvas = canvas_of(self._layer) if self._layer is not None else None
        if canvas is None:
            raise ValueError("Cell classifier: no nuclei layer of this plugin to classify")
        return canvas.table()

    # -- classes ------------------------------------------------------------------------
    def _on_class_change(self, kind: str, old: str | None, new: str | None) -> None:
        """Make the examples follow a renamed or removed class, then retrain and redraw."""
        if kind == "renamed" and new is not None:
            self.examples = {i: (new if c == old else c) for i, c in self.examples.items()}
        elif kind == "removed":
            self.examples = {i: c for i, c in self.examples.items() if c != old}
        self._changed()

    # -- examples -----------------------------------------------------------------------
    def mark(self, nucleus_id: int, name: str | None = None) -> None:
        """Make nucleus `nucleus_id` an example of `name` (default: the selected class).

        Marking a nucleus again with its own class unmarks it.
        """
        name = name or self.current_class
        if name is None or name not in self.classes:
            raise ValueError(f"mark: {name!r} is not one of the classes {list(self.classes)}")
        if self.examples.get(nucleus_id) == name:
            del self.examples[nucleus_id]
        else:
            self.examples[int(nucleus_id)] = name
        self._changed()

    def _on_viewer_click(self, viewer: Any, event: Any) -> None:
        layer = self._layer
        if not self.mark_button.isChecked() or layer is None or layer not in viewer.layers:
            return
        from napari_slidescope._napari.viewport import clicked_label

        value = clicked_label(layer, event)
        if value is not None and self.current_class is not None:
            self.mark(value)

    def _draw_examples(self) -> None:
        layer = self._layer
        if layer is None:
            return
        canvas = canvas_of(layer)
        if canvas is None:
            return
        table = canvas.table()
        ids = np.asarray(table["id"])
        row_of = {int(i): r for r, i in enumerate(ids)}
        marked = [(i, c) for i, c in self.examples.items() if i in row_of]
        rows = np.array([row_of[i] for i, _ in marked], np.intp)
        s = np.asarray(layer.scale, float)[-2:] / np.asarray(canvas.downsample, float)
        o, d = np.asarray(canvas.origin, float), np.asarray(canvas.downsample, float)
        level0 = np.column_stack(
            [np.asarray(table["centroid_row"])[rows], np.asarray(table["centroid_col"])[rows]]
        ).reshape(-1, 2)
        world = np.asarray(layer.translate, float)[-2:] + s * (level0 - o - d / 2 + 0.5)
        classes = self.classes
        colors = np.array([[*(v / 255 for v in classes[c]), 1.0] for _, c in marked]).reshape(-1, 4)
        size = float(6 * s.mean())
        name = f"{layer.name} examples"
        if self._points is None or self._points not in self._viewer.layers:
            self._points = self._viewer.add_points(
                world,
                name=name,
                size=size,
                face_color=colors if len(colors) else "white",
                border_color="white",
                border_width=0.15,
                **({"units": tuple(layer.units)} if getattr(layer, "units", None) else {}),
            )
            self._viewer.layers.selection.active = layer
        else:
            self._points.data = world
            self._points.size = size
            if len(colors):
                self._points.face_color = colors

    # -- training and preview ------------------------------------------------------------
    def _changed(self) -> None:
        self._draw_examples()
        counts = {c: 0 for c in self.classes}
        for c in self.examples.values():
            counts[c] = counts.get(c, 0) + 1
        from napari_slidescope.pipeline.cell_forest import MIN_EXAMPLES_PER_CLASS

        shown = ", ".join(f"{c} {n}" for c, n in counts.items())
        few = any(n < MIN_EXAMPLES_PER_CLASS for n in counts.values())
        hint = f" (too few to trust: {MIN_EXAMPLES_PER_CLASS}+ per class)" if few else ""
        self.status.setText(f"{len(self.examples)} examples: {shown}{hint}")
        if self.live.isChecked() and sum(1 for n in counts.values() if n) >= 2:
            try:
                self.train()
                self.preview()
            except (ValueError, ImportError) as exc:
                self.status.setText(f"{self.status.text()} · {exc}")

    def train(self) -> Any:
        """Train the classifier on the examples (classes without examples are left out)."""
        from napari_slidescope.pipeline.cell_forest import train_classifier

        table = self._table()
        classes = self.classes
        used = [c for c in classes if c in set(self.examples.values())]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # the status line already counts the examples and says when they are too few
            warnings.filterwarnings("ignore", "too few examples", SlidescopeWarning)
            self.classifier = train_classifier(
                table,
                self.examples,
                classes=used,
                colors={c: classes[c] for c in used},
            )
        dt = time.perf_counter() - t0
        self.status.setText(f"{self.status.text()} · trained in {dt:.2f} s")
        return self.classifier

    def _visible_rows(self, table: dict[str, np.ndarray]) -> np.ndarray:
        rows, _ = self._in_view(table)
        return rows

    def _in_view(self, table: dict[str, np.ndarray]) -> tuple[np.ndarray, float | None]:
        """Rows of the nuclei in view and the view's area in mm²."""
        from napari_slidescope._napari.viewport import visible_region

        try:
            y0, x0, y1, x1 = visible_region(self._viewer, self._layer)
        except ValueError:
            return np.zeros(0, np.intp), None
        r, c = np.asarray(table["centroid_row"]), np.asarray(table["centroid_col"])
        rows = np.flatnonzero((r >= y0) & (r < y1) & (c >= x0) & (c < x1))
        return rows, self._area_mm2((y1 - y0) * (x1 - x0))

    def _area_mm2(self, level0_px: float) -> float | None:
        canvas = canvas_of(self._layer)
        if canvas is None:
            return None
        return float(level0_px * canvas.mpp[0] * canvas.mpp[1] / 1e6)

    def preview(self) -> dict[str, int]:
        """Colour the nuclei in view by their predicted class; return the counts.

        Beyond :data:`PREVIEW_MAX` nuclei in view the preview waits for a closer view (the
        legend says so): it runs on the GUI thread after every click.
        """
        table = self._table()
        rows, area = self._in_view(table)
        if rows.size > PREVIEW_MAX:
            self.legend.setText(
                f"{rows.size:,} nuclei in view: zoom in for the live preview, or Classify all"
            )
            return {}
        return self._show(table, rows, "in view", area)

    def classify_all(self) -> Any:
        """Classify every nucleus of the layer in the background; return the worker.

        The features and the forest run on a worker thread (a whole slide's 10^6 nuclei take
        seconds); when they are done the layer takes the class colours and columns and the "Cell
        classes" legend opens (:func:`napari_slidescope._qt.cell_classes_dock.classify`), and
        :attr:`last_counts` holds the counts.
        """
        from napari.qt.threading import create_worker

        if self.classifier is None:
            self.train()
        canvas = canvas_of(self._layer) if self._layer is not None else None
        if canvas is None:
            raise ValueError("Cell classifier: no nuclei layer of this plugin to classify")
        table = canvas.to_result().columns
        clf, layer = self.classifier, self._layer
        self.classify_button.setEnabled(False)
        self.status.setText(f"Classifying {len(table['id']):,} nuclei…")
        worker = create_worker(clf.predict_classes, table)
        worker.returned.connect(lambda out: self._on_classified(layer, clf, out))
        worker.errored.connect(lambda exc: self.status.setText(str(exc)))
        worker.finished.connect(lambda: self.classify_button.setEnabled(True))
        self._worker = worker
        worker.start()
        return worker

    def _on_classified(self, layer: Any, clf: Any, out: tuple) -> None:
        from napari_slidescope._qt.cell_classes_dock import classify

        if layer is not self._layer or layer not in self._viewer.layers:
            return  # the user moved on to another layer
        try:  # the predictions, applied (the table must still be the one classified)
            result = classify(self._viewer, layer, classifier=_Predicted(out))
        except ValueError as exc:
            self.status.setText(f"{exc}: the nuclei changed while classifying; classify again")
            return
        names = np.asarray(result.columns["class"])
        counts = {c: int(np.count_nonzero(names == c)) for c in clf.class_names}
        self.last_counts = counts
        self.status.setText(f"Classified {len(names):,} nuclei")
        self._show_legend(counts, dict(result.classes), "in the layer", None)

    def classify_in_shape(self) -> dict[str, int]:
        """Colour the nuclei inside the selected shape by class; return the counts.

        Raises
        ------
        ValueError
            If no shape is selected (or nothing is trained).
        """
        from napari_slidescope._napari.shapes import selected_polygon
        from napari_slidescope.pipeline.regions import inside_polygon

        if self.classifier is None:
            self.train()
        canvas = canvas_of(self._layer)
        table = self._table()
        assert canvas is not None  # _table() checked it
        ring = selected_polygon(self._viewer, _SlideFrame(self._layer, canvas))
        inside = inside_polygon(table["centroid_row"], table["centroid_col"], ring)
        y, x = ring[:, 0], ring[:, 1]
        area_px = 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
        return self._show(table, np.flatnonzero(inside), "in the shape", self._area_mm2(area_px))

    def _on_classify_all(self) -> None:
        self._report(self.classify_all)

    def _on_shape(self) -> None:
        self._report(self.classify_in_shape)

    def _show(
        self,
        table: dict[str, np.ndarray],
        rows: np.ndarray,
        where: str = "in view",
        area_mm2: float | None = None,
    ) -> dict[str, int]:
        from napari.utils.colormaps import DirectLabelColormap

        clf = self.classifier
        if clf is None or self._layer is None:
            return {}
        names, _, colors = clf.predict_classes(table, rows=rows) if len(rows) else ([], [], {})
        ids = np.asarray(table["id"])[rows]
        rgba = {c: (*(v / 255 for v in colors[c]), 1.0) for c in colors}
        mapping: dict[Any, Any] = {None: _UNCLASSIFIED, 0: (0.0, 0.0, 0.0, 0.0)}
        mapping.update({int(i): rgba[str(n)] for i, n in zip(ids, names, strict=True)})
        self._layer.colormap = DirectLabelColormap(color_dict=mapping)
        counts = {c: int(np.count_nonzero(np.asarray(names) == c)) for c in clf.class_names}
        self.last_counts = counts
        self._show_legend(counts, colors, where, area_mm2)
        return counts

    def _show_legend(
        self,
        counts: dict[str, int],
        colors: dict[str, tuple[int, int, int]],
        where: str,
        area_mm2: float | None,
    ) -> None:
        total = sum(counts.values()) or 1
        lines = []
        for c, n in counts.items():
            density = f" · {n / area_mm2:,.0f} /mm²" if area_mm2 else ""
            lines.append(
                f'<span style="color: rgb{tuple(colors[c])}">&#9632;</span> {c}: '
                f"{n:,} ({100 * n / total:.0f} %){density}"
            )
        self.legend.setText(f"<b>Nuclei {where}</b><br>" + "<br>".join(lines))

    def show_plain_colors(self) -> None:
        """Give the layer back its segmentation colours."""
        if self._layer is not None and self._plain_colormap is not None:
            self._layer.colormap = self._plain_colormap

    # -- files ---------------------------------------------------------------------------
    def save_classifier(self, path: str | Path) -> Path:
        """Save the trained classifier (see :meth:`ObjectClassifier.save`)."""
        if self.classifier is None:
            raise ValueError("Cell classifier: nothing to save; mark examples of two classes first")
        out = self.classifier.save(path)
        self.status.setText(f"Saved {out.name}")
        return out

    def load_classifier(self, path: str | Path) -> Any:
        """Load a classifier file; its classes join the list and it colours the view."""
        from napari_slidescope.pipeline.cell_forest import load_classifier

        clf = load_classifier(path)
        self.class_editor.take_colors({c: clf.colors[c] for c in clf.class_names})
        self.classifier = clf
        if self._layer is not None:
            self.preview()
        return clf
