"""Make the README screenshots: the sample slide, the "Slide analysis" widget, results.

Run (Linux without a display: under ``xvfb-run -a``)::

    python docs/screenshots.py            # writes docs/images/*.png

Opens the bundled synthetic slide in napari, docks the widget, detects tissue on the
whole slide, segments the nuclei of the visible region with the default parameters,
and saves the window (widget included) and a close-up of the nuclei. With
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


def _save(image: np.ndarray, path: Path, *, width: int) -> None:
    """Save an RGBA screenshot as a small palette PNG (under MAX_BYTES)."""
    from PIL import Image

    img = Image.fromarray(np.asarray(image)[..., :3])
    for w in (width, int(width * 0.8), int(width * 0.64)):
        small = img.resize((w, round(img.height * w / img.width)), Image.Resampling.LANCZOS)
        small.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
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
    viewer, camera = _analysed(None, center=(1000.0, 900.0), zoom=1.6)  # ~400 x 420 µm
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "slide_analysis.png", width=1200)
    camera.zoom = 6.0
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=True, flash=False), OUT / "nuclei_closeup.png", width=700)
    viewer.close()
    real = Path(os.environ.get("SLIDESCOPE_TESTDATA", "/nonexistent")) / "CMU-1-Small-Region.svs"
    if real.is_file():  # a real 20x H&E slide (CC0)
        viewer, _ = _analysed(real, center=(725.0, 475.0), zoom=2.2)  # ~300 µm wide
        _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "real_slide.png", width=1200)
        viewer.close()
    return 0


def _analysed(path: Path | None, *, center: tuple[float, float], zoom: float) -> tuple[Any, Any]:
    """Open `path` (None: the synthetic sample), find its tissue and the nuclei in view.

    The widget is docked; tissue is detected on the whole slide, then the camera moves to
    `center` (µm) and `zoom` and the nuclei of that view are segmented. Returns the viewer
    and its camera.
    """
    import napari
    from napari_slidescope._napari.launcher import dock_analysis_widget

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
        widget.controller.wait()

    run("tissue", "slide")
    camera.center, camera.zoom = center, zoom
    _settle()
    run("nuclei", "visible")
    viewer.layers.selection.active = viewer.layers[f"{image.name} nuclei"]
    _settle(1.0)
    return viewer, camera


if __name__ == "__main__":
    sys.exit(main())
