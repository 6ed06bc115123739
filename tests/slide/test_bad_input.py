"""Bad input: a clear SlideError naming the file and the problem, never a crash or a hang."""

import builtins

import numpy as np
import pytest
import tifffile

from napari_slidescope import SlideError, SlidescopeWarning, open_slide


def _tiled_tiff(path, *, compression="jpeg", shape=(512, 512, 3)):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, shape, dtype=np.uint8)
    tifffile.imwrite(
        path,
        data,
        tile=(256, 256),
        photometric="rgb",
        compression=compression,
        resolution=(1e4 / 0.5, 1e4 / 0.5),
        resolutionunit="CENTIMETER",
    )
    return data


def test_non_tiff_bytes_behind_slide_extension(tmp_path):
    path = tmp_path / "fake.svs"
    path.write_bytes(b"%PDF-1.7 not a slide at all" * 10)
    with pytest.raises(SlideError, match=r"fake\.svs: is not a TIFF file"):
        open_slide(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.ndpi"
    path.write_bytes(b"")
    with pytest.raises(SlideError, match=r"empty\.ndpi: is empty"):
        open_slide(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "cut.tif"
    _tiled_tiff(path)
    data = path.read_bytes()
    path.write_bytes(data[:200])
    with pytest.raises(SlideError, match=r"cut\.tif: is truncated: image directory 0"):
        open_slide(path)


def test_truncated_tile_data(tmp_path):
    path = tmp_path / "short.tif"
    _tiled_tiff(path, compression="zlib")
    with tifffile.TiffFile(path) as tif:
        end = max(
            o + n
            for o, n in zip(tif.pages[0].dataoffsets, tif.pages[0].databytecounts, strict=True)
        )
        ifd = tif.pages[0].offset
    data = path.read_bytes()
    assert ifd < end  # tifffile writes the IFD first: cutting the end cuts pixel data only
    path.write_bytes(data[: end - 50])
    with pytest.raises(
        SlideError, match=r"short\.tif: is truncated: 1 of 4 level-0 tiles lie past the end"
    ):
        open_slide(path)
    with pytest.warns(SlidescopeWarning, match=r"short\.tif: opened with parts left out.*blank"):
        slide = open_slide(path, on_error="blank")
    with slide, pytest.warns(SlidescopeWarning, match=r"short\.tif: level 0: damaged tile"):
        got = np.asarray(slide.levels[0])
    assert np.all(got[256:, 256:] == 0)


def _corrupt_tile(path, index=1):
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[index]
        count = tif.pages[0].databytecounts[index]
    raw = bytearray(path.read_bytes())
    raw[offset : offset + count] = b"\x00" * count
    path.write_bytes(bytes(raw))


def test_corrupt_tile_raises_by_default(tmp_path):
    path = tmp_path / "corrupt.tif"
    _tiled_tiff(path)
    _corrupt_tile(path)
    with open_slide(path) as slide:
        np.asarray(slide.levels[0][:256, :256])  # the intact tile reads fine
        with pytest.raises(SlideError, match=r"corrupt\.tif: level 0: cannot decode pixels"):
            np.asarray(slide.levels[0])


def test_corrupt_tile_blank_mode_blanks_only_that_tile_and_warns(tmp_path):
    path = tmp_path / "corrupt.tif"
    data = _tiled_tiff(path, compression="zlib")
    _corrupt_tile(path, index=1)
    with open_slide(path, on_error="blank") as slide:
        with pytest.warns(SlidescopeWarning, match=r"corrupt\.tif: level 0: damaged tile"):
            got = np.asarray(slide.levels[0])
    assert np.all(got[:256, 256:512] == 0)
    np.testing.assert_array_equal(got[:256, :256], data[:256, :256])
    np.testing.assert_array_equal(got[256:], data[256:])


def test_missing_codec(tmp_path):
    path = tmp_path / "odd.tif"
    _tiled_tiff(path, compression="zlib")
    # rewrite the Compression tag to a code no codec handles
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags["Compression"]
        offset = tag.valueoffset
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 2] = (34999).to_bytes(2, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(SlideError, match=r"odd\.tif"):
        with open_slide(path) as slide:
            np.asarray(slide.levels[0])


def test_directory(tmp_path):
    with pytest.raises(SlideError, match="is a directory"):
        open_slide(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(SlideError, match=r"nope\.svs: no such file"):
        open_slide(tmp_path / "nope.svs")


def test_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "locked.svs"
    _tiled_tiff(path)
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    with pytest.raises(SlideError, match=r"locked\.svs: cannot be read \(permission denied"):
        open_slide(path)


def test_uncalibrated_file_warns_once_and_has_no_mpp(tmp_path):
    path = tmp_path / "plain.tif"
    tifffile.imwrite(path, np.zeros((300, 300, 3), np.uint8), tile=(256, 256), photometric="rgb")
    with pytest.warns(SlidescopeWarning, match="no pixel size") as record:
        slide = open_slide(path)
    assert len(record) == 1
    assert slide.mpp is None
    slide.close()


def test_bad_chunk_bytes(tmp_path):
    path = tmp_path / "x.tif"
    _tiled_tiff(path)
    with pytest.raises(ValueError, match="chunk size"):
        open_slide(path, chunk_bytes="huge")
