"""Fixtures the napari-glue tests (tests/_napari) and the Qt tests (tests/_qt) share.

Each folder's conftest.py imports the ones it uses from here, so neither folder reaches
into the other's conftest.
"""

import pytest
from tests.fakes import ThresholdSegmenter


@pytest.fixture(autouse=True)
def background_workers_end(qapp):
    """After each test, let the background workers it started end (60 s at most).

    superqt's workers save the warnings filters when they start and put them back when
    they end, and those filters are global: a worker that ended in the next test would put
    this test's filters back there (a ``pytest.warns`` of that test missing its warning).
    """
    import time

    from qtpy.QtCore import QThreadPool

    yield
    pool, end = QThreadPool.globalInstance(), time.monotonic() + 60
    while not pool.waitForDone(20) and time.monotonic() < end:
        qapp.processEvents()  # what a worker may be waiting for of the GUI thread


@pytest.fixture
def threshold_segmenter():
    """The shared stand-in segmenter class, ``tests.fakes.ThresholdSegmenter``."""
    return ThresholdSegmenter


@pytest.fixture(scope="session")
def small_slide(tmp_path_factory):
    """A 1024 x 1536 synthetic slide at 0.5 µm/px (whole-slide runs in a few seconds)."""
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("small") / "small.svs"
    write_sample_slide(path, shape=(1024, 1536), mpp=0.5, seed=2, tile=128)
    return path


@pytest.fixture
def dock_slide(make_napari_viewer, qtbot):
    """Open a slide in a shown viewer and dock a plugin widget: ``(viewer, layers, widget)``."""

    def dock(path, widget="Slide analysis"):
        viewer = make_napari_viewer(show=True)
        layers = viewer.open(str(path), plugin="napari-slidescope")
        _, docked = viewer.window.add_plugin_dock_widget("napari-slidescope", widget)
        qtbot.wait(10)
        return viewer, layers, docked

    return dock


def find_tissue_in_dock(viewer, layer, qtbot, timeout_ms=60_000):
    """Dock "Slide analysis", find the tissue of the whole slide `layer`, wait; the widget.

    Checks that the dock took `layer` as its slide and that the run ended "Done".
    """
    _, widget = viewer.window.add_plugin_dock_widget("napari-slidescope", "Slide analysis")
    qtbot.wait(10)
    assert widget.image.value is layer
    widget.task.value = "tissue"
    widget.scope.value = "slide"
    assert widget.run() is not None
    qtbot.waitUntil(lambda: not widget.session.busy, timeout=timeout_ms)
    assert widget.status.value.startswith("Done"), widget.status.value
    return widget
