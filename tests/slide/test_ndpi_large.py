"""Hamamatsu NDPI of scanner size: past 4 GiB, past 65535 px, with wrapped McuStarts.

No test needs 4 GiB of disk: a sparse hole before the image data puts every strip, offset
table and image directory past 4 GiB (64-bit first-IFD offset, the high bytes of the IFD
entries); a level wider than 65535 px is made of bands encoded one by one (its JPEG frame
says width 0, as NDP.scan writes it). McuStarts that wrap past 2**32 need a strip longer
than 4 GiB of real data: the wrap the reader repairs is shrunk to a few KiB instead
(``_check.MCU_WRAP``), and :func:`~napari_slidescope.slide._check.mcu_starts` is checked
at the real 2**32 on arrays. Pixels are compared with what was encoded.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest
import tifffile

from napari_slidescope import SlideError, SlidescopeWarning, open_slide
from napari_slidescope.slide import _check, _tiff
from napari_slidescope.slide.probe import probe

G4 = 2**32
BAND = 256


@pytest.fixture(scope="module")
def pixels(ndpi_writer):
    """Two levels (64 x 1024 and 32 x 512 px) and what their 8 x 256 bands decode to."""
    level0 = ndpi_writer.textured_rgb((64, 1024), seed=7)
    level1 = level0.reshape(32, 2, 512, 2, 3).mean(axis=(1, 3)).astype(np.uint8)
    levels = [level0, level1]
    return levels, [ndpi_writer.spliced_jpeg(rgb, BAND)[1] for rgb in levels]


def _write(ndpi_writer, path, levels, **kwargs):
    return ndpi_writer.write_ndpi(path, levels, band_width=BAND, spliced=True, **kwargs)


def _open(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SlidescopeWarning)  # e.g. no label image
        return open_slide(path, **kwargs)


def _assert_levels(slide, expected):
    assert [tuple(s) for s in slide.level_shapes] == [e.shape[:2] for e in expected]
    for i, want in enumerate(expected):
        level = slide.levels[i]
        np.testing.assert_array_equal(np.asarray(level[:, :]), want)  # decode pool
        np.testing.assert_array_equal(level[:, :].compute(), want)  # dask graph
    h, w = expected[0].shape[:2]
    np.testing.assert_array_equal(
        slide.read_region((h - 13, w - 300, h, w)), expected[0][h - 13 :, w - 300 :]
    )


def test_ndpi_past_4gib_opens_pixel_exact(tmp_path, ndpi_writer, pixels):
    levels, expected = pixels
    path = _write(ndpi_writer, tmp_path / "past4g.ndpi", levels, hole=G4 + 1000, mcu_high=True)
    assert os.path.getsize(path) > G4
    with tifffile.TiffFile(path) as tif:  # the layout the test means to reach
        page = tif.pages.first
        assert page.offset > G4 and page.dataoffsets[0] > G4
        assert 65432 in page.tags and page.tags[65426].valueoffset > G4
        ifds = [p.offset for p in tif.pages]
        mcu = (page.tags[65426].valueoffset, 4 * len(page.tags[65426].value))
    # the structure check walks the same directories and finds the 64-bit value offsets
    layout = _check.walk(str(path), os.path.getsize(path))
    assert layout.ifds == ifds and layout.truncated is None
    assert mcu in layout.values
    with _open(path) as slide:
        assert slide.format == "ndpi"
        _assert_levels(slide, expected)
    found = probe(path)
    assert (found.format, found.levels, found.damage) == ("ndpi", 2, None)


def test_ndpi_past_4gib_napari_reader(tmp_path, ndpi_writer, pixels):
    from napari_slidescope._napari.reader import get_reader

    levels, expected = pixels
    path = _write(ndpi_writer, tmp_path / "past4g.ndpi", levels, hole=G4 + 8)
    reader = get_reader(str(path))
    assert reader is not None
    (data, _meta, kind), *_ = reader(str(path))
    assert kind == "image"
    np.testing.assert_array_equal(np.asarray(data[0][:, :]), expected[0])


def test_ndpi_past_4gib_over_http(tmp_path, ndpi_writer, pixels):
    from tests import remote_server

    levels, expected = pixels
    _write(ndpi_writer, tmp_path / "past4g.ndpi", levels, hole=G4 + 8, mcu_high=True)
    with remote_server.serve(tmp_path) as server, _open(server.url("past4g.ndpi")) as slide:
        _assert_levels(slide, expected)


def test_ndpi_wider_than_65535_px(tmp_path, ndpi_writer):
    rgb = ndpi_writer.textured_rgb((16, 66 * 1024), seed=3)  # 67,584 px wide: SOF width 0
    half = rgb.reshape(8, 2, 33 * 1024, 2, 3).mean(axis=(1, 3)).astype(np.uint8)
    path = ndpi_writer.write_ndpi(
        tmp_path / "wide.ndpi", [rgb, half], band_width=1024, spliced=True, hole=G4
    )
    expected = [ndpi_writer.spliced_jpeg(a, 1024)[1] for a in (rgb, half)]
    with open(path, "rb") as fh, tifffile.TiffFile(path) as tif:
        tags = tif.pages.first.tags
        fh.seek(int(tags["StripOffsets"].value[0]))
        head = fh.read(int(tags[65426].value[0]))  # the JPEG header, up to band 0
    sof = head.index(b"\xff\xc0")
    assert head[sof + 5 : sof + 9] == b"\x00\x10\x00\x00"  # 16 rows, width 0
    with _open(path) as slide:
        _assert_levels(slide, expected)


@pytest.fixture
def small_wrap(monkeypatch):
    """Repair McuStarts that wrap at 4 KiB instead of 4 GiB (see the module docstring)."""
    monkeypatch.setattr(_check, "MCU_WRAP", 4096)
    return 4096


@pytest.mark.parametrize("path_taken", ["direct decoder", "zarr store"])
def test_wrapped_mcu_starts_are_repaired(
    tmp_path, ndpi_writer, pixels, small_wrap, path_taken, monkeypatch
):
    if path_taken == "zarr store":  # tifffile's zarr store reads the repaired offsets too
        monkeypatch.setattr(_tiff._PageChunks, "create", classmethod(lambda cls, *a: None))
    levels, expected = pixels
    path = _write(ndpi_writer, tmp_path / "wrapped.ndpi", levels, wrap=small_wrap, hole=G4)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages.first
        low = np.asarray(page.tags[65426].value, np.int64)
        assert np.any(np.diff(low) < 0), "the stored McuStarts must wrap"
        assert page.tags["StripByteCounts"].value[0] > small_wrap
        # tifffile < 2026.11 takes the wrapped values as they are (wrong bytes for most
        # bands); later ones refuse them and leave the strip whole (no bands at all)
        assert min(page.databytecounts) < 0 or page.jpegheader is None
    with _open(path) as slide:
        _assert_levels(slide, expected)


def test_wrapped_mcu_starts_log_no_tifffile_warning(
    tmp_path, ndpi_writer, pixels, small_wrap, caplog
):
    """tifffile >= 2026.11 warns that it ignores the wrapped McuStarts: we repair them."""
    levels, expected = pixels
    path = _write(ndpi_writer, tmp_path / "wrapped.ndpi", levels, wrap=small_wrap, hole=G4)
    with caplog.at_level(logging.DEBUG):
        with _open(path) as slide:
            _assert_levels(slide, expected)
    assert not [r for r in caplog.records if "McuStarts" in r.getMessage()]


def test_only_the_mcu_starts_warning_of_our_own_parse_is_dropped(caplog):
    log = logging.getLogger("tifffile")
    note = "<tifffile.TiffPage 0 @8> ignoring NDPI McuStarts, raised ValueError('invalid')"
    with caplog.at_level(logging.WARNING, logger="tifffile"):
        with _tiff._parsing():
            log.warning(note)
            log.warning("some other tifffile warning")
        log.warning(note)  # someone else's parse: passed on
    assert [r.getMessage() for r in caplog.records] == ["some other tifffile warning", note]


def test_mcu_starts_at_4gib():
    starts = np.array([100, G4 - 50, G4 + 7_000, 2 * G4 + 3, 2 * G4 + 9_000], np.int64)
    low, high = starts % G4, starts >> 32
    strip = int(starts[-1]) + 5_000
    assert np.array_equal(_check.mcu_starts(low, high, strip)[0], starts)
    for missing in (None, np.zeros_like(high)):  # no McuStartsHighBytes, or zeros in it
        got, wrapped = _check.mcu_starts(low, missing, strip)
        assert wrapped and np.array_equal(got, starts)
    got, wrapped = _check.mcu_starts(low[:2], None, G4 + 10)  # no wrap: nothing to repair
    assert not wrapped and np.array_equal(got, low[:2])
    got, wrapped = _check.mcu_starts(low, None, G4 - 1)  # a strip under 4 GiB cannot wrap
    assert not wrapped and np.array_equal(got, low)


def _damaged(ndpi_writer, tmp_path, pixels, edit, **kwargs):
    levels, _ = pixels
    return _write(ndpi_writer, tmp_path / "damaged.ndpi", levels, edit_mcu=edit, **kwargs)


def test_band_start_off_its_restart_marker_is_refused(tmp_path, ndpi_writer, pixels):
    def edit(level, low, high):
        low = low.copy()
        if level == 0:
            low[-1] += 3  # the last band (always checked) starts 3 bytes late
        return low, high

    path = _damaged(ndpi_writer, tmp_path, pixels, edit, hole=G4)
    with pytest.raises(SlideError, match=r"damaged\.ndpi: .*McuStarts\) are damaged: band 31"):
        _open(path)


def test_high_bytes_past_the_strip_are_refused(tmp_path, ndpi_writer, pixels):
    def edit(level, low, high):
        high = high.copy()
        high[-1] = 1  # the last band 4 GiB further on: past the strip and the file
        return low, high

    path = _damaged(ndpi_writer, tmp_path, pixels, edit, mcu_high=True)
    with pytest.raises(SlideError, match=r"damaged\.ndpi: .*McuStarts\) point outside"):
        _open(path)


def test_high_bytes_of_another_length_are_refused(tmp_path, ndpi_writer, pixels):
    def edit(level, low, high):
        return low, high[:-1]

    path = _damaged(ndpi_writer, tmp_path, pixels, edit, mcu_high=True)
    with pytest.raises(SlideError, match=r"damaged\.ndpi: is a damaged TIFF"):  # tifffile's
        _open(path)


def test_wrapped_mcu_starts_that_cannot_be_repaired_are_refused(
    tmp_path, ndpi_writer, pixels, small_wrap
):
    def edit(level, low, high):
        low = low.copy()
        if level == 0:
            low[-1] = (low[-1] + 2) % small_wrap
        return low, high

    path = _damaged(ndpi_writer, tmp_path, pixels, edit, wrap=small_wrap)
    with pytest.raises(SlideError, match=r"wrap past 4 GiB with no McuStartsHighBytes"):
        _open(path)
    with pytest.raises(SlideError, match=r"damaged\.ndpi"):
        probe(path)


def test_ifd_high_bytes_cut_off_is_reported_truncated(tmp_path, ndpi_writer, pixels):
    levels, _ = pixels
    path = _write(ndpi_writer, tmp_path / "cut.ndpi", levels[:1], hole=G4)
    with tifffile.TiffFile(path) as tif:
        ifd = tif.pages.first.offset
    ntags = 22
    with open(path, "r+b") as fh:
        fh.truncate(ifd + 2 + 12 * ntags + 8 + 4)  # the high-byte block cut short
    layout = _check.walk(str(path), os.path.getsize(path))
    assert layout.ifds == [ifd]
    assert "cut off by the end of the file" in (layout.truncated or "")


def test_ndpi_past_4gib_in_a_batch_run(tmp_path, ndpi_writer, pixels):
    distributed = pytest.importorskip("distributed")
    from napari_slidescope.batch.engine import analyze_slides

    levels, _ = pixels
    path = _write(ndpi_writer, tmp_path / "past4g.ndpi", levels, hole=G4 + 8)
    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0"
    ) as client:
        (row,) = analyze_slides([path], tmp_path / "out", tasks=("tissue",), client=client)
    assert (row["slide"], row["status"], row["error"]) == ("past4g.ndpi", "done", None)


def test_ndpi_past_4gib_cut_short_shows_the_cut_bands_blank(tmp_path, ndpi_writer, pixels):
    levels, expected = pixels
    path = _write(ndpi_writer, tmp_path / "cut.ndpi", levels, hole=G4, ifds_first=True)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages.first
        cut_at = int(page.dataoffsets[20]) + 5  # level 0 from band 20 on, and level 1
    rows = 20 // 4 * 8  # bands 0-19: the first five rows of four bands
    with open(path, "r+b") as fh:
        fh.truncate(cut_at)
    with pytest.raises(SlideError, match=r"cut\.ndpi: is truncated: 12 of 32 level-0 tiles"):
        _open(path)
    with _open(path, on_error="blank") as slide:
        with pytest.warns(SlidescopeWarning, match=r"level 0: damaged tile.*file is truncated"):
            got = np.asarray(slide.levels[0][:, :])
    assert not got[rows:].any()  # blank, and said so
    np.testing.assert_array_equal(got[:rows], expected[0][:rows])
