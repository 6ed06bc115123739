"""What a batch records of what ran, and how resume and failures use it.

An in-process cluster (``Client(processes=False)``): its workers see the segmenters this
test registers and the functions it patches.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from tests.fakes import FAKE_MODEL as FAKE
from tests.fakes import FakeLearned

from napari_slidescope import analyze_slides
from napari_slidescope.batch import tasks
from napari_slidescope.segmenters import SegmenterInfoWarning, register_segmenter, registry
from napari_slidescope.slide import SlideError

TILE_UM = 256.0


@pytest.fixture(scope="module")
def local_client():
    import distributed

    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=2, dashboard_address="127.0.0.1:0"
    ) as client:
        yield client


def manifest(out, name):
    return json.loads((out / name / "manifest.json").read_text())


def test_resume_redoes_slides_once_a_learned_model_is_installed(
    local_client, slides, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "no-models"))
    kw = dict(client=local_client, tile_size_um=TILE_UM)
    with pytest.warns(SegmenterInfoWarning) as said:
        rows = analyze_slides(slides, tmp_path / "out", **kw)  # auto: the built-in method
    assert len([w for w in said if w.category is SegmenterInfoWarning]) == 1  # once per run
    out = tmp_path / "out"
    assert [r["status"] for r in rows] == ["done", "done"]
    before = manifest(out, "a.svs")
    assert before["parameters"]["nuclei"]["segmenter"] == "auto"
    resolved = before["resolved"]
    assert resolved["segmenter"] == "builtin"
    assert resolved["weights_sha256"] is None
    assert resolved["stain_mode"] == "brightfield"
    assert resolved["mpp"] == 0.5
    meta = json.loads(pq.read_schema(out / "a.svs" / "nuclei.parquet").metadata[b"slidescope"])
    assert meta["resolved"] == resolved
    assert meta["parameters_sha256"] == before["parameters_sha256"]

    # nothing changed: resume keeps both, and says so
    kept = []
    analyze_slides(slides, out, resume=True, progress=lambda s: kept.append(s.kept), **kw)
    assert kept.count(True) == 2
    assert manifest(out, "a.svs") == before

    # the learned model is installed now: resume redoes both, with it
    monkeypatch.setitem(registry._REGISTRY, "instanseg", registry._REGISTRY["instanseg"])
    register_segmenter("instanseg", FakeLearned, identity=lambda: dict(FAKE))
    kept.clear()
    rows = analyze_slides(slides, out, resume=True, progress=lambda s: kept.append(s.kept), **kw)
    assert True not in kept
    assert [r["status"] for r in rows] == ["done", "done"]
    after = manifest(out, "a.svs")
    assert after["resolved"]["segmenter"] == "instanseg"
    assert {k: after["resolved"][k] for k in FAKE} == FAKE
    assert after["parameters"] == before["parameters"]  # the same request ...
    assert after["parameters_sha256"] != before["parameters_sha256"]  # ... another result
    meta = json.loads(pq.read_schema(out / "a.svs" / "nuclei.parquet").metadata[b"slidescope"])
    assert meta["resolved"]["segmenter"] == "instanseg"
    assert meta["parameters_sha256"] == after["parameters_sha256"]

    # and with the model still there, the next resume keeps them
    kept.clear()
    analyze_slides(slides, out, resume=True, progress=lambda s: kept.append(s.kept), **kw)
    assert kept.count(True) == 2

    # the model changes (another version): redone again
    monkeypatch.setitem(FAKE, "weights_sha256", "cd" * 32)
    kept.clear()
    analyze_slides(slides, out, resume=True, progress=lambda s: kept.append(s.kept), **kw)
    assert True not in kept
    assert manifest(out, "a.svs")["resolved"]["weights_sha256"] == "cd" * 32


def test_builtin_and_a_learned_model_never_share_a_hash(
    local_client, slides, tmp_path, monkeypatch
):
    monkeypatch.setitem(registry._REGISTRY, "instanseg", registry._REGISTRY["instanseg"])
    register_segmenter("instanseg", FakeLearned, identity=lambda: dict(FAKE))
    kw = dict(client=local_client, tile_size_um=TILE_UM, tasks=["nuclei"])
    analyze_slides(slides / "b.svs", tmp_path / "builtin", segmenter="builtin", **kw)
    analyze_slides(slides / "b.svs", tmp_path / "learned", segmenter="instanseg", **kw)
    one, two = manifest(tmp_path / "builtin", "b.svs"), manifest(tmp_path / "learned", "b.svs")
    assert one["resolved"]["segmenter"] == "builtin"
    assert two["resolved"]["model"] == "fake_nuclei"
    assert one["parameters_sha256"] != two["parameters_sha256"]


def test_summary_path_is_absolute(local_client, slides, tmp_path, monkeypatch):
    monkeypatch.chdir(slides.parent)
    rows = analyze_slides(f"{slides.name}/b.svs", tmp_path, tasks=["tissue"], client=local_client)
    assert rows[0]["path"] == str(slides / "b.svs")
    text = (tmp_path / "summary.csv").read_text()
    assert f",{slides / 'b.svs'}\n" in text


def test_errors_that_recur_are_not_retried(local_client, slides, tmp_path, monkeypatch):
    calls = []

    def unreadable(path, stamp, storage_options=None):
        calls.append(path)
        raise SlideError(path, "not a slide (test)")

    monkeypatch.setattr(tasks, "_open", unreadable)
    kw = dict(tasks=["tissue"], client=local_client, retries=3)
    [row] = analyze_slides(slides / "b.svs", tmp_path / "a", **kw)
    assert row["status"] == "failed"  # not retried
    assert len(calls) == 1
    assert row["error"] == f"SlideError: {slides / 'b.svs'}: not a slide (test)"
    m = manifest(tmp_path / "a", "b.svs")
    assert m["error"] == row["error"]
    assert "Traceback" in m["traceback"]
    assert "unreadable" in m["traceback"]

    # an error that may pass (a worker's hiccup) is retried
    def flaky(path, stamp, storage_options=None):
        calls.append(path)
        raise RuntimeError("flaky")

    calls.clear()
    monkeypatch.setattr(tasks, "_open", flaky)
    [row] = analyze_slides(slides / "b.svs", tmp_path / "b", **kw)
    assert row["status"] == "failed"
    assert len(calls) == 4


@pytest.mark.parametrize(
    "nuclei_mpp, expected",
    [
        (None, 0.5),  # the rule: the 0.5 µm/px model on a 0.5 µm/px slide
        (1.0, 1.0),  # asked: coarser than both
    ],
)
def test_batch_segments_at_the_asked_resolution_else_the_rule(
    local_client, slides, tmp_path, monkeypatch, nuclei_mpp, expected
):
    monkeypatch.setitem(registry._REGISTRY, "instanseg", registry._REGISTRY["instanseg"])
    register_segmenter("instanseg", FakeLearned, identity=lambda: dict(FAKE))
    out = tmp_path / "out"
    rows = analyze_slides(
        slides / "b.svs",
        out,
        client=local_client,
        tile_size_um=TILE_UM,
        tasks=["nuclei"],
        segmenter="instanseg",
        nuclei_mpp=nuclei_mpp,
    )
    assert rows[0]["status"] == "done", rows[0]["error"]
    assert manifest(out, "b.svs")["resolved"]["mpp"] == expected
    meta = json.loads(pq.read_schema(out / "b.svs" / "nuclei.parquet").metadata[b"slidescope"])
    assert meta["resolved"]["mpp"] == expected
