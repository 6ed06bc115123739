"""Closed docks no longer follow the viewer's and the session's events (which outlive them)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gui


def test_closed_docks_are_disconnected_from_the_viewer_and_the_session(make_napari_viewer, qtbot):
    from napari_slidescope._napari.class_layers import events as class_events
    from napari_slidescope._qt import session
    from napari_slidescope._qt.cell_classifier_dock import CellClassifierWidget
    from napari_slidescope._qt.cell_rules_dock import ClassifyWidget
    from napari_slidescope._qt.regions_dock import RegionsWidget
    from napari_slidescope._qt.table import NucleiTableWidget
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    viewer = make_napari_viewer(show=False)
    docks = [
        cls(viewer)
        for cls in (
            SlideAnalysisWidget,
            NucleiTableWidget,
            CellClassifierWidget,
            ClassifyWidget,
            RegionsWidget,
        )
    ]
    clicks = [d._on_viewer_click for d in docks if hasattr(d, "_on_viewer_click")]
    assert len(clicks) == 2
    assert all(c in viewer.mouse_drag_callbacks for c in clicks)
    destroyed = []
    for dock in docks:
        qt = getattr(dock, "native", dock)  # the magicgui widget's Qt widget
        qt.destroyed.connect(lambda *_: destroyed.append(1))
        qt.deleteLater()
    qtbot.waitUntil(lambda: len(destroyed) == len(docks), timeout=10_000)
    assert not any(c in viewer.mouse_drag_callbacks for c in clicks)
    # each of these reached a slot touching deleted Qt widgets (RuntimeError) before
    ses = session.session_for(viewer)
    ses.started.emit("nuclei")
    ses.progress.emit(session.Progress("nuclei", "segmenting", done=1, total=4))
    ses.finished.emit(None)
    layer = viewer.add_image(np.zeros((8, 8), np.uint8))
    viewer.layers.selection.active = layer
    viewer.camera.zoom = viewer.camera.zoom * 2
    viewer.camera.center = (0, 4, 4)
    class_events.changed.emit(layer, None)
    viewer.layers.remove(layer)
