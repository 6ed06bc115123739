"""The "Slide analysis" dock widget in a real viewer (run under xvfb-run)."""

import ctypes
import gc
import json
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from tests.fakes import GatedSegmenter

from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._napari.viewport import box_to_world, camera_of, visible_region

pytestmark = pytest.mark.gui


def _wait_ready(qtbot, widget, timeout=60_000):
    qtbot.waitUntil(lambda: not widget.session.busy, timeout=timeout)


def test_widget_describes_the_slide_and_uses_function_defaults(dock_slide, sample_slide, qtbot):
    from napari_slidescope.analysis.brightfield_nuclei import NucleiParams

    viewer, [image], widget = dock_slide(sample_slide[0])
    assert widget.image.value is image
    assert "svs" in widget.info.value
    assert "0.5 µm/px" in widget.info.value
    assert "20×" in widget.info.value
    # "auto" (0): the resolution rule decides, with the slide's own pixel size
    assert widget.nuclei_mpp.value == 0
    assert widget.nuclei_mpp.native.text() == "auto"
    assert widget.run_options()["nuclei_run"].options.target_mpp is None
    assert NucleiParams().target_mpp < 0.5
    assert "0.5 µm/px" in widget.nuclei_mpp.tooltip
    assert widget.tissue_mpp.value == 8.0  # detect_tissue's documented 8 µm/px (1.25x)
    assert not widget.advanced.visible
    widget.show_advanced.value = True
    assert widget.advanced.visible
    assert widget.status.value == "Ready"
    assert not widget.cancel_button.enabled
    assert widget.run_button.enabled


def test_choosing_a_segmenter_shows_its_working_resolution(
    dock_slide, sample_slide, qtbot, monkeypatch
):
    from napari_slidescope.segmenters import registry

    monkeypatch.setitem(
        registry._REGISTRY, "coarse-model", registry.SegmenterEntry("", "brightfield", 1.0)
    )
    monkeypatch.setattr(registry, "missing_reason", lambda name: None)
    viewer, [image], widget = dock_slide(sample_slide[0])
    widget.restore_defaults.clicked.emit()  # not what an earlier test left in the settings
    assert widget.segmenter.value == "auto"
    assert "coarse-model" in [c for c in widget.segmenter.choices]
    widget.segmenter.value = "coarse-model"
    assert widget.nuclei_mpp.value == 0
    assert "auto: 1 µm/px" in widget.nuclei_mpp.tooltip
    assert widget.run_options()["nuclei_run"].options.target_mpp is None  # the rule decides
    widget.segmenter.value = "builtin"
    assert "auto: 0.5 µm/px" in widget.nuclei_mpp.tooltip  # the slide's 0.5, not 0.25
    widget.nuclei_mpp.value = 0.3  # the user asks: that wins
    assert widget.run_options()["nuclei_run"].options.target_mpp == 0.3


def test_widget_runs_on_a_multichannel_slide(make_napari_viewer, shared_file, qtbot):
    """The QPTIFF opens as one layer per channel: the widget takes it, DAPI is the default."""
    viewer = make_napari_viewer(show=True)
    layers = viewer.open(str(shared_file("small_vectra.qptiff")), plugin="napari-slidescope")
    assert len(layers) == 3
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    qtbot.wait(10)
    assert widget.image.value is not None
    assert widget.why_not_runnable() is None
    assert list(widget.channel.choices) == ["auto", "DAPI", "FITC", "Cy3"]
    widget.segmenter.value = "builtin-fluorescence"
    widget.channel.value = "DAPI"
    opts = widget.run_options()
    assert opts["nuclei_run"].options.channel == "DAPI"
    widget.session.run(widget.image.value, "nuclei", region=(300, 300, 600, 600), **opts)
    _wait_ready(qtbot, widget, timeout=60_000)
    nuclei = viewer.layers[f"{widget.image.value.name} nuclei"]
    assert nuclei.features.shape[0] > 5
    assert {"DAPI_mean", "FITC_mean", "Cy3_mean"} <= set(nuclei.features.columns)


def test_nuclei_on_visible_region_fill_exactly_that_region(dock_slide, sample_slide, qtbot):
    path, truth = sample_slide
    viewer, [image], widget = dock_slide(path)
    cy, cx = truth.nuclei[0][:2] * 0.5  # a nucleus, in µm
    camera_of(viewer).center = (cy, cx)
    camera_of(viewer).zoom = 2.0
    qtbot.wait(30)
    region = visible_region(viewer, image)
    widget.segmenter.value = "builtin"  # "auto" runs InstanSeg where it is installed
    widget.nuclei_mpp.value = 0.5
    assert widget.run() is not None
    assert widget.cancel_button.enabled
    _wait_ready(qtbot, widget)
    layer = viewer.layers[f"{image.name} nuclei"]
    # the layer covers exactly the visible region, in world coordinates
    y0, x0 = np.asarray(layer.translate) - np.asarray(layer.scale) / 2
    y1, x1 = np.array([y0, x0]) + np.asarray(layer.scale) * layer.data.shape
    np.testing.assert_allclose(
        (y0, x0, y1, x1), box_to_world(region, scale=image.scale, translate=image.translate)
    )
    count = int(layer.features.shape[0])
    assert count >= 1
    assert len(np.unique(layer.data)) - 1 == count
    assert "area_um2" in layer.features.columns
    assert widget.summary.value.startswith(f"{count} nuclei")
    assert "/mm² of tissue" in widget.summary.value
    assert widget.status.value.startswith("Done")
    assert not widget.cancel_button.enabled


def test_instanseg_from_the_widget_on_the_visible_region(dock_slide, sample_slide, qtbot):
    from napari_slidescope.segmenters import missing_reason

    reason = missing_reason("instanseg")
    if reason is not None:
        pytest.skip(f"InstanSeg not installed here: {reason}")
    path, truth = sample_slide
    viewer, [image], widget = dock_slide(path)
    camera_of(viewer).center = tuple(truth.nuclei[0][:2] * 0.5)  # a nucleus, in µm
    camera_of(viewer).zoom = 2.0
    qtbot.wait(30)
    widget.segmenter.value = "instanseg"
    assert "auto: 0.5 µm/px" in widget.nuclei_mpp.tooltip  # the model's training resolution
    assert widget.run() is not None
    _wait_ready(qtbot, widget, timeout=120_000)
    assert widget.status.value.startswith("Done"), widget.status.value
    layer = viewer.layers[f"{image.name} nuclei"]
    np.testing.assert_allclose(layer.scale, (0.5, 0.5))  # µm per label pixel, as the image
    count = int(layer.features.shape[0])
    assert count >= 1
    assert len(np.unique(layer.data)) - 1 == count
    assert widget.summary.value.startswith(f"{count} nuclei")


def test_add_mode_skips_nuclei_already_found_and_replace_starts_afresh(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    a, b = (0, 0, 512, 768), (256, 384, 768, 1152)  # overlapping regions
    ctl.run(image, "nuclei", region=a, nuclei_run=seg)
    _wait_ready(qtbot, widget)
    layer = viewer.layers[f"{image.name} nuclei"]
    n_a = canvas_of(layer).table()["id"].size
    ctl.run(image, "nuclei", region=a, nuclei_run=seg)  # the same region again: nothing new
    _wait_ready(qtbot, widget)
    assert canvas_of(layer).table()["id"].size == n_a
    ctl.run(image, "nuclei", region=b, nuclei_run=seg)
    _wait_ready(qtbot, widget)
    table = canvas_of(layer).table()
    ids = table["id"]
    assert len(np.unique(ids)) == ids.size > n_a
    assert set(np.unique(layer.data)) - {0} == set(ids.tolist())
    cents = np.stack([table["centroid_row"], table["centroid_col"]], 1)
    d = np.linalg.norm(cents[:, None] - cents[None], axis=-1) + np.eye(len(cents)) * 1e9
    assert d.min() > 2.0  # no nucleus twice
    ctl.run(image, "nuclei", region=b, mode="replace", nuclei_run=seg)
    _wait_ready(qtbot, widget)
    assert layer.data.shape == (512, 768)
    assert canvas_of(layer).table()["id"].size < ids.size


def test_cancel_mid_run_keeps_finished_tiles_then_run_again(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    seg = GatedSegmenter(threshold_segmenter(), free=2)  # the third tile waits at the gate
    slow = {"segmenter": seg, "tile_size_um": 64.0, "workers": 1}
    worker = ctl.run(image, "nuclei", scope="slide", nuclei_run=slow)
    run = ctl._run
    qtbot.waitUntil(lambda: run.pbar.n >= 2 and seg.held.is_set(), timeout=60_000)
    total = run.pbar.total
    assert total > 2  # the whole slide in 64 µm tiles: many more than are let through
    widget.cancel_button.clicked.emit()
    assert not ctl.busy
    assert not widget.cancel_button.enabled
    assert widget.status.value.startswith("Cancelled: "), widget.status.value
    seg.gate.set()  # the tile in flight finishes, no more start
    qtbot.waitUntil(lambda: not worker.is_running, timeout=30_000)  # a hang guard only
    assert run.pbar.n < total
    assert seg.seen < total  # the tiles after the cancel were never predicted
    layer = viewer.layers[f"{image.name} nuclei"]
    assert layer.multiscale  # finished tiles stay on screen
    assert np.asarray(layer.data[0]).any()
    # the widget is ready for another run
    fast = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    ctl.run(image, "nuclei", region=(0, 0, 256, 256), mode="replace", nuclei_run=fast)
    _wait_ready(qtbot, widget)
    layer = viewer.layers[f"{image.name} nuclei"]  # a small region: a dense layer again
    assert not layer.multiscale
    assert layer.data.shape == (256, 256)


def test_a_new_run_cancels_the_one_in_flight(dock_slide, small_slide, qtbot, threshold_segmenter):
    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    seg = GatedSegmenter(threshold_segmenter(), free=1)  # held in flight after one tile
    slow = {"segmenter": seg, "tile_size_um": 64.0, "workers": 1}
    first = ctl.run(image, "nuclei", scope="slide", nuclei_run=slow)
    qtbot.waitUntil(lambda: ctl._run.pbar.n >= 1 and seg.held.is_set(), timeout=60_000)
    ctl.run(image, "tissue", scope="slide")
    seg.gate.set()
    qtbot.waitUntil(lambda: not first.is_running, timeout=30_000)  # a hang guard only
    _wait_ready(qtbot, widget)
    assert f"{image.name} tissue" in viewer.layers


def test_error_in_worker_notifies_and_leaves_widget_ready(
    dock_slide, small_slide, qtbot, monkeypatch
):
    from napari.utils.notifications import notification_manager

    from napari_slidescope.pipeline import nuclei

    def boom(*args, **kwargs):
        raise OSError("disk on fire")
        yield  # pragma: no cover

    viewer, [image], widget = dock_slide(small_slide)
    monkeypatch.setattr(nuclei, "iter_segment_nuclei", boom)
    seen = []
    notification_manager.notification_ready.connect(seen.append)
    try:
        widget.run()
        _wait_ready(qtbot, widget)
        qtbot.waitUntil(lambda: any("disk on fire" in str(n.message) for n in seen), timeout=5_000)
    finally:
        notification_manager.notification_ready.disconnect(seen.append)
    assert widget.status.value.startswith("Failed")
    assert "disk on fire" in widget.status.value
    assert not widget.cancel_button.enabled
    monkeypatch.undo()
    widget.task.value = "tissue"
    assert widget.run() is not None
    _wait_ready(qtbot, widget)
    assert widget.status.value == "Done"
    assert widget.summary.value.startswith("Tissue ")
    assert "mm²" in widget.summary.value


def test_export_buttons_write_geojson_and_csv(
    dock_slide, small_slide, qtbot, tmp_path, threshold_segmenter
):
    viewer, [image], widget = dock_slide(small_slide)
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
    widget.session.run(image, "nuclei", scope="slide", nuclei_run=seg)
    _wait_ready(qtbot, widget)
    widget.export_dir.value = tmp_path
    widget.export_tissue.clicked.emit()
    qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
    widget.session.run(image, "tissue", scope="slide")
    _wait_ready(qtbot, widget)
    buttons = (widget.export_tissue, widget.export_nuclei, widget.export_csv, widget.export_parquet)
    for button in buttons:  # each written in the background, one at a time
        button.clicked.emit()
        qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
        assert widget.export_status.value.startswith("Wrote "), widget.export_status.value
    count = viewer.layers[f"{image.name} nuclei"].features.shape[0]
    doc = json.loads((tmp_path / "small_nuclei.geojson").read_text())
    assert len(doc["features"]) == count > 0
    assert (tmp_path / "small_nuclei.csv").read_text().count("\n") == count + 1
    assert json.loads((tmp_path / "small_tissue.geojson").read_text())["features"]
    pq = pytest.importorskip("pyarrow.parquet")
    assert pq.read_table(tmp_path / "small_nuclei.parquet").num_rows == count


def test_tile_work_runs_off_the_main_thread_while_the_event_loop_turns(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    """What keeps the GUI responsive: no segmenter stage runs on the main thread, and Qt
    keeps serving timer events while tiles are worked on. (The latency figures themselves
    are measured by ``benchmarks/gui_latency.py``, not asserted here.)"""
    from qtpy.QtCore import QTimer

    main = threading.get_ident()
    stage_threads: set[int] = set()
    ticks = [0]
    ticks_at_tile: list[int] = []

    class Recording(threshold_segmenter):
        def predict(self, tiles, *, mpp):
            stage_threads.add(threading.get_ident())
            return super().predict(tiles, mpp=mpp)

        def postprocess(self, raw, *, mpp):
            stage_threads.add(threading.get_ident())
            ticks_at_tile.append(ticks[0])
            time.sleep(0.03)  # each tile takes a while, as a real one does
            return super().postprocess(raw, mpp=mpp)

    viewer, [image], widget = dock_slide(small_slide)
    options = {"segmenter": Recording(), "target_mpp": 0.5, "tile_size_um": 128.0, "workers": 1}

    def whole_slide_run():
        ticks_at_tile.clear()
        widget.session.run(image, "nuclei", scope="slide", mode="replace", nuclei_run=options)
        _wait_ready(qtbot, widget, timeout=60_000)

    whole_slide_run()  # creating the result layers is napari's one-off work on the main thread
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.__setitem__(0, ticks[0] + 1))
    timer.start()
    whole_slide_run()  # a second run replaces its results in the existing layers
    timer.stop()
    assert viewer.layers[f"{image.name} nuclei"].features.shape[0] > 0
    assert len(ticks_at_tile) >= 4
    assert main not in stage_threads
    # the event loop turned between the first tile and the last: a blocked main thread
    # would deliver no timer events until the run had finished
    assert ticks_at_tile[-1] > ticks_at_tile[0]


#: Peak RSS growth allowed during a whole-slide run: the 6 MiB label canvas plus tiles in
#: flight (each under 1 MiB here), the texture copies napari keeps, and allocator slack.
RUN_BOUND_MB = 150
#: Growth allowed after the result layers are deleted, and across five runs in a row.
AFTER_BOUND_MB = 40


def test_memory_is_bounded_and_returns_after_runs(
    dock_slide, small_slide, qtbot, threshold_segmenter
):
    from qtpy.QtCore import QTimer

    proc = psutil.Process()

    def rss():
        if sys.platform.startswith("linux"):  # hand freed heap back, so RSS shows what is held
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        return proc.memory_info().rss

    viewer, [image], widget = dock_slide(small_slide)
    ctl = widget.session
    seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "tile_size_um": 128.0}

    def one_run():
        peak = [rss()]
        timer = QTimer()
        timer.setInterval(20)
        timer.timeout.connect(lambda: peak.append(proc.memory_info().rss))
        timer.start()
        ctl.run(image, "nuclei", scope="slide", mode="replace", nuclei_run=seg)
        _wait_ready(qtbot, widget, timeout=30_000)
        timer.stop()
        qtbot.wait(50)
        gc.collect()
        return max(peak), rss()

    one_run()  # warm-up: imports, thread pools, GL textures
    # Only the nuclei layer: deleting every layer drawn above the slide crashes xvfb's
    # software GL (Mesa 22.3) on the second repaint, in plain napari too (vispy/napari GL
    # program deletion, not this plugin); test_layers.py deletes both, viewer hidden.
    viewer.layers.remove(f"{image.name} nuclei")
    gc.collect()
    start = rss()
    results = [one_run() for _ in range(5)]
    peaks = [(p - start) / 2**20 for p, _ in results]
    ends = [(e - start) / 2**20 for _, e in results]
    viewer.layers.remove(f"{image.name} nuclei")
    gc.collect()
    qtbot.wait(50)
    after = (rss() - start) / 2**20
    print(
        f"\nRSS vs start (MiB): peaks {np.round(peaks, 1)}, ends {np.round(ends, 1)}, "
        f"after deleting the layer {after:.1f}"
    )
    assert max(peaks) < RUN_BOUND_MB
    assert ends[-1] - ends[0] < AFTER_BOUND_MB  # five runs do not grow it
    assert after < AFTER_BOUND_MB


def test_the_widget_says_which_model_runs_and_which_are_installed(
    dock_slide, small_slide, qtbot, monkeypatch
):
    from napari_slidescope.segmenters import registry

    real = registry.missing_reason
    viewer, [image], widget = dock_slide(small_slide)
    # as on a machine without the InstanSeg models
    monkeypatch.setattr(
        registry,
        "missing_reason",
        lambda name: "not here" if name.startswith("instanseg") else real(name),
    )
    widget.task.value = "nuclei"
    widget.segmenter.value = "builtin"
    widget.segmenter.value = "auto"
    text = widget.models.value
    assert text.startswith("auto runs builtin on this brightfield slide")
    assert "instanseg is not installed" in text
    assert "installed: builtin" in text
    assert widget.models.visible
    # and with them installed
    monkeypatch.setattr(
        registry,
        "missing_reason",
        lambda name: None if name.startswith("instanseg") else real(name),
    )
    widget.segmenter.value = "builtin"
    assert widget.models.value.startswith("builtin on this brightfield slide")
    widget.segmenter.value = "auto"
    assert widget.models.value.startswith("auto runs instanseg on this brightfield slide")
    assert "instanseg" in widget.models.value.split("installed:")[1]
