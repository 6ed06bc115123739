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
    """Write ``docs/images/slide_analysis.png`` and ``docs/images/nuclei_closeup.png``."""
    import napari
    from napari_slidescope._napari.launcher import dock_analysis_widget

    OUT.mkdir(parents=True, exist_ok=True)
    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    [image] = viewer.open_sample("napari-slidescope", "synthetic_he")
    widget = dock_analysis_widget(viewer)
    _settle()
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    widget.task.value, widget.scope.value = "tissue", "slide"
    widget.run()
    widget.controller.wait()
    camera.center, camera.zoom = (1000.0, 900.0), 1.6  # µm; ~400 x 420 µm on screen
    _settle()
    widget.task.value, widget.scope.value = "nuclei", "visible"
    widget.run()
    widget.controller.wait()
    viewer.layers.selection.active = viewer.layers[f"{image.name} nuclei"]
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "slide_analysis.png", width=1200)
    camera.zoom = 6.0
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=True, flash=False), OUT / "nuclei_closeup.png", width=700)
    viewer.close()
    real = Path(os.environ.get("SLIDESCOPE_TESTDATA", "/nonexistent")) / "CMU-1-Small-Region.svs"
    if real.is_file():
        _real_slide(real)
    return 0


def _real_slide(path: Path) -> None:
    """Tissue on the whole slide and nuclei of a zoomed-in view of a real 20x H&E slide."""
    import napari
    from napari_slidescope._napari.launcher import dock_analysis_widget

    viewer = napari.Viewer(title="napari-slidescope")
    viewer.window._qt_window.resize(1500, 900)
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    widget = dock_analysis_widget(viewer)
    _settle()
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    widget.task.value, widget.scope.value = "tissue", "slide"
    widget.run()
    widget.controller.wait()
    camera.center, camera.zoom = (725.0, 475.0), 2.2  # µm; a ~300 µm wide view
    _settle()
    widget.task.value, widget.scope.value = "nuclei", "visible"
    widget.run()
    widget.controller.wait()
    viewer.layers.selection.active = viewer.layers[f"{image.name} nuclei"]
    _settle(1.0)
    _save(viewer.screenshot(canvas_only=False, flash=False), OUT / "real_slide.png", width=1200)
    viewer.close()


if __name__ == "__main__":
    sys.exit(main())
