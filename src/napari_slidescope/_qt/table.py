"""The "Nuclei measurements" dock: one row per nucleus, a range filter and a histogram.

The table follows the slide chosen in the viewer (the selected slide layer, else the
last one) and its ``"<slide> nuclei"`` layer; it reloads when a run ends. Selecting a
row centres the view on that nucleus and rings it; clicking a nucleus in the viewer
selects its row. Sorting and filtering run on numpy arrays (a whole slide holds
hundreds of thousands of nuclei), never row by row in Python.

The histogram offers the marker means too (``CD3_cell_mean``, ``dab_od_nucleus_mean``). Once
the cells are classified by rules (the "Cell classification" dock, or ``classify``), a
marker's histogram shows its positivity threshold (IHC: the 1+, 2+, 3+ thresholds) as a red
line: drag it and the cells are classified again as it moves, their colours and the legend
following; the "Cell classification" dock takes the new value into the rules it saves.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from qtpy.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, QTimer
from qtpy.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from napari_slidescope._napari import jobs
from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._qt import session
from napari_slidescope._qt.lifetime import attach
from napari_slidescope.pipeline.task_table import task

__all__ = ["NucleiTableModel", "NucleiTableWidget", "column_title"]

#: Table columns shown, in order (the analysis table's names).
SHOWN = (
    "id",
    "area_um2",
    "perimeter_um",
    "eccentricity",
    "solidity",
    "hematoxylin_od_mean",
    "eosin_od_mean",
    "centroid_row",
    "centroid_col",
    "centroid_y_um",
    "centroid_x_um",
)
_TITLES = {
    "id": "ID",
    "area_um2": "Area (µm²)",
    "perimeter_um": "Perimeter (µm)",
    "eccentricity": "Eccentricity",
    "solidity": "Solidity",
    "hematoxylin_od_mean": "Hematoxylin (OD)",
    "eosin_od_mean": "Eosin (OD)",
    "centroid_row": "Row (px)",
    "centroid_col": "Column (px)",
    "centroid_y_um": "y (µm)",
    "centroid_x_um": "x (µm)",
}
_INTEGER = {"id", "centroid_row", "centroid_col", "centroid_y_um", "centroid_x_um"}
_Index = QModelIndex | QPersistentModelIndex


def column_title(name: str) -> str:
    """Column heading with its unit (``"Area (µm²)"``)."""
    return _TITLES.get(name, name)


class NucleiTableModel(QAbstractTableModel):
    """A nuclei table (dict of equal-length arrays) with numpy sorting and range filter."""

    def __init__(self) -> None:
        super().__init__()
        self._table: dict[str, np.ndarray] = {}
        self._columns: list[str] = []
        self._rows = np.zeros(0, np.intp)  # table rows shown, in display order
        self._sort: tuple[int, Qt.SortOrder] | None = None
        self._filter: tuple[str, float, float] | None = None

    # -- content --------------------------------------------------------------------------

    def set_table(self, table: dict[str, np.ndarray]) -> None:
        """Show `table` (keeps the sort order and the filter)."""
        self.beginResetModel()
        self._table = {k: np.asarray(v) for k, v in table.items()}
        self._columns = [c for c in SHOWN if c in self._table]
        self._update_rows()
        self.endResetModel()

    @property
    def columns(self) -> list[str]:
        """Names of the shown columns."""
        return list(self._columns)

    def marker_columns(self) -> list[str]:
        """Numeric ``*_mean`` columns (markers per compartment, stain optical densities)."""
        return [c for c, v in self._table.items() if c.endswith("_mean") and v.dtype.kind in "biuf"]

    @property
    def total(self) -> int:
        """Rows in the table (filtered or not)."""
        return int(self._table["id"].size) if "id" in self._table else 0

    def values(self, column: str) -> np.ndarray:
        """`column` of the rows shown, in display order."""
        return self._table[column][self._rows]

    def set_filter(self, column: str | None, lo: float = -math.inf, hi: float = math.inf) -> None:
        """Show only rows with ``lo <= column <= hi`` (None: every row)."""
        self.beginResetModel()
        self._filter = None if column is None else (column, float(lo), float(hi))
        self._update_rows()
        self.endResetModel()

    def _update_rows(self) -> None:
        n = self.total
        keep = np.ones(n, bool)
        if self._filter is not None and self._filter[0] in self._table:
            col, lo, hi = self._filter
            v = self._table[col]
            keep = (v >= lo) & (v <= hi)
        rows = np.flatnonzero(keep)
        if self._sort is not None and self._columns:
            column, order = self._sort
            v = self._table[self._columns[column]][rows]
            rows = rows[np.argsort(v, kind="stable")]
            if order == Qt.SortOrder.DescendingOrder:
                rows = rows[::-1]
        self._rows = rows

    def nucleus_id(self, row: int) -> int:
        """Return the nucleus id shown in `row`."""
        return int(self._table["id"][self._rows[row]])

    def record(self, row: int) -> dict[str, float]:
        """All values of the nucleus shown in `row`."""
        i = self._rows[row]
        return {k: float(v[i]) for k, v in self._table.items()}

    def row_of(self, nucleus_id: int) -> int:
        """Return the display row of `nucleus_id`, or -1 when it is not shown."""
        if "id" not in self._table:
            return -1
        hit = np.flatnonzero(self._table["id"][self._rows] == nucleus_id)
        return int(hit[0]) if hit.size else -1

    # -- Qt model -------------------------------------------------------------------------

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else int(self._rows.size)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._columns)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        name = self._columns[index.column()]
        value = self._table[name][self._rows[index.row()]]
        if role == Qt.ItemDataRole.DisplayRole:
            if name in _INTEGER:
                return f"{int(round(float(value))):,}"
            return f"{float(value):.3f}" if abs(value) < 10 else f"{float(value):,.1f}"
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def headerData(  # noqa: N802
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal and section < len(self._columns):
            return column_title(self._columns[section])
        return None

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.layoutAboutToBeChanged.emit()
        self._sort = (column, order)
        self._update_rows()
        self.layoutChanged.emit()


class NucleiTableWidget(QWidget):
    """Dock: the nuclei of the chosen slide, a range filter, and a histogram.

    Parameters
    ----------
    napari_viewer : napari.Viewer
    """

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self._viewer = getattr(napari_viewer, "__wrapped__", napari_viewer)
        self.session = session.session_for(self._viewer)
        self._image: Any = None
        self._layer: Any = None
        self._syncing = False
        self.model = NucleiTableModel()

        self.heading = QLabel("No nuclei yet: run “Segment nuclei”")
        self.heading.setWordWrap(True)
        self.tissue = QLabel("")
        self.tissue.setWordWrap(True)
        self.filter_column = QComboBox()
        self.filter_lo = QDoubleSpinBox()
        self.filter_hi = QDoubleSpinBox()
        for box in (self.filter_lo, self.filter_hi):
            box.setRange(-1e12, 1e12)
            box.setDecimals(3)
            box.setMinimumWidth(90)
            box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.filter_button = QPushButton("Filter")
        self.filter_button.setToolTip("Show only nuclei whose value lies in the range")
        self.clear_button = QPushButton("All")
        self.clear_button.setToolTip("Show every nucleus")
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.view.verticalHeader()
        if header is not None:
            header.setVisible(False)
        columns = self.view.horizontalHeader()
        if columns is not None:  # fit columns to 200 rows, not to every nucleus of a slide
            columns.setResizeContentsPrecision(200)
        self.view.setToolTip("Select a row to centre the view on that nucleus")
        self.hist_column = QComboBox()
        from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=(3.6, 2.0), dpi=100, layout="constrained")
        self.axes = self.figure.add_subplot()
        self.canvas = FigureCanvasQTAgg(self.figure)
        self.canvas.setMinimumHeight(160)
        self._lines: list[tuple[Any, str, int]] = []  # (line, marker, index) drawn
        self._drag: tuple[str, int] | None = None  # (marker, index) being dragged
        self._pending: tuple[str, float, int] | None = None  # a move not yet applied
        self._throttle = QTimer(self)
        self._throttle.setSingleShot(True)
        self._throttle.setInterval(60)  # ms between classifications while dragging
        self._throttle.timeout.connect(self._apply_pending)
        self.canvas.mpl_connect("button_press_event", self._on_press)
        self.canvas.mpl_connect("motion_notify_event", self._on_motion)
        self.canvas.mpl_connect("button_release_event", self._on_release)

        column = QHBoxLayout()
        column.addWidget(QLabel("Show nuclei with"))
        column.addWidget(self.filter_column, 1)
        filt = QHBoxLayout()
        for w in (self.filter_lo, QLabel("to"), self.filter_hi):
            filt.addWidget(w)
        filt.addWidget(self.filter_button)
        filt.addWidget(self.clear_button)
        hist = QHBoxLayout()
        hist.addWidget(QLabel("Histogram of"))
        hist.addWidget(self.hist_column, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.heading)
        layout.addWidget(self.tissue)
        layout.addLayout(column)
        layout.addLayout(filt)
        layout.addWidget(self.view, 3)
        layout.addLayout(hist)
        layout.addWidget(self.canvas, 2)
        self.setMaximumWidth(560)

        self.filter_button.clicked.connect(self._on_filter)
        self.clear_button.clicked.connect(self._on_clear)
        self.filter_column.currentIndexChanged.connect(self._on_filter_column)
        self.hist_column.currentIndexChanged.connect(self._draw_histogram)
        self._selection().selectionChanged.connect(self._on_row_selected)
        from napari_slidescope._napari.class_layers import events as class_events

        layers = self._viewer.layers
        attach(
            self,
            [
                (self.session.finished, self._on_run_finished),
                (layers.events.inserted, self._on_layers_changed),
                (layers.events.removed, self._on_layers_changed),
                (layers.selection.events.active, self._on_layers_changed),
                (class_events.changed, self._on_classes_changed),
            ],
            callbacks=[(self._viewer.mouse_drag_callbacks, self._on_viewer_click)],
        )
        self.refresh()

    # -- loading -----------------------------------------------------------------------

    def _slide(self) -> Any:
        try:
            return jobs.active_slide_layer(self._viewer)
        except ValueError:
            return None

    def refresh(self) -> None:
        """Reload the nuclei (and tissue) of the chosen slide."""
        image = self._slide()
        self._image = image
        name = task("nuclei").layer_name(image.name) if image is not None else None
        layer = self._viewer.layers[name] if name and name in self._viewer.layers else None
        canvas = canvas_of(layer) if layer is not None else None
        self._layer = layer if canvas is not None else None
        table = canvas.table() if canvas is not None else {}
        self.model.set_table(table)
        self.view.resizeColumnsToContents()
        markers = [c for c in self.model.marker_columns() if c not in self.model.columns]
        for combo in (self.filter_column, self.hist_column):
            current = combo.currentData()
            combo.blockSignals(True)
            combo.clear()
            for col in self.model.columns + (markers if combo is self.hist_column else []):
                if col != "id":
                    combo.addItem(column_title(col), col)
            i = combo.findData(current if current is not None else "area_um2")
            combo.setCurrentIndex(max(i, 0))
            combo.blockSignals(False)
        if self.model._filter is None:
            self._on_filter_column()  # the range offered: the column's own min and max
        self._update_heading()
        self._update_tissue()
        self._draw_histogram()

    def _update_heading(self) -> None:
        if self._image is None:
            self.heading.setText("No slide: open one first")
        elif self._layer is None:
            self.heading.setText(f"No nuclei on {self._image.name} yet: run “Segment nuclei”")
        else:
            summary = self.session.summary(self._image)
            shown = f"{self.model.rowCount():,} of {self.model.total:,} nuclei shown"
            self.heading.setText(shown + (f" · {summary}" if summary is not None else ""))

    def _update_tissue(self) -> None:
        image = self._image
        name = task("tissue").layer_name(image.name) if image is not None else None
        layer = self._viewer.layers[name] if name and name in self._viewer.layers else None
        result = layer.metadata.get("slidescope_tissue") if layer is not None else None
        if result is None:
            self.tissue.setText("")
            return
        area = (
            f"{result.area_um2 / 1e6:,.2f} mm²"
            if result.area_um2 is not None
            else f"{result.area_px:,.0f} px²"
        )
        self.tissue.setText(f"Tissue: {area} · {100 * result.fraction:.1f}% of the area analysed")

    def _on_run_finished(self, _summary: Any = None) -> None:
        self.refresh()

    def _on_layers_changed(self, _event: Any = None) -> None:
        image = self._slide()
        if image is not self._image or (
            self._layer is not None and self._layer not in self._viewer.layers
        ):
            self.refresh()

    # -- filter and histogram ------------------------------------------------------------

    def _on_filter_column(self, _index: int = 0) -> None:
        col = self.filter_column.currentData()
        if col is None or self.model.total == 0:
            return
        v = self.model._table[col]
        self.filter_lo.setValue(float(np.min(v)))
        self.filter_hi.setValue(float(np.max(v)))

    def _on_filter(self) -> None:
        self.set_filter(
            self.filter_column.currentData(), self.filter_lo.value(), self.filter_hi.value()
        )

    def _on_clear(self) -> None:
        self.set_filter(None)

    def set_filter(self, column: str | None, lo: float = -math.inf, hi: float = math.inf) -> None:
        """Show only nuclei with ``lo <= column <= hi`` (None: all)."""
        self.model.set_filter(column, lo, hi)
        self._update_heading()
        self._draw_histogram()

    def _draw_histogram(self, _index: int = 0) -> None:
        col = self.hist_column.currentData()
        self.axes.clear()
        if col is not None and self.model.rowCount():
            values = self.model.values(col)
            self.axes.hist(values, bins=min(50, max(5, int(np.sqrt(values.size)))), color="#3b7dd8")
            self.axes.set_xlabel(column_title(col))
            self.axes.set_ylabel("Nuclei")
        else:
            self.axes.text(0.5, 0.5, "no nuclei", ha="center", va="center")
            self.axes.set_axis_off()
        self._lines = []
        for marker, index, value, label in self.thresholds(col) if col is not None else []:
            line = self.axes.axvline(value, color="#d62728", linewidth=2)
            self.axes.annotate(
                label,
                (value, 1.0),
                xycoords=("data", "axes fraction"),
                color="#d62728",
                xytext=(3, -12),
                textcoords="offset points",
                fontsize=8,
            )
            self._lines.append((line, marker, index))
        self.canvas.draw_idle()

    # -- thresholds on the histogram ------------------------------------------------------

    def _classification(self) -> dict[str, Any] | None:
        info = self._layer.metadata.get("slidescope_classification") if self._layer else None
        return info if isinstance(info, dict) and info.get("kind") == "rules" else None

    def thresholds(self, column: str) -> list[tuple[str, int, float, str]]:
        """Thresholds of the classification that apply to `column`.

        Returns
        -------
        list of (marker, index, value, label)
            A marker's positivity threshold (index 0, label ``"CD3+"``), or the three IHC
            thresholds on the DAB column (index 0-2, labels ``"1+"`` to ``"3+"``); empty
            when the layer is not classified by rules or `column` is none of theirs.
        """
        from napari_slidescope.pipeline.cell_classes import DAB, marker_column

        info = self._classification()
        if info is None:
            return []
        table = self.model._table
        rules = info["rules"]
        out: list[tuple[str, int, float, str]] = []
        for marker, spec in rules.get("markers", {}).items():
            comp = (spec.get("compartment") if isinstance(spec, dict) else None) or info[
                "compartment"
            ]
            try:
                hit = marker_column(table, marker, comp) == column
            except ValueError:
                continue
            value = info["thresholds"].get(marker)
            if hit and value is not None and math.isfinite(value):
                out.append((marker, 0, float(value), f"{marker}+"))
        dab = rules.get("dab")
        if dab is not None:
            try:
                hit = marker_column(table, DAB, dab["compartment"]) == column
            except ValueError:
                hit = False
            if hit:
                for k, value in enumerate(info.get("dab_thresholds", dab["thresholds"])):
                    out.append((DAB, k, float(value), f"{k + 1}+"))
        return out

    def set_threshold(self, marker: str, value: float, index: int = 0) -> Any:
        """Move a threshold of the classification and classify the cells again.

        `marker` and `index` as :meth:`thresholds` gives them; an IHC threshold stays
        between its neighbours. Returns the classified result (None when the layer is
        not classified by rules).
        """
        from napari_slidescope._qt.cell_classes_dock import classify
        from napari_slidescope.pipeline.cell_classes import DAB, PhenotypeRules

        info = self._classification()
        if info is None or self._layer is None:
            return None
        rules = dict(info["rules"])
        if marker == DAB:
            t = [float(v) for v in rules["dab"]["thresholds"]]
            step = 1e-6 * max(1.0, abs(value))
            lo = t[index - 1] + step if index > 0 else -math.inf
            hi = t[index + 1] - step if index < len(t) - 1 else math.inf
            t[index] = min(max(float(value), lo), hi)
            rules["dab"] = {**rules["dab"], "thresholds": t}
        else:
            markers = dict(rules["markers"])
            spec = markers[marker]
            markers[marker] = (
                {**spec, "threshold": float(value)} if isinstance(spec, dict) else float(value)
            )
            rules["markers"] = markers
        new = PhenotypeRules.from_dict(rules, where="threshold on the histogram")
        return classify(self._viewer, self._layer, rules=new)

    def _on_classes_changed(self, layer: Any, _result: Any = None) -> None:
        if layer is self._layer:
            self._draw_histogram()

    def _line_near(self, event: Any) -> tuple[str, int] | None:
        if event.inaxes is not self.axes or event.x is None:
            return None
        best, key = 6.0, None  # display pixels
        for line, marker, index in self._lines:
            x = self.axes.transData.transform((line.get_xdata()[0], 0))[0]
            if abs(x - event.x) <= best:
                best, key = abs(x - event.x), (marker, index)
        return key

    def _on_press(self, event: Any) -> None:
        self._drag = self._line_near(event)

    def _on_motion(self, event: Any) -> None:
        if self._drag is None or event.inaxes is not self.axes or event.xdata is None:
            return
        x = float(event.xdata)
        for line, marker, index in self._lines:  # the line follows the mouse at once
            if (marker, index) == self._drag:
                line.set_xdata([x, x])
        self.canvas.draw_idle()
        # the cells follow as often as classifying allows (a whole slide takes a while)
        self._pending = (self._drag[0], x, self._drag[1])
        if not self._throttle.isActive():
            self._throttle.start()

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.set_threshold(*pending)

    def _on_release(self, event: Any) -> None:
        self._throttle.stop()
        if self._drag is not None and event.inaxes is self.axes and event.xdata is not None:
            self._pending = (self._drag[0], float(event.xdata), self._drag[1])
        self._apply_pending()  # where it was let go (or last seen over the histogram)
        self._drag = None

    # -- selection both ways ----------------------------------------------------------------

    def _selection(self) -> Any:
        selection = self.view.selectionModel()
        if selection is None:
            raise RuntimeError("the table view has no selection model")
        return selection

    def _on_row_selected(self, *_args: Any) -> None:
        rows = self._selection().selectedRows()
        if not rows or self._image is None:
            return
        rec = self.model.record(rows[0].row())
        self._highlight(rec)
        if not self._syncing:
            self.centre_on(rec)

    def centre_on(self, rec: dict[str, float]) -> None:
        """Centre the view on a nucleus (a table record in level-0 pixels)."""
        from napari_slidescope._napari.viewport import camera_of

        camera_of(self._viewer).center = self._world(rec)

    def _world(self, rec: dict[str, float]) -> tuple[float, float]:
        """World (y, x) of a nucleus centroid (level-0 pixel ``i`` spans ``[i, i + 1)``)."""
        s = np.asarray(self._image.scale, float)[-2:]
        t = np.asarray(self._image.translate, float)[-2:]
        c = np.array([rec["centroid_row"], rec["centroid_col"]]) - 0.5
        y, x = t + s * c
        return float(y), float(x)

    def _highlight(self, rec: dict[str, float]) -> None:
        """Ring the nucleus in a Points layer ``"<slide> selected nucleus"``."""
        name = f"{self._image.name} selected nucleus"
        diameter = 2.0 * math.sqrt(max(rec.get("area_um2", 30.0), 1.0) / math.pi)
        world = np.array([self._world(rec)])
        size = max(4.0 * diameter, 20.0)  # world units are µm: a ring well around it
        if name in self._viewer.layers:
            ring = self._viewer.layers[name]
            ring.data = world
            ring.size = size
        else:
            active = self._viewer.layers.selection.active
            units = getattr(self._image, "units", None)  # the slide's µm: one unit for all
            ring = self._viewer.add_points(
                world,
                name=name,
                size=size,
                face_color="yellow",
                border_width=0,
                symbol="ring",
                **({"units": tuple(units)[-2:]} if units is not None else {}),
            )
            if active is not None:  # keep the user's selection of layers
                self._viewer.layers.selection.active = active
        if self._layer is not None:
            self._layer.selected_label = int(rec["id"])

    def select_nucleus(self, nucleus_id: int) -> bool:
        """Select the row of `nucleus_id` without moving the view; False if not shown."""
        row = self.model.row_of(nucleus_id)
        if row < 0:
            return False
        self._syncing = True
        try:
            self.view.selectRow(row)
            self.view.scrollTo(self.model.index(row, 0))
        finally:
            self._syncing = False
        return True

    def _on_viewer_click(self, viewer: Any, event: Any) -> None:
        layer = self._layer
        if layer is None or layer not in viewer.layers or not layer.visible:
            return
        from napari_slidescope._napari.viewport import clicked_label

        value = clicked_label(layer, event)
        if value is not None:
            self.select_nucleus(value)
