"""The OpenSlide backend, forced on the shared SVS and NDPI, against the tifffile path."""

import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.slide import SlideError, open_slide

pytest.importorskip("openslide")


@pytest.mark.parametrize(
    ("name", "vendor", "mpp"),
    [
        ("CMU-1-Small-Region.svs", "aperio", 0.499),
        ("test3-DAPI-2-387.ndpi", "hamamatsu", 0.22817),
    ],
)
def test_forced_openslide_equals_tifffile(shared_file, name, vendor, mpp):
    path = shared_file(name)
    with open_slide(path, backend="openslide") as slide, open_slide(path) as ref:
        assert slide.backend == "openslide"
        assert slide.format == vendor
        assert slide.axes == "YXS"
        assert slide.mpp == pytest.approx((mpp, mpp), rel=1e-4)
        assert slide.calibration_source == "OpenSlide mpp-x / mpp-y"
        # OpenSlide may add levels of its own (NDPI: JPEG scale-decoded 1/16...1/64)
        assert slide.level_shapes[: len(ref.levels)] == ref.level_shapes
        assert set(ref.associated) & {"label", "macro"} <= set(slide.associated)
        for level in range(len(ref.levels)):
            # whole-number downsamples: OpenSlide's pixels are the file's
            assert float(slide.downsamples[level][0]).is_integer()
            np.testing.assert_array_equal(
                np.asarray(slide.levels[level]), np.asarray(ref.levels[level]), f"level {level}"
            )
        box = (1000, 700, 1600, 1500)
        np.testing.assert_array_equal(slide.read_region(box), ref.read_region(box))


def test_chunks_are_whole_openslide_tiles(shared_file):
    with open_slide(shared_file("CMU-1-Small-Region.svs"), backend="openslide") as slide:
        th, tw, _ = slide._readers[0].native
        assert (th, tw) == (240, 240)  # the SVS's own tiles, as OpenSlide reports them
        cy, cx, _ = slide.levels[0].chunksize
        assert cy % th == 0 or cy == slide.shape0[0]
        assert cx % tw == 0 or cx == slide.shape0[1]


def test_fractional_downsample_is_resampled_close(shared_file):
    """An SVS level of downsample 2.0005: OpenSlide resamples it at sub-pixel offsets."""
    path = shared_file("TCGA-CR-7395-01A-01-TS1.svs")
    with pytest.warns(SlidescopeWarning, match="no pixel size"):
        slide = open_slide(path, backend="openslide")
    with pytest.warns(SlidescopeWarning, match="no pixel size"):
        ref = open_slide(path)
    with slide, ref:
        assert slide.level_shapes == ref.level_shapes
        np.testing.assert_array_equal(np.asarray(slide.levels[0]), np.asarray(ref.levels[0]))
        got = np.asarray(slide.levels[1]).astype(int)
        want = np.asarray(ref.levels[1]).astype(int)
        assert np.abs(got - want).mean() < 3


def test_not_an_openslide_format(tmp_path):
    path = tmp_path / "fake.mrxs"
    path.write_bytes(b"not a slide")
    with pytest.raises(SlideError, match="OpenSlide") as info:
        open_slide(path)
    assert str(path) in str(info.value)


def test_unknown_backend(shared_file):
    with pytest.raises(ValueError, match="backend"):
        open_slide(shared_file("CMU-1-Small-Region.svs"), backend="bioformats")
