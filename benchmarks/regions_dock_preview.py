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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
