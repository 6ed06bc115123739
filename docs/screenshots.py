"""Make the README screenshots: the sample slide, the "Slide analysis" widget, results.

Run (Linux without a display: under ``xvfb-run -a``)::

    python docs/screenshots.py            # writes docs/images/*.png
    python docs/screenshots.py overview   # only overview.png
    python docs/screenshots.py wholeslide # only whole_slide_zoomed.png
    python docs/screenshots.py real       # only real_slide.png ($SLIDESCOPE_TESTDATA)
    python docs/screenshots.py regions    # only regions_dock.png

Opens the bundled synthetic slide in napari, docks the widget, detects tissue on the
whole slide, segments the nuclei of the visible region with the default parameters,
and saves the window (widget included) and a close-up of the nuclei. Then the widget
in its states: ``widget_idle.png``, ``widget_running.png`` (progress mid-run),
``widget_cancelled.png`` (a partial result) and ``measurements.png`` (the window with
the "Nuclei measurements" dock, a row selected) and ``overview.png`` (the window with
the "Slide overview" dock, zoomed in) and ``whole_slide_zoomed.png`` (nuclei of the whole
slide, a multiscale labels layer, seen at full resolution; on the real slide below when
it is at hand). With
``$SLIDESCOPE_TESTDATA`` set it does the same on the real 20x slide
``CMU-1-Small-Region.svs`` (CC0) and saves ``real_slide.png``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "images"
MAX_BYTES = 300_000


def _save(image: np.ndarray, path: Path, *, width: int, colors: int = 128) -> None:
    """Save an RGBA screenshot as a small palette PNG (under MAX_BYTES) of `colors` colours."""
    from PIL import Image

    img = Image.fromarray(np.asarray(image)[..., :3])
    for w in (width, int(width * 0.8), int(width * 0.64)):
        small = img.resize((w, round(img.height * w / img.width)), Image.Resampling.LANCZOS)
        small.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        if path.stat().st_size < MAX_BYTES:
            return


def _settle(seconds: float = 0.5) -> None:
    from qtpy.QtWidgets import QApplication

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.01)


def main() -> int:
    """Write the PNGs of ``docs/images`` (``real_slide.png`` when the test data is at hand)."""
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["overview"]:
        _overview_shot()
        return 0
    if sys.argv[1:] == ["wholeslide"]:
        _whole_slide_shot()
        return 0
    if sys.argv[1:] == ["real"]:
        _real_slide_shot()
        return 0
    if sys.argv[1:] == ["regions"]:
        _regions_shot()
        return 0
    viewer, camera = _analysed(None, center=(1000.0, 900.0), zoom=1.6)  # ~400 x 420 µm
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "slide_analysis.png", width=1200)
    camera.zoom = 6.0
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=True, flash=False), OUT / "nuclei_closeup.png", width=700)
    viewer.close()
    _widget_states()
    _overview_shot()
    _whole_slide_shot()
    _real_slide_shot()
    _regions_shot()
    return 0


def _real_slide_shot() -> None:
    """``real_slide.png``: the real 20x slide, with its label and macro previews."""
    real = Path(os.environ.get("SLIDESCOPE_TESTDATA", "/nonexistent")) / "CMU-1-Small-Region.svs"
    if real.is_file():  # a real 20x H&E slide (CC0)
        viewer, _ = _analysed(real, center=(725.0, 475.0), zoom=2.2)  # ~300 µm wide
        _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "real_slide.png", width=1200)
        viewer.close()


def _analysed(path: Path | None, *, center: tuple[float, float], zoom: float) -> tuple[Any, Any]:
    """Open `path` (None: the synthetic sample), find its tissue and the nuclei in view.

    The widget is docked; tissue is detected on the whole slide, then the camera moves to
    `center` (µm) and `zoom` and the nuclei of that view are segmented. Returns the viewer
    and its camera.
    """
    import napari

    from napari_slidescope._qt.launcher import dock_analysis_widget

    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    if path is None:
        [image] = viewer.open_sample("napari-slidescope", "synthetic_he")
    else:
        [image] = viewer.open(str(path), plugin="napari-slidescope")
    widget = dock_analysis_widget(viewer)
    _settle()
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera

    def run(task: str, scope: str) -> None:
        widget.task.value, widget.scope.value = task, scope
        widget.run()
        widget.session.wait()

    run("tissue", "slide")
    camera.center, camera.zoom = center, zoom
    _settle()
    run("nuclei", "visible")
    viewer.layers.selection.active = viewer.layers[f"{image.name} nuclei"]
    _settle(1.0)
    return viewer, camera


def _grab(widget: Any, path: Path) -> None:
    """Save a Qt widget as it is drawn on screen."""
    from PIL import Image

    tmp = path.with_suffix(".tmp.png")
    widget.grab().save(str(tmp))
    img = np.asarray(Image.open(tmp).convert("RGB"))
    tmp.unlink()
    _save(img, path, width=img.shape[1])


def _widget_states() -> None:
    """Save the widget idle, mid-run and after Cancel, and the window with the table dock."""
    import napari

    from napari_slidescope._qt.launcher import dock_analysis_widget, fit_view

    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    [image] = viewer.open_sample("napari-slidescope", "synthetic_he")
    widget = dock_analysis_widget(viewer)
    viewer.scale_bar.visible = True
    fit_view(viewer)
    _settle()
    _grab(widget.native, OUT / "widget_idle.png")

    ctl = widget.session
    widget.task.value, widget.scope.value = "nuclei", "slide"
    widget.tile_size_um.value = 128.0  # many small tiles: a run long enough to watch
    widget.run()
    end = time.monotonic() + 120
    while ctl.busy and time.monotonic() < end:
        _settle(0.2)
        prog = ctl.current_progress
        if prog is not None and prog.total and prog.done >= max(3, prog.total // 4):
            break
    _settle(0.3)
    _grab(widget.native, OUT / "widget_running.png")
    widget.cancel()
    _settle(0.5)
    _grab(widget.native, OUT / "widget_cancelled.png")

    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    camera.center, camera.zoom = (1000.0, 900.0), 1.6
    widget.scope.value, widget.mode.value = "visible", "replace"
    widget.tile_size_um.value = 512.0
    _settle()
    widget.run()
    ctl.wait()
    table = widget.open_table()
    _settle(0.5)
    table.view.selectRow(5)
    _settle(1.0)
    viewer.layers.selection.active = viewer.layers[f"{image.name} nuclei"]
    _settle(0.5)
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "measurements.png", width=1400)
    widget.reset_settings()  # leave the user's remembered settings as they were by default
    viewer.close()


def _overview_shot() -> None:
    """Save the window with the analysis and "Slide overview" docks, zoomed into the slide."""
    import napari

    from napari_slidescope._qt.launcher import dock_analysis_widget, dock_plugin_widget

    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    viewer.open_sample("napari-slidescope", "synthetic_he")
    dock_analysis_widget(viewer)
    overview = dock_plugin_widget(viewer, "Slide overview")
    overview.setMinimumHeight(320)  # room for the thumbnail under the analysis widget
    viewer.scale_bar.visible = True
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    camera.center, camera.zoom = (1100.0, 800.0), 1.2
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "overview.png", width=1200)
    viewer.close()


def _whole_slide_shot() -> None:
    """Save the nuclei of a whole-slide run seen at full resolution (screen px > slide px).

    The built-in segmenter runs over the whole slide (the real 20x slide
    ``CMU-1-Small-Region.svs`` when ``$SLIDESCOPE_TESTDATA`` has it, else the synthetic
    sample); the result is the multiscale labels layer of a whole-slide run, drawn as
    outlines, and the camera is centred where the nuclei are densest, zoomed to two
    screen pixels per level-0 pixel.
    """
    import napari

    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope._qt.launcher import dock_analysis_widget

    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    real = Path(os.environ.get("SLIDESCOPE_TESTDATA", "/nonexistent")) / "CMU-1-Small-Region.svs"
    if real.is_file():
        [image] = viewer.open(str(real), plugin="napari-slidescope")
    else:
        [image] = viewer.open_sample("napari-slidescope", "synthetic_he")
    widget = dock_analysis_widget(viewer)
    _settle()
    widget.task.value, widget.scope.value, widget.mode.value = "nuclei", "slide", "replace"
    widget.segmenter.value = "builtin"
    widget.run()
    widget.session.wait()
    layer = viewer.layers[f"{image.name} nuclei"]
    assert layer.multiscale, "a whole-slide run shows a multiscale labels layer"
    layer.contour = 1
    table = canvas_of(layer).table()
    rows, cols = np.asarray(table["centroid_row"]), np.asarray(table["centroid_col"])
    h, w = image.data[0].shape[:2]
    counts, ey, ex = np.histogram2d(rows, cols, bins=(max(1, h // 256), max(1, w // 256)))
    iy, ix = np.unravel_index(int(np.argmax(counts)), counts.shape)
    center = ((ey[iy] + ey[iy + 1]) / 2, (ex[ix] + ex[ix + 1]) / 2)  # the densest cell
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    camera.center = tuple(image.data_to_world(list(center)))
    camera.zoom = 2.0 / float(image.scale[-1])  # two screen px per level-0 px
    viewer.scale_bar.visible = True
    viewer.layers.selection.active = layer
    _settle(2.0)
    assert layer.data_level == 0 and image.data_level == 0, "not at full resolution"
    path = OUT / "whole_slide_zoomed.png"
    _save(viewer.screenshot(canvas_only=False, flash=False), path, width=1200)
    print(f"{path}: {len(rows):,} nuclei on the whole slide")  # noqa: T201 - a script
    widget.reset_settings()
    viewer.close()


def _regions_shot() -> None:
    """Save the "Tissue regions" dock after a whole-slide run on a synthetic region slide.

    Five short strokes per class (from the slide's truth) are the examples; the class map
    of the whole slide lies over the slide at half opacity, the table lists area and % per
    class.
    """
    import tempfile

    import napari

    from napari_slidescope import write_region_slide

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "regions.svs"
        truth = write_region_slide(path, shape=(2048, 2048), region_um=200.0, seed=3)
        viewer = napari.Viewer(title="napari-slidescope")
        viewer.window._qt_window.resize(1500, 950)
        viewer.open(str(path), plugin="napari-slidescope")
        _, dock = viewer.window.add_plugin_dock_widget("napari-slidescope", "Tissue regions")
        dock.live.setChecked(False)
        dock.add_examples(truth.example_lines(per_class=5))
        dock.run_on_slide()
        while dock.busy:
            _settle(0.2)
        viewer.reset_view()
        viewer.scale_bar.visible = True
        _settle(1.0)
        path_png = OUT / "regions_dock.png"
        # 256 colours: with 128 the small class swatches lose their hue
        _save(viewer.screenshot(canvas_only=False, flash=False), path_png, width=1300, colors=256)
        print(f"{path_png}: {dock.status.text()}")  # noqa: T201 - a script
        viewer.close()


if __name__ == "__main__":
    sys.exit(main())
