"""The public errors and warnings: one home, re-exported at top level, old paths kept."""

import importlib
import pickle

import pytest

import napari_slidescope
from napari_slidescope import errors

OLD_PATHS = [
    ("napari_slidescope.slide", "SlideError"),
    ("napari_slidescope.slide.errors", "SlideError"),
    ("napari_slidescope.segmenters", "SegmenterUnavailableError"),
    ("napari_slidescope.segmenters", "SegmenterMismatchWarning"),
    ("napari_slidescope.segmenters", "SegmenterInfoWarning"),
    ("napari_slidescope.segmenters", "UncalibratedWarning"),
    ("napari_slidescope.segmenters.base", "SegmenterUnavailableError"),
    ("napari_slidescope.segmenters.resolution", "UncalibratedWarning"),
    ("napari_slidescope.segmenters.instanseg", "InstallError"),
    ("napari_slidescope.pipeline.cancel", "Cancelled"),
    ("napari_slidescope.pipeline.cell_forest", "ClassifierFileError"),
]


@pytest.mark.parametrize("name", errors.__all__)
def test_public_names_are_the_same_class_at_top_level(name):
    assert getattr(napari_slidescope, name) is getattr(errors, name)
    assert name in napari_slidescope.__all__


@pytest.mark.parametrize(("module", "name"), OLD_PATHS)
def test_old_import_paths_give_the_same_class(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_every_warning_is_a_slidescope_warning():
    warnings = [getattr(errors, n) for n in errors.__all__ if n.endswith("Warning")]
    assert len(warnings) == 4
    for cls in warnings:
        assert issubclass(cls, errors.SlidescopeWarning), cls


def test_slide_error_names_the_file_and_the_problem():
    err = errors.SlideError("/data/a.svs", "not a TIFF file")
    assert str(err) == "/data/a.svs: not a TIFF file"
    assert (err.path, err.problem) == ("/data/a.svs", "not a TIFF file")
    assert isinstance(err, ValueError)


def test_cancelled_says_the_stage():
    err = errors.Cancelled("tissue detection")
    assert err.stage == "tissue detection"
    assert str(err) == "cancelled during tissue detection"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.Cancelled
