"""Reading JPEG levels at 1/2, 1/4, 1/8 in the DCT domain (Slide.read_level_scaled)."""

import numpy as np
import pytest
import tifffile
from scipy import ndimage as ndi

from napari_slidescope import SlideError, SlidescopeWarning, open_slide
from napari_slidescope.analysis.resample import block_mean


def _smooth_rgb(shape, seed=0):
    rng = np.random.default_rng(seed)
    planes = [ndi.gaussian_filter(rng.random(shape[:2]), 6) for _ in range(3)]
    rgb = np.stack([(p - p.min()) / (np.ptp(p) + 1e-9) for p in planes], axis=-1)
    return (40 + 200 * rgb).astype(np.uint8)


def _jpeg_tiff(path, *, photometric="rgb", shape=(1000, 1200, 3), compression="jpeg"):
    data = _smooth_rgb(shape)
    tifffile.imwrite(
        path,
        data,
        tile=(256, 256),
        photometric=photometric,
        compression=compression,
        compressionargs={"level": 95} if compression == "jpeg" else None,
        resolution=(1e4 / 0.5, 1e4 / 0.5),
        resolutionunit="CENTIMETER",
    )
    return data


@pytest.mark.parametrize("photometric", ["rgb", "ycbcr"])
@pytest.mark.parametrize("scale", [2, 4, 8])
def test_scaled_read_is_the_block_mean_of_the_full_decode(tmp_path, photometric, scale):
    path = tmp_path / "slide.tif"
    _jpeg_tiff(path, photometric=photometric)  # 1000 x 1200: partial tiles at two edges
    with open_slide(path) as slide:
        assert slide.level_scales(0) == (1, 2, 4, 8)
        for box in [(0, 0, 1000, 1200), (256, 512, 777, 1200), (8, 16, 300, 41)]:
            got = slide.read_level_scaled(0, box, scale)
            # an output pixel shows its whole block, also where the box ends inside one
            y0, x0, y1, x1 = box
            whole = (y0, x0, -(-y1 // scale) * scale, -(-x1 // scale) * scale)
            ref = block_mean(slide.read_level(0, whole), scale)
            assert got.shape == ref.shape
            diff = np.abs(got.astype(int) - ref.astype(int))
            # libjpeg's scaled inverse DCT: about the block mean
            assert diff.mean() < 1.5, diff.mean()
            assert np.percentile(diff, 99) <= 8, np.percentile(diff, 99)


def test_scales_of_a_level_that_is_not_jpeg_and_bad_boxes(tmp_path):
    path = tmp_path / "zlib.tif"
    _jpeg_tiff(path, compression="zlib")
    with open_slide(path) as slide:
        assert slide.level_scales(0) == (1,)
        np.testing.assert_array_equal(
            slide.read_level_scaled(0, (0, 0, 10, 10), 1), slide.read_level(0, (0, 0, 10, 10))
        )
        with pytest.raises(ValueError, match="cannot be read at 1/2"):
            slide.read_level_scaled(0, (0, 0, 10, 10), 2)
    path = tmp_path / "jpeg.tif"
    _jpeg_tiff(path)
    with open_slide(path) as slide:
        with pytest.raises(ValueError, match="multiple of 4"):
            slide.read_level_scaled(0, (2, 0, 10, 10), 4)
        with pytest.raises(ValueError, match="level 3 does not exist"):
            slide.level_scales(3)


def _damage_entropy_data(path, index):
    """Overwrite the middle of a tile's entropy-coded data (its markers stay intact)."""
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[index]
        count = tif.pages[0].databytecounts[index]
    raw = bytearray(path.read_bytes())
    start = offset + count // 2
    raw[start : start + 64] = b"\xff\xd5" * 32  # markers where entropy data should be
    path.write_bytes(bytes(raw))


def test_scaled_read_refuses_a_corrupt_tile_as_the_full_read(tmp_path):
    path = tmp_path / "corrupt.tif"
    _jpeg_tiff(path)
    _damage_entropy_data(path, 1)  # tile row 0, column 1
    with open_slide(path) as slide:
        slide.read_level_scaled(0, (0, 0, 256, 256), 2)  # the intact tile reads fine
        with pytest.raises(SlideError, match=r"corrupt\.tif: level 0: cannot decode pixels"):
            slide.read_level(0, (0, 256, 256, 512))
        with pytest.raises(
            SlideError, match=r"corrupt\.tif: level 0: cannot decode pixels \[0:256, 256:512"
        ):
            slide.read_level_scaled(0, (0, 0, 512, 1200), 2)
    blank = open_slide(path, on_error="blank")
    with blank, pytest.warns(SlidescopeWarning, match=r"corrupt\.tif: level 0: damaged tile"):
        got = blank.read_level_scaled(0, (0, 0, 512, 1200), 2)
        assert np.all(got[:128, 128:256] == 0)
        assert got[:128, :128].min() > 0
        assert blank.damage.tiles() == [(0, ((0, 256), (256, 512)))]


@pytest.mark.parametrize("photometric", ["rgb", "ycbcr"])
def test_full_size_scaled_read_is_the_level_readers_pixels_without_its_cache(tmp_path, photometric):
    from napari_slidescope.slide import tile_cache

    path = tmp_path / "slide.tif"
    _jpeg_tiff(path, photometric=photometric)
    with open_slide(path) as slide:
        tile_cache().clear()
        got = slide.read_level_scaled(0, (0, 0, 1000, 1200), 1)
        assert tile_cache().nbytes == 0  # decoded straight into the output
        np.testing.assert_array_equal(got, slide.read_level(0, (0, 0, 1000, 1200)))


# -- NDPI levels: runs of band rows decoded as one JPEG stream each ------------------------


@pytest.fixture
def band_ndpi(tmp_path, ndpi_writer, monkeypatch):
    """A 200 x 768 px NDPI of 8 x 256 px restart bands (3 a row: spans start on multiples
    of 8 band rows; 25 band rows), read in spans of 8 band rows (several spans a read)."""
    from napari_slidescope.slide import _scaled

    monkeypatch.setattr(_scaled, "SPAN_PIXELS", 1)  # spans of the least: 8 band rows
    level0 = ndpi_writer.textured_rgb((200, 768), seed=5)
    return ndpi_writer.write_ndpi(tmp_path / "bands.ndpi", [level0], band_width=256)


def _spans_used(monkeypatch):
    """Record the spans asked for (``jpeg_band_rows``: r0, r1, a stream came) and the band
    rows decoded band by band (``("row", r)``)."""
    from napari_slidescope.slide import _scaled, _tiff

    real, real_row = _tiff._PageChunks.jpeg_band_rows, _scaled._Rows.row
    used = []

    def spy(self, r0, r1):
        stream = real(self, r0, r1)
        used.append((r0, r1, stream is not None))
        return stream

    def row(self, r):
        used.append(("row", r))
        return real_row(self, r)

    monkeypatch.setattr(_tiff._PageChunks, "jpeg_band_rows", spy)
    monkeypatch.setattr(_scaled._Rows, "row", row)
    return used


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_ndpi_band_row_spans_decode_to_the_bands_pixels(band_ndpi, monkeypatch, scale):
    from napari_slidescope.slide import _tiff

    boxes = [(0, 0, 200, 768), (72, 0, 133, 768), (8, 0, 197, 768), (0, 256, 200, 700)]
    with open_slide(band_ndpi) as slide:
        assert slide.level_scales(0) == (1, 2, 4, 8)
        used = _spans_used(monkeypatch)
        spans = [slide.read_level_scaled(0, b, scale) for b in boxes[:3]]
        # every full-width box was decoded in spans, each from a multiple of 8 band rows,
        # none band by band (a span libjpeg refused would have been)
        assert used and all(ok is True and r0 % 8 == 0 for r0, _, ok in used), used
        assert {r0 for r0, *_ in used} == {0, 8, 16, 24}
        spans.append(slide.read_level_scaled(0, boxes[3], scale))  # part of a row: bands
        assert ("row", 0) in used
        monkeypatch.setattr(_tiff._PageChunks, "jpeg_band_rows", lambda self, r0, r1: None)
        bands = [slide.read_level_scaled(0, b, scale) for b in boxes]
        for box, got, want in zip(boxes, spans, bands, strict=True):
            np.testing.assert_array_equal(got, want, err_msg=str(box))  # bit for bit
            if scale == 1:
                np.testing.assert_array_equal(got, slide.read_level(0, box))


def test_ndpi_span_with_a_damaged_band_reads_as_band_by_band(band_ndpi, monkeypatch):
    with tifffile.TiffFile(band_ndpi) as tif:
        offset = tif.pages[0].dataoffsets[3 * 9 + 1]  # band row 9, column 1
        count = tif.pages[0].databytecounts[3 * 9 + 1]
    raw = bytearray(band_ndpi.read_bytes())
    raw[offset + count // 2 : offset + count // 2 + 8] = b"\xff\xd5" * 4
    band_ndpi.write_bytes(bytes(raw))
    used = _spans_used(monkeypatch)
    with open_slide(band_ndpi) as slide:
        with pytest.raises(
            SlideError, match=r"bands\.ndpi: level 0: cannot decode pixels \[72:80, 256:512"
        ):
            slide.read_level_scaled(0, (0, 0, 200, 768), 2)
    assert (8, 16, True) in used and ("row", 9) in used  # the span failed: band by band
    assert ("row", 0) not in used and ("row", 16) not in used  # the other spans did not
    with open_slide(band_ndpi, on_error="blank") as slide:
        with pytest.warns(SlidescopeWarning, match=r"level 0: damaged tile"):
            got = slide.read_level_scaled(0, (0, 0, 200, 768), 1)
        want = slide.read_level(0, (0, 0, 72, 768))
        np.testing.assert_array_equal(got[:72], want)
        assert not got[72:80, 256:512].any()
        np.testing.assert_array_equal(got[72:80, :256], slide.read_level(0, (72, 0, 80, 256)))
        np.testing.assert_array_equal(got[80:], slide.read_level(0, (80, 0, 200, 768)))


def test_ndpi_band_row_spans_over_http(band_ndpi, monkeypatch):
    from tests import remote_server

    with open_slide(band_ndpi) as local:
        want = local.read_level(0, (0, 0, 200, 768))
    used = _spans_used(monkeypatch)
    with (
        remote_server.serve(band_ndpi.parent) as server,
        open_slide(server.url(band_ndpi.name)) as slide,
    ):
        got = slide.read_level_scaled(0, (0, 0, 200, 768), 1)
    np.testing.assert_array_equal(got, want)
    assert used and all(ok is True for *_, ok in used), used  # one range request a span
