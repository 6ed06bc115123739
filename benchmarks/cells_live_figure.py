"""The screenshot of cells drawn live by the "Slide analysis" dock (docs/guide/cells.md).

The shared test slide CMU-1-Small-Region.svs (a real H&E crop, 0.5 µm/px, from
``$SLIDESCOPE_TESTDATA``; ``--slide`` takes another) is opened in napari, the dock's
task is "Segment nuclei" on the visible region with the built-in segmenter and "Cell
expansion" 3 µm, and the run is started from the dock as a user would. The nuclei layer
and the ``"<slide> cells"`` layer (outlines, same ids) are painted tile by tile; once the
run is done the nuclei are switched to filled (one click in their layer controls) and the
screenshot is taken. There is no ground truth: the figure is for
the eye (the tests compare the cells with ``segment_nuclei(cell_expansion_um=3)``).

Usage (needs a display: ``xvfb-run -a``)::

    python benchmarks/cells_live_figure.py [--slide S.svs] [--center Y X] [--out PNG]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

from napari_slidescope import SlidescopeWarning


def main(argv: list[str] | None = None) -> int:
    """Write the screenshot; return the exit status."""
    import napari
    from skimage import io

    from napari_slidescope._napari.viewport import camera_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--out", type=Path, default=root / "docs" / "images" / "cells_live.png")
    shared = Path(os.environ.get("SLIDESCOPE_TESTDATA", "."))
    ap.add_argument("--slide", type=Path, default=shared / "CMU-1-Small-Region.svs")
    ap.add_argument("--center", type=float, nargs=2, default=(560.0, 740.0), help="µm")
    ap.add_argument("--zoom", type=float, default=3.0)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", SlidescopeWarning)
    path = args.slide
    viewer = napari.Viewer(show=True)
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    viewer.window._qt_window.resize(1500, 950)
    app = napari.qt.get_qapp()
    app.processEvents()
    camera_of(viewer).center = tuple(args.center)
    camera_of(viewer).zoom = args.zoom
    app.processEvents()
    widget.task.value = "nuclei"
    widget.scope.value = "visible"
    widget.segmenter.value = "builtin"
    widget.nuclei_mpp.value = 0.5
    widget.show_advanced.value = True  # where "Cell expansion" is
    widget.cell_expansion_um.value = 3.0
    widget.run()
    while widget.session.busy:
        app.processEvents()
        time.sleep(0.01)
    app.processEvents()
    nuclei = viewer.layers[f"{image.name} nuclei"]
    cells = viewer.layers[f"{image.name} cells"]
    nuclei.contour = 0  # filled (nuclei are outlines by default): told apart from the cells
    app.processEvents()
    shot = viewer.screenshot(canvas_only=False, flash=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    io.imsave(args.out, shot, check_contrast=False)
    print(f"{nuclei.features.shape[0]} nuclei; cells layer {cells.name!r}, contour")
    print(f"{widget.summary.value}; wrote {args.out}")
    viewer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
