"""Screenshot of a threshold dragged on the measurements table's histogram (IHC, synthetic).

A synthetic hematoxylin-DAB image with nuclei at known DAB levels
(:func:`napari_slidescope.sample_cells.make_hdab`) is opened in napari, its nuclei are
segmented with the built-in method, and the "Cell classification" dock scores them at
QuPath's 0.2 / 0.4 / 0.6 (mean DAB OD of the nucleus). The measurements table's histogram
of the DAB column then shows the three thresholds as red lines; the script drags the 1+ line
to 0.3 with mouse events on the histogram, as a user would, and saves the window: the nuclei
between 0.2 and 0.3 have turned from 1+ (yellow) to Negative (blue), the legend counts
follow, and the dock's 1+ box reads 0.300 (the value **Save rules...** writes).

Usage (needs a display: ``xvfb-run -a``)::

    python benchmarks/threshold_drag_figure.py [--out docs/images/threshold_drag.png]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

from napari_slidescope import SlidescopeWarning


def _drag(canvas, axes, x0, x1):
    """Press on the line at data x `x0`, move to `x1` in steps, release (matplotlib events)."""
    from matplotlib.backend_bases import MouseButton, MouseEvent

    canvas.draw()
    y = axes.transAxes.transform((0, 0.5))[1]
    for name, x in [("button_press_event", x0)] + [
        ("motion_notify_event", x0 + (x1 - x0) * k / 4) for k in range(1, 5)
    ]:
        MouseEvent(
            name, canvas, axes.transData.transform((x, 0))[0], y, button=MouseButton.LEFT
        )._process()
    px = axes.transData.transform((x1, 0))[0]
    MouseEvent("button_release_event", canvas, px, y, button=MouseButton.LEFT)._process()


def main(argv: list[str] | None = None) -> int:
    """Write the screenshot; return the exit status."""
    import napari
    import numpy as np
    from skimage import io

    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope.sample_cells import make_hdab

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--out", type=Path, default=root / "docs" / "images" / "threshold_drag.png")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", SlidescopeWarning)
    warnings.simplefilter("ignore", FutureWarning)
    app = napari.qt.get_qapp()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_hdab(seed=5, shape=(384, 384)).write(Path(tmp) / "hdab.ome.tif")
        viewer = napari.Viewer(show=True)
        viewer.window._qt_window.resize(1500, 950)
        [image] = viewer.open(str(path), plugin="napari-slidescope")
        _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
        table = widget.open_table()
        ctl = widget.session
        viewer.reset_view()
        ctl.run(
            image,
            "nuclei",
            scope="visible",
            nuclei_run={"segmenter": "builtin", "target_mpp": 0.5, "workers": 1},
        )
        deadline = time.monotonic() + 120
        while ctl.busy and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.05)
        dock = ClassifyWidget(viewer)
        viewer.window.add_dock_widget(dock, name="Cell classification", area="left")
        before = dock.apply()
        col = "dab_od_mean"
        table.hist_column.setCurrentIndex(table.hist_column.findData(col))
        app.processEvents()
        _drag(table.canvas, table.axes, 0.2, 0.3)
        after = viewer.layers[f"{image.name} nuclei"].metadata["slidescope_classification"]
        for _ in range(20):
            app.processEvents()
            time.sleep(0.05)
        shot = viewer.screenshot(canvas_only=False, flash=False)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        io.imsave(args.out, shot, check_contrast=False)
        dab = np.asarray(before.columns[col])
        moved = int(((dab > 0.2) & (dab <= after["dab_thresholds"][0])).sum())
        print(
            f"{before.count} nuclei; 1+ threshold 0.2 -> {after['dab_thresholds'][0]:.3f}: "
            f"{moved} nuclei from 1+ to Negative; dock thresholds "
            f"{[round(t, 3) for t in dock.current_rules().dab['thresholds']]}; wrote {args.out}"
        )
        viewer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
