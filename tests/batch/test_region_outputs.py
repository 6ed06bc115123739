"""Per-region figures in regions.csv and summary.csv (no cluster needed)."""

from __future__ import annotations

from types import SimpleNamespace

from napari_slidescope.batch.outputs import (
    SUMMARY_COLUMNS,
    SummaryRow,
    read_summary,
    region_rows,
    write_summary,
)


def test_region_rows_split_figures_by_the_longest_class_name():
    regions = SimpleNamespace(classes=("Tumor", "Tumor stroma", "Fat"))
    figures = {
        "Tumor_area_mm2": 1.0,
        "Tumor_cells": 10,
        "Tumor stroma_area_mm2": 2.0,
        "Tumor stroma_cells": 3,
        "Fat_area_mm2": 0.5,
        "tumour_stroma_ratio": 0.33,  # of no region: summary.csv only
    }
    rows = region_rows(regions, figures)
    assert rows == [
        {"region": "Tumor", "area_mm2": 1.0, "cells": 10},
        {"region": "Tumor stroma", "area_mm2": 2.0, "cells": 3},
        {"region": "Fat", "area_mm2": 0.5},
    ]


def test_summary_region_columns_follow_the_usual_ones_and_round_trip(tmp_path):
    plain = SummaryRow("a.svs", "done", nuclei=5, path="/a.svs")
    assert list(plain.to_json()) == list(SUMMARY_COLUMNS)  # a run without regions
    row = SummaryRow(
        "b.svs", "done", nuclei=7, path="/b.svs", regions={"Tumor_area_mm2": 1.5, "Tumor_cells": 7}
    )
    assert row.to_json()["Tumor_cells"] == 7
    assert SummaryRow.from_json(row.to_json()) == row  # manifests keep them (resume)
    path = tmp_path / "summary.csv"
    write_summary(path, [plain, row])
    header = path.read_text().splitlines()[0].split(",")
    assert header == [*SUMMARY_COLUMNS, "Tumor_area_mm2", "Tumor_cells"]
    back = read_summary(path)
    assert back[1].regions == {"Tumor_area_mm2": 1.5, "Tumor_cells": 7.0}
    assert back[0].regions == {"Tumor_area_mm2": None, "Tumor_cells": None}
    write_summary(path, [plain])
    assert path.read_text().splitlines()[0].split(",") == list(SUMMARY_COLUMNS)
