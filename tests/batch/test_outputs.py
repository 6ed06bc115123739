"""The batch's file records: summary rows and manifests, to and from JSON and CSV."""

from __future__ import annotations

import csv
import json

import pytest

from napari_slidescope.batch.outputs import (
    SUMMARY_COLUMNS,
    Manifest,
    SummaryRow,
    TileRecord,
    read_manifest,
    read_summary,
    write_manifest,
    write_summary,
)


def test_summary_columns_are_the_documented_ones_in_order():
    assert SUMMARY_COLUMNS == (
        "slide",
        "status",
        "error",
        "tissue_area_mm2",
        "nuclei",
        "nuclei_per_mm2",
        "mean_nucleus_area_um2",
        "seconds",
        "classes",
        "positive_percent",
        "h_score",
        "positive_per_mm2",
        "path",
    )


def test_summary_rows_round_trip_through_csv_and_json(tmp_path):
    rows = [
        SummaryRow(
            "a.svs",
            "done",
            None,
            1.25,
            300,
            240.0,
            35.5,
            12.5,
            "Negative: 2; 1+: 1",
            33.3333,
            66.6667,
            0.8,
            "/data/a.svs",
        ),
        SummaryRow("b.svs", "failed", "ValueError: not a slide", path="/data/b.svs"),
    ]
    path = tmp_path / "summary.csv"
    write_summary(path, rows)
    with open(path, newline="") as fh:
        raw = list(csv.DictReader(fh))
    assert raw[0]["nuclei"] == "300"
    assert raw[0]["tissue_area_mm2"] == "1.25"
    assert raw[1]["nuclei"] == ""
    assert raw[1]["error"] == "ValueError: not a slide"
    assert read_summary(path) == rows
    for row in rows:
        assert SummaryRow.from_json(json.loads(json.dumps(row.to_json()))) == row
    assert list(rows[0].to_json()) == list(SUMMARY_COLUMNS)


def test_manifest_round_trips_and_reads_what_it_does_not_know(tmp_path):
    m = Manifest(
        "a.svs",
        "/data/a.svs",
        "done",
        slide_stamp={"size": 10, "mtime_ns": 5, "head_sha256": "0" * 64},
        parameters={"tasks": ["tissue", "nuclei"]},
        requested_sha256="1" * 64,
        resolved={"segmenter": "builtin"},
        parameters_sha256="2" * 64,
        plan={"mpp": 0.5},
        tiles={3: TileRecord("done", 0.25), 11: TileRecord("pending")},
        summary=SummaryRow("a.svs", "done", nuclei=3, path="/data/a.svs"),
    )
    write_manifest(tmp_path, m)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["tiles"] == {"3": {"status": "done", "seconds": 0.25}, "11": {"status": "pending"}}
    assert raw["summary"]["nuclei"] == 3
    assert raw["status"] == "done"
    assert read_manifest(tmp_path) == m
    assert m.replace(status="failed").status == "failed"
    assert m.status == "done"
    # an older or newer manifest: unknown keys ignored, missing ones None
    raw["from_the_future"] = 1
    del raw["plan"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    assert read_manifest(tmp_path) == m.replace(plan=None)


@pytest.mark.parametrize("text", ["", "{oops", "[1, 2]", '{"tiles": 3}'])
def test_unreadable_manifest_is_none(tmp_path, text):
    (tmp_path / "manifest.json").write_text(text)
    assert read_manifest(tmp_path) is None
