"""Reading tiles: exact µm/px by pixel area, the iterator, the dataset, remote slides."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

from napari_slidescope import open_slide
from napari_slidescope.tiles import TileDataset, area_resize, iter_tiles, read_tile, tile_slide


def _area_reference(pixels: np.ndarray, start: float, step: float, size: int) -> np.ndarray:
    """Area average by upsampling to a grid where every boundary is a whole pixel."""
    # step and start are multiples of 1/2 in the tests: repeat each pixel 2 x 2
    up = pixels.repeat(2, axis=0).repeat(2, axis=1).astype(float)
    s, k = int(round(start * 2)), int(round(step * 2))
    block = up[s : s + size * k, s : s + size * k]
    return block.reshape(size, k, size, k, -1).mean(axis=(1, 3))


def test_area_resize_matches_the_exact_area_average():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (40, 40, 3), np.uint8)
    got = area_resize(img, (1.5, 1.5), (1.5, 1.5), 20)
    ref = _area_reference(img, 1.5, 1.5, 20)
    assert np.abs(got.astype(float) - ref).max() <= 0.5 + 1e-6
    # whole-number ratio: the block mean; ratio 1: a crop
    np.testing.assert_array_equal(
        area_resize(img, (2, 4), (2, 2), 10),
        np.rint(img[2:22, 4:24].reshape(10, 2, 10, 2, 3).mean((1, 3))).astype(np.uint8),
    )
    np.testing.assert_array_equal(area_resize(img, (3, 5), (1, 1), 8), img[3:11, 5:13])


def test_tile_at_a_fractional_ratio_is_the_area_average_of_level0(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=30, mpp=0.375, tissue=None)  # 1.5 level-0 px per px
        i = int(np.flatnonzero(tiles["grid_row"] == 3)[3])
        r = tiles.row(i)
        image = read_tile(slide, tiles, i)
        assert image.shape == (80, 80, 3) and image.dtype == np.uint8
        y0, x0 = r["y_um"] / 0.25, r["x_um"] / 0.25  # exact level-0 corner (multiple of 1/2)
        fy, fx = int(np.floor(y0)), int(np.floor(x0))
        raw = slide.read_region((fy, fx, fy + 130, fx + 130))
        assert y0 - fy == x0 - fx
        ref = _area_reference(raw, y0 - fy, 1.5, 80)
        assert np.abs(image.astype(float) - ref).max() <= 0.5 + 1e-6


def test_tile_over_the_edge_is_padded_with_glass(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
        last = len(tiles) - 1  # grid (9, 11): rows 2016.. of 2048, cols 2464.. of 2560
        image = read_tile(slide, tiles, last)
    assert image.shape == (112, 112, 3)
    assert (image[16:, :] == 255).all() and (image[:, 48:] == 255).all()


def test_iterator_yields_every_tile_in_order(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, min_tissue_fraction=0.2)
        seen = []
        for row, image in iter_tiles(slide, tiles, read_ahead=3, threads=2):
            i = len(seen)
            assert row == tiles.row(i)
            np.testing.assert_array_equal(image, read_tile(slide, tiles, i))
            seen.append(row["id"])
    assert seen == tiles["id"].tolist()
    with pytest.raises(ValueError, match="read_ahead"):
        next(iter_tiles(slide, tiles, read_ahead=0))


def test_iterator_stopped_early_leaves_no_reads_behind(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
        it = iter_tiles(slide, tiles, read_ahead=4)
        next(it)
        it.close()  # the pool shuts down; the slide is still usable
        assert read_tile(slide, tiles, 0).shape == (112, 112, 3)


def test_remote_tiles_equal_local_tiles(tile_slide_path):
    from tests import remote_server

    server = remote_server.serve(tile_slide_path.parent)
    try:
        with (
            open_slide(server.url(tile_slide_path.name)) as remote,
            open_slide(tile_slide_path) as local,
        ):
            t_remote = tile_slide(remote, tile_um=60, mpp=0.6)
            t_local = tile_slide(local, tile_um=60, mpp=0.6)
            np.testing.assert_array_equal(t_remote["id"], t_local["id"])
            for (_, a), (_, b) in zip(
                iter_tiles(remote, t_remote), iter_tiles(local, t_local), strict=True
            ):
                np.testing.assert_array_equal(a, b)
    finally:
        server.close()


def test_dataset_pickles_paths_and_boxes_only(tile_slide_path):
    torch = pytest.importorskip("torch", reason="torch (the 'torch' extra) is not installed")
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5)
        first = read_tile(slide, tiles, 0)
    ds = TileDataset([(tile_slide_path, tiles), (str(tile_slide_path), tiles.subset(slice(0, 3)))])
    assert len(ds) == len(tiles) + 3
    image, k, tile_id = ds[0]
    assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
    np.testing.assert_array_equal(image.numpy(), first)
    assert ds[len(tiles) + 1][1:] == (1, int(tiles["id"][1]))
    blob = pickle.dumps(ds)  # after a read: the slide is open in this process
    assert first.tobytes()[:256] not in blob
    assert len(blob) < 20_000
    clone = pickle.loads(blob)
    assert clone._slides == {}
    np.testing.assert_array_equal(clone[0][0].numpy(), first)
    ds.close()
    clone.close()


def test_dataloader_workers_open_the_slide_themselves(tile_slide_path):
    torch = pytest.importorskip("torch", reason="torch (the 'torch' extra) is not installed")
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5).subset(slice(0, 6))
        expected = np.stack([read_tile(slide, tiles, i) for i in range(6)])
    ds = TileDataset((tile_slide_path, tiles), output="float_chw", transform=lambda a: 255 - a)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    batches = list(loader)
    images = torch.cat([b[0] for b in batches]).numpy()
    assert images.shape == (6, 3, 112, 112) and images.dtype == np.float32
    np.testing.assert_allclose(images, (255 - expected).transpose(0, 3, 1, 2) / 255, atol=1e-6)
    assert torch.cat([b[2] for b in batches]).tolist() == tiles["id"].tolist()


def test_dataset_without_torch_names_the_extra(tile_slide_path, monkeypatch):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
    ds = TileDataset((tile_slide_path, tiles))  # no torch needed to build it
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"napari-slidescope\[torch\]"):
        ds[0]
    with pytest.raises(ValueError, match="output"):
        TileDataset((tile_slide_path, tiles), output="float")


def test_ome_zarr_anisotropic_and_multichannel(slide_writers, tmp_path):
    """Any source: an OME-Zarr with different µm/px along y and x, RGB and 4 channels."""
    rgb = slide_writers.rgb_planes((700, 900))
    path = tmp_path / "slide.ome.zarr"
    levels = slide_writers.write_ngff(
        path, rgb, mpp=(0.5, 0.25),
        channels=[("Red", "FF0000"), ("Green", "00FF00"), ("Blue", "0000FF")],
    )  # fmt: skip
    with open_slide(path) as slide:
        tiles = tile_slide(slide, tile_um=64, mpp=1.0, tissue=None)
        assert set(tiles["level"]) == {1}  # (1.0, 0.5) µm/px: the coarsest not coarser
        i = 1  # grid (0, 1): x from 64 µm
        r = tiles.row(i)
        image = read_tile(slide, tiles, i)
    level1 = np.moveaxis(levels[1], 0, -1)  # (350, 450, 3) at (1.0, 0.5) µm/px
    y, x = int(r["y_um"]), int(r["x_um"] / 0.5)
    ref = level1[y : y + 64, x : x + 128].reshape(64, 64, 2, 3).mean(axis=2)
    np.testing.assert_array_equal(image, np.rint(ref).astype(np.uint8))

    planes = np.random.default_rng(4).integers(0, 4000, (4, 512, 512), np.uint16)
    fl = tmp_path / "fl.ome.zarr"
    slide_writers.write_ngff(fl, planes, mpp=(0.5, 0.5), nlevels=2)
    with open_slide(fl) as slide:
        tiles = tile_slide(slide, tile_um=32, mpp=0.5, tissue=None)
        image = read_tile(slide, tiles, 1)
    assert image.shape == (64, 64, 4) and image.dtype == np.uint16
    np.testing.assert_array_equal(image, np.moveaxis(planes[:, 0:64, 64:128], 0, -1))


def test_read_ahead_is_bounded(tile_slide_path):
    """The iterator never reads more than `read_ahead` tiles beyond the one consumed."""
    import threading
    import time

    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
        reads = []
        lock = threading.Lock()

        class Counting:
            def __getattr__(self, name):
                return getattr(slide, name)

            def read_level(self, level, box):
                with lock:
                    reads.append(box)
                return slide.read_level(level, box)

        it = iter_tiles(Counting(), tiles, read_ahead=3, threads=2)
        next(it)
        time.sleep(0.3)  # give the pool every chance to run ahead
        assert len(reads) <= 1 + 3
        for _ in range(5):
            next(it)
        time.sleep(0.3)
        assert len(reads) <= 6 + 3
        it.close()
