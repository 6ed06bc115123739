"""The dock's exports: the runs' own nuclei, written off the GUI thread; opening writes nothing."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from napari_slidescope._napari import export as export_mod
from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._qt import widget as widget_mod


def _folder_state(folder):
    return sorted(p.name for p in folder.iterdir()), os.stat(folder).st_mtime_ns


def test_opening_a_slide_writes_nothing_into_its_folder(dock_slide, tmp_path, qtbot):
    """Issue #36: no probe file next to the slide (API, napari reader, dock)."""
    from napari_slidescope.sample_data import write_sample_slide
    from napari_slidescope.slide import open_slide

    folder = tmp_path / "slides"
    folder.mkdir()
    write_sample_slide(folder / "s.svs", shape=(512, 768), mpp=0.5, seed=4, tile=128)
    before = _folder_state(folder)
    with open_slide(folder / "s.svs") as slide:
        slide.read_region((0, 0, 64, 64))
    assert _folder_state(folder) == before
    viewer, [image], widget = dock_slide(folder / "s.svs")
    widget.image.value = image
    qtbot.wait(200)
    assert str(widget.export_dir.value) == str(folder)  # proposed, not probed
    assert _folder_state(folder) == before


def _run(widget, image, qtbot, seg, **where):
    widget.session.run(image, "nuclei", nuclei_run=seg, **where)
    qtbot.waitUntil(lambda: not widget.session.busy, timeout=30_000)


@pytest.mark.parametrize("scope", ["region", "slide"])
def test_dock_writes_the_runs_own_nuclei_on_a_worker_thread(
    dock_slide, small_slide, qtbot, tmp_path, threshold_segmenter, monkeypatch, scope
):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    where = {"region": (0, 0, 512, 768)} if scope == "region" else {"scope": "slide"}
    _run(widget, image, qtbot, seg, **where)
    canvas = canvas_of(viewer.layers[f"{image.name} nuclei"])
    table = canvas.table()
    assert table["id"].size > 0
    kept = canvas.kept_result()
    assert kept is not None and kept.labels is None
    assert sorted(kept.outlines[1].tolist()) == sorted(table["id"].tolist())

    def no_tracing(*_a, **_k):
        raise AssertionError("the export traced the label canvas again")

    monkeypatch.setattr(type(canvas), "to_result", no_tracing)
    threads, seen = [], []
    real = export_mod.write_export

    def recording(source, kind, target, *, progress=None):
        threads.append(threading.get_ident())

        def report(done, total):
            seen.append((done, total))
            progress(done, total)

        return real(source, kind, target, progress=report)

    monkeypatch.setattr(widget_mod, "write_export", recording)
    widget.export_dir.value = tmp_path
    for kind in ("nuclei", "csv", "geoparquet"):
        worker = widget.export(kind)
        assert worker is not None
        assert widget.exporting and not widget.export_parquet.enabled
        qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
        assert widget.export_status.value.startswith("Wrote "), widget.export_status.value
        assert widget.export_parquet.enabled
    assert threads and threading.get_ident() not in threads
    assert seen[-1][0] == seen[-1][1] == table["id"].size
    feats = json.loads((tmp_path / "small_nuclei.geojson").read_text())["features"]
    ids = [f["properties"]["measurements"]["id"] for f in feats]
    assert sorted(ids) == sorted(float(i) for i in table["id"])
    assert (tmp_path / "small_nuclei.csv").read_text().count("\n") == table["id"].size + 1


def test_a_canvas_without_kept_outlines_is_traced_again(
    dock_slide, small_slide, qtbot, tmp_path, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    _run(widget, image, qtbot, seg, region=(0, 0, 512, 512))
    canvas = canvas_of(viewer.layers[f"{image.name} nuclei"])
    canvas.traced = False  # as for nuclei that came without outlines
    assert canvas.kept_result() is None
    snapshot = export_mod.export_source(viewer, image, "nuclei")
    assert snapshot.data is canvas.data
    assert all(a is b for a, b in zip(snapshot.tables, canvas.tables, strict=True))
    assert snapshot.tables is not canvas.tables  # a run going on adds nothing to it
    widget.export_dir.value = tmp_path
    widget.export("nuclei")
    qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
    feats = json.loads((tmp_path / "small_nuclei.geojson").read_text())["features"]
    assert len(feats) == canvas.to_result().count > 0


def test_erased_nuclei_leave_the_kept_result(dock_slide, small_slide, qtbot, threshold_segmenter):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    _run(widget, image, qtbot, seg, region=(0, 0, 512, 768))
    layer = viewer.layers[f"{image.name} nuclei"]
    canvas = canvas_of(layer)
    before = canvas.kept_result()
    gone = int(before.columns["id"][0])
    layer.data[layer.data == gone] = 0
    after = canvas.kept_result()
    assert after.count == before.count - 1
    assert gone not in after.columns["id"] and gone not in after.outlines[1]
    assert np.array_equal(np.sort(after.outlines[1]), np.sort(after.columns["id"]))


def test_a_failed_export_says_why_and_frees_the_buttons(
    dock_slide, small_slide, qtbot, tmp_path, threshold_segmenter, monkeypatch
):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    _run(widget, image, qtbot, seg, region=(0, 0, 256, 256))

    def full(*_a, **_k):
        raise OSError(28, "cannot write x: No space left on device (the disk is full)")

    monkeypatch.setattr(widget_mod, "write_export", full)
    widget.export_dir.value = tmp_path
    assert widget.export("csv") is not None
    qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
    assert widget.export_status.value.startswith("Export failed: ")
    assert "disk is full" in widget.export_status.value
    assert widget.export_csv.enabled
