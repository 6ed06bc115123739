"""The widget as a user meets it: progress, partial results, layout, settings, shortcuts."""

import dataclasses
import threading

import numpy as np
import pytest
from tests.fakes import GatedSegmenter

from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._qt import session
from napari_slidescope._qt.settings import default_settings
from napari_slidescope._qt.widget import SlideAnalysisWidget

pytestmark = pytest.mark.gui

#: The widget's defaults, written out from the documentation (README, docstrings): nuclei
#: "auto" (segmenter and resolution), 512 µm tiles, nuclei of 10-400 µm² (NucleiParams),
#: all cores but one; tissue at 8 µm/px (1.25x), pieces from 2,500 µm² (a 50 µm square),
#: holes up to 1,000 µm² filled, the stain mode guessed.
DEFAULTS = {
    "task": "nuclei",
    "scope": "visible",
    "mode": "add",
    "workers": 0,
    "tissue": {
        "target_mpp": 8.0,
        "mode": "auto",
        "threshold": None,
        "smooth_um": None,
        "min_tissue_um2": 2_500.0,
        "max_hole_um2": 1_000.0,
        "outer_only": False,
        "reject_artifacts": True,
    },
    "nuclei": {
        "segmenter": "auto",
        "target_mpp": None,
        "tile_size_um": 512.0,
        "channel": None,
        "stain": "auto",
        "cell_expansion_um": None,
        "segmenter_options": {"min_area_um2": 10.0, "max_area_um2": 400.0},
    },
}
#: Widest the dock's contents may grow (px), whatever the slide's name or a message.
MAX_WIDTH_PX = 420


def _assert_defaults(settings):
    got = dataclasses.asdict(settings)
    assert got == DEFAULTS


def _slow_run(widget, image, threshold_segmenter, delay=0.15, gate=None, free=6, held=None):
    """Start a slow nuclei run; with `gate`, tiles after the first `free` wait for it.

    `held` (a list) receives the gated segmenter.
    """
    seg = threshold_segmenter(delay=delay)
    if gate is not None:
        seg = GatedSegmenter(seg, free, gate)
        if held is not None:
            held.append(seg)
    opts = {
        "segmenter": seg,
        "tile_size_um": 64.0,
        "target_mpp": 0.5,
        "workers": 1,
    }
    return widget.session.run(image, "nuclei", scope="slide", nuclei_run=opts)


def test_progress_shows_stage_tiles_and_time_left(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    seen = []
    widget.session.progress.connect(lambda p: seen.append((p.stage, p.done, p.total)))
    gate, held = threading.Event(), []
    _slow_run(widget, image, threshold_segmenter, gate=gate, held=held)
    assert widget.progress.visible
    assert widget.cancel_button.enabled
    assert not widget.run_button.enabled
    assert "in progress" in widget.run_button.tooltip
    qtbot.waitUntil(lambda: widget.progress.value >= 3, timeout=60_000)
    # the bar shows the tiles done while the next one is still held at the gate: the
    # widget's throttle shows its last update when the interval is over, not with the next
    assert held[0].late == 0
    bar = widget.progress.native
    done, total = bar.value(), bar.maximum()
    assert 3 <= done < total
    assert f"of {total} tiles" in widget.status.value
    assert "left" in widget.status.value
    assert widget.status.value.startswith("Segmenting nuclei")
    stages = [s for s, _, _ in seen]
    assert stages[:3] == ["starting", "tissue", "preparing"]
    assert "segmenting" in stages
    counts = [d for s, d, _ in seen if s == "segmenting" and d]
    assert counts == sorted(counts)
    assert counts[0] == 1
    # napari's activity entry follows the same run
    assert widget.session._run.pbar.total == total
    widget.cancel_button.clicked.emit()
    gate.set()
    assert not widget.progress.visible
    out = widget.session.outcome
    assert out.state == "cancelled"
    assert 3 <= out.tiles_done < out.tiles_total == total
    assert widget.status.value == f"Cancelled: {out.tiles_done} of {total} tiles"
    qtbot.waitUntil(lambda: not widget.session.busy)


def test_partial_summary_equals_a_run_over_the_finished_tiles(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    gate = threading.Event()
    worker = _slow_run(widget, image, threshold_segmenter, gate=gate)
    qtbot.waitUntil(lambda: widget.progress.value >= 4, timeout=60_000)
    widget.cancel()
    gate.set()
    qtbot.waitUntil(lambda: not worker.is_running, timeout=30_000)  # a hang guard only
    out = ctl.outcome
    partial = ctl.summary(image)
    assert partial.partial
    assert partial.tiles_done == out.tiles_done < partial.tiles_total
    assert widget.summary.value == str(partial)
    assert widget.summary.value.startswith("Partial (")
    layer = viewer.layers[f"{image.name} nuclei"]
    cores = list(canvas_of(layer).regions)
    assert len(cores) == out.tiles_done  # the density's area: finished tiles only
    count_partial = partial.count
    assert count_partial == canvas_of(layer).table()["id"].size > 0

    # the complete run, restricted to the same tiles, gives the same numbers
    _slow_run(widget, image, threshold_segmenter, delay=0.0)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=30_000)
    full = ctl.summary(image)
    assert not full.partial
    assert full.count > count_partial
    table = canvas_of(layer).table()
    rows, cols = table["centroid_row"], table["centroid_col"]
    inside = np.zeros(rows.shape, bool)
    for y0, x0, y1, x1 in cores:
        inside |= (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
    assert int(inside.sum()) == count_partial
    area = session.tissue_area_um2(ctl.tissue_result(image), cores)
    assert partial.tissue_mm2 == pytest.approx(area / 1e6)
    assert partial.density_per_mm2 == pytest.approx(count_partial / (area / 1e6))
    assert partial.density_per_mm2 == pytest.approx(full.density_per_mm2, rel=0.5)


def test_replace_run_clears_the_previous_summary(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    widget.session.run(image, "nuclei", region=(0, 0, 256, 256), nuclei_run=seg)
    qtbot.waitUntil(lambda: not widget.session.busy, timeout=60_000)
    assert "nuclei" in widget.summary.value
    gate = threading.Event()  # the run stays in flight until the test lets it go
    _slow_run(widget, image, threshold_segmenter, gate=gate, free=0)
    assert widget.summary.value == "–"
    widget.cancel()
    gate.set()


def test_run_is_disabled_without_a_slide(make_napari_viewer, small_slide, qtbot):
    viewer = make_napari_viewer(show=True)
    widget = SlideAnalysisWidget(viewer)
    assert not widget.run_button.enabled
    assert widget.run_button.tooltip.startswith("Open a slide")
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    qtbot.wait(10)
    assert widget.image.value is image
    assert widget.run_button.enabled
    assert "Ctrl+Shift+R" in widget.run_button.tooltip
    viewer.layers.remove(image)
    assert widget.image.value is None
    assert not widget.run_button.enabled
    assert not widget.thumbnails.visible


def test_dock_width_stays_bounded_with_a_long_slide_name(make_napari_viewer, qtbot):
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1400, 900)
    name = "a-very-long-slide-name-without-spaces-" * 8 + ".svs"
    viewer.add_image(np.zeros((256, 256, 3), np.uint8), name=name, rgb=True)
    dock, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    widget.status.value = "Failed: " + "x" * 400  # a long unbreakable message too
    widget.summary.value = "word " * 200
    qtbot.wait(200)
    assert widget.image.value.name == name
    assert widget.native.width() <= MAX_WIDTH_PX
    assert dock.width() <= MAX_WIDTH_PX + 60  # the dock's frame and scroll bar
    assert viewer.window._qt_viewer.canvas.native.width() >= 500  # was ~250 px


def test_parameters_show_for_the_chosen_task_only(dock_slide, small_slide, qtbot):
    viewer, [image], widget = dock_slide(small_slide)
    widget.task.value = "tissue"
    assert widget.tissue_params.visible
    assert not widget.nuclei_params.visible
    assert not widget.advanced.visible
    widget.show_advanced.value = True
    assert widget.tissue_advanced.visible
    assert not widget.nuclei_advanced.visible
    widget.task.value = "nuclei"
    assert widget.nuclei_params.visible
    assert widget.nuclei_advanced.visible
    assert not widget.tissue_params.visible
    assert not widget.tissue_advanced.visible


def test_settings_survive_closing_and_reopening_the_widget(make_napari_viewer, qtbot):
    viewer = make_napari_viewer(show=False)
    first = SlideAnalysisWidget(viewer)
    first.task.value = "tissue"
    first.scope.value = "slide"
    first.tile_size_um.value = 256.0
    first.tissue_mpp.value = 4.0
    first.max_area_um2.value = 250.0
    first.mode.value = "replace"
    first.close()
    del first
    second = SlideAnalysisWidget(viewer)
    got = second.settings()
    assert (got.task, got.scope, got.mode) == ("tissue", "slide", "replace")
    assert got.nuclei.tile_size_um == 256.0
    assert got.tissue.target_mpp == 4.0
    assert got.nuclei.segmenter_options["max_area_um2"] == 250.0
    second.restore_defaults.clicked.emit()
    _assert_defaults(second.settings())
    third = SlideAnalysisWidget(viewer)
    _assert_defaults(third.settings())


def test_defaults_come_from_the_options_model():
    """The widget's defaults are the options model's, and the built-in's documented range."""
    from napari_slidescope.analysis.brightfield_nuclei import NucleiParams
    from napari_slidescope.options import NucleiOptions, TissueOptions

    d = default_settings()
    assert d.tissue == TissueOptions()
    # nuclei: "auto" segmenter and resolution (segmenters.working_mpp decides on the slide)
    assert d.nuclei.segmenter == "auto"
    assert d.nuclei.target_mpp is None
    assert d.nuclei.replace(segmenter_options={}) == NucleiOptions()
    assert dict(d.nuclei.segmenter_options) == {
        "min_area_um2": NucleiParams().min_area_um2,
        "max_area_um2": NucleiParams().max_area_um2,
    }
    # the built-in's range reaches only the built-in segmenter
    assert dict(d.nuclei_run().options.segmenter_options) == {}
    builtin = dataclasses.replace(d, nuclei=d.nuclei.replace(segmenter="builtin"))
    assert builtin.nuclei_run().options.segmenter_options["min_area_um2"] == (
        NucleiParams().min_area_um2
    )


def test_defaults_are_the_documented_values():
    # nuclei: "auto" segmenter and resolution (segmenters.working_mpp decides on the slide)
    _assert_defaults(default_settings())


def test_shortcuts_start_and_cancel_a_run(
    dock_slide, small_slide, qtbot, threshold_segmenter, monkeypatch
):
    from qtpy.QtCore import Qt

    viewer, [image], widget = dock_slide(small_slide)
    widget.task.value = "nuclei"
    widget.scope.value = "slide"  # the shortcut runs on the current view whatever is chosen
    gate = threading.Event()  # the run stays in flight until the test lets it go
    seg = GatedSegmenter(threshold_segmenter(), 0, gate)
    nuclei = {"segmenter": seg, "target_mpp": 0.5, "workers": 1}
    monkeypatch.setattr(type(widget), "run_options", lambda self: {"nuclei_run": nuclei})
    canvas = viewer.window._qt_viewer.canvas.native
    viewer.reset_view()  # the whole slide in view: the run on the view has tissue tiles
    mods = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(canvas, Qt.Key.Key_R, mods)
    assert widget.session.busy
    assert widget.session._run.scope == "visible"
    assert widget.session._run.task == "nuclei"
    # the gate holds the run at its first tile
    qtbot.waitUntil(lambda: seg.held.is_set() or not widget.session.busy, timeout=60_000)
    assert seg.held.is_set(), widget.session.outcome
    qtbot.keyClick(canvas, Qt.Key.Key_X, mods)
    gate.set()
    assert not widget.session.busy
    assert widget.status.value.startswith("Cancelled"), widget.session.outcome
    assert widget.session.outcome.state == "cancelled"
    assert "Ctrl+Shift+X" in widget.cancel_button.tooltip


def test_label_and_macro_previews_open_as_layers(dock_slide, small_slide, qtbot):
    viewer, [image], widget = dock_slide(small_slide)
    rng = np.random.default_rng(0)
    images = {
        "label": rng.integers(0, 255, (600, 580, 3), np.uint8),
        "macro": rng.integers(0, 255, (700, 1800, 3), np.uint8),
    }
    widget._show_thumbnails(images)  # what the reading worker hands over
    assert widget.thumbnails.visible
    for key in ("label", "macro"):
        preview = getattr(widget, f"{key}_image")
        assert max(preview.value.shape[:2]) >= 100  # readable, not a 14 px icon
        layer = widget.open_associated(key)
        assert layer.name == f"{image.name} {key}"
        assert layer.data.shape == images[key].shape
    viewer.layers.remove(image)
    assert not widget.thumbnails.visible
    assert not widget._associated


def test_a_closed_dock_no_longer_follows_the_session(make_napari_viewer, qtbot):
    """The session and the viewer outlive a dock: once its widgets are gone, no slot of it runs."""
    viewer = make_napari_viewer(show=False)
    gone = SlideAnalysisWidget(viewer)
    kept = SlideAnalysisWidget(viewer)
    assert gone.session is kept.session
    destroyed = []
    gone.native.destroyed.connect(lambda *_: destroyed.append(1))
    gone.native.deleteLater()
    qtbot.waitUntil(lambda: destroyed == [1], timeout=10_000)
    ses = kept.session
    ses.started.emit("nuclei")  # would raise here (deleted Qt widgets) if still connected
    ses.progress.emit(session.Progress("nuclei", "segmenting", done=1, total=4))
    assert kept.progress.value == 1
    viewer.camera.zoom = viewer.camera.zoom * 2
    viewer.add_image(np.zeros((8, 8), np.uint8))
    ses.finished.emit(None)
