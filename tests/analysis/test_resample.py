"""Nearest-neighbour resampling between pixel grids placed in level-0 pixels."""

import numpy as np
import pytest

from napari_slidescope.analysis.resample import resample_nearest


def _centre_formula(labels, downsample, shape):
    """Reference: level-0 pixel r takes working pixel floor((r + 0.5) / ds), edge-clamped."""
    dy, dx = downsample
    rows = np.minimum(((np.arange(shape[0]) + 0.5) / dy).astype(np.intp), labels.shape[0] - 1)
    cols = np.minimum(((np.arange(shape[1]) + 0.5) / dx).astype(np.intp), labels.shape[1] - 1)
    return labels[rows[:, None], cols[None, :]]


@pytest.mark.parametrize("downsample", [(2.0, 2.0), (3.0, 1.5), (2.5, 4.0), (1.0, 1.0)])
def test_upsampling_onto_level0_takes_the_pixel_under_each_centre(downsample):
    rng = np.random.default_rng(0)
    region = (37, 53)  # level-0 extent the working grid covers
    shape = tuple(int(np.ceil(n / d)) for n, d in zip(region, downsample, strict=True))
    labels = rng.integers(0, 50, shape).astype(np.int32)
    out = resample_nearest(
        labels,
        src_origin=(100, 200),
        src_downsample=downsample,
        dst_origin=(100, 200),
        dst_downsample=(1, 1),
        dst_shape=region,
    )
    assert out is not None
    box, patch = out
    assert box == (0, 0, *region)
    assert patch.dtype == labels.dtype
    np.testing.assert_array_equal(patch, _centre_formula(labels, downsample, region))


def test_only_destination_pixels_whose_centres_fall_inside_the_source_are_returned():
    src = np.arange(1, 7, dtype=np.int32).reshape(2, 3)  # covers rows 10..14, cols 20..26 at 2x
    box, patch = resample_nearest(
        src,
        src_origin=(10, 20),
        src_downsample=(2, 2),
        dst_origin=(0, 0),
        dst_downsample=(4, 4),
        dst_shape=(10, 10),
    )
    # destination pixel centres at 2, 6, 10, 14...: rows 10 (index 2) only; cols 22, 26 -> 5, 6
    assert box == (2, 5, 3, 6)
    np.testing.assert_array_equal(patch, [[2]])


def test_clipped_to_the_destination_and_none_when_disjoint():
    src = np.ones((4, 4), np.int32)
    box, patch = resample_nearest(
        src,
        src_origin=(-2, -2),
        src_downsample=(1, 1),
        dst_origin=(0, 0),
        dst_downsample=(1, 1),
        dst_shape=(3, 3),
    )
    assert box == (0, 0, 2, 2)
    assert patch.shape == (2, 2)
    assert (
        resample_nearest(
            src,
            src_origin=(50, 50),
            src_downsample=(1, 1),
            dst_origin=(0, 0),
            dst_downsample=(1, 1),
            dst_shape=(10, 10),
        )
        is None
    )


def test_downsampling_labels_never_mixes_values():
    src = np.zeros((8, 8), np.int32)
    src[:, 4:] = 7
    box, patch = resample_nearest(
        src,
        src_origin=(0, 0),
        src_downsample=(1, 1),
        dst_origin=(0, 0),
        dst_downsample=(4, 4),
        dst_shape=(2, 2),
    )
    assert box == (0, 0, 2, 2)
    np.testing.assert_array_equal(patch, [[0, 7], [0, 7]])
