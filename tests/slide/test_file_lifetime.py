"""A slide file changed or deleted while open, and what closing a slide releases."""

import os

import numpy as np
import pytest

from napari_slidescope import SlideError, open_slide
from napari_slidescope.slide import probe, tile_cache
from napari_slidescope.slide.cache import set_cache_bytes


@pytest.fixture
def slide_copy(sample_slide, tmp_path):
    path = tmp_path / "copy.svs"
    path.write_bytes(sample_slide[0].read_bytes())
    return path


def test_file_cut_while_open_gives_slide_error(slide_copy):
    with open_slide(slide_copy) as slide:
        first = slide.read_region((0, 0, 256, 256))
        os.truncate(slide_copy, slide_copy.stat().st_size // 3)
        np.testing.assert_array_equal(slide.read_region((0, 0, 256, 256)), first)  # cached
        with pytest.raises(SlideError, match=r"copy\.svs: level 0: cannot decode pixels"):
            slide.read_region((1536, 2048, 2048, 3072))


def test_file_overwritten_while_open_gives_slide_error(slide_copy):
    with open_slide(slide_copy) as slide:
        size = slide_copy.stat().st_size
        with open(slide_copy, "r+b") as fh:  # in place: the open handle sees the new bytes
            fh.seek(size // 2)
            fh.write(bytes(size // 2))
        with pytest.raises(SlideError, match=r"copy\.svs: level 0"):
            slide.read_region((1024, 0, 2048, 3072))


def test_file_deleted_while_open_reads_or_raises_slide_error(slide_copy):
    with open_slide(slide_copy) as slide:
        slide_copy.unlink()
        # POSIX keeps the open file readable; elsewhere the read must be a SlideError
        try:
            region = slide.read_region((0, 0, 512, 512))
        except SlideError as exc:
            assert "copy.svs" in str(exc)
        else:
            assert region.shape == (512, 512, 3)


def test_read_after_close_is_a_slide_error(slide_copy):
    slide = open_slide(slide_copy)
    slide.close()
    with pytest.raises(SlideError, match=r"copy\.svs"):
        slide.read_region((0, 0, 256, 256))


def test_closing_releases_the_slides_tile_cache(slide_copy):
    set_cache_bytes("64 MiB")
    cache = tile_cache()
    try:
        cache.clear()  # no other slide holds chunks now, whatever ran before
        assert cache.nbytes == 0
        slide = open_slide(slide_copy)
        slide.read_region((0, 0, 1024, 1024))
        assert cache.nbytes > 0
        slide.close()
        assert cache.nbytes == 0
        assert cache.free_nbytes == 0  # the slabs are unmapped too
    finally:
        set_cache_bytes(os.environ.get("SLIDESCOPE_CACHE_BYTES", "256 MiB"))


def test_probe(sample_slide, tmp_path):
    info = probe(sample_slide[0])
    assert info.format == "svs"
    assert info.levels == 3
    assert info.tiled
    assert info.nbytes == 2048 * 3072 * 3
    with pytest.raises(SlideError, match="not a TIFF"):
        (tmp_path / "x.svs").write_bytes(b"hello world")
        probe(tmp_path / "x.svs")
