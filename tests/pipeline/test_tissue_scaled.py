"""Tissue detection reads its working image decoded at 1/2-1/8 in the DCT domain."""

import pytest

import napari_slidescope.pipeline.tissue as tissue_mod
from napari_slidescope import open_slide
from napari_slidescope.pipeline.tissue import detect_tissue
from napari_slidescope.slide import Slide


def iou(a, b):
    return (a & b).sum() / max((a | b).sum(), 1)


def _spy_reads(monkeypatch):
    """Record every pixel array a slide hands back; a full-size read_level fails the test."""
    arrays = []
    scaled = Slide.read_level_scaled

    def read_level_scaled(self, level, box, scale, **kw):
        out = scaled(self, level, box, scale, **kw)
        arrays.append((level, box, scale, out.shape))
        return out

    def read_level(self, level, box):
        y0, x0, y1, x1 = box
        if y1 > y0 and x1 > x0:
            raise AssertionError(f"full-size read of level {level} box {box}")
        return Slide._read_level(self, self._level_box(level, box), level)

    monkeypatch.setattr(Slide, "read_level_scaled", read_level_scaled)
    monkeypatch.setattr(Slide, "read_level", read_level)
    return arrays


def test_working_image_is_read_scaled_and_nothing_larger(sample_slide, monkeypatch):
    path, _ = sample_slide  # JPEG levels at 0.5, 2 and 8 µm/px
    arrays = _spy_reads(monkeypatch)
    with open_slide(path) as slide:
        assert slide.level_scales(1) == (1, 2, 4, 8)
        res = detect_tissue(slide, target_mpp=4.0)
    # the level at 2 µm/px, two of its pixels per working pixel: decoded at 1/2
    assert res.level == 1
    assert res.mpp == pytest.approx(4.0)
    assert res.downsample == pytest.approx((8.0, 8.0))
    # the plan: one read at 1/2 straight into the working image (the empty first read
    # only asks for the dtype); no array larger than the mask was ever read
    reads = [a for a in arrays if a[3][0] > 0]
    assert [(lv, s) for lv, _, s, _ in reads] == [(1, 2)]
    assert reads[0][3][:2] == res.mask.shape


def test_scaled_and_full_decode_give_the_same_mask(sample_slide, monkeypatch):
    path, _ = sample_slide
    with open_slide(path) as slide:
        scaled = detect_tissue(slide, target_mpp=4.0)
    monkeypatch.setattr(tissue_mod, "_dct_scale", lambda *a: 1)  # decode whole, block mean
    with open_slide(path) as slide:
        whole = detect_tissue(slide, target_mpp=4.0)
    assert scaled.mask.shape == whole.mask.shape
    assert scaled.origin == whole.origin and scaled.downsample == whole.downsample
    assert iou(scaled.mask, whole.mask) >= 0.99
    assert scaled.area_um2 == pytest.approx(whole.area_um2, rel=0.01)


@pytest.mark.parametrize("name", ["CMU-1-Small-Region.svs", "TCGA-CR-7395-01A-01-TS1.svs"])
def test_shared_slides_mask_agrees_with_the_full_decode(shared_file, name, monkeypatch):
    import warnings

    path = shared_file(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TCGA: uncalibrated
        with open_slide(path) as slide:
            scaled = detect_tissue(slide)
            uses = tissue_mod._dct_scale(slide, scaled.level, round(scaled.downsample[1]))
        monkeypatch.setattr(tissue_mod, "_dct_scale", lambda *a: 1)
        with open_slide(path) as slide:
            whole = detect_tissue(slide)
    if name.startswith("CMU"):  # one level at 0.5 µm/px: 16 px per working pixel, 1/8 + 2x2
        assert uses == 8
    assert iou(scaled.mask, whole.mask) >= 0.99


def test_cancel_stops_a_scaled_read(sample_slide):
    import threading

    from napari_slidescope.pipeline.cancel import Cancelled

    cancel = threading.Event()
    cancel.set()
    with open_slide(sample_slide[0]) as slide, pytest.raises(Cancelled):
        detect_tissue(slide, target_mpp=4.0, cancel=cancel)


def test_region_reads_start_on_the_scale_and_cover_the_region(sample_slide):
    with open_slide(sample_slide[0]) as slide:
        res = detect_tissue(slide, target_mpp=4.0, region=(101, 203, 1500, 2500))
    # level 1 is 4x level 0: the read starts at level pixel (25, 50) -> (24, 50) on the
    # 1/2 grid, level 0 (96, 200); the mask still covers the whole region
    assert res.origin == (96, 200)
    assert res.origin[0] + res.mask.shape[0] * res.downsample[0] >= 1500
    assert res.origin[1] + res.mask.shape[1] * res.downsample[1] >= 2500
    assert res.region == (101, 203, 1500, 2500)
