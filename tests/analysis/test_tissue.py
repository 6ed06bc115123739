"""Array-level tissue detection: synthetic H&E / fluorescence images with known masks."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.analysis.tissue import (
    artifact_mask,
    block_mean,
    brightfield_feature,
    fill_small_holes,
    infer_mode,
    remove_small_pieces,
    tissue_mask,
)

GLASS = (243, 241, 244)
PINK = (228, 148, 190)
PURPLE = (120, 70, 150)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum()) / max(int((a | b).sum()), 1)


def ellipse(shape: tuple[int, int], cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1


def he_scene(seed: int = 0, shape: tuple[int, int] = (160, 200)) -> tuple[np.ndarray, np.ndarray]:
    """H&E-like RGB at ~8 µm/px: pink tissue with nuclei speckle and a lumen, on glass."""
    rng = np.random.default_rng(seed)
    truth = ellipse(shape, 65, 75, 45, 55) | ellipse(shape, 125, 160, 25, 30)
    truth &= ~ellipse(shape, 60, 70, 9, 9)  # a lumen (~ 16,000 µm²): stays a hole
    img = np.empty((*shape, 3), np.float32)
    img[:] = GLASS
    tissue = np.asarray(PINK, np.float32) * rng.uniform(0.9, 1.05, (*shape, 1))
    nuclei = rng.random(shape) < 0.15
    tissue[nuclei] = PURPLE
    img[truth] = tissue[truth]
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), truth


def test_block_mean_exact_with_partial_blocks():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (7, 10, 3)).astype(np.uint8)
    for f in (1, 2, 3, 4):
        out = block_mean(a, f)
        ref = np.array(
            [
                [
                    a[i * f : (i + 1) * f, j * f : (j + 1) * f].reshape(-1, 3).mean(0)
                    for j in range(-(-10 // f))
                ]
                for i in range(-(-7 // f))
            ]
        )
        np.testing.assert_array_equal(out, np.rint(ref).astype(np.uint8))
    assert block_mean(a[..., 0].astype(np.float32), 3).dtype == np.float32
    with pytest.raises(ValueError, match="factor"):
        block_mean(a, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_brightfield_iou_against_known_mask(seed):
    img, truth = he_scene(seed)
    mask, thr = tissue_mask(img, mpp=8.0)
    assert iou(mask, truth) >= 0.95
    assert 0.08 <= thr <= 0.30
    assert not mask[60, 70]  # the lumen stays open


def test_sizes_are_physical():
    """The same scene at half the pixel size gives the same physical answer."""
    img, truth = he_scene(0)
    fine = np.repeat(np.repeat(img, 2, 0), 2, 1)
    coarse_mask, _ = tissue_mask(img, mpp=8.0)
    fine_mask, _ = tissue_mask(fine, mpp=4.0)
    assert iou(block_mean(fine_mask.astype(np.float32), 2) >= 0.5, coarse_mask) >= 0.95
    # the smaller piece (~ 2,350 px at 8 µm/px = 150,000 µm²) goes when the minimum exceeds it
    small_piece = ellipse(truth.shape, 125, 160, 25, 30)
    m, _ = tissue_mask(img, mpp=8.0, min_tissue_um2=200_000)
    assert not (m & small_piece).any()
    assert m.any()
    m, _ = tissue_mask(fine, mpp=4.0, min_tissue_um2=200_000)
    assert not (m[::2, ::2] & small_piece).any()
    assert m.any()


def test_holes_fill_below_max_and_outer_only():
    img, _ = he_scene(0)
    mask, _ = tissue_mask(img, mpp=8.0, max_hole_um2=30_000)  # lumen ~ 250 px * 64 µm²
    assert mask[60, 70]
    mask, _ = tissue_mask(img, mpp=8.0, outer_only=True)
    assert mask[60, 70]


def test_all_white_is_empty_and_all_tissue_is_full():
    rng = np.random.default_rng(0)
    white = np.clip(rng.normal(GLASS, 3, (64, 64, 3)), 0, 255).astype(np.uint8)
    mask, _ = tissue_mask(white, mpp=8.0)
    assert not mask.any()
    img, _ = he_scene(0)
    tissue = img[40:90, 50:100]  # inside the big ellipse, away from the lumen
    tissue = np.where(ellipse((50, 50), 20, 20, 12, 12)[..., None], PINK, tissue).astype(np.uint8)
    mask, _ = tissue_mask(tissue, mpp=8.0)
    assert mask.mean() > 0.98


def test_pen_marks_and_black_debris_are_rejected():
    img, truth = he_scene(0)
    ink = np.zeros(truth.shape, bool)
    img[5:9, 10:190] = (40, 70, 200)  # blue pen
    img[150:154, 5:100] = (40, 160, 70)  # green pen
    img[100:140, 20:23] = (25, 25, 28)  # black marker
    ink[5:9, 10:190] = ink[150:154, 5:100] = ink[100:140, 20:23] = True
    assert artifact_mask(img)[ink & ~truth].mean() > 0.95
    mask, _ = tissue_mask(img, mpp=8.0)
    assert not (mask & ink & ~truth).any()
    assert iou(mask, truth & ~ink) >= 0.93
    mask, _ = tissue_mask(img, mpp=8.0, reject_artifacts=False)
    assert (mask & ink & ~truth).any()


def test_dense_hematoxylin_is_tissue_not_debris():
    img, truth = he_scene(0)
    img[ellipse(truth.shape, 80, 90, 15, 15)] = (45, 22, 55)  # very dark, saturated purple
    assert not artifact_mask(img)[80, 90]
    mask, _ = tissue_mask(img, mpp=8.0)
    assert mask[80, 90]


def test_manual_threshold_overrides():
    img, truth = he_scene(0)
    mask, thr = tissue_mask(img, mpp=8.0, threshold=0.99)
    assert thr == 0.99
    assert not mask.any()
    mask, _ = tissue_mask(img, mpp=8.0, threshold=0.01)
    assert mask.mean() > 0.95


def test_feature_is_low_on_glass_high_on_tissue():
    img, truth = he_scene(0)
    f = brightfield_feature(img)
    assert f.dtype == np.float32
    assert f.shape == truth.shape
    assert np.median(f[~truth]) < 0.05 < 0.25 < np.median(f[truth])


def fluo_scene(seed: int = 0, channels: int = 3, dtype=np.uint8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (150, 130)
    truth = ellipse(shape, 75, 65, 55, 45)
    img = rng.normal(2, 1, (*shape, channels))
    signal = rng.gamma(2.0, 12.0, shape) * (rng.random(shape) < 0.6) + 8  # speckled nuclei
    img[..., -1] += np.where(truth, signal, 0)
    scale = 1 if dtype == np.uint8 else 40
    return np.clip(img * scale, 0, np.iinfo(dtype).max).astype(dtype), truth


@pytest.mark.parametrize(("channels", "dtype"), [(3, np.uint8), (4, np.uint16), (1, np.uint16)])
def test_fluorescence_iou(channels, dtype):
    img, truth = fluo_scene(0, channels, dtype)
    if channels == 1:
        img = img[..., 0]
    mask, _ = tissue_mask(img, mpp=8.0, mode="fluorescence")
    assert iou(mask, truth) >= 0.95


def test_fluorescence_uniform_background_is_empty():
    rng = np.random.default_rng(0)
    img = np.clip(rng.normal(3, 1, (80, 80, 3)), 0, 255).astype(np.uint8)
    mask, _ = tissue_mask(img, mpp=8.0, mode="fluorescence")
    assert not mask.any()


def test_infer_mode():
    assert infer_mode(he_scene(0)[0]) == "brightfield"
    assert infer_mode(fluo_scene(0)[0]) == "fluorescence"
    assert infer_mode(np.zeros((8, 8), np.uint16)) == "fluorescence"
    assert infer_mode(np.zeros((8, 8, 5), np.uint8)) == "fluorescence"


def test_small_pieces_and_holes_helpers():
    m = np.zeros((20, 20), bool)
    m[2:12, 2:12] = True
    m[5:7, 5:7] = False  # 4-px hole
    m[15, 15] = True  # 1-px piece
    out = remove_small_pieces(m, 2)
    assert not out[15, 15]
    assert out[2, 2]
    filled = fill_small_holes(out, 5)
    assert filled[5:7, 5:7].all()
    assert not fill_small_holes(out, 4)[5:7, 5:7].any()  # not strictly smaller: stays
    edge = np.ones((10, 10), bool)
    edge[0, 3:5] = False  # touches the border: not a hole
    assert not fill_small_holes(edge, 100)[0, 3]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "darkfield"}, "mode"),
        ({"mpp": 0.0}, "mpp"),
        ({"mpp": float("nan")}, "mpp"),
        ({"min_tissue_um2": -1.0}, "min_tissue_um2"),
        ({"smooth_um": -1.0}, "smooth_um"),
    ],
)
def test_bad_arguments(kwargs, match):
    img, _ = he_scene(0)
    args = {"mpp": 8.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        tissue_mask(img, **args)


def test_bad_images():
    with pytest.raises(ValueError, match="image"):
        tissue_mask(np.zeros(10, np.uint8), mpp=8.0)
    with pytest.raises(ValueError, match="image"):
        tissue_mask(np.zeros((0, 4, 3), np.uint8), mpp=8.0)
    with pytest.raises(ValueError, match="RGB"):
        tissue_mask(np.zeros((8, 8), np.uint8), mpp=8.0, mode="brightfield")


def test_disk_is_skimages_disk():
    from skimage.morphology import disk

    from napari_slidescope.analysis.tissue import _disk

    for radius in range(0, 60):
        np.testing.assert_array_equal(_disk(radius), disk(radius).astype(bool))


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (3, 4), (40, 57), (123, 80)])
def test_disk_dilation_and_erosion_are_scipys(shape):
    from scipy import ndimage as ndi

    from napari_slidescope.analysis.tissue import _dilate, _disk, _erode

    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    for density in (0.02, 0.5, 0.97):
        mask = rng.random(shape) < density
        for radius in range(0, 9):
            disk = _disk(radius)
            np.testing.assert_array_equal(_dilate(mask, radius), ndi.binary_dilation(mask, disk))
            np.testing.assert_array_equal(
                _erode(mask, radius), ndi.binary_erosion(mask, disk, border_value=1)
            )


def _brightfield_reference(rgb):
    """The former whole-image computation of the brightfield feature and artifacts."""
    scale = np.float32(1.0 / 255.0)
    r, g, b = (rgb[..., i].astype(np.float32) * scale for i in range(3))
    mx = np.maximum(np.maximum(r, g), b)
    mn = np.minimum(np.minimum(r, g), b)
    chroma = mx - mn
    sat = chroma / np.maximum(mx, np.float32(0.05))
    gray = np.float32(0.299) * r + np.float32(0.587) * g + np.float32(0.114) * b
    white = max(float(np.percentile(gray[::2, ::2], 99)), 0.8)
    dark = np.clip(1.0 - gray / np.float32(white), 0.0, 1.0)
    feature = np.maximum(sat, dark)
    safe = np.maximum(chroma, np.float32(1e-6))
    hue = np.where(g >= b, 120.0 + 60.0 * (b - r) / safe, 240.0 + 60.0 * (r - g) / safe)
    ink = (mx > r) & (hue >= 75.0) & (hue <= 250.0) & (sat > 0.25) & (chroma > 0.08)
    return feature, ink | ((mx < 0.25) & (sat < 0.35))


@pytest.mark.parametrize("seed", [0, 1])
def test_brightfield_strips_change_no_bit(seed, monkeypatch):
    from napari_slidescope.analysis import tissue

    img, _ = he_scene(seed)
    rng = np.random.default_rng(seed)
    noisy = rng.integers(0, 256, (301, 517, 3)).astype(np.uint8)
    for rgb in (img, noisy, img[:1], img[:, :1]):
        want_feature, want_bad = _brightfield_reference(rgb)
        for strip in (1, 1000, 1 << 16):
            monkeypatch.setattr(tissue, "_STRIP_PIXELS", strip)
            feature, bad = tissue._brightfield(rgb, artifacts=True)
            np.testing.assert_array_equal(feature, want_feature)
            np.testing.assert_array_equal(bad, want_bad)
            np.testing.assert_array_equal(tissue.brightfield_feature(rgb), want_feature)


def _two_classes_reference(values):
    """The Ridler-Calvard split as it was: one copy of the values, whole-array passes."""
    from skimage import filters

    counts, edges = np.histogram(values, bins=256)
    t = float(filters.threshold_otsu(hist=(counts, (edges[:-1] + edges[1:]) / 2.0)))
    for _ in range(10):
        low = values[values <= t]
        if low.size in (0, values.size):
            break
        new = 0.5 * (low.mean(dtype=np.float64) + values[values > t].mean(dtype=np.float64))
        if abs(new - t) < 1e-4:
            return new
        t = new
    return t


@pytest.mark.parametrize("seed", [0, 1])
def test_threaded_passes_are_the_one_pass_results(seed, monkeypatch):
    """Strips on threads: the Gaussian's bits, the split's threshold, lookups and counts."""
    from scipy import ndimage as ndi

    from napari_slidescope.analysis import _strips, geometry, tissue

    monkeypatch.setattr(_strips, "STRIP_PIXELS", 4096)  # many strips on a small image
    monkeypatch.setattr(geometry, "_PARALLEL_PIXELS", 1)
    rng = np.random.default_rng(seed)
    image = ndi.gaussian_filter(rng.random((301, 457)).astype(np.float32), 4)
    want = ndi.gaussian_filter(image, 1.7, mode="nearest")
    got = image.copy()
    tissue._gaussian_in_place(got, 1.7)
    np.testing.assert_array_equal(got, want)

    valid = rng.random(image.shape) > 0.1
    for v in (None, valid):
        values = image.ravel() if v is None else image[v]
        t, low, high = tissue._two_classes(tissue._Values(image, v))
        assert t == pytest.approx(_two_classes_reference(values), abs=1e-12)
        assert low < t < high

    labels, n = ndi.label(image > image.mean())
    assert n > 2
    np.testing.assert_array_equal(geometry.label_sizes(labels, n), np.bincount(labels.ravel()))
    table = rng.random(n + 1) > 0.5
    np.testing.assert_array_equal(geometry.gather(table, labels), table[labels])


def test_outlines_traced_while_labelled_are_the_serial_ones(monkeypatch):
    from napari_slidescope.analysis import geometry

    rng = np.random.default_rng(3)
    from scipy import ndimage as ndi

    mask = ndi.gaussian_filter(rng.random((240, 320)), 3) > 0.5
    monkeypatch.setattr(geometry, "_PARALLEL_PIXELS", 1 << 40)  # on this thread
    want = geometry.mask_to_polygons(mask, downsample=4)
    monkeypatch.setattr(geometry, "_PARALLEL_PIXELS", 1)  # labelled on the pool
    got = geometry.mask_to_polygons(mask, downsample=4)
    assert len(want[0]) > 3 and sum(map(len, want[1])) > 3
    assert len(got[0]) == len(want[0])
    for a, b in zip(got[0], want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got[1], want[1], strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_strip_threads_work_in_a_forked_child():
    """The pool of the parent has no threads in a forked child: the child starts its own."""
    import os

    from napari_slidescope.analysis import _strips

    assert _strips.map_parallel(abs, [-1, -2, -3]) == [1, 2, 3]  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when its strips ran (killed after 20 s if stuck)
        import signal

        signal.alarm(20)
        ok = (
            _strips.map_parallel(abs, [-4, -5]) == [4, 5]
            and _strips.submit(lambda: 7).result(timeout=20) == 7
        )
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
