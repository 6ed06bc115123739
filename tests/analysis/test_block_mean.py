"""block_mean: identical to the float reference it replaced, for every dtype and block."""

import numpy as np
import pytest

from napari_slidescope.analysis.resample import _divide, block_mean


def _reference(image, factor, dtype=None):
    """The former implementation (padded copy, float64 division, np.rint).

    Its integer sums are taken in int64 here: the former uint16 / uint32 sums were exact
    for unsigned images and wrapped for signed ones.
    """
    ky, kx = (factor, factor) if np.ndim(factor) == 0 else factor
    out_dtype = np.dtype(image.dtype if dtype is None else dtype)
    if ky == 1 and kx == 1:
        return image.astype(out_dtype, copy=False)
    h, w = -(-image.shape[0] // ky), -(-image.shape[1] // kx)
    partial = bool(image.shape[0] % ky or image.shape[1] % kx)
    padded = np.zeros((h * ky, w * kx, *image.shape[2:]), image.dtype)
    padded[: image.shape[0], : image.shape[1]] = image
    if np.issubdtype(image.dtype, np.integer):
        acc = padded.astype(np.int64).reshape(h, ky, w, kx, *image.shape[2:]).sum((1, 3))
        acc = acc.astype(np.float64)
    else:
        acc = padded.astype(np.float64)[0::ky]
        for i in range(1, ky):
            acc += padded[i::ky]
        cols = acc[:, 0::kx].copy()
        for j in range(1, kx):
            cols += acc[:, j::kx]
        acc = cols
    if not partial and out_dtype == np.float32:
        out = acc.astype(np.float32)
        out *= np.float32(1.0 / (ky * kx))
        return out
    nr = np.minimum(ky, image.shape[0] - ky * np.arange(h))
    nc = np.minimum(kx, image.shape[1] - kx * np.arange(w))
    count = np.multiply.outer(nr, nc).astype(np.float64)
    mean = acc / (count if image.ndim == 2 else count[..., None])
    if np.issubdtype(out_dtype, np.integer):
        return np.rint(mean).astype(out_dtype)
    return mean.astype(out_dtype)


@pytest.mark.parametrize(
    ("acc_dtype", "top", "counts"),
    [
        (np.uint16, 255, range(1, 258)),  # uint8 images, blocks of up to 257 pixels
        (np.uint32, 65535, range(1, 17)),  # uint16 images
        (np.int16, 127, range(1, 257)),  # int8 images (sums down to -128 n)
    ],
)
def test_integer_rounding_is_rint_of_the_float_mean_for_every_sum(acc_dtype, top, counts):
    for n in counts:
        low = -128 * n if acc_dtype == np.int16 else 0
        acc = np.arange(low, top * n + 1).astype(acc_dtype)
        got = np.empty(acc.size, np.int64)
        _divide(acc.copy(), np.array([n]), np.array([1]), n, got, every_block_full=True)
        np.testing.assert_array_equal(got, np.rint(acc / np.float64(n)).astype(np.int64))


SHAPES = [(7, 10, 3), (8, 12, 3), (2880 // 40, 3840 // 40, 3), (9, 5), (1, 1, 3), (33, 17, 4)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.float32, np.float64])
@pytest.mark.parametrize("factor", [1, 2, 3, 4, 8, (2, 3), (5, 1), 16])
def test_block_mean_equals_the_former_implementation(shape, dtype, factor):
    rng = np.random.default_rng(abs(hash((shape, factor))) % 2**32)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        image = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    else:
        image = rng.random(shape).astype(dtype) * 255
    for out in (None, np.float32, np.float64, np.uint8):
        got = block_mean(image, factor, dtype=out)
        if np.issubdtype(dtype, np.signedinteger) and out == np.uint8:
            continue  # negative means have no uint8 value
        want = _reference(image, factor, out)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_signed_integers_average_without_wrapping():
    image = np.array([[-128, -127], [-1, -2]], np.int8)
    np.testing.assert_array_equal(block_mean(image, 2), np.array([[-64]], np.int8))
    np.testing.assert_array_equal(block_mean(image, (1, 2)), np.array([[-128], [-2]], np.int8))


def test_strips_join_without_seams(monkeypatch):
    from napari_slidescope.analysis import resample

    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (101, 67, 3)).astype(np.uint8)
    whole = block_mean(image, 3)
    monkeypatch.setattr(resample, "_STRIP_BYTES", 1)  # one output row per strip
    np.testing.assert_array_equal(block_mean(image, 3), whole)
    np.testing.assert_array_equal(whole, _reference(image, 3))
