"""``napari-slidescope [PATH]``: napari with a slide open and the analysis widget docked."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from napari_slidescope._io import one_line

#: Exit status for a path that is missing or cannot be opened as a slide.
EXIT_BAD_PATH = 2
#: Widest napari's own left docks (layer controls, layer list) and the overview are
#: made (px), so that the canvas keeps most of the window's width.
LEFT_DOCKS_WIDTH = 260


def main(argv: list[str] | None = None) -> int:
    """Open napari with `PATH` (or the bundled sample slide) and dock "Slide analysis".

    The path is checked before any window exists: a missing path, or a file that
    cannot be opened as a slide, prints one line naming the file and the problem to
    stderr and returns :data:`EXIT_BAD_PATH` (2), with no viewer to tear down.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0 once the napari window is closed, 2 for a bad path.
    """
    parser = argparse.ArgumentParser(
        prog="napari-slidescope",
        description="Open a whole-slide image in napari with the Slide analysis widget.",
    )
    parser.add_argument(
        "path",
        nargs="?",
        help="slide file or URL (https://, s3://...; default: the synthetic sample slide)",
    )
    args = parser.parse_args(argv)
    if args.path is not None:
        problem = check_path(args.path)
        if problem is not None:
            return _fail(problem)

    import napari

    viewer = napari.Viewer(title="napari-slidescope")
    try:
        if args.path is None:
            viewer.open_sample("napari-slidescope", "synthetic_he")
        else:
            viewer.open(args.path, plugin="napari-slidescope")
    except Exception as exc:  # noqa: BLE001 - any failure to open is one line and status 2
        _close(viewer)
        return _fail(one_line(exc, limit=400))
    dock_analysis_widget(viewer)
    dock_plugin_widget(viewer, "Slide overview")
    arrange_window(viewer)
    show_scale_bar(viewer)
    fit_view(viewer)
    napari.run()
    return 0


def check_path(path: str) -> str | None:
    """Return why `path` cannot be opened as a slide (one line), or None when it can."""
    from napari_slidescope.slide import open_slide
    from napari_slidescope.slide.source import is_url

    if is_url(path):
        pass  # opened below: a refused, missing or forbidden URL is said by open_slide
    elif not os.path.exists(path):
        return f"{path}: no such file"
    elif not os.path.isfile(path):
        return f"{path}: not a regular file"
    # our message says what is wrong: tifffile's own log lines would only repeat it
    quiet = logging.NullHandler()
    logging.getLogger("tifffile").addHandler(quiet)
    try:
        with open_slide(path, on_error="blank"):
            pass
    except Exception as exc:  # noqa: BLE001 - SlideError, or anything else, is reported
        return one_line(exc, limit=400)
    finally:
        logging.getLogger("tifffile").removeHandler(quiet)
    return None


def _fail(message: str) -> int:
    print(f"napari-slidescope: {message}", file=sys.stderr)
    return EXIT_BAD_PATH


def _close(viewer: Any) -> None:
    """Close a viewer and let Qt finish tearing it down (no live widgets at exit)."""
    from qtpy.QtWidgets import QApplication

    viewer.close()
    app = QApplication.instance()
    if app is not None:
        app.processEvents()


def dock_analysis_widget(viewer: Any) -> Any:
    """Dock the plugin's "Slide analysis" widget; return it (None without the contribution)."""
    return dock_plugin_widget(viewer, "Slide analysis")


def dock_plugin_widget(viewer: Any, name: str) -> Any:
    """Dock the plugin's widget `name`; return it (None without the contribution)."""
    from npe2 import PluginManager

    manifest = PluginManager.instance().get_manifest("napari-slidescope")
    names = [w.display_name for w in manifest.contributions.widgets or []]
    if name not in names:
        return None
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", name)
    return widget


def arrange_window(viewer: Any, screen: Any = None) -> None:
    """Size the window to the screen and give the image most of it.

    The window takes the screen's available area (`screen`, a ``QRect``; default the
    window's screen). The docks take two narrow columns: on the left napari's layer
    list with the "Slide overview" under it, :data:`LEFT_DOCKS_WIDTH` wide; on the
    right "Slide analysis" (at most
    :data:`~napari_slidescope._qt.layout.MAX_WIDTH` wide, scrolling when the screen
    is too short for it), with napari's layer controls as a tab behind it (one click
    away; they would otherwise take a third column). Docks the user moves later stay
    where they are put.
    """
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QApplication

    from napari_slidescope._qt.layout import MAX_WIDTH

    window = viewer.window
    qwin = window._qt_window
    if screen is None:
        where = qwin.screen() or QApplication.primaryScreen()
        if where is None:
            return
        screen = where.availableGeometry()
    frame = qwin.frameGeometry().size() - qwin.geometry().size()  # a window manager's
    qwin.resize(screen.width() - frame.width(), screen.height() - frame.height())
    qwin.move(screen.topLeft())
    qt_viewer = window._qt_viewer
    ours = {d.name.split(" (")[0]: d for d in window._wrapped_dock_widgets.values()}
    left = [qt_viewer.dockLayerList]
    overview = ours.get("Slide overview")
    if overview is not None:
        qwin.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, overview)
        qwin.splitDockWidget(qt_viewer.dockLayerList, overview, Qt.Orientation.Vertical)
        left.append(overview)
    analysis = ours.get("Slide analysis")
    if analysis is not None:
        controls = qt_viewer.dockLayerControls
        qwin.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, controls)
        qwin.tabifyDockWidget(controls, analysis)  # the analysis is the tab shown
        qwin.resizeDocks([analysis], [MAX_WIDTH], Qt.Orientation.Horizontal)
    qwin.resizeDocks(left, [LEFT_DOCKS_WIDTH] * len(left), Qt.Orientation.Horizontal)
    if overview is not None:  # the layer list keeps the larger share of the height
        half = screen.height() // 2
        qwin.resizeDocks(left, [half, half // 2], Qt.Orientation.Vertical)
    if analysis is not None:
        app = QApplication.instance()
        if app is not None:
            app.processEvents()  # the tab bar exists once the layout is done
        analysis.raise_()  # its tab is the one shown


def scale_bar_of(viewer: Any) -> Any:
    """Return the viewer's scale bar (``viewer.canvas.overlays`` from napari 0.9, else its own)."""
    overlays = getattr(getattr(viewer, "canvas", None), "overlays", None)
    bar = getattr(overlays, "scale_bar", None)
    return bar if bar is not None else viewer.scale_bar


def show_scale_bar(viewer: Any) -> None:
    """Turn napari's scale bar on, in µm.

    Slide layers are scaled in µm per pixel and carry ``units=("µm", "µm")``, which
    napari >= 0.6 shows on the bar; older napari takes the unit from the overlay.
    """
    bar = scale_bar_of(viewer)
    bar.visible = True
    if "unit" in getattr(type(bar), "model_fields", {}):
        bar.unit = "um"


def fit_view(viewer: Any) -> None:
    """Fit the slide to the canvas as it is once the docks took their room."""
    from qtpy.QtWidgets import QApplication

    app = QApplication.instance()
    if app is not None:
        app.processEvents()  # the canvas shrinks to its final size
    viewer.reset_view()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
