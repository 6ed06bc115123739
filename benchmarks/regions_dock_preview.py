"""Live preview of the "Tissue regions" dock: time per update, and the dock's overhead.

A synthetic region slide (1 mm square at 0.5 µm/px, :func:`napari_slidescope.write_region_slide`)
is opened in napari (offscreen: run under ``xvfb-run -a``) and the dock is given five strokes
per class. Then, interleaved, N times each:

- "pan": the view moves (the whole ~1 mm slide stays in view); the dock classifies the view
  on its worker thread; the time is from the camera move to the preview layer's update
  (debounce excluded: the dock's own ``preview()`` is called directly);
- "stroke": one stroke is added; the dock retrains and classifies;
- the baseline: ``classify_regions`` on the same box with the same classifier (tissue-gated,
  as the dock with "Tissue only" on), called
  directly on the main thread (no Qt, no layer).

Medians of the N runs and the ratio to the baseline; the 1 s target is for an update.

    xvfb-run -a python benchmarks/regions_dock_preview.py [--runs 7]

With ``--slide SLIDE.svs`` (a synthetic region slide with ``SLIDE.truth.npz`` beside it,
``benchmarks/regions_data.py``, e.g. 24000 x 30000) the view is a full screen instead: the
camera is zoomed so that about ``--view-px`` working pixels a side are in view (the dock
classifies at most 1024 a side), five strokes per class are drawn in it, and each run
times through the dock, in order: a quarter-screen pan to a part of the slide not seen
yet, a 2x zoom in, the 2x zoom out back, and one stroke more in the view (retrain +
classify); the baseline is ``train_region_classifier`` + ``classify_regions`` of the
same view, called directly (what the dock did before its tile caches).

    xvfb-run -a python benchmarks/regions_dock_preview.py --slide SLIDE.svs [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _wait(dock: object, app: object) -> None:
    while dock.busy:  # type: ignore[attr-defined]
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--slide", help="a large synthetic region slide: full-screen views")
    parser.add_argument("--view-px", type=int, default=1024)
    args = parser.parse_args()
    if args.slide:
        full_screen(args)
        return
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_slidescope import classify_regions, write_region_slide

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "regions.svs"
        truth = write_region_slide(path, shape=(2048, 2048), region_um=200.0, seed=3)
        viewer = napari.Viewer(show=True)
        viewer.window._qt_window.resize(1400, 900)
        [image] = viewer.open(str(path), plugin="napari-slidescope")
        _, dock = viewer.window.add_plugin_dock_widget("napari-slidescope", "Tissue regions")
        app = QApplication.instance()
        dock.live.setChecked(False)
        lines = truth.example_lines(per_class=5)
        extra = truth.example_lines(per_class=args.runs + 1, seed=1)
        dock.add_examples(lines)
        viewer.reset_view()
        dock.preview()
        _wait(dock, app)
        camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
        pan, stroke, direct = [], [], []
        box = None
        for k in range(args.runs):
            camera.center = tuple(np.asarray(camera.center) + (1.0 if k % 2 else -1.0))
            t0 = time.perf_counter()
            dock.preview()
            _wait(dock, app)
            pan.append(time.perf_counter() - t0)
            box = dock.preview_regions.region
            t0 = time.perf_counter()
            classify_regions(str(path), dock.classifier, region=box)  # tissue-gated, as the dock
            direct.append(time.perf_counter() - t0)
            dock.add_examples({"Tumor": [extra["Tumor"][k]]})
            dock._timer.stop()
            t0 = time.perf_counter()
            dock.preview()
            _wait(dock, app)
            stroke.append(time.perf_counter() - t0)
        h, w = dock.preview_regions.labels.shape
        mpp = dock.preview_regions.mpp
        viewer.close()
    base = statistics.median(direct)
    print(f"load average: {os.getloadavg()}")
    print(f"view: level-0 box {box}, {h} x {w} working px at {mpp:.2f} µm/px")
    print(f"{'update':<34}{'median s':>10}{'min s':>8}{'max s':>8}{'x direct':>10}")
    for name, times in (
        ("pan (classify the view)", pan),
        ("stroke (retrain + classify)", stroke),
        ("direct classify_regions (baseline)", direct),
    ):
        med = statistics.median(times)
        print(f"{name:<34}{med:>10.3f}{min(times):>8.3f}{max(times):>8.3f}{med / base:>10.2f}")


def full_screen(args: argparse.Namespace) -> None:
    """Pan, zoom and stroke updates of a full-screen view through the dock (see the top)."""
    import sys

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_slidescope import classify_regions, open_slide, train_region_classifier

    sys.path.insert(0, str(Path(__file__).parent))
    from regions_data import load_truth
    from regions_preview_cache import _strokes_in

    truth = load_truth(args.slide)
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1400, 900)
    [image] = viewer.open(args.slide, plugin="napari-slidescope")
    _, dock = viewer.window.add_plugin_dock_widget("napari-slidescope", "Tissue regions")
    app = QApplication.instance()
    dock.live.setChecked(False)
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    viewer.reset_view()
    mpp0 = float(np.mean(np.asarray(image.scale, float)[-2:]))  # world units per level-0 px
    from napari_slidescope._napari.viewport import visible_region

    def view_px() -> int:
        y0, x0, y1, x1 = visible_region(viewer, image)
        return min(y1 - y0, x1 - x0)

    # zoom so that the shorter side of the view is about `want` level-0 px (+5 %)
    slide = open_slide(args.slide)  # the baseline's, kept open as the dock keeps its own
    want = args.view_px * dock.mpp_box.value() / float(slide.mpp[0]) * 1.05
    for _ in range(3):  # the canvas settles after a zoom: adjust again
        camera.zoom = camera.zoom * view_px() / want
        app.processEvents()
    h0, w0 = image.data[0].shape[:2] if image.multiscale else image.data.shape[:2]
    start = np.array([h0 * 0.3, w0 * 0.2])
    camera.center = tuple(start * mpp0)
    y0, x0, y1, x1 = visible_region(viewer, image)
    dock.add_examples(_strokes_in(truth, (y0, x0, y1, x1), 5, seed=0))
    dock._timer.stop()
    dock.preview()
    _wait(dock, app)
    times: dict[str, list[float]] = {}
    direct: dict[str, list[float]] = {"classify (pan)": [], "train + classify (stroke)": []}

    def update(name: str) -> None:
        dock._timer.stop()
        t0 = time.perf_counter()
        dock.preview()
        _wait(dock, app)
        times.setdefault(name, []).append(time.perf_counter() - t0)
        if os.environ.get("VERBOSE"):
            print(name, round(times[name][-1], 3), dock.status.text())

    step = (x1 - x0) / 4 * mpp0
    box = None
    for k in range(args.runs):
        camera.center = (camera.center[-2], camera.center[-1] + step)  # new ground
        update("pan (quarter screen, new ground)")
        box = dock.preview_regions.region
        t0 = time.perf_counter()
        classify_regions(slide, dock.classifier, region=box)
        direct["classify (pan)"].append(time.perf_counter() - t0)
        camera.zoom = camera.zoom * 2
        update("zoom in 2x")
        camera.zoom = camera.zoom / 2
        update("zoom out 2x")
        more = _strokes_in(truth, box, 1, seed=100 + k)
        name = list(more)[k % len(more)]
        dock.add_examples({name: [more[name][0]]})
        update("stroke (retrain + classify)")
        t0 = time.perf_counter()
        clf = train_region_classifier(slide, dock.examples(), mpp=dock.mpp_box.value())
        classify_regions(slide, clf, region=box)
        direct["train + classify (stroke)"].append(time.perf_counter() - t0)
    h, w = dock.preview_regions.labels.shape
    mpp = dock.preview_regions.mpp
    viewer.close()
    slide.close()
    print(f"load average: {os.getloadavg()}")
    print(f"slide {Path(args.slide).name}; last view: level-0 box {box}, {h} x {w} working px")
    print(f"at {mpp:.2f} µm/px; {args.runs} runs")
    print(f"{'update through the dock':<36}{'median s':>10}{'min s':>8}{'max s':>8}")
    for name, ts in [*times.items(), *(("direct " + k, v) for k, v in direct.items())]:
        print(f"{name:<36}{statistics.median(ts):>10.3f}{min(ts):>8.3f}{max(ts):>8.3f}")


if __name__ == "__main__":
    main()
