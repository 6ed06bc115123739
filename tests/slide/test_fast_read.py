"""The fast read paths return exactly the pixels tifffile decodes, from any thread, in bound.

Paths covered: ``np.asarray(level[box])`` (a region read on the decode pool), the region's
dask graph (``.compute()``), the whole level (``np.asarray(level)``), and
``Slide.read_region`` (calling thread only), each with the tile cache cold and warm.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import tifffile

from napari_slidescope import SlideError, SlidescopeWarning, open_slide
from napari_slidescope.slide.cache import SLAB_MIN_BYTES, TileCache, set_cache_bytes, tile_cache

SHARED = [
    "CMU-1-Small-Region.svs",
    "TCGA-CR-7395-01A-01-TS1.svs",
    "openslide-python_small.svs",
    "test3-DAPI-2-387.ndpi",
    "test3-TRITC-2-560.ndpi",
    "small_vectra.qptiff",
    "derived/derived_CMU-1-Small-Region_subifd-pyramid.ome.tif",
    "derived/derived_CMU-1-Small-Region_generic-pyramid.tif",
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache of the default size and leaves it so."""
    bound = tile_cache().maxbytes
    tile_cache().clear()
    yield
    set_cache_bytes(bound)
    tile_cache().clear()


def _open(path, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SlidescopeWarning)  # e.g. uncalibrated files
        return open_slide(path, **kwargs)


def _expected_levels(path):
    with tifffile.TiffFile(path) as tif:
        series = max(
            tif.series, key=lambda s: s.shape[s.axes.index("Y")] * s.shape[s.axes.index("X")]
        )
        return [lv.asarray() for lv in series.levels]


def _boxes(shape, rng, n, *, yi, xi):
    """Random boxes plus the four corners and a one-pixel box at the last pixel."""
    h, w = shape[yi], shape[xi]
    out = [
        (0, 0, min(h, 300), min(w, 300)),
        (max(0, h - 257), max(0, w - 257), h, w),
        (h - 1, w - 1, h, w),
        (0, max(0, w - 5), 7, w),
        (max(0, h - 9), 0, h, 3),
    ]
    for _ in range(n):
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        y1, x1 = (
            int(rng.integers(y0 + 1, min(h, y0 + 1500) + 1)),
            int(rng.integers(x0 + 1, min(w, x0 + 1500) + 1)),
        )
        out.append((y0, x0, y1, x1))
    return out


def _index(axes, y0, x0, y1, x1):
    return (
        (slice(None), slice(y0, y1), slice(x0, x1))
        if axes == "CYX"
        else (slice(y0, y1), slice(x0, x1))
    )


def _check_zarr_geometry(path, slide):
    """The direct decoder's level geometry, found without zarr, is what zarr reports."""
    from napari_slidescope.slide import _tiff

    with tifffile.TiffFile(path) as tif:
        main = max(
            tif.series, key=lambda s: s.shape[s.axes.index("Y")] * s.shape[s.axes.index("X")]
        )
        zarrs = _tiff.open_levels(main, str(path))
        index = tuple(slice(None) if ax in "CYXS" else 0 for ax in main.axes)
        assert len(zarrs) == len(slide._readers)
        for reader, z in zip(slide._readers, zarrs, strict=True):
            shape = _tiff._kept(z.shape, index)
            assert reader.shape == shape
            assert reader.dtype == z.dtype
            chunks = tuple(
                min(c, n) for c, n in zip(_tiff._kept(z.chunks, index), shape, strict=True)
            )
            assert reader.native == chunks


def _check_all_paths(path, *, chunk_bytes=None, n=4, expect_fast=None):
    rng = np.random.default_rng(7)
    expected = _expected_levels(path)
    with _open(path, chunk_bytes=chunk_bytes) as slide:
        _check_zarr_geometry(path, slide)
        yi, xi = slide._yx
        assert len(slide.levels) == len(expected)
        for level, (arr, want) in enumerate(zip(slide.levels, expected, strict=True)):
            if expect_fast is not None:
                assert slide._readers[level]._source.fast is expect_fast, (path, level)
            assert arr.shape == want.shape
            assert arr.dtype == want.dtype
            ds = slide.downsamples[level]
            for y0, x0, y1, x1 in _boxes(want.shape, rng, n, yi=yi, xi=xi):
                idx = _index(slide.axes, y0, x0, y1, x1)
                for _ in range(2):  # cold, then warm cache
                    np.testing.assert_array_equal(np.asarray(arr[idx]), want[idx])
                np.testing.assert_array_equal(arr[idx].compute(), want[idx])
                if ds == (1.0, 1.0):
                    np.testing.assert_array_equal(slide.read_region((y0, x0, y1, x1)), want[idx])
            # ints drop axes exactly as numpy does
            np.testing.assert_array_equal(np.asarray(arr[..., -1, :]), want[..., -1, :])
            np.testing.assert_array_equal(
                np.asarray(arr[want.shape[0] // 2]), want[want.shape[0] // 2]
            )
            tile_cache().clear()
            np.testing.assert_array_equal(np.asarray(arr), want)
            if want.size <= 2**22:  # the whole level through dask too, where it is quick
                np.testing.assert_array_equal(arr.compute(), want)


@pytest.mark.parametrize("name", SHARED)
def test_shared_files_equal_tifffile(shared_file, name):
    _check_all_paths(shared_file(name), expect_fast=True)


def test_shared_ndpi_with_small_dask_chunks(shared_file):
    _check_all_paths(shared_file("test3-DAPI-2-387.ndpi"), chunk_bytes="64 KiB", n=2)


def _write_pyramid(path, data, *, tile, compression, levels=3, **kwargs):
    with tifffile.TiffWriter(path) as tw:
        tw.write(data, tile=tile, compression=compression, subifds=levels - 1, **kwargs)
        for k in range(1, levels):
            tw.write(
                data[:: 2**k, :: 2**k], tile=tile, compression=compression, subfiletype=1, **kwargs
            )


@pytest.fixture(scope="module")
def tiled_rgb(tmp_path_factory, ndpi_writer):
    """A 2960 x 2220 RGB pyramid in 240-px JPEG tiles (about CMU-1-Small-Region's size)."""
    data = ndpi_writer.textured_rgb((2960, 2220), seed=5)  # downsamples exactly 2, 4
    path = tmp_path_factory.mktemp("tiled") / "tiled240.tif"
    _write_pyramid(path, data, tile=(240, 240), compression="jpeg", photometric="rgb")
    return path


@pytest.mark.parametrize(
    ("shape", "tile", "compression", "photometric"),
    [
        ((1000, 777, 3), (256, 256), "jpeg", "rgb"),  # odd sizes, edge tiles on both axes
        ((517, 1301, 3), (128, 256), "zlib", "rgb"),
        ((300, 260), (64, 128), "zlib", "minisblack"),  # YX, uint8
        ((45, 70, 3), (64, 64), "jpeg", "rgb"),  # one tile larger than the image
    ],
)
def test_synthetic_tiled_pyramids_equal_tifffile(tmp_path, shape, tile, compression, photometric):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 255, shape, dtype=np.uint8)
    path = tmp_path / "pyr.tif"
    _write_pyramid(path, data, tile=tile, compression=compression, photometric=photometric)
    _check_all_paths(path, expect_fast=True)


def test_uint16_tiles_equal_tifffile(tmp_path):
    data = np.random.default_rng(2).integers(0, 60000, (700, 513), dtype=np.uint16)
    path = tmp_path / "u16.tif"
    tifffile.imwrite(path, data, tile=(128, 128), compression="zlib", predictor=True)
    _check_all_paths(path, expect_fast=True)


def test_strips_with_short_last_strip_equal_tifffile(tmp_path):
    data = np.random.default_rng(3).integers(0, 255, (1003, 611, 3), dtype=np.uint8)
    path = tmp_path / "strips.tif"
    tifffile.imwrite(path, data, rowsperstrip=40, compression="zlib", photometric="rgb")
    _check_all_paths(path, expect_fast=True)


def test_channel_pages_equal_tifffile(tmp_path):
    data = np.random.default_rng(4).integers(0, 4000, (3, 530, 390), dtype=np.uint16)
    path = tmp_path / "cyx.ome.tif"
    tifffile.imwrite(path, data, tile=(128, 128), compression="zlib", metadata={"axes": "CYX"})
    _check_all_paths(path, expect_fast=True)


def test_tile_with_no_bytes_is_damage_not_glass(tmp_path):
    # tifffile reads a 0 byte count as a sparse tile of fill value; no slide scanner
    # writes one, so here it is a missing tile: an error, or blank with a warning
    data = np.random.default_rng(5).integers(1, 255, (512, 512, 3), dtype=np.uint8)
    path = tmp_path / "sparse.tif"
    tifffile.imwrite(path, data, tile=(256, 256), compression="zlib", photometric="rgb")
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags["TileByteCounts"]
        offset = tag.valueoffset
        itemsize = {3: 2, 4: 4, 16: 8}[int(tag.dtype)]
    raw = bytearray(path.read_bytes())
    raw[offset + itemsize : offset + 2 * itemsize] = b"\0" * itemsize  # tile 1: no bytes
    path.write_bytes(bytes(raw))
    # (tifffile's own reader hands the tiles after it the wrong bytes: not a reference)
    expected = data.copy()
    expected[:256, 256:] = 0
    with _open(path) as slide:
        np.testing.assert_array_equal(np.asarray(slide.levels[0][256:]), expected[256:])
        with pytest.raises(SlideError, match=r"sparse\.tif: level 0: .*byte count is 0"):
            slide.read_region((0, 0, 512, 512))
    with _open(path, on_error="blank") as slide:
        with pytest.warns(
            SlidescopeWarning, match=r"level 0: damaged tile\(s\) \(rows 0:256 cols 256:512\)"
        ):
            got = np.asarray(slide.levels[0])
        np.testing.assert_array_equal(got, expected)  # only that tile blank, none after it
        assert slide.damage.tiles() == [(0, ((0, 256), (256, 512)))]


def test_ndpi_restart_bands_equal_tifffile(small_ndpi):
    with tifffile.TiffFile(small_ndpi) as tif:
        assert tif.is_ndpi
        assert tif.series[0].levels[0].keyframe.chunks[:2] == (8, 1920)
    _check_all_paths(small_ndpi, expect_fast=True)
    _check_all_paths(small_ndpi, chunk_bytes="100 KiB", n=3, expect_fast=True)


@pytest.mark.parametrize("name", ["small_ndpi", "tiled_rgb"])  # 8 x 1920 bands; 240-px tiles
def test_eight_threads_equal_serial(request, name):
    path = request.getfixturevalue(name)
    want = _expected_levels(path)
    rng = np.random.default_rng(11)
    jobs = []
    for _ in range(160):
        level = int(rng.integers(0, len(want)))
        h, w = want[level].shape[:2]
        y0, x0 = int(rng.integers(0, h - 1)), int(rng.integers(0, w - 1))
        jobs.append(
            (
                level,
                y0,
                x0,
                min(h, y0 + int(rng.integers(1, 900))),
                min(w, x0 + int(rng.integers(1, 900))),
            )
        )
    set_cache_bytes("2 MiB")  # small: threads keep evicting each other's bands
    with _open(path) as slide:
        results: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def work(k0):
            try:
                for k in range(k0, len(jobs), 8):
                    level, y0, x0, y1, x1 = jobs[k]
                    arr = slide.levels[level]
                    if k % 3 == 0:  # downsamples are exactly 2**level here
                        box0 = tuple(v * 2**level for v in (y0, x0, y1, x1))
                        got = slide.read_region(box0, level=level)
                    elif k % 3 == 1:
                        got = arr[y0:y1, x0:x1].compute()
                    else:
                        got = np.asarray(arr[y0:y1, x0:x1])
                    results[k] = got
                    cache = tile_cache()
                    assert cache.held_nbytes <= cache.maxbytes
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert tile_cache().reused > 0  # evicted slabs were written again under the readers
        for k, (level, y0, x0, y1, x1) in enumerate(jobs):
            np.testing.assert_array_equal(results[k], want[level][y0:y1, x0:x1])


def test_cache_never_exceeds_its_bound(tiled_rgb):
    tile = 240 * 240 * 3
    set_cache_bytes(5 * tile + 100)
    cache = tile_cache()
    with _open(tiled_rgb) as slide:
        lv = slide.levels[0]
        rng = np.random.default_rng(3)
        for _ in range(30):
            y, x = int(rng.integers(0, 2000)), int(rng.integers(0, 1500))
            np.asarray(lv[y : y + 600, x : x + 600])
            assert cache.nbytes <= cache.maxbytes
            assert len(cache) <= 5
        assert cache.nbytes > 0
    assert cache.nbytes == 0  # closing the slide drops its chunks


def test_cache_hits_on_pan_and_results_are_private_copies(tiled_rgb):
    with _open(tiled_rgb) as slide:
        lv = slide.levels[0]
        first = np.asarray(lv[0:720, 0:720])
        misses = tile_cache().misses
        first[:] = 0  # the caller owns its array: the cache must not change
        again = np.asarray(lv[0:720, 180:900])  # a quarter-screen pan: 3 of 4 columns cached
        assert tile_cache().misses - misses == 3  # 3 rows x 1 new column of 240-px tiles
        np.testing.assert_array_equal(again, _expected_levels(slide.path)[0][0:720, 180:900])


def test_cache_disabled(tiled_rgb):
    set_cache_bytes(0)
    with _open(tiled_rgb) as slide:
        np.asarray(slide.levels[0][:500, :500])
    assert tile_cache().nbytes == 0
    assert len(tile_cache()) == 0


def test_tile_cache_lru_and_bounds():
    cache = TileCache(300)
    a, b, c = (np.full(100, i, np.uint8) for i in range(3))
    cache.put("a", a)
    cache.put("b", b)
    cache.put("c", c)
    got = cache.get("a")  # a is now the most recently used
    assert got is not None  # a copy...
    assert got is not a
    assert np.array_equal(got, a)
    assert not got.flags.writeable  # ...read-only; the caller's is not
    assert a.flags.writeable
    cache.put("d", np.zeros(100, np.uint8))
    assert cache.get("b") is None
    assert np.array_equal(cache.get("a"), a)
    assert cache.nbytes == 300
    cache.put("big", np.zeros(301, np.uint8))  # larger than the bound: never stored
    assert cache.get("big") is None
    assert cache.nbytes == 300
    cache.resize(150)
    assert cache.nbytes <= 150
    assert len(cache) == 1
    cache.put((7, 0, (0, 0)), np.zeros(50, np.uint8))
    cache.discard(7)
    assert cache.get((7, 0, (0, 0))) is None
    with pytest.raises(ValueError, match="cache size"):
        TileCache(-1)


def test_tile_cache_reuses_slabs_nobody_holds():
    tile = 256 * 256 * 3  # one RGB tile: big enough for a slab of its own
    assert tile >= SLAB_MIN_BYTES
    cache = TileCache(2 * tile)
    rng = np.random.default_rng(0)
    tiles = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(6)]
    cache.put(0, tiles[0])
    cache.put(1, tiles[1])
    cache.put(2, tiles[2])  # evicts 0, nobody holds it: its slab takes tile 2
    assert cache.reused == 1
    held = cache.get(1)  # a reader still pasting tile 1...
    cache.get(2)  # (2 is now the most recently used)
    cache.put(3, tiles[3])  # ...so evicting 1 must not overwrite its slab
    assert cache.reused == 1
    np.testing.assert_array_equal(held, tiles[1])
    view = cache.get(2)[10:20]  # a view of tile 2 holds its slab too
    cache.get(3)
    cache.put(4, tiles[4])  # evicts 2
    assert cache.reused == 1
    np.testing.assert_array_equal(view, tiles[2][10:20])
    cache.put(5, tiles[5])  # evicts 3: nobody holds it, reused
    assert cache.reused == 2
    np.testing.assert_array_equal(cache.get(4), tiles[4])
    np.testing.assert_array_equal(cache.get(5), tiles[5])
    assert cache.nbytes == 2 * tile
    assert len(cache) == 2
    cache.put(6, np.zeros((3, 5), np.float64))  # other sizes and dtypes evict as needed
    assert cache.get(6).dtype == np.float64
    assert cache.nbytes + cache.free_nbytes <= 2 * tile


def test_tile_cache_keeps_cleared_slabs_for_reuse_within_the_bound():
    tile = np.ones((256, 256, 3), np.uint8)
    cache = TileCache(3 * tile.nbytes)
    for k in range(3):
        cache.put(k, tile)
    cache.clear()  # the chunks go, their slabs stay (resident memory within the bound)
    assert len(cache) == 0
    assert cache.nbytes == 0
    assert cache.free_nbytes == 3 * tile.nbytes
    cache.put("a", tile * 2)
    assert cache.reused == 1
    assert cache.free_nbytes == 2 * tile.nbytes
    np.testing.assert_array_equal(cache.get("a"), tile * 2)
    cache.resize(tile.nbytes)  # a lower bound unmaps free slabs first
    assert cache.free_nbytes == 0
    assert cache.nbytes == tile.nbytes
    cache.resize(0)
    assert cache.nbytes == cache.free_nbytes == 0
    assert len(cache) == 0


def test_region_graph_holds_only_touched_chunks(small_ndpi):
    with _open(small_ndpi, chunk_bytes="16 KiB") as slide:
        lv = slide.levels[0]
        assert lv.npartitions == 512  # one 8 x 1920 restart band per chunk
        region = lv[100:300, 50:2000]
        # rows 100:300 touch bands 12..37, columns 50:2000 two band columns: 52 of 512
        assert region.npartitions == len(dict(region.__dask_graph__())) == 26 * 2
        assert len(lv.dask.layers) == 1


def test_corrupt_tile_in_region_read_names_the_pixels(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, (512, 512, 3), dtype=np.uint8)
    path = tmp_path / "corrupt.tif"
    tifffile.imwrite(path, data, tile=(256, 256), photometric="rgb", compression="jpeg")
    with tifffile.TiffFile(path) as tif:
        offset, count = tif.pages[0].dataoffsets[1], tif.pages[0].databytecounts[1]
    raw = bytearray(path.read_bytes())
    raw[offset : offset + count] = b"\0" * count
    path.write_bytes(bytes(raw))
    with _open(path) as slide:
        for read in (
            lambda: np.asarray(slide.levels[0][:300, 100:400]),
            lambda: slide.levels[0][:300, 100:400].compute(),
            lambda: slide.read_region((0, 100, 300, 400)),
        ):
            with pytest.raises(
                SlideError,
                match=r"corrupt\.tif: level 0: cannot decode pixels \[0:256, 256:512, 0:3\]",
            ):
                read()
    with _open(path, on_error="blank") as slide:
        with pytest.warns(
            SlidescopeWarning, match=r"damaged tile\(s\) \(rows 0:256 cols 256:512\)"
        ):
            got = np.asarray(slide.levels[0][:300, 100:400])
        assert np.all(got[:256, 156:] == 0)
        np.testing.assert_array_equal(got[256:], slide.levels[0][256:300, 100:400].compute())


def test_non_basic_indexing_falls_back_to_dask(tiled_rgb):
    want = _expected_levels(tiled_rgb)[0]
    with _open(tiled_rgb) as slide:
        lv = slide.levels[0]
        np.testing.assert_array_equal(np.asarray(lv[10:500:7, ::-50]), want[10:500:7, ::-50])
        np.testing.assert_array_equal(np.asarray(lv[[1, 5, 9], 3]), want[[1, 5, 9], 3])
        np.testing.assert_array_equal(np.asarray(lv[5:5, 0:10]), want[5:5, 0:10])
        with pytest.raises(IndexError):
            lv[10**6, 0]


def test_tile_with_no_bytes_on_the_zarr_path_is_damage_too(tmp_path, monkeypatch):
    # layouts the direct decoder does not take are read through zarr, which gives a
    # 0-byte tile tifffile's fill value: the open refuses it (or warns) instead
    from napari_slidescope.slide import _tiff

    data = np.random.default_rng(5).integers(1, 255, (512, 512, 3), dtype=np.uint8)
    path = tmp_path / "sparse.tif"
    tifffile.imwrite(path, data, tile=(256, 256), compression="zlib", photometric="rgb")
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags["TileByteCounts"]
        offset, itemsize = tag.valueoffset, {3: 2, 4: 4, 16: 8}[int(tag.dtype)]
    raw = bytearray(path.read_bytes())
    raw[offset + 3 * itemsize : offset + 4 * itemsize] = b"\0" * itemsize
    path.write_bytes(bytes(raw))
    monkeypatch.setattr(_tiff._PageChunks, "create", classmethod(lambda cls, *a: None))
    with pytest.raises(SlideError, match=r"sparse\.tif: is damaged: 1 level-0 tiles have a byte"):
        _open(path)
    with (
        pytest.warns(SlidescopeWarning, match=r"sparse\.tif: opened with parts left out: 1 lev"),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", "(?s).*no pixel size", SlidescopeWarning)
        slide = open_slide(path, on_error="blank")
    with slide:
        assert not slide._readers[0]._source.fast


def test_tile_cache_grows_only_when_an_evicted_chunk_is_asked_for_again(monkeypatch):
    from napari_slidescope.slide import cache as cache_module

    unit = 1000
    monkeypatch.setattr(cache_module, "GROW_START_BYTES", 3 * unit)
    cache = TileCache(8 * unit)
    assert cache.limit == 3 * unit
    for k in range(6):  # chunks never asked for again: the cache stays at its start
        assert cache.get(k) is None
        cache.put(k, np.full(unit, k, np.uint8))
    assert cache.nbytes == 3 * unit
    assert cache.limit == 3 * unit
    assert cache.get(0) is None  # evicted, asked for again: a larger cache would have hit
    assert cache.limit == 5 * unit
    cache.put(0, np.zeros(unit, np.uint8))
    cache.put(6, np.zeros(unit, np.uint8))
    assert cache.nbytes == 5 * unit  # 0, 3, 4, 5, 6
    for k in (1, 2, 1, 2):  # ...up to the bound, never past it
        cache.get(k)
        cache.put(k, np.zeros(unit, np.uint8))
    assert cache.limit == 8 * unit
    assert cache.nbytes + cache.free_nbytes <= cache.maxbytes
    cache.resize(4 * unit)
    assert cache.limit == 4 * unit
    assert cache.nbytes <= 4 * unit
    assert TileCache(2 * unit).limit == 2 * unit  # a bound below the start: the bound
