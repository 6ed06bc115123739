"""embed_slide / embed_slides: one slide's tiles and embeddings on disk, resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.tiles.tiny_models import W, onnx_model

from napari_slidescope.tiles import TileTable
from napari_slidescope.tiles.cohort import embed_slide, embed_slides

anndata = pytest.importorskip("anndata", reason="anndata (the 'scverse' extra) is not installed")
pytest.importorskip("pyarrow", reason="pyarrow is not installed")

ARGS = {"tile_um": 32, "mpp": 0.5, "batch_size": 8}


def test_outputs_resume_and_hash(tile_slide_path, tmp_path):
    model = onnx_model(tmp_path / "tiny.onnx")
    out = tmp_path / "out"
    first = embed_slide(tile_slide_path, out, model=model, **ARGS)
    assert first["status"] == "done" and first["tiles"] > 0 and first["features"] == 8
    tiles = TileTable.from_geoparquet(out / "sample.svs.tiles.parquet")
    adata = anndata.read_zarr(out / "sample.svs.embeddings.zarr")
    assert len(tiles) == adata.n_obs == first["tiles"]
    assert adata.obs["id"].tolist() == tiles["id"].tolist()
    manifest = json.loads((out / "sample.svs.tiles.json").read_text())
    assert manifest["parameter_hash"] == first["parameter_hash"]
    assert manifest["parameters"]["model_sha256"] == adata.uns["slidescope_tiles"]["model_sha256"]

    again = embed_slide(tile_slide_path, out, model=model, **ARGS)
    assert again["status"] == "skipped" and again["parameter_hash"] == first["parameter_hash"]
    # another normalisation, another model file: recomputed under another hash
    other = embed_slide(tile_slide_path, out, model=model, std=(1, 1, 1), **ARGS)
    assert other["status"] == "done" and other["parameter_hash"] != first["parameter_hash"]
    onnx_model(model, weight=W * 2)
    changed = embed_slide(tile_slide_path, out, model=model, std=(1, 1, 1), **ARGS)
    assert changed["status"] == "done"
    assert changed["parameters"]["model_sha256"] != other["parameters"]["model_sha256"]
    assert changed["parameter_hash"] != other["parameter_hash"]
    refreshed = anndata.read_zarr(out / "sample.svs.embeddings.zarr")
    assert not np.allclose(refreshed.X, adata.X)
    assert not list(out.glob("*.partial"))


def test_cohort_on_a_dask_client(tile_slide_path, tmp_path):
    distributed = pytest.importorskip("distributed")
    model = onnx_model(tmp_path / "tiny.onnx")
    alone = embed_slides([tile_slide_path], tmp_path / "here", model=model, **ARGS)
    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as client:
        done = embed_slides(
            [tile_slide_path], tmp_path / "dask", client=client, model=model, **ARGS
        )
    assert done[0]["status"] == alone[0]["status"] == "done"
    assert done[0]["parameter_hash"] == alone[0]["parameter_hash"]
    a = anndata.read_zarr(tmp_path / "here" / "sample.svs.embeddings.zarr")
    b = anndata.read_zarr(tmp_path / "dask" / "sample.svs.embeddings.zarr")
    np.testing.assert_array_equal(a.X, b.X)


def test_missing_model_file_is_named(tile_slide_path, tmp_path):
    with pytest.raises(ValueError, match=r"nope\.onnx: no such model file"):
        embed_slide(tile_slide_path, tmp_path, model=tmp_path / "nope.onnx", **ARGS)
