"""Built-in nuclei segmentation on synthetic H&E and on one real MoNuSeg crop."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_slidescope import SlidescopeWarning
from napari_slidescope.analysis.brightfield_nuclei import (
    RAW_CHANNELS,
    BuiltinSegmenter,
    NucleiParams,
    segment_nuclei_array,
)
from napari_slidescope.analysis.stains import RUIFROK_HE, estimate_stains

MPP = 0.25
RADIUS_UM = 3.5


def _he(shape, centres, *, radius_um=RADIUS_UM, mpp=MPP, seed=0) -> np.ndarray:
    """Pink stroma with dark purple discs, by Beer-Lambert mixing of the Ruifrok stains.

    The stroma is pale (red OD < 0.15), so Macenko sees it as glass: pass RUIFROK_HE.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    disc = np.zeros(shape)
    for cy, cx in centres:
        disc = np.maximum(disc, (np.hypot(yy - cy, xx - cx) <= radius_um / mpp).astype(float))
    disc = ndi.gaussian_filter(disc, 0.5)  # soft edge, like optics
    c_h = 0.1 + 0.8 * disc + rng.normal(0, 0.02, shape)
    c_e = 0.35 * (1 - 0.5 * disc) + rng.normal(0, 0.02, shape)
    od = c_h[..., None] * RUIFROK_HE.hematoxylin + c_e[..., None] * RUIFROK_HE.eosin
    return np.clip(np.round(255 * 10.0 ** (-od)), 0, 255).astype(np.uint8)


GRID = [(40 + 70 * i, 40 + 70 * j) for i in range(4) for j in range(4)]


@pytest.fixture(scope="module")
def grid_image() -> np.ndarray:
    return _he((300, 300), GRID)


def test_counts_and_areas(grid_image):
    labels = segment_nuclei_array(grid_image, mpp=MPP, stains=RUIFROK_HE)
    assert labels.dtype == np.int32
    assert labels.shape == (300, 300)
    assert labels.max() == len(GRID)
    assert set(np.unique(labels[tuple(np.array(GRID).T)])) == set(range(1, len(GRID) + 1))
    areas = np.bincount(labels.ravel())[1:] * MPP**2
    expected = math.pi * RADIUS_UM**2
    assert np.all(np.abs(areas - expected) < 0.25 * expected), areas


def test_touching_discs_are_split():
    r = RADIUS_UM / MPP
    centres = [(60, 60), (60, 60 + 2 * r - 2), (150, 150), (150 + 2 * r - 3, 150)]
    labels = segment_nuclei_array(_he((220, 220), centres), mpp=MPP, stains=RUIFROK_HE)
    ids = labels[tuple(np.round(np.array(centres)).astype(int).T)]
    assert labels.max() == 4
    assert len(set(ids.tolist())) == 4
    assert 0 not in ids


def test_other_resolution_returns_input_shape(grid_image):
    fine = np.repeat(np.repeat(grid_image, 2, axis=0), 2, axis=1)  # 0.125 µm/px
    labels = segment_nuclei_array(fine, mpp=MPP / 2, stains=RUIFROK_HE)
    assert labels.shape == fine.shape[:2]
    assert labels.dtype == np.int32
    assert labels.max() == len(GRID)


def test_no_nuclei_gives_no_labels():
    pink = _he((128, 128), [])
    assert segment_nuclei_array(pink, mpp=MPP, stains=RUIFROK_HE).max() == 0
    glass = np.full((128, 128, 3), 242, np.uint8)
    with pytest.warns(SlidescopeWarning):  # stains cannot be estimated from glass
        labels = segment_nuclei_array(glass, mpp=MPP)
    assert labels.dtype == np.int32
    assert labels.max() == 0


def test_two_stages(grid_image):
    seg = BuiltinSegmenter(stains=RUIFROK_HE)
    assert seg.name == "builtin"
    assert seg.target_mpp == NucleiParams().target_mpp
    assert seg.min_overlap_um >= 2 * NucleiParams().max_diameter_um
    seg.prepare(grid_image)
    raw = seg.predict(np.stack([grid_image, grid_image[::-1]]), mpp=MPP)
    assert raw.shape == (2, 300, 300, len(RAW_CHANNELS))
    assert raw.dtype == np.float32
    a, b = (seg.postprocess(r, mpp=MPP) for r in raw)
    assert a.max() == b.max() == len(GRID)
    np.testing.assert_array_equal(a > 0, (b > 0)[::-1])


def test_predict_without_prepare_warns(grid_image):
    seg = BuiltinSegmenter()
    with pytest.warns(SlidescopeWarning) as record:
        # the synthetic image shows no pure eosin, so the stain fallback may warn too
        seg.predict(grid_image[np.newaxis], mpp=MPP)
    assert any("prepare" in str(w.message) for w in record)
    assert seg.stains is not None


def _two_stain_image(hematoxylin, eosin, *, seed) -> np.ndarray:
    """Random mixtures of two stains, dense enough in both for Macenko estimation."""
    rng = np.random.default_rng(seed)
    conc = rng.uniform([0.0, 0.3], [1.0, 1.0], size=(64, 64, 2))
    od = conc[..., :1] * np.asarray(hematoxylin) + conc[..., 1:] * np.asarray(eosin)
    return np.clip(np.round(255 * 10.0 ** (-od)), 0, 255).astype(np.uint8)


def test_prepare_reestimates_stains_for_each_slide():
    e = RUIFROK_HE.eosin
    h_b = np.array([0.45, 0.80, 0.40]) / np.linalg.norm([0.45, 0.80, 0.40])
    slide_a = _two_stain_image(RUIFROK_HE.hematoxylin, e, seed=1)
    slide_b = _two_stain_image(h_b, e, seed=2)
    seg = BuiltinSegmenter()
    seg.prepare(slide_a)
    first = seg.stains
    seg.prepare(slide_b)  # a new slide: its own stains, not the first slide's
    assert seg.stains is not first
    np.testing.assert_allclose(seg.stains.matrix, estimate_stains(slide_b).matrix)
    assert not np.allclose(seg.stains.hematoxylin, first.hematoxylin, atol=0.02)
    fixed = BuiltinSegmenter(stains=RUIFROK_HE)  # stains passed explicitly are kept
    fixed.prepare(slide_a)
    fixed.prepare(slide_b)
    assert fixed.stains is RUIFROK_HE


def test_predict_may_run_in_parallel(grid_image):
    seg = BuiltinSegmenter(stains=RUIFROK_HE)
    assert seg.parallel_predict is True  # the runner then gives predict `workers` threads
    seg.prepare(grid_image)
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda _: seg.predict(grid_image[np.newaxis], mpp=MPP), range(2)))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.zeros((32, 32), np.uint8), "grayscale"),
        (np.zeros((32, 32, 4), np.uint8), "RGBA"),
        (np.zeros((32, 32, 3), np.float32), "uint8"),
        (np.zeros((32, 32, 3), np.uint16), "uint8"),
    ],
)
def test_invalid_images(image, match):
    with pytest.raises(ValueError, match=match):
        segment_nuclei_array(image, mpp=MPP)


def test_invalid_arguments(grid_image):
    with pytest.raises(ValueError, match="mpp"):
        segment_nuclei_array(grid_image, mpp=0)
    seg = BuiltinSegmenter(stains=RUIFROK_HE)
    with pytest.raises(ValueError, match=r"\(B, H, W, 3\)"):
        seg.predict(grid_image, mpp=MPP)
    with pytest.raises(ValueError, match="raw must have shape"):
        seg.postprocess(np.zeros((8, 8, 2), np.float32), mpp=MPP)
    with pytest.raises(ValueError, match="min_area_um2"):
        NucleiParams(min_area_um2=500.0)
    with pytest.raises(ValueError, match="target_mpp"):
        NucleiParams(target_mpp=-1.0)


# F1@0.5 of this crop measured by benchmarks/nuclei_accuracy.py: 0.841; floor = that - 0.05
REAL_ID = "TCGA-AR-A1AS-01Z-00-DX1"
REAL_F1_FLOOR = 0.79


def test_real_monuseg_crop(testdata):
    import tifffile

    from napari_slidescope.analysis.metrics import f1_at_iou

    folder = testdata / "nuclei_gt" / "monuseg_train"
    image, gt = folder / f"{REAL_ID}.tif", folder / f"{REAL_ID}_instances.tif"
    for path in (image, gt):
        if not path.is_file():
            pytest.fail(f"{path} is missing")
    labels = segment_nuclei_array(tifffile.imread(image), mpp=0.2457)
    assert f1_at_iou(tifffile.imread(gt), labels) >= REAL_F1_FLOOR
