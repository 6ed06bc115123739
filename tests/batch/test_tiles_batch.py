"""``--tiles --embed MODEL``: the fourth task, added through the task table.

Each slide is cut into tissue tiles (gated by the tissue the tissue task found) and its
tiles embedded by a tiny ONNX model the test builds; ``resume`` after the model file or
the tiling changed runs the tiles task alone (no slide task reaches the cluster, the
tissue is not written again); a model file that is not one is a clear error naming it; a
slide that cannot be read fails while the others are written.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from tests.batch_setup import cli, summary, write_two_slides
from tests.tiles.tiny_models import W, onnx_model

from napari_slidescope import analyze_slides
from napari_slidescope.batch.params import BatchParams
from napari_slidescope.options import TilesOptions

anndata = pytest.importorskip("anndata", reason="anndata (the 'scverse' extra) is not installed")
pytest.importorskip("pyarrow", reason="pyarrow is not installed")

TILES = {"tile_um": 32.0, "mpp": 1.0, "min_tissue": 0.5, "embed_batch": 16}


def _tasks_run(client, run):
    """Run `run()` and return its rows and the keys of the tasks the cluster ran meanwhile."""
    from distributed import get_task_stream

    with get_task_stream(client) as ts:
        rows = run()
    return rows, [str(t["key"]) for t in ts.data]


def _ran(keys):
    """The batch tasks of the readable slides (index 2 is ``broken.svs``, always retried)."""
    return [k for k in keys if k.startswith("slidescope-") and not k.split("-")[-2] == "2"]


def _manifest(out, name):
    return json.loads((out / name / "manifest.json").read_text())


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Two synthetic slides and a file that is not a slide, in one folder; a tiny model."""
    root = tmp_path_factory.mktemp("tilebatch")
    (root / "slides").mkdir()
    folder = write_two_slides(root / "slides")
    (folder / "broken.svs").write_bytes(b"this is not a slide" * 100)
    model = onnx_model(root / "tiny.onnx")
    return root, folder, model


def test_tiles_embeddings_resume_and_errors(cohort, client):
    root, folder, model = cohort
    out = root / "out"
    options = TilesOptions(**TILES, model=str(model))

    def run(opts: TilesOptions, resume: bool):
        return _tasks_run(
            client,
            lambda: analyze_slides(
                folder, out, tasks=("tissue",), tiles_options=opts, client=client, resume=resume
            ),
        )

    rows, keys = run(options, False)
    status = {r["slide"]: r["status"] for r in rows}
    assert status == {"a.svs": "done", "b.svs": "done", "broken.svs": "failed"}
    assert "broken.svs" in next(r["error"] for r in rows if r["slide"] == "broken.svs")
    # one tiles task per good slide; the broken slide's depends on its failed slide task,
    # which dask may or may not have started before the failure reached it
    assert sum(k.startswith("slidescope-tile-table-") for k in keys) in (2, 3)
    first = {}
    for name in ("a.svs", "b.svs"):
        m = _manifest(out, name)
        record = m["tile_table"]
        assert m["parameters"]["tiles"]["model_sha256"] == _sha256(model)
        assert m["parameters"]["tasks"] == ["tissue"] and "tiles" in m["parameters"]
        assert record["tissue"] == "slide task"  # the tissue task's result gated the tiles
        assert record["tiles"] > 0 and record["features"] == 8
        assert record["tiles_per_s"] > 0 and record["model_wait_s"] >= 0
        adata = anndata.read_zarr(out / name / "tile_embeddings.zarr")
        assert adata.n_obs == record["tiles"] and adata.n_vars == 8
        assert adata.uns["slidescope_tiles"]["model_sha256"] == _sha256(model)
        assert (out / name / "tiles.parquet").is_file()
        first[name] = (
            record,
            np.asarray(adata.X).copy(),
            (out / name / "tissue.geojson").stat().st_mtime_ns,
        )
    table = summary(out)
    assert int(table["a.svs"]["tiles"]) == first["a.svs"][0]["tiles"]
    assert float(table["a.svs"]["model_wait_s"]) >= 0

    # the same request: everything kept, nothing runs
    rows, keys = run(options, True)
    assert not _ran(keys)
    assert _manifest(out, "a.svs")["tile_table"] == first["a.svs"][0]

    # a new model saved under the same name: the tiles task alone, the tissue kept
    onnx_model(model, weight=W * 2)
    new = TilesOptions(**TILES, model=str(model))
    rows, keys = run(new, True)
    assert {r["slide"]: r["status"] for r in rows}["a.svs"] == "done"
    ran = _ran(keys)
    assert ran and all(k.startswith("slidescope-tile-table-") for k in ran), ran
    for name in ("a.svs", "b.svs"):
        m = _manifest(out, name)
        assert m["status"] == "done"
        assert m["parameters"]["tiles"]["model_sha256"] == _sha256(model)
        assert m["tile_table"]["sha256"] != first[name][0]["sha256"]
        assert m["tile_table"]["tiles"] == first[name][0]["tiles"]  # same tiling
        assert (out / name / "tissue.geojson").stat().st_mtime_ns == first[name][2]
        x = np.asarray(anndata.read_zarr(out / name / "tile_embeddings.zarr").X)
        assert not np.allclose(x, first[name][1])

    # another tiling: the tiles task alone again, a different tile count
    coarse = TilesOptions(**{**TILES, "tile_um": 64.0}, model=str(model))
    rows, keys = run(coarse, True)
    ran = _ran(keys)
    assert ran and all(k.startswith("slidescope-tile-table-") for k in ran), ran
    m = _manifest(out, "a.svs")
    assert m["tile_table"]["tiles"] < first["a.svs"][0]["tiles"]
    assert m["parameters"]["tiles"]["tile_um"] == 64.0
    assert (out / "a.svs" / "tissue.geojson").stat().st_mtime_ns == first["a.svs"][2]

    # tiles no longer asked for: their files go, nothing runs
    rows, keys = _tasks_run(
        client,
        lambda: analyze_slides(folder, out, tasks=("tissue",), client=client, resume=True),
    )
    assert not _ran(keys)
    assert not (out / "a.svs" / "tiles.parquet").exists()
    assert not (out / "a.svs" / "tile_embeddings.zarr").exists()
    assert _manifest(out, "a.svs")["tile_table"] is None
    assert "tiles" not in summary(out)["a.svs"]


def test_tiles_without_a_model_and_a_changed_tissue_option(cohort, client, tmp_path):
    _, folder, _ = cohort
    slides = tmp_path / "slides"
    slides.mkdir()
    shutil.copy(folder / "a.svs", slides / "a.svs")
    out = tmp_path / "out"
    rows = analyze_slides(slides, out, tasks=("tiles",), client=client)
    assert rows[0]["status"] == "done"
    m = _manifest(out, "a.svs")
    assert m["parameters"]["tiles"] == TilesOptions().as_dict()
    assert m["tile_table"]["tiles"] > 0 and "features" not in m["tile_table"]
    assert not (out / "a.svs" / "tile_embeddings.zarr").exists()
    from napari_slidescope.options import TissueOptions

    # the tissue options gate the tiles: changing them redoes the slide, tiles included
    rows, keys = _tasks_run(
        client,
        lambda: analyze_slides(
            slides,
            out,
            tasks=("tiles",),
            tissue_options=TissueOptions(target_mpp=16.0),
            client=client,
            resume=True,
        ),
    )
    assert any(k.startswith("slidescope-slide-") for k in keys)
    assert any(k.startswith("slidescope-tile-table-") for k in keys)


def test_a_bad_model_file_is_a_clear_error(cohort, tmp_path):
    _, folder, _ = cohort
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(ValueError, match="bad.onnx"):
        analyze_slides(folder, tmp_path / "out", tiles_options=TilesOptions(model=str(bad)))
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        TilesOptions(model=str(tmp_path / "missing.onnx"))
    res = cli("batch", folder, "-o", tmp_path / "out", "--tiles", "--embed", bad, timeout=120)
    assert res.returncode == 2
    assert "bad.onnx" in res.stderr


def test_the_model_digest_and_tiling_are_in_the_parameters(tmp_path):
    model = onnx_model(tmp_path / "m.onnx")
    a = BatchParams(("tissue", "tiles"), tiles_options=TilesOptions(model=str(model)))
    assert a.as_dict()["tiles"]["model_sha256"] == _sha256(model)
    onnx_model(model, weight=W * 3)
    b = BatchParams(("tissue", "tiles"), tiles_options=TilesOptions(model=str(model)))
    c = BatchParams(("tissue", "tiles"), tiles_options=TilesOptions(mpp=0.25, model=str(model)))
    assert len({a.digest(), b.digest(), c.digest()}) == 3
    # what the tissue (and nuclei) depend on is the same: resume keeps them
    plain = BatchParams(("tissue",))
    assert a.digest_without(["tiles"]) == b.digest_without(["tiles"]) == plain.digest()
    assert a.segmentation_dict() == plain.segmentation_dict()
    other = onnx_model(tmp_path / "other.onnx", weight=W * 7)
    assert a.tiles_options.replace(model=str(other)).model_sha256 == _sha256(other)
    with pytest.raises(ValueError, match="overlap_um"):
        TilesOptions(tile_um=32, overlap_um=32)


def test_cli_tiles_and_embed(cohort, tmp_path):
    root, folder, model = cohort
    slides = tmp_path / "slides"
    slides.mkdir()
    shutil.copy(folder / "b.svs", slides / "b.svs")
    out = tmp_path / "out"
    args = ["--tasks", "tissue", "--tile-um", "32", "--tile-mpp", "1"]  # --embed: --tiles
    res = cli(
        "batch", slides, "-o", out, *args, "--min-tissue", "0.25", "--embed", model,
        "--embed-batch", "8", "--workers", "1", "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    m = _manifest(out, "b.svs")
    assert m["parameters"]["tiles"]["tile_um"] == 32.0
    assert m["parameters"]["tiles"]["min_tissue"] == 0.25
    assert m["parameters"]["tiles"]["embed_batch"] == 8
    assert m["parameters"]["tiles"]["model_sha256"] == _sha256(model)
    assert (out / "b.svs" / "tile_embeddings.zarr").is_dir()


def test_a_model_changed_during_the_batch_fails_its_slide_naming_the_file(cohort, tmp_path):
    from napari_slidescope.batch.params import stamp_slide
    from napari_slidescope.batch.tasks import TaskFailed, tiles_task

    _, folder, _ = cohort
    model = onnx_model(tmp_path / "drifting.onnx")
    params = BatchParams(("tissue", "tiles"), tiles_options=TilesOptions(model=str(model)))
    onnx_model(model, weight=W * 5)  # re-exported while the batch runs
    out = tiles_task(str(folder / "a.svs"), stamp_slide(folder / "a.svs").key, params)
    assert isinstance(out, TaskFailed)  # the slide fails at once, not retried
    assert "drifting.onnx" in out.message and "changed" in out.message


def test_resume_with_a_new_model_keeps_the_nuclei(cohort, client, tmp_path):
    _, folder, model = cohort
    slides = tmp_path / "slides"
    slides.mkdir()
    shutil.copy(folder / "b.svs", slides / "b.svs")
    out = tmp_path / "out"
    kwargs = dict(client=client, segmenter="builtin", tile_size_um=256.0)
    first = TilesOptions(**TILES, model=str(model))
    rows = analyze_slides(slides, out, tiles_options=first, **kwargs)
    assert rows[0]["status"] == "done" and rows[0]["nuclei"] > 0
    nuclei = (out / "b.svs" / "nuclei.parquet").stat().st_mtime_ns
    other = tmp_path / "other.onnx"
    onnx_model(other, weight=W * 4)
    rows, keys = _tasks_run(
        client,
        lambda: analyze_slides(
            slides, out, tiles_options=TilesOptions(**TILES, model=str(other)), resume=True,
            **kwargs,
        ),
    )  # fmt: skip
    assert rows[0]["status"] == "done" and rows[0]["nuclei"] > 0
    ran = [k for k in keys if k.startswith("slidescope-")]
    assert ran and all(k.startswith("slidescope-tile-table-") for k in ran), ran
    assert (out / "b.svs" / "nuclei.parquet").stat().st_mtime_ns == nuclei
    m = _manifest(out, "b.svs")
    assert m["parameters"]["tiles"]["model_sha256"] == _sha256(other)
    assert m["summary"]["nuclei"] == rows[0]["nuclei"]
