"""The on-disk label pyramid: every level shows level 0's ids; memory stays bounded."""

import gc

import numpy as np
import pytest

from napari_slidescope.pipeline.label_pyramid import LabelPyramid


@pytest.fixture
def pyramid(tmp_path):
    return LabelPyramid((1000, 1500), chunk=128, root=tmp_path)


def _dense(pyr):
    return np.asarray(pyr.levels[0])


def test_levels_halve_exactly_and_sample_level0(pyramid):
    rng = np.random.default_rng(0)
    lab = rng.integers(0, 6, (300, 700)).astype(np.int32)
    pyramid.paste((100, 37, 400, 737), lab)
    ref = np.zeros(pyramid.shape, np.int32)
    ref[100:400, 37:737] = lab
    shapes = [lv.shape for lv in pyramid.levels]
    assert shapes[0][0] >= 1000
    assert shapes[0][1] >= 1500
    assert max(shapes[-1]) <= 128
    for k, lv in enumerate(pyramid.levels):
        f = 2**k
        assert lv.shape == (shapes[0][0] // f, shapes[0][1] // f)
        np.testing.assert_array_equal(np.asarray(lv), ref[f // 2 :: f, f // 2 :: f])


def test_slicing_like_napari(pyramid):
    lab = np.arange(1, 401, dtype=np.int32).reshape(20, 20)
    pyramid.paste((120, 250, 140, 270), lab)
    lv = pyramid.levels[0]
    assert lv[125, 255] == lab[5, 5]
    assert np.ndim(lv[125, 255]) == 0
    np.testing.assert_array_equal(lv[120:140, 250:270], lab)
    np.testing.assert_array_equal(lv[120:140:3, 250:270:2], lab[::3, ::2])
    np.testing.assert_array_equal(lv[130], _dense(pyramid)[130])
    np.testing.assert_array_equal(lv[..., 260], _dense(pyramid)[:, 260])
    assert lv[-1, -1] == 0
    assert lv[2000:3000, 0:5].shape == (0, 5)
    with pytest.raises(IndexError):
        lv[5000, 0]


def test_paste_never_overwrites_and_erase_removes(pyramid):
    a = np.full((50, 50), 3, np.int32)
    pyramid.paste((0, 0, 50, 50), a)
    b = np.full((50, 50), 9, np.int32)
    b[:10] = 0
    pyramid.paste((25, 25, 75, 75), b)
    d = _dense(pyramid)
    assert d[30, 30] == 3  # b's zero rows stay empty
    assert d[60, 60] == 9
    assert d[30, 60] == 0
    pyramid.erase(np.array([3]))
    d = _dense(pyramid)
    assert not (d == 3).any()
    assert d[60, 60] == 9
    assert not (np.asarray(pyramid.levels[2]) == 3).any()


def test_memory_is_the_chunk_cache_whatever_the_area(tmp_path):
    """A 64k x 64k label image, painted all over, holds at most its cache in memory."""
    bound = 8 * 2**20
    pyr = LabelPyramid((65536, 65536), chunk=256, root=tmp_path, cache_bytes=bound)
    tile = np.zeros((512, 512), np.int32)
    tile[100:140, 100:140] = 1
    for y in range(0, 65536, 8192):
        for x in range(0, 65536, 8192):
            pyr.paste((y, x, y + 512, x + 512), tile + (y // 8192) * 8 + x // 8192)
            assert pyr.nbytes_cached <= bound
    assert pyr.chunks_written >= 64  # the chunks went to disk, not memory
    assert pyr.levels[0][8192 * 3 + 120, 8192 * 5 + 120] == 1 + 3 * 8 + 5
    assert pyr.levels[4][(8192 * 3 + 120) // 16, (8192 * 5 + 120) // 16] == 1 + 3 * 8 + 5


def test_store_is_deleted_with_the_pyramid(tmp_path):
    pyr = LabelPyramid((300, 300), chunk=64, root=tmp_path)
    pyr.paste((0, 0, 10, 10), np.ones((10, 10), np.int32))
    path = pyr.path
    assert any(path.iterdir())
    del pyr
    gc.collect()
    assert not path.exists()


def test_levels_advertise_the_read_chunk_grid(tmp_path):
    pyr = LabelPyramid((3000, 2000), chunk=256, root=tmp_path, read_chunk=1000)
    assert [level.chunks for level in pyr.levels] == [(1000, 1000)] * len(pyr.levels)
    assert LabelPyramid((300, 200), chunk=128, root=tmp_path).levels[0].chunks == (128, 128)
    with pytest.raises(ValueError, match="read_chunk"):
        LabelPyramid((10, 10), root=tmp_path, read_chunk=0)


def test_bad_input():
    with pytest.raises(ValueError, match="positive"):
        LabelPyramid((0, 10))
    pyr = LabelPyramid((100, 100), chunk=32)
    with pytest.raises(ValueError, match="shape"):
        pyr.paste((0, 0, 10, 10), np.ones((5, 5), np.int32))
    pyr.close()


def _chunk_files(path):
    return [p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".z", "zarr."))]


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_store_is_an_ngff_label_image_that_reopens(tmp_path, zarr_format):
    """A kept store is OME-NGFF labels (0.4 / zarr 2, 0.5 / zarr 3) that zarr reads back."""
    import zarr

    from napari_slidescope.pipeline.label_pyramid import zarr_major
    from napari_slidescope.slide._ngff import ngff_metadata

    if zarr_format == 3 and zarr_major() < 3:
        pytest.skip("zarr format 3 needs zarr >= 3")
    path = tmp_path / "labels.zarr"
    pyr = LabelPyramid(
        (1000, 700), chunk=128, path=path, mpp=(0.25, 0.5), name="nuclei", zarr_format=zarr_format
    )
    lab = np.arange(1, 301, dtype=np.int32).reshape(15, 20)
    pyr.paste((500, 300, 515, 320), lab)
    del pyr
    gc.collect()
    assert path.is_dir()  # a store at a chosen path stays
    group = zarr.open_group(store=str(path), mode="r")
    meta, version = ngff_metadata(dict(group.attrs))
    assert version == ("0.5" if zarr_format == 3 else "0.4")
    assert "image-label" in meta
    ms = meta["multiscales"][0]
    assert [a["name"] for a in ms["axes"]] == ["y", "x"]
    assert ms["datasets"][1]["coordinateTransformations"][0]["scale"] == [0.5, 1.0]
    np.testing.assert_array_equal(np.asarray(group["0"][500:515, 300:320]), lab)
    again = LabelPyramid.open(path)
    # format 2 chunks are read on the calling thread with zarr's codec, format 3 by zarr
    assert all((d is not None) == (zarr_format == 2) for d in again._direct)
    assert again.shape == (1000, 704)
    assert len(again.levels) == 4
    np.testing.assert_array_equal(again.levels[0][500:515, 300:320], lab)
    np.testing.assert_array_equal(np.asarray(again.levels[2]), np.asarray(group["2"]))
    with pytest.raises(ValueError, match="read-only"):
        again.paste((0, 0, 1, 1), np.ones((1, 1), np.int32))
    with pytest.raises(ValueError, match="must not exist"):
        LabelPyramid((10, 10), path=path)


def test_chunks_never_written_cost_nothing(tmp_path):
    pyr = LabelPyramid((65536, 65536), chunk=512, path=tmp_path / "l.zarr")
    assert not _chunk_files(pyr.path)
    pyr.paste((1000, 1000, 1010, 1010), np.full((10, 10), 4, np.int32))
    # one chunk per level (the label's sample), however large the image
    assert len(_chunk_files(pyr.path)) <= len(pyr.levels)
    pyr.erase(np.array([4]))  # a chunk erased to zeros leaves the store
    assert not _chunk_files(pyr.path)
    assert not np.asarray(pyr.levels[-1]).any()


def test_reopen_rejects_what_is_not_a_label_pyramid(tmp_path):
    with pytest.raises(ValueError, match="not a readable NGFF label image"):
        LabelPyramid.open(tmp_path / "missing.zarr")


def test_worker_pastes_while_the_gui_reads(tmp_path):
    """Pastes from a thread never show a half-written chunk to a reader: ids only grow."""
    import threading

    pyr = LabelPyramid((2048, 2048), chunk=128, root=tmp_path, cache_bytes=2**18)
    stop = threading.Event()
    errors = []

    def paint():
        try:
            for k in range(64):
                y, x = divmod(k, 8)
                box = (y * 256, x * 256, y * 256 + 256, x * 256 + 256)
                pyr.paste(box, np.full((256, 256), k + 1, np.int32))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            stop.set()

    t = threading.Thread(target=paint)
    t.start()
    while not stop.is_set():
        d = np.asarray(pyr.levels[0])
        # a 256-block is all its id or all 0: never part of one
        for blk in d.reshape(8, 256, 8, 256).swapaxes(1, 2).reshape(64, -1):
            assert blk.min() == blk.max() or set(np.unique(blk)) <= {0, blk.max()}
    t.join()
    assert not errors
    ref = (np.arange(64) + 1).reshape(8, 8).repeat(256, 0).repeat(256, 1)
    np.testing.assert_array_equal(np.asarray(pyr.levels[0]), ref)
    np.testing.assert_array_equal(np.asarray(pyr.levels[3]), ref[4::8, 4::8])


@pytest.mark.parametrize("cache_bytes", [0, 2**18, 2**24])
def test_buffered_writes_reach_the_store(tmp_path, cache_bytes):
    """Pastes inside buffered() land in the store whatever the cache evicts meanwhile."""
    path = tmp_path / "b.zarr"
    pyr = LabelPyramid((2048, 2048), chunk=128, path=path, cache_bytes=cache_bytes)
    rng = np.random.default_rng(1)
    ref = np.zeros(pyr.shape, np.int32)
    with pyr.buffered():
        for k in range(30):
            y, x = rng.integers(0, 1900, 2)
            lab = rng.integers(0, 3, (100, 140)).astype(np.int32) * (k + 1)
            pyr.paste((y, x, y + 100, x + 140), lab)
            view = ref[y : y + 100, x : x + 140]
            view[view == 0] = lab[view == 0]
        np.testing.assert_array_equal(np.asarray(pyr.levels[0]), ref)  # readers see the cache
    again = LabelPyramid.open(path)
    for k, level in enumerate(again.levels):
        f = 2**k
        np.testing.assert_array_equal(np.asarray(level), ref[f // 2 :: f, f // 2 :: f])
