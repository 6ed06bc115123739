"""embed_tiles: a tiny ONNX model, a TorchScript one and a callable give the numpy features."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from tests.tiles.tiny_models import B, W, onnx_model

from napari_slidescope import open_slide
from napari_slidescope.tiles import read_tile, tile_slide
from napari_slidescope.tiles.embed import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    embed_tiles,
    load_model,
    write_tile_embeddings,
)

anndata = pytest.importorskip("anndata", reason="anndata (the 'scverse' extra) is not installed")


def _reference(images: np.ndarray) -> np.ndarray:
    """Global average pooling of the normalised tiles, then the fixed linear layer."""
    x = images.astype(np.float32) / 255.0
    x = (x - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)
    return x.mean(axis=(1, 2)) @ W + B


@pytest.fixture(scope="module")
def tiled(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=32, mpp=0.5)
        images = np.stack([read_tile(slide, tiles, i) for i in range(len(tiles))])
    return tiles, images


def test_onnx_features_equal_the_numpy_reference(tile_slide_path, tiled, tmp_path):
    tiles, images = tiled
    path = onnx_model(tmp_path / "tiny.onnx")
    with open_slide(tile_slide_path) as slide:
        adata = embed_tiles(slide, tiles, path, batch_size=7, device="cpu")
    assert adata.shape == (len(tiles), 8)
    np.testing.assert_allclose(adata.X, _reference(images), rtol=1e-4, atol=1e-4)
    # obs: the tile table; spatial: centres in µm
    assert adata.obs["id"].tolist() == tiles["id"].tolist()
    assert list(adata.obs_names) == [str(i) for i in tiles["id"]]
    np.testing.assert_allclose(adata.obsm["spatial"][:, 0], tiles["x_um"] + 16)
    np.testing.assert_allclose(adata.obsm["spatial"][:, 1], tiles["y_um"] + 16)
    uns = adata.uns["slidescope_tiles"]
    import hashlib

    assert uns["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert uns["model_kind"] == "onnx" and uns["input_size"] == 64
    assert uns["mpp"] == 0.5 and uns["tile_px"] == 64 and uns["tile_um"] == 32
    assert list(uns["mean"]) == pytest.approx(IMAGENET_MEAN)
    runtime = uns["runtime"]
    assert runtime["tiles"] == len(tiles) and runtime["model_wait_s"] >= 0
    assert "CPUExecutionProvider" in runtime["device"]
    assert json.loads(uns["tiles"])["tile_px"] == 64


def test_parameter_hash_changes_with_what_was_computed(tile_slide_path, tiled, tmp_path):
    tiles, _ = tiled
    path = onnx_model(tmp_path / "tiny.onnx")
    sub = tiles.subset(slice(0, 4))
    with open_slide(tile_slide_path) as slide:
        a = embed_tiles(slide, sub, path).uns["slidescope_tiles"]["parameter_hash"]
        b = embed_tiles(slide, sub, path).uns["slidescope_tiles"]["parameter_hash"]
        c = embed_tiles(slide, sub, path, mean=None, std=None).uns["slidescope_tiles"]
        d = embed_tiles(slide, sub, path, input_size=32).uns["slidescope_tiles"]
    assert a == b
    assert len({a, c["parameter_hash"], d["parameter_hash"]}) == 3
    assert d["input_size"] == 32


def test_fixed_input_size_resizes_tiles(tile_slide_path, tiled, tmp_path):
    tiles, images = tiled
    path = onnx_model(tmp_path / "fixed.onnx", side=32)  # the model declares 32 x 32
    sub = tiles.subset(slice(0, 5))
    with open_slide(tile_slide_path) as slide:
        adata = embed_tiles(slide, sub, path, batch_size=2)
    half = images[:5].reshape(5, 32, 2, 32, 2, 3).mean(axis=(2, 4))
    assert adata.uns["slidescope_tiles"]["input_size"] == 32
    np.testing.assert_allclose(adata.X, _reference(np.rint(half)), rtol=1e-4, atol=1e-4)


def test_callable_model_and_its_errors(tile_slide_path, tiled):
    tiles, images = tiled
    seen = []

    def features(batch: np.ndarray) -> np.ndarray:
        seen.append(batch.shape)
        return batch.mean(axis=(2, 3)) @ W + B

    with open_slide(tile_slide_path) as slide:
        adata = embed_tiles(slide, tiles, features, batch_size=5)
        assert seen[0] == (5, 3, 64, 64)
        np.testing.assert_allclose(adata.X, _reference(images), rtol=1e-4, atol=1e-4)
        assert adata.uns["slidescope_tiles"]["model_kind"] == "callable"
        with pytest.raises(ValueError, match="one feature row per tile"):
            embed_tiles(slide, tiles, lambda b: np.zeros(3), batch_size=4)
        with pytest.raises(RuntimeError, match="boom"):
            embed_tiles(slide, tiles, lambda b: (_ for _ in ()).throw(RuntimeError("boom")))


def test_model_file_errors_name_the_file(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"missing\.onnx: no such model file"):
        load_model(tmp_path / "missing.onnx")
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"weights\.bin: unknown model file suffix"):
        load_model(bad)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match=r"junk\.onnx: not an ONNX model"):
        load_model(junk)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"napari-slidescope\[onnx\]"):
        load_model(junk)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_features_equal_the_numpy_reference(tile_slide_path, tiled, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (Python 3.12 env)")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 8)
            with torch.no_grad():
                self.linear.weight.copy_(torch.from_numpy(W.T.copy()))
                self.linear.bias.copy_(torch.from_numpy(B))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x.mean(dim=(2, 3)))

    path = tmp_path / "tiny.pt"
    torch.jit.script(Tiny()).save(str(path))
    tiles, images = tiled
    with open_slide(tile_slide_path) as slide:
        adata = embed_tiles(slide, tiles, path, batch_size=8, device="cpu")
    np.testing.assert_allclose(adata.X, _reference(images), rtol=1e-4, atol=1e-4)
    assert adata.uns["slidescope_tiles"]["model_kind"] == "torchscript"
    assert adata.uns["slidescope_tiles"]["runtime"]["device"] == "cpu"


def test_written_beside_the_cells_of_a_store(tile_slide_path, tiled, tmp_path):
    zarr = pytest.importorskip("zarr")
    pq = pytest.importorskip("pyarrow.parquet")
    tiles, _ = tiled
    from napari_slidescope import segment_nuclei

    store = tmp_path / "slide.zarr"
    with open_slide(tile_slide_path) as slide:
        cells = segment_nuclei(slide, region=(1024, 1024, 1536, 1536), segmenter="builtin")
        cells.to_spatialdata(store, image="none")  # the slide's store, with its nuclei
        adata = embed_tiles(slide, tiles, lambda b: b.mean(axis=(2, 3)), batch_size=16)
    before = anndata.read_zarr(store / "tables" / "table")
    write_tile_embeddings(adata, tiles, store)
    back = anndata.read_zarr(store / "tables" / "tile_embeddings")
    np.testing.assert_allclose(back.X, adata.X)
    assert (back.obs["region"] == "tiles").all()
    assert back.obs["instance_id"].tolist() == tiles["id"].tolist()
    assert (
        back.uns["slidescope_tiles"]["parameter_hash"]
        == adata.uns["slidescope_tiles"]["parameter_hash"]
    )
    shapes = pq.read_table(store / "shapes" / "tiles" / "shapes.parquet")
    assert shapes.column("__index_level_0__").to_pylist() == tiles["id"].tolist()
    root = zarr.open_group(str(store), mode="r")
    assert set(root["tables"]) == {"table", "tile_embeddings"}
    assert set(root["shapes"]) == {"nuclei", "tiles"}
    assert root.attrs["slidescope"]["region"] == [1024, 1024, 1536, 1536]
    kept = anndata.read_zarr(store / "tables" / "table")
    assert kept.n_obs == before.n_obs == cells.count > 0
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        write_tile_embeddings(adata, tiles, store)
    write_tile_embeddings(adata, tiles, store, overwrite=True)
