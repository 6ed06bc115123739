"""YCbCr and grey JPEG tiles are decoded once, strictly, into tifffile's own pixels."""

from __future__ import annotations

import numpy as np
import pytest
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


def test_one_pass_refuses_garbage_entropy_data(tmp_path):
    path = _ycbcr_svs(tmp_path / "s.tif", np.random.default_rng(1))
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        offset, count = page.dataoffsets[1], page.databytecounts[1]
    data = bytearray(path.read_bytes())
    # keep the segment's markers (SOI .. SOS header), scramble the entropy-coded bytes
    sos = data.index(b"\xff\xda", offset)
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    junk = np.random.default_rng(2).integers(0, 255, offset + count - 2 - start, dtype=np.uint8)
    junk[junk == 0xFF] = 0x7F  # no stray markers: garbage that libjpeg alone would decode
    data[start : offset + count - 2] = junk.tobytes()
    path.write_bytes(bytes(data))
    with open_slide(path) as slide:
        assert slide._readers[0]._source._strict_colorspace == "RGB"
        with pytest.raises(SlideError, match="level 0"):
            np.asarray(slide.levels[0][:256, 256:512])
