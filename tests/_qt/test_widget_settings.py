"""The widget's fields come from the options model; its settings load old and new files."""

import os

import pytest

from napari_slidescope.options import NucleiOptions, TissueOptions, option_fields

pytestmark = pytest.mark.gui


@pytest.fixture
def widget(make_napari_viewer):
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    return SlideAnalysisWidget(make_napari_viewer(show=False))


@pytest.mark.parametrize("cls", [TissueOptions, NucleiOptions])
def test_every_option_has_a_field_showing_the_model_default(widget, cls):
    """One field per documented option: its default, label, unit, doc and bounds."""
    from napari_slidescope._qt.fields import field_value

    fields = widget.tissue_fields if cls is TissueOptions else widget.nuclei_fields
    names = [name for name, _default, _info in option_fields(cls)]
    assert sorted(fields) == sorted(names)
    for name, default, info in option_fields(cls):
        shown = fields[name]
        assert field_value(shown, info) == default, name
        assert info.doc[1:] in shown.tooltip, name
        if info.kind == "bool":
            assert shown.text == info.label, name
            continue
        assert shown.label == info.label, name
        if info.choices is not None:
            assert tuple(shown.choices) == info.choices, name
        if info.kind in ("float", "int"):
            if info.unit:
                assert shown.native.suffix() == f" {info.unit}", name
            # a set value within the model's bounds (the minimum of an optional one: None)
            low = shown.min + (shown.step if info.optional else 0)
            info.check(name, float(low))
            if shown.max < 1e12:
                info.check(name, float(shown.max))


def test_the_new_options_reach_the_run(widget):
    """stain and cell_expansion_um (issue 20) are set in the widget and passed to the run."""
    widget.stain.value = "H-DAB"
    widget.cell_expansion_um.value = 5.0
    widget.tissue_fields["reject_artifacts"].value = False
    widget.tissue_fields["threshold"].value = 0.3
    opts = widget.run_options()
    assert opts["nuclei_run"].options.stain == "H-DAB"
    assert opts["nuclei_run"].options.cell_expansion_um == 5.0
    assert opts["tissue_options"].reject_artifacts is False
    assert opts["tissue_options"].threshold == 0.3
    widget.cell_expansion_um.value = widget.cell_expansion_um.min  # shown as "off"
    assert widget.cell_expansion_um.native.text() == "off"
    assert widget.run_options()["nuclei_run"].options.cell_expansion_um is None


def test_builtin_area_range_reaches_only_the_builtin_segmenter(widget):
    widget.min_area_um2.value = 12.0
    widget.max_area_um2.value = 300.0
    widget.workers.value = 3
    widget.segmenter.value = "builtin"
    run = widget.run_options()["nuclei_run"]
    assert dict(run.options.segmenter_options) == {"min_area_um2": 12.0, "max_area_um2": 300.0}
    assert run.workers == 3
    widget.segmenter.value = "auto"
    assert dict(widget.run_options()["nuclei_run"].options.segmenter_options) == {}


def test_settings_round_trip_through_the_file(make_napari_viewer):
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    viewer = make_napari_viewer(show=False)
    first = SlideAnalysisWidget(viewer)
    first.stain.value = "H&E"
    first.cell_expansion_um.value = 4.0
    first.tissue_fields["outer_only"].value = True
    first.tissue_fields["smooth_um"].value = 12.0
    first.nuclei_mpp.value = 0.4
    want = first.settings()
    first.close()
    second = SlideAnalysisWidget(viewer)
    got = second.settings()
    assert got == want
    assert got.nuclei.stain == "H&E"
    assert got.nuclei.cell_expansion_um == 4.0
    assert got.tissue.outer_only is True
    assert got.tissue.smooth_um == 12.0
    assert got.nuclei.target_mpp == 0.4
    second.restore_defaults.clicked.emit()
    assert second.settings().nuclei.cell_expansion_um is None
    assert second.settings().tissue == TissueOptions()


LEGACY_INI = """[slide_analysis]
task=tissue
scope=slide
mode=replace
segmenter=builtin
nuclei_mpp=0.0
tile_size_um=256.0
min_area_um2=11.0
max_area_um2=222.0
workers=2
tissue_mpp=4.0
min_tissue_um2=5000.0
max_hole_um2=750.0
tissue_mode=brightfield
"""


def test_settings_saved_under_the_old_keys_still_load(make_napari_viewer, tmp_path):
    """An INI file written as versions before the options model wrote it."""
    from napari_slidescope._qt.settings import (
        read_settings,
        settings_store,
        write_settings,
    )
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    path = settings_store().fileName()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(LEGACY_INI)
    widget = SlideAnalysisWidget(make_napari_viewer(show=False))
    got = widget.settings()
    assert (got.task, got.scope, got.mode, got.workers) == ("tissue", "slide", "replace", 2)
    assert got.nuclei.segmenter == "builtin"
    assert got.nuclei.target_mpp is None  # 0.0 meant "auto"
    assert got.nuclei.tile_size_um == 256.0
    assert dict(got.nuclei.segmenter_options) == {"min_area_um2": 11.0, "max_area_um2": 222.0}
    assert got.tissue == TissueOptions(
        target_mpp=4.0, min_tissue_um2=5000.0, max_hole_um2=750.0, mode="brightfield"
    )
    # once saved again, the file holds today's keys only, and reads back the same
    write_settings(settings_store(), got)
    text = open(path, encoding="utf-8").read()
    assert "tissue_mpp" not in text
    assert "nuclei_mpp" not in text
    assert read_settings(settings_store()) == got


def test_a_bad_value_in_the_file_falls_back_to_the_default(make_napari_viewer):
    from napari_slidescope._qt.settings import default_settings, read_settings, settings_store

    path = settings_store().fileName()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[slide_analysis]\ntissue\\target_mpp=-3\nnuclei\\stain=HE\nworkers=two\n")
    got = read_settings(settings_store())
    assert got == default_settings()
