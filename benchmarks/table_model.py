"""How fast the "Nuclei measurements" table answers on a whole slide's worth of nuclei.

Run (no display needed)::

    QT_QPA_PLATFORM=offscreen python benchmarks/table_model.py --rows 300000

Prints the median of five calls of each action the user triggers: loading the table at
the end of a run, sorting by a column, a range filter, fitting the columns, and finding
the row of a nucleus clicked in the viewer. Sorting and filtering run on numpy arrays;
the peer is the same sort done row by row by Qt's ``QSortFilterProxyModel`` over the
same model (the usual way to add sorting to a Qt table).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np


def _median_ms(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1000


def main() -> None:
    """Print the medians (ms) for ``--rows`` synthetic nuclei."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    args = parser.parse_args()
    from qtpy.QtCore import QSortFilterProxyModel, Qt
    from qtpy.QtWidgets import QApplication, QTableView

    from napari_slidescope._qt.table import NucleiTableModel

    app = QApplication.instance() or QApplication([])
    n = args.rows
    rng = np.random.default_rng(0)
    table = {
        "id": np.arange(1, n + 1, dtype=np.int32),
        "area_um2": rng.uniform(10, 300, n),
        "centroid_row": rng.uniform(0, 1e5, n),
        "centroid_col": rng.uniform(0, 1e5, n),
        "eccentricity": rng.uniform(0, 1, n),
    }
    model = NucleiTableModel()
    view = QTableView()
    view.setModel(model)
    view.horizontalHeader().setResizeContentsPrecision(200)
    desc = Qt.SortOrder.DescendingOrder
    rows = {
        "load the table": _median_ms(lambda: model.set_table(table)),
        "sort by area": _median_ms(lambda: model.sort(1, desc)),
        "range filter on area": _median_ms(lambda: model.set_filter("area_um2", 50, 150)),
        "fit the columns": _median_ms(view.resizeColumnsToContents),
        "row of a clicked nucleus": _median_ms(lambda: model.row_of(n // 2)),
    }
    model.set_filter(None)
    proxy = QSortFilterProxyModel()
    proxy.setSourceModel(model)
    peer = _median_ms(lambda: (proxy.sort(-1), proxy.sort(1, desc)), repeat=1)
    print(f"{n:,} nuclei, median of 5 (ms):")
    for name, ms in rows.items():
        print(f"  {name:<26} {ms:9.1f}")
    ratio = peer / rows["sort by area"]
    print(f"  peer: QSortFilterProxyModel sort by area {peer:9.1f}  ({ratio:.0f}x)")
    del app


if __name__ == "__main__":
    main()
