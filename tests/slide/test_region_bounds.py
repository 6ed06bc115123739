"""read_region on boxes partly or wholly outside the slide: padded, or an error; never empty."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.slide import ArraySlide, open_slide


def _rgb(h=64, w=96):
    rng = np.random.default_rng(0)
    return rng.integers(0, 200, (h, w, 3), dtype=np.uint8)


@pytest.fixture(params=["slide", "array"])
def any_slide(request, sample_slide):
    if request.param == "array":
        yield ArraySlide(_rgb(), mpp=0.5, name="img")
    else:
        with open_slide(sample_slide[0]) as s:
            yield s


def test_partly_outside_is_padded_to_the_box_shape_with_white(any_slide):
    h, w = any_slide.shape0
    box = (h - 10, w - 20, h + 30, w + 40)
    got = any_slide.read_region(box)
    assert got.shape == (40, 60, 3)
    inside = any_slide.read_region((h - 10, w - 20, h, w))
    np.testing.assert_array_equal(got[:10, :20], inside)
    assert (got[10:] == 255).all()
    assert (got[:, 20:] == 255).all()


def test_partly_outside_before_the_origin_keeps_box_relative_indices(any_slide):
    got = any_slide.read_region((-5, -7, 10, 10))
    assert got.shape == (15, 17, 3)
    assert (got[:5] == 255).all()
    assert (got[:, :7] == 255).all()
    np.testing.assert_array_equal(got[5:, 7:], any_slide.read_region((0, 0, 10, 10)))


def test_fill_is_a_parameter(any_slide):
    h, _ = any_slide.shape0
    got = any_slide.read_region((h - 2, 0, h + 2, 4), fill=7)
    assert got.shape == (4, 4, 3)
    assert (got[2:] == 7).all()


def test_partly_outside_at_a_coarser_level(sample_slide):
    with open_slide(sample_slide[0]) as s:
        h, w = s.shape0
        dy, dx = s.downsamples[1]
        got = s.read_region((h - 64, w - 64, h + 64, w + 64), level=1)
        assert got.shape == (round(128 / dy), round(128 / dx), 3)
        assert (got[round(64 / dy) :] == 255).all()


@pytest.mark.parametrize("box", [(10_000, 0, 10_100, 100), (0, -200, 50, 0), (-9, -9, -1, -1)])
def test_wholly_outside_raises_naming_box_and_size(any_slide, box):
    h, w = any_slide.shape0
    with pytest.raises(ValueError, match="wholly outside") as err:
        any_slide.read_region(box)
    assert str(box) in str(err.value)
    assert f"{h} x {w} px" in str(err.value)


@pytest.mark.parametrize("box", [(5, 5, 5, 10), (5, 10, 9, 3)])
def test_empty_box_raises(any_slide, box):
    with pytest.raises(ValueError, match="empty"):
        any_slide.read_region(box)


def test_fluorescence_array_is_padded_with_zero():
    s = ArraySlide(np.full((20, 20), 9, np.uint16), mpp=0.5, name="dapi")
    got = s.read_region((10, 10, 30, 30))
    assert got.shape == (20, 20)
    assert (got[:10, :10] == 9).all()
    assert (got[10:] == 0).all()
