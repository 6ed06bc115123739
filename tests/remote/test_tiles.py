"""Tiles from an S3 bucket and a DICOMweb server (real servers on 127.0.0.1) equal local tiles.

``tile_slide`` on the remote slide must cut the same table as on the local file (same ids,
boxes, levels, tissue fractions), ``iter_tiles`` must deliver the same pixels, and a
``TileDataset`` over the URL must pickle the URL, the boxes and the storage options only
(no pixels, no open slide; a secret key only when given in them), its DataLoader workers
opening the remote slide themselves.
"""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from napari_slidescope.slide import open_slide
from napari_slidescope.tiles import TileDataset, iter_tiles, read_tile, tile_slide

COLUMNS = ("id", "row0", "col0", "row1", "col1", "level", "downsample", "y_um", "x_um")


def _same_tiles(remote, local, **kwargs):
    """Cut both slides alike; assert equal tables and equal pixels; return the remote table."""
    t_remote = tile_slide(remote, **kwargs)
    t_local = tile_slide(local, **kwargs)
    assert len(t_remote) > 0
    assert t_remote.tile_px == t_local.tile_px and t_remote.slide_mpp == t_local.slide_mpp
    for name in COLUMNS:
        np.testing.assert_array_equal(t_remote[name], t_local[name], err_msg=name)
    np.testing.assert_allclose(t_remote["tissue_fraction"], t_local["tissue_fraction"])
    n = 0
    for (row_a, a), (row_b, b) in zip(
        iter_tiles(remote, t_remote), iter_tiles(local, t_local), strict=True
    ):
        assert row_a["id"] == row_b["id"]
        assert a.shape == (t_local.tile_px, t_local.tile_px, 3)
        np.testing.assert_array_equal(a, b, err_msg=f"tile {row_a['id']}")
        n += 1
    assert n == len(t_local)
    return t_remote, t_local


def _dataset_reads_like_local(url, tiles, local, storage_options=None):
    """Pickle a TileDataset over `url` (small, no pixels), read it on two DataLoader workers."""
    sub = tiles.subset(slice(0, min(6, len(tiles))))
    expected = np.stack([read_tile(local, sub, i) for i in range(len(sub))])
    ds = TileDataset((url, sub), storage_options=storage_options)

    def pickled() -> TileDataset:
        blob = pickle.dumps(ds)
        assert expected[0].tobytes()[:256] not in blob
        assert len(blob) < 20_000
        assert url.encode() in blob
        clone = pickle.loads(blob)
        assert clone._slides == {}
        return clone

    pickled()
    if importlib.util.find_spec("torch") is None:
        return  # reading an item needs torch (the 'torch' extra)
    import torch

    first, k, tile_id = ds[0]  # opens the remote slide in this process
    np.testing.assert_array_equal(first.numpy(), expected[0])
    assert (k, tile_id) == (0, int(sub["id"][0]))
    clone = pickled()  # with the slide open here: still the URL and the boxes only
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    batches = list(loader)
    np.testing.assert_array_equal(torch.cat([b[0] for b in batches]).numpy(), expected)
    assert torch.cat([b[2] for b in batches]).tolist() == sub["id"].tolist()
    ds.close()
    clone.close()


@pytest.mark.parametrize(
    ("name", "tile_um", "mpp"),
    [
        ("sample.svs", 64.0, 0.8),  # 1.6 level-0 px per tile px: resampled
        ("CMU-1-Small-Region.svs", 112.0, 1.0),  # a scanner's JPEG SVS, 0.499 µm/px
    ],
)
def test_s3_tiles_equal_the_local_file(s3, served, name, tile_um, mpp):
    options, prefix, _ = s3
    with (
        open_slide(prefix + name, storage_options=options) as remote,
        open_slide(served / name) as local,
    ):
        tiles, _ = _same_tiles(remote, local, tile_um=tile_um, mpp=mpp)
        _dataset_reads_like_local(prefix + name, tiles, local, storage_options=options)


def test_s3_dataset_with_credentials_from_the_environment(s3, served, monkeypatch):
    """Keys in the environment, not in storage_options: the pickle holds no secret (tiles.md)."""
    options, prefix, secret = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    public = {k: v for k, v in options.items() if k not in ("key", "secret")}
    name = "sample.svs"
    with open_slide(served / name) as local:
        tiles = tile_slide(local, tile_um=64.0, mpp=0.8)
        ds = TileDataset((prefix + name, tiles), storage_options=public)
        assert secret.encode() not in pickle.dumps(ds)
        _dataset_reads_like_local(prefix + name, tiles, local, storage_options=public)
    with_key = TileDataset((prefix + name, tiles), storage_options=options)
    assert secret.encode() in pickle.dumps(with_key)  # what the guide warns of


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("CMU-1-Small-Region.svs", {"tile_um": 112.0, "mpp": 0.75}),
        # fluorescence (DAPI): every tile, no tissue gate
        ("test3-DAPI-2-387.ndpi", {"tile_um": 200.0, "mpp": 2.0, "tissue": None}),
    ],
)
def test_dicomweb_tiles_equal_the_local_folder(dicomweb, dicom_slides, name, kwargs):
    pytest.importorskip("wsidicom", reason="wsidicom (the 'dicom' extra) is not installed")
    study, series = dicomweb.series()[name.replace(".", "_")]
    url = dicomweb.url(study, series)
    with open_slide(url) as remote, open_slide(dicom_slides[name]) as local:
        tiles, _ = _same_tiles(remote, local, **kwargs)
        frames = [p for p, _ in dicomweb.log if "/frames/" in p]
        assert frames  # the pixels came over DICOMweb
        _dataset_reads_like_local(url, tiles, local)
