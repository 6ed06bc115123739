"""``napari-slidescope [PATH]``: napari with a slide open and the analysis widget docked."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Open napari with `PATH` (or the bundled sample slide) and dock "Slide analysis".

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status, 0 once the napari window is closed. A slide that cannot be
        opened exits with status 2 and a message naming the file.
    """
    parser = argparse.ArgumentParser(
        prog="napari-slidescope",
        description="Open a whole-slide image in napari with the Slide analysis widget.",
    )
    parser.add_argument("path", nargs="?", help="slide file (default: the synthetic sample slide)")
    args = parser.parse_args(argv)

    import napari
    from napari_slidescope.slide import SlideError

    viewer = napari.Viewer(title="napari-slidescope")
    if args.path is None:
        viewer.open_sample("napari-slidescope", "synthetic_he")
    else:
        try:
            viewer.open(args.path, plugin="napari-slidescope")
        except SlideError as exc:
            parser.exit(2, f"napari-slidescope: {exc}\n")
    dock_analysis_widget(viewer)
    napari.run()
    return 0


def dock_analysis_widget(viewer: object) -> object | None:
    """Dock the plugin's "Slide analysis" widget; return it (None without the contribution)."""
    from npe2 import PluginManager

    manifest = PluginManager.instance().get_manifest("napari-slidescope")
    names = [w.display_name for w in manifest.contributions.widgets or []]
    if "Slide analysis" not in names:
        return None
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")  # type: ignore[attr-defined]
    return widget


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
