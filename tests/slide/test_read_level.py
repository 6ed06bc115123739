"""``read_level``: a box of one level's pixels, the same as the dask level's, bad input refused."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.slide import ArraySlide, open_slide


@pytest.fixture
def slides(sample_slide):
    """A file's slide (its own tile reader) and an array's (its dask level)."""
    rgb = np.random.default_rng(0).integers(0, 255, (300, 200, 3), dtype=np.uint8)
    with open_slide(sample_slide[0]) as slide:
        yield [
            (slide, sample_slide[0].name),
            (ArraySlide(rgb, mpp=0.5, name="array.tif"), "array.tif"),
        ]


def test_a_box_is_the_levels_pixels_and_is_clipped_to_the_level(slides):
    for slide, _ in slides:
        last = len(slide.level_shapes) - 1
        h, w = slide.level_shapes[last]
        level = np.asarray(slide.levels[last])
        np.testing.assert_array_equal(slide.read_level(last, (3, 5, 40, 60)), level[3:40, 5:60])
        np.testing.assert_array_equal(slide.read_level(last, (h - 4, 0, h + 50, w + 9)), level[-4:])
        empty = slide.read_level(np.int64(0), (10, 0, 10, 7))  # no rows: dtype and channels
        assert empty.shape == (0, 7, 3)
        assert empty.dtype == np.uint8


@pytest.mark.parametrize(
    ("level", "box", "message"),
    [
        (9, (0, 0, 4, 4), "level 9 does not exist"),
        (-1, (0, 0, 4, 4), "level -1 does not exist"),
        (True, (0, 0, 4, 4), "level must be an integer"),
        (0, (0, 0, 4), "box must be four integers"),
        (0, (0, 0, 4.5, 4), "box must be four integers"),
        (0, (-1, 0, 4, 4), "0 <= y0 <= y1"),
        (0, (5, 0, 4, 4), "0 <= y0 <= y1"),
        (0, (0, 6, 4, 4), "0 <= x0 <= x1"),
    ],
)
def test_bad_level_or_box_is_refused_naming_the_slide(slides, level, box, message):
    for slide, name in slides:
        with pytest.raises(ValueError, match=message) as err:
            slide.read_level(level, box)
        assert name in str(err.value)
