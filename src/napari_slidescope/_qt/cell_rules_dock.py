"""The "Cell classification" dock: IHC scoring or phenotype rules, saved and loaded as JSON.

A thin Qt layer over :func:`~napari_slidescope._qt.cell_classes_dock.classify`: the IHC
thresholds and compartment, or a rules file, become
:class:`~napari_slidescope.pipeline.cell_classes.PhenotypeRules`; **Apply** classifies the
active slide's nuclei layer (class colours and the "Cell classes" legend); **Save rules...**
and **Load rules...** write and read the same JSON ``slidescope batch --classify`` takes.
Thresholds dragged on the measurements table's histogram come back here (the IHC
thresholds' boxes, or the loaded rules), so **Save rules...** saves them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qtpy.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from napari_slidescope._qt.lifetime import attach
from napari_slidescope.pipeline.cell_classes import PhenotypeRules, load_rules
from napari_slidescope.pipeline.task_table import task

__all__ = ["ClassifyWidget"]


class ClassifyWidget(QWidget):
    """Classify the active slide's cells by IHC score or by loaded phenotype rules."""

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.rules: PhenotypeRules | None = None  # rules loaded from a file
        self._dragged: tuple[float, ...] | None = None  # IHC thresholds set elsewhere
        box = QVBoxLayout(self)
        form = QFormLayout()
        self.mode = QComboBox()
        self.mode.addItems(["IHC (DAB score)", "Phenotype rules"])
        form.addRow("Classify by", self.mode)
        self.thresholds = []
        for name, value in zip(
            ("1+ from DAB OD", "2+ from", "3+ from"), (0.2, 0.4, 0.6), strict=True
        ):
            spin = QDoubleSpinBox()
            spin.setRange(0.0, 3.0)
            spin.setDecimals(3)
            spin.setSingleStep(0.05)
            spin.setValue(value)
            form.addRow(name, spin)
            self.thresholds.append(spin)
        self.compartment = QComboBox()
        self.compartment.addItems(["nucleus", "cell", "cytoplasm"])
        self.compartment.setToolTip(
            "nucleus for nuclear markers (Ki-67, ER, PR); cell for membrane markers (HER2)"
        )
        form.addRow("Compartment", self.compartment)
        box.addLayout(form)
        row = QHBoxLayout()
        self.load_button = QPushButton("Load rules...")
        self.save_button = QPushButton("Save rules...")
        row.addWidget(self.load_button)
        row.addWidget(self.save_button)
        box.addLayout(row)
        self.apply_button = QPushButton("Apply")
        box.addWidget(self.apply_button)
        self.annotation_button = QPushButton("Count in selected shape")
        self.annotation_button.setToolTip(
            "Cells per class and per mm² inside the selected polygon (e.g. a tumour annotation)"
        )
        box.addWidget(self.annotation_button)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        box.addWidget(self.status)
        box.addStretch(1)
        self.load_button.clicked.connect(self._on_load)
        self.save_button.clicked.connect(self._on_save)
        self.apply_button.clicked.connect(self._on_apply)
        self.annotation_button.clicked.connect(self._on_annotation)
        self.result: Any = None  # the last classified result of this viewer
        from napari_slidescope._napari.class_layers import events as class_events

        connections: list[tuple[Any, Any]] = [(class_events.changed, self._on_classes_changed)]
        layers = getattr(self.viewer, "layers", None)
        if layers is not None:
            connections += [
                (layers.selection.events.active, self.follow_slide),
                (layers.events.inserted, self.follow_slide),
            ]
        attach(self, connections)
        self.follow_slide()

    def _nuclei_layer(self) -> Any:
        """Return the nuclei layer :meth:`apply` would classify, or None."""
        import warnings

        from napari_slidescope._napari import jobs

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # several slides: apply() says which it took
                image = jobs.slide_with_results(self.viewer, "nuclei")
        except ValueError:
            return None
        name = task("nuclei").layer_name(image.name)
        return self.viewer.layers[name] if name in self.viewer.layers else None

    def follow_slide(self, _event: Any = None) -> None:
        """Set the mode from the slide: its last classification, else its kind.

        A slide classified before shows how (its rules, or its IHC thresholds); an H-DAB
        slide starts on IHC scoring; a slide without DAB (H&E, fluorescence) cannot be
        IHC-scored, so that choice is greyed out and the mode is phenotype rules, with the
        slide's markers named.
        """
        from napari_slidescope._napari.layers import canvas_of
        from napari_slidescope.pipeline.cell_classes import cell_kind, markers_of

        layer = self._nuclei_layer()
        canvas = canvas_of(layer) if layer is not None else None
        if canvas is None:
            return
        table = canvas.table()
        kind = cell_kind(table)
        item = getattr(self.mode.model(), "item", lambda _k: None)(0)
        if item is not None:
            item.setEnabled(kind == "H-DAB")
        info = layer.metadata.get("slidescope_classification")
        if isinstance(info, dict) and info.get("kind") == "rules":
            self._take_rules(info)
            return
        if kind == "H-DAB":
            self.mode.setCurrentIndex(0)
            return
        self.mode.setCurrentIndex(1)
        if self.rules is None:
            markers = ", ".join(sorted(markers_of(table))) or "none"
            self.status.setText(
                f"{layer.name}: {kind}, no DAB to score; markers: {markers}. Load phenotype "
                "rules, or classify in the console: classify(viewer, phenotypes=...)"
            )

    def _on_classes_changed(self, layer: Any, result: Any) -> None:
        """Take the rules a layer of this viewer was classified with (e.g. dragged)."""
        if layer not in getattr(self.viewer, "layers", ()):
            return
        self.result = result
        info = getattr(result, "classification", None)
        if isinstance(info, dict) and info.get("kind") == "rules":
            self._take_rules(info)

    def _take_rules(self, info: dict[str, Any]) -> None:
        """Show the rules of a classification: IHC thresholds in the boxes, else the rules."""
        rules = PhenotypeRules.from_dict(info["rules"])
        if rules.dab is not None and not rules.markers and not rules.phenotypes:
            for spin, value in zip(self.thresholds, rules.dab["thresholds"], strict=True):
                spin.blockSignals(True)
                spin.setValue(float(value))
                spin.blockSignals(False)
            self._dragged = tuple(float(v) for v in rules.dab["thresholds"])
            self.compartment.setCurrentText(str(rules.dab["compartment"]))
            self.mode.setCurrentIndex(0)
        else:
            self.rules = rules
            self.mode.setCurrentIndex(1)

    def current_rules(self) -> PhenotypeRules:
        """Return the rules the widget shows: a loaded file's, or IHC from the thresholds.

        Raises
        ------
        ValueError
            Thresholds out of order, or "Phenotype rules" without rules loaded.
        """
        if self.mode.currentIndex() == 1:
            if self.rules is None:
                raise ValueError("no rules file loaded: press Load rules...")
            return self.rules
        t = [s.value() for s in self.thresholds]
        exact = self._dragged
        if exact is not None and all(
            abs(a - b) <= 0.5 * 10.0 ** -s.decimals()
            for a, b, s in zip(t, exact, self.thresholds, strict=True)
        ):  # the boxes round what was dragged on the histogram: keep the exact values
            t = list(exact)
        return PhenotypeRules.of(
            dab={"thresholds": t, "compartment": self.compartment.currentText()},
            where="IHC thresholds",
        )

    def load(self, path: str | Path) -> PhenotypeRules:
        """Load a rules file and switch to it (errors are shown, then raised)."""
        try:
            self.rules = load_rules(path)
        except ValueError as exc:
            self.status.setText(str(exc))
            raise
        self.mode.setCurrentIndex(1)
        names = ", ".join(self.rules.markers_needed())
        self.status.setText(f"Rules from {Path(path).name}: {names}")
        return self.rules

    def save(self, path: str | Path) -> Path:
        """Save the current rules as JSON."""
        out = self.current_rules().save(path)
        self.status.setText(f"Saved {out.name}")
        return out

    def apply(self) -> Any:
        """Classify the active slide's nuclei with the current rules; return the result."""
        from napari_slidescope._qt.cell_classes_dock import classify

        try:
            result = classify(self.viewer, rules=self.current_rules())
        except ValueError as exc:
            self.status.setText(str(exc))
            raise
        self.status.setText(f"{result.count} cells classified")
        return result

    def count_in_annotation(self) -> dict[str, Any]:
        """Return counts and densities per class in the selected shape (last classification).

        Returns
        -------
        dict
            :func:`~napari_slidescope.pipeline.cell_classes.annotation_summary`, also shown in
            the status line.

        Raises
        ------
        ValueError
            Nothing classified yet, or no shape selected (shown in the status line too).
        """
        from napari_slidescope._napari import jobs
        from napari_slidescope._napari.shapes import selected_polygon
        from napari_slidescope.pipeline.cell_classes import annotation_summary

        try:
            if self.result is None or "class" not in self.result.columns:
                raise ValueError("nothing classified yet: press Apply first")
            polygon = selected_polygon(self.viewer, jobs.active_slide_layer(self.viewer))
            s = annotation_summary(self.result, polygon)
        except ValueError as exc:
            self.status.setText(str(exc))
            raise
        lines = [f"Selected shape: {s['area_mm2']:.4g} mm², {s['cells']} cells"]
        for name in self.result.classes:
            lines.append(f"{name}: {s[f'{name}_count']} ({s[f'{name}_per_mm2']:.0f} /mm²)")
        if "h_score" in s:
            lines.append(f"Positive {s['positive_percent']:.1f} % · H-score {s['h_score']:.0f}")
        self.status.setText("\n".join(lines))
        return s

    def _on_annotation(self) -> None:
        try:
            self.count_in_annotation()
        except ValueError:
            pass  # shown in the status line

    def _on_load(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load rules", "", "JSON (*.json)")
        if path:
            try:
                self.load(path)
            except ValueError:
                pass  # shown in the status line

    def _on_save(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save rules", "rules.json", "JSON (*.json)")
        if path:
            try:
                self.save(path)
            except ValueError as exc:
                self.status.setText(str(exc))

    def _on_apply(self) -> None:
        try:
            self.apply()
        except ValueError:
            pass  # shown in the status line
