"""The napari side reads the task table: layer names, exports and which steps a job runs.

A task added to the table (here a dummy one, registered for the test) reaches the layer
names, the exports and the job runner without any other edit of the napari side.
"""

import threading
import typing

import numpy as np
import pytest

from napari_slidescope._napari import export, jobs
from napari_slidescope._qt.task_fields import DOCK_TASKS
from napari_slidescope.options import TissueOptions
from napari_slidescope.pipeline import task_table
from napari_slidescope.pipeline.task_table import TASK_TABLE, ExportSpec, TaskSpec, task


@pytest.fixture
def dummy_task(monkeypatch):
    """A task "dummy" (needs tissue, a layer, one export) added to the table and the jobs."""
    spec = TaskSpec(
        "dummy",
        "Dummy",
        TissueOptions,
        "tissue_options",
        task("tissue").loader,
        task("tissue").result_loader,
        needs=("tissue",),
        segmentation=False,
        layer="dummy things",
        exports=(ExportSpec("dummy", "_dummy.geojson", "dummy GeoJSON", progress=False),),
    )
    table = (*TASK_TABLE, spec)
    monkeypatch.setattr(task_table, "TASK_TABLE", table)
    monkeypatch.setattr(task_table, "TASK_NAMES", tuple(t.name for t in table))
    monkeypatch.setattr(task_table, "_BY_NAME", {t.name: t for t in table})
    seen = []

    def step(spec, slide, state, cancel, asked):
        seen.append((asked, state.results.get("tissue")))
        yield "dummy done"

    monkeypatch.setitem(jobs.JOB_STEPS, "dummy", step)
    return spec, seen


def test_every_task_the_viewer_runs_has_a_step_a_layer_and_exports():
    for dock in DOCK_TASKS:
        spec = task(dock.name)
        assert dock.name in jobs.JOB_STEPS
        assert dock.layer_name("s.svs") == spec.layer_name("s.svs") == f"s.svs {spec.layer}"
        assert spec.exports, dock.name
        for e in spec.exports:
            path = export.default_export_path(type("I", (), {"name": "s.svs"}), e.kind, "out")
            assert path.name == f"s{e.suffix}"
            assert export.export_words(e.kind) == e.words
    kinds = [e.kind for t in TASK_TABLE for e in t.exports]
    assert len(kinds) == len(set(kinds))  # an export kind names one task's export
    assert set(typing.get_args(export.ExportKind)) == set(kinds)  # the type checker's list
    # the names the viewer has always used (tests of the layers pin them too)
    assert task("tissue").layer_name("a.svs") == "a.svs tissue"
    assert task("nuclei").layer_name("a.svs") == "a.svs nuclei"
    assert task("regions").layer_name("a.svs") == "a.svs regions"
    with pytest.raises(ValueError, match="tiles"):
        task("tiles").layer_name("a.svs")  # the tile overlay is named after what it shows
    with pytest.raises(ValueError, match="csv"):
        export.export_words("nothing")


def test_a_task_added_to_the_table_reaches_the_napari_side(dummy_task, tmp_path):
    spec, seen = dummy_task
    # layer name and export file, from the table alone
    assert task("dummy").layer_name("s.svs") == "s.svs dummy things"

    class _Image:
        name = "s.svs"

    assert export.default_export_path(_Image(), "dummy", tmp_path) == tmp_path / "s_dummy.geojson"
    assert export.export_words("dummy") == "dummy GeoJSON"

    class _Written:
        def to_geojson(self, target):  # no progress=: the table says so
            target.write_text("{}")

    out = export.write_export(_Written(), "dummy", tmp_path / "d.geojson")
    assert out.read_text() == "{}"
    # a job of the task runs what it needs first (the table's needs), then its own step
    rgb = np.full((256, 256, 3), 240, np.uint8)
    rgb[64:192, 64:192] = (180, 80, 150)  # a square of "tissue" on glass
    source = jobs.SlideSource("s", None, rgb, (1.0, 1.0), (256, 256), {"mpp": (1.0, 1.0)})
    job = jobs.JobSpec(source, "dummy", None, TissueOptions(), jobs.NucleiRun())
    out = list(jobs.run_job(job, threading.Event()))
    assert not [m for m in out if isinstance(m, jobs.Failed)], out
    assert isinstance(out[0], jobs.Stage) and out[0].name == "tissue"
    assert isinstance(out[1], jobs.TissueDone) and out[1].whole
    assert out[2:] == ["dummy done"]
    assert seen == [(True, out[1].result)]  # the step saw the tissue found for it
    # a job that carries the tissue it needs does not look for it again
    seen.clear()
    job.tissue = out[1].result
    assert list(jobs.run_job(job, threading.Event())) == ["dummy done"]


def test_a_tissue_job_runs_only_tissue():
    rgb = np.full((128, 128, 3), 240, np.uint8)
    source = jobs.SlideSource("s", None, rgb, (1.0, 1.0), (128, 128), {"mpp": (1.0, 1.0)})
    job = jobs.JobSpec(source, "tissue", (0, 0, 64, 64), TissueOptions(), jobs.NucleiRun())
    out = list(jobs.run_job(job, threading.Event()))
    assert [type(m).__name__ for m in out] == ["Stage", "TissueDone"]
    assert not out[1].whole  # found in the job's region


def test_only_a_tissue_layer_exports_without_a_result_canvas():
    """A Shapes layer named like the nuclei layer is no nuclei result (nothing to export)."""
    from napari.layers import Shapes

    square = np.array([[0, 0], [0, 10], [10, 10], [10, 0]], float)

    class _Viewer:
        layers = {"s.svs nuclei": Shapes([square]), "s.svs tissue": Shapes([square])}

    class _Image:
        name = "s.svs"

    for kind in ("nuclei", "csv", "geoparquet"):
        assert export.export_source(_Viewer(), _Image(), kind) is None, kind
    assert export.export_source(_Viewer(), _Image(), "tissue") is not None
