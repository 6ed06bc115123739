"""YCbCr, grey and RGB-coded JPEG tiles are decoded once, strictly, into tifffile's own pixels."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
import tifffile

from napari_slidescope import SlideError, open_slide


def _ycbcr_svs(path, rng):
    image = (rng.random((512, 768, 3)) * 60 + np.array([200, 120, 180])).astype(np.uint8)
    tifffile.imwrite(
        path,
        image,
        tile=(256, 256),
        compression="jpeg",
        photometric="ycbcr",
        description="Aperio Image Library v11\n768x512 [0,0 768x512] (256x256) JPEG/RGB|MPP = 0.5",
    )
    return path


def _grey_tiff(path, rng):
    image = (rng.random((512, 640)) * 255).astype(np.uint8)
    tifffile.imwrite(
        path,
        image,
        tile=(256, 256),
        compression="jpeg",
        photometric="minisblack",
        resolution=(20000, 20000),
        resolutionunit="CENTIMETER",
    )
    return path


@pytest.mark.parametrize(("writer", "colorspace"), [(_ycbcr_svs, "RGB"), (_grey_tiff, "GRAY")])
def test_one_pass_pixels_equal_tifffiles(tmp_path, writer, colorspace):
    path = writer(tmp_path / "s.tif", np.random.default_rng(0))
    with open_slide(path) as slide:
        assert slide._readers[0]._source._strict_colorspace == colorspace
        ours = np.asarray(slide.levels[0])
    expected = tifffile.imread(path)
    assert ours.shape == expected.shape
    np.testing.assert_array_equal(ours, expected)


def _scramble_entropy(path, rng):
    """Scramble the entropy-coded bytes of level 0's second tile, keeping its markers.

    The segment's SOI .. SOS header stays, the bytes after it become random with no 0xFF
    (no stray markers): garbage that libjpeg alone would decode without complaint.
    """
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        offset, count = page.dataoffsets[1], page.databytecounts[1]
    data = bytearray(path.read_bytes())
    sos = data.index(b"\xff\xda", offset)
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    junk = rng.integers(0, 255, offset + count - 2 - start, dtype=np.uint8)
    junk[junk == 0xFF] = 0x7F
    data[start : offset + count - 2] = junk.tobytes()
    path.write_bytes(bytes(data))


def test_one_pass_refuses_garbage_entropy_data(tmp_path):
    path = _ycbcr_svs(tmp_path / "s.tif", np.random.default_rng(1))
    _scramble_entropy(path, np.random.default_rng(2))
    with open_slide(path) as slide:
        assert slide._readers[0]._source._strict_colorspace == "RGB"
        with pytest.raises(SlideError, match="level 0"):
            np.asarray(slide.levels[0][:256, 256:512])


# ------------------------------------------------------------------ RGB-coded (Aperio) tiles


def _segments(jpeg):
    """(marker, start, end) of each marker segment up to and including SOS."""
    out, i = [], 2
    while True:
        marker = jpeg[i + 1]
        end = i + 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
        out.append((marker, i, end))
        if marker == 0xDA:
            return out
        i = end


def _aperio_split(jpeg, *, jfif=False):
    """(JPEGTables, abbreviated tile) of an RGB-coded JPEG, as Aperio writes them.

    Component ids 0, 1, 2 and no JFIF or Adobe marker, so that libjpeg alone would take
    the stream for YCbCr; with `jfif` the tile keeps a JFIF APP0 segment of its own.
    """
    tables, tile = bytearray(b"\xff\xd8"), bytearray(b"\xff\xd8")
    if jfif:
        tile += b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    segments = _segments(jpeg)
    for marker, start, end in segments:
        seg = bytearray(jpeg[start:end])
        if marker in (0xDB, 0xC4):
            tables += seg
        elif marker == 0xC0:
            for k in range(seg[9]):
                seg[10 + 3 * k] = k
            tile += seg
        elif marker == 0xDA:
            for k in range(seg[4]):
                seg[5 + 2 * k] = k
            tile += seg
    tile += jpeg[segments[-1][2] :]
    return bytes(tables + b"\xff\xd9"), bytes(tile)


def _aperio_svs(path, rng, *, jfif_tiles=()):
    """A one-level SVS of RGB-coded 256 x 256 JPEG tiles sharing one JPEGTables."""
    import imagecodecs

    h, w = 512, 768
    image = (rng.random((h, w, 3)) * 90 + np.array([150, 90, 140])).astype(np.uint8)
    tiles, tables = [], None
    for n, (y, x) in enumerate((y, x) for y in range(0, h, 256) for x in range(0, w, 256)):
        jpeg = imagecodecs.jpeg8_encode(
            image[y : y + 256, x : x + 256],
            level=85,
            colorspace="RGB",
            outcolorspace="RGB",
            subsampling="444",
            optimize=False,
        )
        tables, tile = _aperio_split(jpeg, jfif=n in jfif_tiles)
        tiles.append(tile)
    tifffile.imwrite(
        path,
        iter(tiles),
        shape=(h, w, 3),
        dtype=np.uint8,
        tile=(256, 256),
        compression="jpeg",
        photometric="rgb",
        extratags=[(347, 7, len(tables), tables, True)],
        description="Aperio Image Library v11\n768x512 [0,0 768x512] (256x256) JPEG/RGB|MPP = 0.5",
    )
    with tifffile.TiffFile(path, mode="r+b") as tif:  # tifffile writes JPEG RGB as YCbCr
        tif.pages[0].tags["PhotometricInterpretation"].overwrite(2)
    return path


def _no_check(*args, **kwargs):
    raise AssertionError("an RGB-coded tile went through the two-pass path")


def test_rgb_coded_tiles_decode_in_one_pass_into_tifffiles_pixels(tmp_path, monkeypatch):
    from napari_slidescope.slide import _tiff

    path = _aperio_svs(tmp_path / "aperio.svs", np.random.default_rng(3))
    expected = tifffile.imread(path)
    with tifffile.TiffFile(path) as tif:  # libjpeg alone takes the stream for YCbCr
        page = tif.pages[0]
        tif.filehandle.seek(page.dataoffsets[0])
        tile = tif.filehandle.read(page.databytecounts[0])
        plain = simplejpeg.decode_jpeg(page.jpegtables[:-2] + tile[2:], colorspace="RGB")
    assert not np.array_equal(plain, expected[:256, :256])
    monkeypatch.setattr(_tiff, "check_jpeg", _no_check)
    with open_slide(path) as slide:
        assert slide._readers[0]._source._rgb_coded
        ours = np.asarray(slide.levels[0])
        region = slide.read_region((100, 200, 400, 700))
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(region, expected[100:400, 200:700])


def test_rgb_coded_tile_with_its_own_marker_takes_the_general_path(tmp_path):
    path = _aperio_svs(tmp_path / "aperio.svs", np.random.default_rng(4), jfif_tiles=(4,))
    with open_slide(path) as slide:
        assert slide._readers[0]._source._rgb_coded
        ours = np.asarray(slide.levels[0])
    np.testing.assert_array_equal(ours, tifffile.imread(path))


def test_rgb_coded_one_pass_refuses_garbage_entropy_data(tmp_path):
    path = _aperio_svs(tmp_path / "aperio.svs", np.random.default_rng(5))
    _scramble_entropy(path, np.random.default_rng(6))
    with open_slide(path) as slide:
        assert slide._readers[0]._source._rgb_coded
        with pytest.raises(SlideError, match="level 0"):
            np.asarray(slide.levels[0][:256, 256:512])
        np.asarray(slide.levels[0][256:, :])  # the intact tiles still read


def test_rgb_coded_forged_frame_is_refused_before_decoding(tmp_path):
    path = _aperio_svs(tmp_path / "aperio.svs", np.random.default_rng(7))
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[0]
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0", offset)
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # a 60000 x 60000 px frame
    path.write_bytes(bytes(data))
    with open_slide(path) as slide, pytest.raises(SlideError, match="larger than the"):
        np.asarray(slide.levels[0][:256, :256])


def test_cmu1_rgb_coded_tiles_equal_tifffiles(shared_file):
    path = shared_file("CMU-1-Small-Region.svs")
    with open_slide(path) as slide:
        assert slide._readers[0]._source._rgb_coded
        ours = np.asarray(slide.levels[0])
    np.testing.assert_array_equal(ours, tifffile.imread(path))
