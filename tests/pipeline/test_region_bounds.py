"""segment_nuclei and detect_tissue on regions partly or wholly outside the slide.

One rule (see ``check_region``): the part of a box outside the slide holds no pixels, so an
analysis covers the part inside and reports it as its region; a box with no part on the
slide raises, naming the box and the slide's size.
"""

from __future__ import annotations

import pytest

from napari_slidescope import detect_tissue, segment_nuclei
from napari_slidescope.slide import ArraySlide, open_slide


@pytest.fixture(params=["slide", "array"])
def source(request, sample_slide):
    if request.param == "array":
        from napari_slidescope.sample_data import make_truth, render_region

        truth = make_truth((512, 768), mpp=0.5, seed=3)
        yield ArraySlide(render_region(truth, 0, 512), mpp=0.5, name="img")
    else:
        with open_slide(sample_slide[0]) as s:
            yield s


@pytest.mark.filterwarnings("ignore:stain estimation fell back")  # a corner of mostly glass
def test_partly_outside_analyses_the_part_inside(source):
    h, w = source.shape0
    box = (-100, -100, h // 2 + 200, w // 2 + 200)  # past the top and left edges
    nuclei = segment_nuclei(source, region=box, segmenter="builtin", tissue=False)
    assert nuclei.region == (0, 0, h // 2 + 200, w // 2 + 200)
    assert nuclei.count > 0
    tissue = detect_tissue(source, region=box, target_mpp=4.0)
    assert tissue.region == (0, 0, h // 2 + 200, w // 2 + 200)
    assert tissue.area_px > 0


@pytest.mark.parametrize("box", [(10_000, 10_000, 10_500, 10_500), (-600, 0, -100, 300)])
def test_wholly_outside_raises_naming_box_and_size(source, box):
    h, w = source.shape0
    for run in (
        lambda: segment_nuclei(source, region=box, segmenter="builtin"),
        lambda: detect_tissue(source, region=box),
    ):
        with pytest.raises(ValueError, match="outside the slide") as err:
            run()
        assert str(box) in str(err.value)
        assert f"{h} x {w} px" in str(err.value)
