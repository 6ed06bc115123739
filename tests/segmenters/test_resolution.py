"""One resolution rule: every entry point segments at ``segmenters.working_mpp``."""

import math

import numpy as np
import pytest
from tests.fakes import ThresholdSegmenter

from napari_slidescope import segment_nuclei
from napari_slidescope.analysis.stains import RUIFROK_HE
from napari_slidescope.segmenters import UncalibratedWarning, working_mpp
from napari_slidescope.slide import ArraySlide


@pytest.mark.parametrize(
    "segmenter, slide_mpp, requested, expected",
    [
        (0.25, 0.25, None, 0.25),
        (0.25, 0.499, None, 0.499),  # the slide's own pixel size, unrounded
        (0.25, (0.5, 0.499), None, 0.499),  # the finer axis
        (0.5, 0.25, None, 0.5),  # the segmenter's, coarser than the slide
        (0.5, 0.25, 0.25, 0.25),  # the user asked
        (0.25, 0.5, 0.25, 0.25),  # even finer than the slide
        ("builtin", 0.5, None, 0.5),
        ("builtin", 0.2457, None, 0.25),
        ("instanseg", 0.2457, None, 0.5),
        ("builtin-fluorescence", 0.228, None, 0.5),
        (0.5, 0.25, 0, 0.5),  # 0: not asked (a widget's "auto")
    ],
)
def test_rule(segmenter, slide_mpp, requested, expected):
    assert working_mpp(segmenter, slide_mpp, requested) == expected


def test_uncalibrated_slides_work_at_the_segmenters_resolution_and_say_so():
    with pytest.warns(UncalibratedWarning, match="no pixel size.*0.25"):
        assert working_mpp("builtin", None) == 0.25
    assert working_mpp("builtin", None, 0.4) == 0.4  # asked: no guess to report
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="requested"):
            working_mpp(0.5, 0.25, bad)
    with pytest.raises(ValueError, match="slide_mpp"):
        working_mpp(0.5, 0.0)


def test_auto_resolution_follows_the_stain(monkeypatch):
    from napari_slidescope.segmenters import registry

    monkeypatch.setattr(registry, "missing_reason", lambda name: "absent")
    assert working_mpp("auto", 0.2, input="brightfield") == 0.25  # built-in H&E
    assert working_mpp("auto", 0.2, input="fluorescence") == 0.5  # built-in fluorescence
    monkeypatch.setattr(registry, "missing_reason", lambda name: None)
    assert working_mpp("auto", 0.2, input="brightfield") == 0.5  # InstanSeg


class Stand(ThresholdSegmenter):
    """The shared stand-in at 0.5 µm/px, measured with the standard stains (two flat colours)."""

    name = "stand"

    def __init__(self):
        super().__init__(stains=RUIFROK_HE, opening=False)


def _image():
    rng = np.random.default_rng(0)
    img = np.full((256, 256, 3), 230, np.uint8)
    for y, x in rng.integers(10, 246, size=(30, 2)):
        img[y - 4 : y + 4, x - 4 : x + 4] = (80, 40, 120)
    return img


class Fine(Stand):
    name, target_mpp = "fine", 0.25


#: (segmenter, slide mpp, working mpp): 0.25, 0.5 and uncalibrated slides, and 0.499 kept
SLIDES = [(Stand, 0.25, 0.5), (Stand, 0.5, 0.5), (Stand, None, 0.5), (Fine, 0.499, 0.499)]


@pytest.mark.parametrize("seg, slide_mpp, expected", SLIDES)
def test_api_and_batch_entry_use_the_rule(seg, slide_mpp, expected, monkeypatch):
    from napari_slidescope.pipeline import nuclei, nuclei_setup

    calls = []
    real = nuclei_setup.working_mpp

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(nuclei_setup, "working_mpp", spy)
    slide = ArraySlide(_image(), mpp=slide_mpp)
    if slide_mpp is None:
        with pytest.warns(UncalibratedWarning):
            res = segment_nuclei(slide, segmenter=seg(), tissue=False)
    else:
        res = segment_nuclei(slide, segmenter=seg(), tissue=False)
    assert res.mpp == expected
    assert calls
    assert calls[-1][1] == (None if slide_mpp is None else (slide_mpp, slide_mpp))
    # the batch engine's entry point: prepare_nuclei, the same set-up
    if slide_mpp is None:
        with pytest.warns(UncalibratedWarning):
            run = nuclei.prepare_nuclei(
                ArraySlide(_image(), mpp=None), segmenter=seg(), tissue=False
            )
    else:
        run = nuclei.prepare_nuclei(slide, segmenter=seg(), tissue=False)
    assert run.plan.mpp == expected


@pytest.mark.parametrize("seg, slide_mpp, expected", SLIDES)
def test_widget_and_console_runs_use_the_rule(seg, slide_mpp, expected):
    """Widget and console both start runs through the session, which asks jobs.nuclei_mpp."""
    from napari_slidescope._napari import jobs

    info = {"mpp": None if slide_mpp is None else (slide_mpp, slide_mpp), "axes": "YXS"}
    source = jobs.SlideSource("s", "s.svs", None, (1.0, 1.0), (256, 256), info)
    if slide_mpp is None:
        with pytest.warns(UncalibratedWarning):
            got = jobs.nuclei_mpp(source, {"segmenter": seg()})
    else:
        got = jobs.nuclei_mpp(source, {"segmenter": seg(), "target_mpp": None})
    assert got == expected
    # what a session run then segments at: tests/_qt/test_session_resolution.py


def test_batch_leaves_the_resolution_to_the_rule_by_default():
    from napari_slidescope.batch.params import BatchParams

    # default: the rule decides, in prepare_nuclei
    assert BatchParams().nuclei_options.target_mpp is None
    # what a batch then segments at, asked or not: tests/batch/test_resolved.py
