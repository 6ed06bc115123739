"""`slidescope batch --spatialdata`: a SpatialData store per slide, whole or not at all."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from tests.batch_setup import cli

from napari_slidescope import PhenotypeRules, analyze_slides
from napari_slidescope.batch.engine import check_extras
from napari_slidescope.sample_cells import make_hdab

anndata = pytest.importorskip("anndata", reason="the scverse extra is not installed")
zarr = pytest.importorskip("zarr", minversion="3", reason="the store needs zarr >= 3")

TILE_UM = 100.0
RUN = {"segmenter": "builtin", "tile_size_um": TILE_UM, "cell_expansion_um": 3.0}


@pytest.fixture(scope="module")
def hdab_slide(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ihc")
    return make_hdab(seed=11, shape=(512, 512)).write(folder / "ki67.ome.tif")


@pytest.fixture(scope="module")
def stored(client, hdab_slide, tmp_path_factory):
    out = tmp_path_factory.mktemp("sd") / "out"
    rows = analyze_slides(hdab_slide, out, client=client, spatialdata=True, **RUN)
    assert rows[0]["status"] == "done", rows[0]["error"]
    return out / hdab_slide.name


def _leftovers(folder):
    return sorted(p.name for p in folder.glob(".cells.zarr*"))


def _store_ids(store):
    table = anndata.read_zarr(store / "tables" / "table")
    return table, table.obs["instance_id"].to_numpy()


def test_store_rows_and_shapes_are_the_nuclei_of_nuclei_parquet(stored, hdab_slide):
    nuclei = pq.read_table(stored / "nuclei.parquet")
    ids = nuclei.column("id").to_numpy()
    assert ids.size > 20
    table, store_ids = _store_ids(stored / "cells.zarr")
    assert np.array_equal(store_ids, ids)
    assert (table.obs["region"] == "cells").all()
    assert np.allclose(table.obsm["spatial"][:, 0], nuclei.column("centroid_x_um").to_numpy())
    for name in ("cells", "nuclei"):
        shapes = pq.read_table(stored / "cells.zarr" / "shapes" / name / "shapes.parquet")
        assert shapes.num_rows == ids.size
        assert sorted(shapes.column("__index_level_0__").to_pylist()) == sorted(ids.tolist())
    root = zarr.open_group(str(stored / "cells.zarr"), mode="r")
    attrs = root.attrs["slidescope"]
    assert attrs["image"] == "reference"  # the slide named, never copied
    assert attrs["slide"] == str(hdab_slide.resolve())
    assert attrs["region"] == [0, 0, 512, 512]
    assert "images" not in root or len(list(root["images"].keys())) == 0
    assert _leftovers(stored) == []
    manifest = json.loads((stored / "manifest.json").read_text())
    assert manifest["parameters"]["spatialdata"] is True


def test_spatialdata_reads_the_batch_store(stored):
    from tests.pipeline.test_sdata import _read_with_spatialdata

    n = pq.read_metadata(stored / "nuclei.parquet").num_rows
    out = _read_with_spatialdata(stored / "cells.zarr")
    assert out["shapes"] == ["cells", "nuclei"]
    assert out["images"] == []
    assert out["cells"]["count"] == out["nuclei"]["count"] == out["n_obs"] == n
    assert out["joined"] == n
    assert out["attrs"]["slidescope"]["image"] == "reference"


def test_resume_writes_the_store_of_a_slide_finished_without_it(client, hdab_slide, tmp_path):
    out = tmp_path / "out"
    rows = analyze_slides(hdab_slide, out, client=client, **RUN)
    assert rows[0]["status"] == "done", rows[0]["error"]
    folder = out / hdab_slide.name
    before = json.loads((folder / "manifest.json").read_text())
    assert "spatialdata" not in before["parameters"]  # digests of runs without it unchanged
    assert not (folder / "cells.zarr").exists()

    rows = analyze_slides(hdab_slide, out, client=client, spatialdata=True, resume=True, **RUN)
    assert rows[0]["status"] == "done", rows[0]["error"]
    after = json.loads((folder / "manifest.json").read_text())
    # the nuclei were kept, not segmented again: the slide task's record is the old one
    assert after["slide_task_seconds"] == before["slide_task_seconds"]
    assert after["parameters"]["spatialdata"] is True
    table, store_ids = _store_ids(folder / "cells.zarr")
    assert np.array_equal(store_ids, pq.read_table(folder / "nuclei.parquet").column("id"))
    assert (table.obs["region"] == "cells").all()  # the cells' outlines came back too

    # asked for again: kept as it is; no longer asked for: removed
    rows = analyze_slides(hdab_slide, out, client=client, spatialdata=True, resume=True, **RUN)
    assert rows[0]["status"] == "done"
    assert json.loads((folder / "manifest.json").read_text()) == after
    rows = analyze_slides(hdab_slide, out, client=client, resume=True, **RUN)
    assert rows[0]["status"] == "done"
    assert not (folder / "cells.zarr").exists()
    assert _leftovers(folder) == []


def test_an_interrupted_write_leaves_no_store_and_never_half_a_new_one(
    client, hdab_slide, tmp_path, monkeypatch
):
    from napari_slidescope.pipeline import sdata

    def broken(*args, **kwargs):  # the shapes are written, then the table fails
        raise OSError("disk full (simulated)")

    out = tmp_path / "out"
    folder = out / hdab_slide.name
    with monkeypatch.context() as m:
        m.setattr(sdata, "_write_table", broken)
        rows = analyze_slides(hdab_slide, out, client=client, spatialdata=True, **RUN)
    assert rows[0]["status"] == "failed"
    assert "disk full" in rows[0]["error"]
    assert not (folder / "cells.zarr").exists()
    assert _leftovers(folder) == []

    # a complete store; then a new one (other classes) that fails: the old one stays whole
    rules = PhenotypeRules.of(dab=True).save(tmp_path / "rules.json")
    rows = analyze_slides(hdab_slide, out, client=client, spatialdata=True, resume=True, **RUN)
    assert rows[0]["status"] == "done", rows[0]["error"]
    old_ids = _store_ids(folder / "cells.zarr")[1]
    with monkeypatch.context() as m:
        m.setattr(sdata, "_write_table", broken)
        rows = analyze_slides(
            hdab_slide, out, client=client, spatialdata=True, resume=True, classify=rules, **RUN
        )
    assert rows[0]["status"] == "failed"
    table, ids = _store_ids(folder / "cells.zarr")
    assert np.array_equal(ids, old_ids)
    assert "class" not in table.obs  # the old store, not a mix with the new classes
    assert _leftovers(folder) == []


def test_a_slide_without_nuclei_gets_no_store(tmp_path):
    from napari_slidescope.batch import outputs

    (tmp_path / "cells.zarr").mkdir()  # an earlier run's store: no longer true
    got = outputs.write_spatialdata(
        tmp_path, [], slide_path=str(tmp_path / "s.tif"), shape0=(64, 64), mpp=(0.5, 0.5)
    )
    assert got is None  # spatialdata rejects empty shapes: no store rather than a bad one
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_missing_scverse_extra_is_an_error_before_any_work(hdab_slide, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "anndata", None)
    with pytest.raises(ValueError, match=r"spatialdata=True.*napari-slidescope\[scverse\]"):
        check_extras(spatialdata=True)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"scverse"):
        analyze_slides(hdab_slide, out, spatialdata=True, **RUN)
    assert not out.exists()


def test_cli_flag_and_help(tmp_path):
    run = cli("batch", "--help")
    assert run.returncode == 0
    assert "--spatialdata" in run.stdout
    assert "referenced" in " ".join(run.stdout.split())
