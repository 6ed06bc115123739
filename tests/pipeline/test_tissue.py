"""Public detect_tissue: sources, regions, levels, units, GeoJSON, gating, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.analysis.geojson import read_geojson_rings
from napari_slidescope.analysis.geometry import polygons_to_mask
from napari_slidescope.analysis.tissue import block_mean
from napari_slidescope.pipeline.tissue import TissueResult, detect_tissue
from napari_slidescope.slide import ArraySlide, open_slide

GLASS = (243, 241, 244)
PINK = (228, 148, 190)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum()) / max(int((a | b).sum()), 1)


@pytest.fixture(scope="module")
def scene() -> tuple[np.ndarray, np.ndarray]:
    """1 µm/px RGB (1200 x 1600 px) with two tissue pieces; truth on 8 x 8 blocks."""
    rng = np.random.default_rng(0)
    h, w = 1200, 1600
    yy, xx = np.mgrid[:h, :w]
    truth = ((yy - 500) / 380) ** 2 + ((xx - 600) / 450) ** 2 < 1
    truth |= ((yy - 950) / 180) ** 2 + ((xx - 1300) / 220) ** 2 < 1
    truth &= ((yy - 450) / 80) ** 2 + ((xx - 550) / 80) ** 2 >= 1  # a lumen
    img = np.where(truth[..., None], PINK, GLASS).astype(np.float32)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), truth


def test_array_source_result_fields(scene):
    img, truth = scene
    res = detect_tissue(img, mpp=1.0)
    assert isinstance(res, TissueResult)
    assert res.mask.dtype == bool
    assert res.mask.shape == (150, 200)
    assert res.downsample == (8.0, 8.0)
    assert res.origin == (0.0, 0.0)
    assert res.mpp == pytest.approx(8.0)
    assert res.level == 0
    assert res.mode == "brightfield"
    t8 = block_mean(truth.astype(np.float32), 8) >= 0.5
    assert iou(res.mask, t8) >= 0.95
    assert res.area_px == pytest.approx(res.mask.sum() * 64)
    assert res.area_um2 == pytest.approx(res.area_px * 1.0)
    assert res.fraction == pytest.approx(res.area_px / img.shape[0] / img.shape[1])
    assert len(res.polygons) == 2
    assert len(res.holes) == 2
    assert len(res.holes[0]) == 1
    back = polygons_to_mask(res.polygons, res.holes, shape=res.mask.shape, downsample=8)
    np.testing.assert_array_equal(back, res.mask)
    with pytest.raises(AttributeError):
        res.mpp = 1.0  # type: ignore[misc]


def test_array_needs_mpp(scene):
    with pytest.raises(ValueError, match="mpp"):
        detect_tissue(scene[0])


def test_region_has_level0_origin_and_matches_whole(scene):
    img, _ = scene
    whole = detect_tissue(img, mpp=1.0)
    region = (400, 800, 1200, 1600)  # aligned to the 8-px working grid
    res = detect_tissue(img, mpp=1.0, region=region)
    assert res.origin == (400.0, 800.0)
    assert res.region == region
    assert res.mask.shape == (100, 100)
    assert iou(res.mask, whole.mask[50:150, 100:200]) >= 0.97
    allv = np.vstack(res.polygons)
    assert allv[:, 0].min() >= 400
    assert allv[:, 0].max() <= 1200
    assert allv[:, 1].min() >= 800
    assert allv[:, 1].max() <= 1600
    back = polygons_to_mask(
        res.polygons, res.holes, shape=res.mask.shape, downsample=8, origin=res.origin
    )
    assert iou(back, res.mask) >= 0.99


def test_unaligned_region_clips_polygons_and_area(scene):
    img, _ = scene
    region = (403, 805, 901, 1207)
    res = detect_tissue(img, mpp=1.0, region=region)
    assert res.origin == (403.0, 805.0)
    allv = np.vstack(res.polygons)
    assert allv[:, 0].max() <= 901
    assert allv[:, 1].max() <= 1207
    assert 0.0 < res.fraction <= 1.0


def test_geojson_round_trip(scene, tmp_path):
    img, _ = scene
    res = detect_tissue(img, mpp=1.0, region=(400, 800, 1200, 1600))
    path = tmp_path / "t.geojson"
    res.to_geojson(path)
    doc = json.loads(path.read_text())
    props = doc["features"][0]["properties"]
    assert props["objectType"] == "annotation"
    assert props["classification"]["name"] == "Tissue"
    ext, holes = read_geojson_rings(path)
    assert len(ext) == len(res.polygons)
    for a, b in zip(ext, res.polygons, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-3)
    assert [len(h) for h in holes] == [len(h) for h in res.holes]


def test_gating_a_tile_grid(scene):
    img, _ = scene
    res = detect_tissue(img, mpp=1.0)
    tile = 256  # e.g. 256-px tiles of a level with downsample 1
    boxes = [(y, x, y + tile, x + tile) for y in range(0, 1200, tile) for x in range(0, 1600, tile)]
    keep = res.tiles_with_tissue(boxes)
    for box, k in zip(boxes, keep, strict=True):
        y0, x0, y1, x1 = (v // 8 for v in box)
        assert k == bool(res.mask[y0 : -(-box[2] // 8), x0 : -(-box[3] // 8)].any())
    assert keep.any()
    assert not keep.all()


def test_pyramid_reads_a_reduced_level_and_matches_truth(sample_slide):
    path, truth = sample_slide
    with open_slide(path) as slide:
        res = detect_tissue(slide)
        assert len(slide.levels) > 1
    assert res.level > 0  # never level 0 for a whole pyramidal slide
    assert res.mpp == pytest.approx(8.0)
    factor = round(res.downsample[0] / truth.downsample)
    t = block_mean(truth.tissue_mask.astype(np.float32), factor) >= 0.5
    h, w = min(t.shape[0], res.mask.shape[0]), min(t.shape[1], res.mask.shape[1])
    assert iou(res.mask[:h, :w], t[:h, :w]) >= 0.95
    # a path works too and gives the same mask
    np.testing.assert_array_equal(detect_tissue(path).mask, res.mask)


def test_coarser_target_downsamples_in_memory(scene):
    img, _ = scene
    res = detect_tissue(img, mpp=1.0, target_mpp=20.0)
    assert res.downsample == (20.0, 20.0)
    assert res.mask.shape == (60, 80)


def test_region_outside_or_empty_raises(scene):
    img, _ = scene
    with pytest.raises(ValueError, match="outside"):
        detect_tissue(img, mpp=1.0, region=(5000, 5000, 6000, 6000))
    with pytest.raises(ValueError, match="empty"):
        detect_tissue(img, mpp=1.0, region=(100, 100, 100, 300))


def test_region_smaller_than_a_working_pixel_raises(scene):
    with pytest.raises(ValueError, match="smaller than one working pixel"):
        detect_tissue(scene[0], mpp=1.0, region=(10, 10, 15, 100))


def test_uncalibrated_slide_warns_and_reports_pixels(scene):
    img, _ = scene
    slide = ArraySlide(img, mpp=None)
    with pytest.warns(SlidescopeWarning, match="no pixel size"):
        res = detect_tissue(slide)
    assert res.mpp is None
    assert res.area_um2 is None
    assert res.area_px > 0
    assert 0 < res.fraction < 1
    # sizes assumed 0.5 µm/px: 8 µm/px -> 16 level-0 px per mask pixel
    assert res.downsample == (16.0, 16.0)
    calibrated = detect_tissue(ArraySlide(img, mpp=None), mpp=1.0)
    assert calibrated.mpp == pytest.approx(8.0)


def test_all_white_and_all_tissue():
    rng = np.random.default_rng(0)
    white = np.clip(rng.normal(GLASS, 3, (400, 400, 3)), 0, 255).astype(np.uint8)
    res = detect_tissue(white, mpp=1.0)
    assert not res.mask.any()
    assert res.polygons == []
    assert res.fraction == 0.0
    assert res.area_um2 == 0.0
    tissue = np.clip(rng.normal(PINK, 6, (400, 400, 3)), 0, 255).astype(np.uint8)
    res = detect_tissue(tissue, mpp=1.0)
    assert res.fraction == pytest.approx(1.0)
    assert len(res.polygons) == 1


def test_mode_auto_and_override():
    rng = np.random.default_rng(0)
    dark = np.clip(rng.normal(3, 1, (400, 400, 3)), 0, 255)
    dark[100:300, 100:300, 2] += 60
    dark = dark.astype(np.uint8)
    res = detect_tissue(dark, mpp=1.0)
    assert res.mode == "fluorescence"
    assert res.mask[12:37, 12:37].mean() > 0.9
    assert not res.mask[:8].any()
    assert detect_tissue(dark, mpp=1.0, mode="brightfield").mode == "brightfield"
    with pytest.raises(ValueError, match="mode"):
        detect_tissue(dark, mpp=1.0, mode="darkfield")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_mpp"):
        detect_tissue(dark, mpp=1.0, target_mpp=0)


def test_shared_slides_are_plausible(shared_file):
    cmu = detect_tissue(shared_file("CMU-1-Small-Region.svs"))
    assert cmu.mode == "brightfield"
    assert 0.2 < cmu.fraction < 0.6
    assert math.isclose(cmu.mpp or 0, 7.984, rel_tol=1e-3)
    dapi = detect_tissue(shared_file("test3-DAPI-2-387.ndpi"))
    assert dapi.mode == "fluorescence"
    assert dapi.level == 3
    assert dapi.fraction > 0.5
    qptiff = detect_tissue(shared_file("small_vectra.qptiff"))
    assert qptiff.mode == "fluorescence"
    assert 0.3 < qptiff.fraction < 0.7
    with pytest.warns(SlidescopeWarning):
        tcga = detect_tissue(shared_file("TCGA-CR-7395-01A-01-TS1.svs"))
    assert tcga.mpp is None
    assert tcga.level == 1
    assert 0.4 < tcga.fraction < 0.8
    tiny = detect_tissue(shared_file("openslide-python_small.svs"))
    assert tiny.mask.shape == (1, 1)


def test_strip_reads_give_the_same_mask(scene, monkeypatch):
    import napari_slidescope.pipeline.tissue as mod

    img, _ = scene
    whole = detect_tissue(img, mpp=1.0, region=(3, 5, 1195, 1597))
    monkeypatch.setattr(mod, "_READ_BYTES", 100 * 1600 * 3)  # ~100-row strips
    strips = detect_tissue(img, mpp=1.0, region=(3, 5, 1195, 1597))
    np.testing.assert_array_equal(strips.mask, whole.mask)


def test_options_object_and_keywords_agree_and_keywords_win():
    from napari_slidescope.options import TissueOptions

    rng = np.random.default_rng(0)
    dark = np.clip(rng.normal(3, 1, (400, 400, 3)), 0, 255)
    dark[100:300, 100:300, 2] += 60
    dark = dark.astype(np.uint8)
    opts = TissueOptions(mode="brightfield", target_mpp=4)
    by_options = detect_tissue(dark, mpp=1.0, options=opts)
    by_keywords = detect_tissue(dark, mpp=1.0, mode="brightfield", target_mpp=4)
    assert by_options.mode == by_keywords.mode == "brightfield"
    np.testing.assert_array_equal(by_options.mask, by_keywords.mask)
    assert by_options.mask.shape == (100, 100)  # 400 px at 1 µm/px, 4 µm/px working pixels
    assert by_options.parameters == {"options": opts.as_dict()}
    assert by_keywords.parameters == by_options.parameters
    # a keyword wins over the same field of options
    assert detect_tissue(dark, mpp=1.0, options=opts, mode="fluorescence").mode == "fluorescence"
    with pytest.raises(TypeError, match=r"unexpected keyword.*'min_tissue'"):
        detect_tissue(dark, mpp=1.0, min_tissue=5)
    with pytest.raises(TypeError, match="expected a TissueOptions"):
        detect_tissue(dark, mpp=1.0, options={"mode": "brightfield"})


def test_results_are_frozen_with_int_origins_and_exports_return_the_path(tmp_path):
    import dataclasses

    from napari_slidescope.pipeline.nuclei_result import NucleiResult

    img = np.full((300, 300, 3), 240, np.uint8)
    img[60:240, 60:240] = (150, 80, 160)
    tissue = detect_tissue(img, mpp=1.0, target_mpp=4.0, region=(2, 2, 298, 298))
    assert tissue.origin == (2, 2)  # the region's corner: the one level read from there
    assert all(type(v) is int for v in tissue.origin)
    assert tissue.to_geojson(tmp_path / "t.geojson") == tmp_path / "t.geojson"
    assert (tmp_path / "t.geojson").stat().st_size > 0
    nuclei = NucleiResult(None, 1.0, (0, 0), (1.0, 1.0), 0, {"id": np.zeros(0)}, (0, 0, 1, 1))
    for result in (tissue, nuclei):
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.mpp = 2.0  # type: ignore[misc]


@pytest.mark.parametrize("outer_only", [False, True])
def test_outlines_are_traced_when_first_asked_for(scene, monkeypatch, outer_only):
    import dataclasses

    from napari_slidescope.analysis import geometry

    img, _ = scene
    region = (3, 5, 1190, 1597)  # edges that cut working pixels: vertices clipped to it
    real = geometry.mask_to_polygons
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(geometry, "mask_to_polygons", spy)
    res = detect_tissue(img, mpp=1.0, region=region, outer_only=outer_only)
    assert calls == []  # detection itself traces nothing
    want = real(
        res.mask, downsample=res.downsample, origin=res.origin, holes=not outer_only, bounds=region
    )
    polygons, holes = res.polygons, res.holes
    assert len(calls) == 1 and res.polygons is polygons and res.holes is holes  # once
    assert len(polygons) == len(want[0]) == 2
    for a, b in zip(polygons, want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert (
        [len(h) for h in holes] == [len(h) for h in want[1]] == ([0, 0] if outer_only else [1, 0])
    )
    for a, b in zip(sum(holes, []), sum(want[1], []), strict=True):
        np.testing.assert_array_equal(a, b)
    # a copy with another mask traces that mask, not the original's cached rings
    half = res.mask.copy()
    half[:, half.shape[1] // 2 :] = False
    copy = dataclasses.replace(res, mask=half)
    assert len(copy.polygons) == 1 and copy.polygons[0][:, 1].max() < res.polygons[0][:, 1].max()


def test_outlines_are_traced_once_when_two_threads_ask(scene, monkeypatch):
    """A dock's worker and the GUI thread asking at once get one tracing, the same lists."""
    import threading

    from napari_slidescope.analysis import geometry

    img, _ = scene
    res = detect_tissue(img, mpp=1.0)
    real = geometry.mask_to_polygons
    calls = []
    started = threading.Event()

    def slow(*args, **kwargs):
        calls.append(1)
        started.set()
        threading.Event().wait(0.2)  # the other thread asks meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(geometry, "mask_to_polygons", slow)
    got = []

    def ask():
        got.append((res.polygons, res.holes))

    first = threading.Thread(target=ask)
    first.start()
    started.wait(5)
    second = threading.Thread(target=ask)
    second.start()
    first.join(10)
    second.join(10)
    assert len(calls) == 1
    assert got[0][0] is got[1][0] and got[0][1] is got[1][1]
