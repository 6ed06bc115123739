"""What the user sees: previews that show, a window that gives the image most of its room,
nothing clipped, and an export folder that can be written to."""

import napari
import numpy as np
import pytest

from napari_slidescope import _io
from napari_slidescope._napari.export import default_export_folder
from napari_slidescope._qt import launcher
from napari_slidescope._qt.layout import MAX_WIDTH

pytestmark = pytest.mark.gui

SMALL_REGION = "CMU-1-Small-Region.svs"  # has a label and a macro image


def _wait_for_previews(widget, qtbot):
    qtbot.waitUntil(
        lambda: widget.macro_image.visible and widget.label_image.visible, timeout=30_000
    )
    qtbot.wait(50)  # one layout pass


def _shows_an_image(qwidget) -> bool:
    """The widget, grabbed as the screen shows it, is not one flat colour."""
    img = qwidget.grab().toImage()
    w, h = img.width(), img.height()
    if w == 0 or h == 0:
        return False
    colours = {
        img.pixel(x, y) for x in range(0, w, max(1, w // 16)) for y in range(0, h, max(1, h // 16))
    }
    return len(colours) > 8


def test_label_and_macro_previews_appear_in_the_dock(dock_slide, shared_file, qtbot):
    viewer, [image], widget = dock_slide(shared_file(SMALL_REGION))
    viewer.window._qt_window.resize(1600, 1000)
    _wait_for_previews(widget, qtbot)
    row = widget.thumbnails.native
    for preview in (widget.label_image, widget.macro_image):
        native = preview.native
        assert native.isVisible()
        assert native.height() >= 60, (native.width(), native.height())
        assert native.width() >= 60, (native.width(), native.height())
        assert _shows_an_image(native)  # the slide's image, not an empty frame
        # inside the row, and the row inside what the dock shows
        assert row.rect().contains(native.geometry())
    assert row.height() >= widget.label_image.native.height()
    scroll = widget.native
    top_left = row.mapTo(scroll, row.rect().topLeft())
    assert scroll.rect().contains(top_left)
    assert top_left.y() + row.height() <= scroll.height()


@pytest.mark.parametrize("size", [(1280, 800), (1500, 900)])
def test_the_docked_form_is_never_cut_off(dock_slide, shared_file, qtbot, size):
    # docked from the Plugins menu (no launcher layout), parameters shown and hidden
    viewer, [image], widget = dock_slide(shared_file(SMALL_REGION))
    viewer.window._qt_window.resize(*size)
    _wait_for_previews(widget, qtbot)
    scroll = widget.native
    for task, advanced in [("nuclei", False), ("nuclei", True), ("tissue", True)]:
        widget.task.value, widget.show_advanced.value = task, advanced
        qtbot.wait(50)
        assert scroll.widget().width() <= scroll.viewport().width(), (task, advanced)
        assert _clipped(widget) == [], (task, advanced)
        assert scroll.width() <= MAX_WIDTH


@pytest.fixture
def launched(make_napari_viewer, monkeypatch):
    """Run the launcher as if on a screen of the given size; returns the viewer."""
    from qtpy.QtCore import QRect

    monkeypatch.setattr(napari, "run", lambda *a, **k: None)
    viewers = []

    def viewer(*args, **kwargs):
        viewers.append(make_napari_viewer(*args, show=True, **kwargs))
        return viewers[-1]

    monkeypatch.setattr(napari, "Viewer", viewer)
    real_arrange = launcher.arrange_window

    def launch(path, size):
        screen = QRect(0, 0, *size)
        monkeypatch.setattr(launcher, "arrange_window", lambda v: real_arrange(v, screen))
        assert launcher.main([str(path)]) == 0
        return viewers[-1]

    return launch


def _clipped(widget) -> list[str]:
    """Controls of the form drawn smaller than they need (their text or box cut off)."""
    from qtpy.QtWidgets import QAbstractButton, QComboBox, QLabel

    form = widget.native.widget()
    out = []
    for child in form.findChildren((QAbstractButton, QComboBox)):
        if not child.isVisibleTo(form):
            continue
        need = child.minimumSizeHint()
        if child.height() < need.height() or child.width() < min(need.width(), 60):
            out.append(f"{type(child).__name__} {child.text() if hasattr(child, 'text') else ''}")
    for label in form.findChildren(QLabel):
        if label.isVisibleTo(form) and label.wordWrap() and label.text():
            if label.height() < label.heightForWidth(label.width()):
                out.append(f"QLabel {label.text()[:30]}")
    return out


@pytest.mark.parametrize("size", [(1280, 800), (1600, 1000)])
def test_launcher_gives_the_image_most_of_the_window(launched, shared_file, qtbot, tmp_path, size):
    from qtpy.QtWidgets import QRadioButton

    viewer = launched(shared_file(SMALL_REGION), size)
    qwin = viewer.window._qt_window
    widget = viewer.window._wrapped_dock_widgets[
        "Slide analysis (napari-slidescope)"
    ].inner_widget()
    _wait_for_previews(widget, qtbot)
    screenshot = tmp_path / f"launcher_{size[0]}x{size[1]}.png"
    assert qwin.grab().save(str(screenshot))
    # the window fills the screen; the canvas has more room than all the docks together
    assert (qwin.width(), qwin.height()) == size
    canvas = viewer.window._qt_viewer.canvas.native
    assert canvas.width() >= 0.44 * size[0], canvas.width()
    assert canvas.height() >= size[1] - 60
    docks = [d for d in viewer.window._wrapped_dock_widgets.values() if d.isVisible()]
    assert canvas.width() > max(d.width() for d in docks)
    # the analysis dock is the tab shown, bounded in width; nothing in it is clipped
    scroll = widget.native
    assert scroll.isVisible()
    assert not scroll.visibleRegion().isEmpty()
    assert scroll.width() <= MAX_WIDTH
    assert scroll.widget().width() <= scroll.viewport().width()  # no control cut sideways
    assert _clipped(widget) == []
    radios = widget.scope.native.findChildren(QRadioButton)
    assert len(radios) == 3
    for radio in radios:
        assert radio.height() >= radio.sizeHint().height(), (radio.text(), radio.height())
    # what does not fit in the height scrolls; every control stays reachable
    form = scroll.widget()
    assert form.height() >= form.minimumSizeHint().height()
    if form.height() > scroll.viewport().height():
        assert scroll.verticalScrollBar().isVisible()
    # the overview sits under the layer list, on the left
    overview = viewer.window._wrapped_dock_widgets["Slide overview (napari-slidescope)"]
    assert overview.x() < canvas.mapTo(qwin, canvas.rect().topLeft()).x()


def _read_only(folder, monkeypatch):
    """Make `folder` refuse new files, for root too (root passes the permission bits)."""
    folder.chmod(0o555)
    if _io.is_writable_folder(folder):  # root: refuse as a read-only share would
        real = _io._probe_write

        def probe(path):
            if path == folder:
                raise PermissionError(13, "Permission denied", str(path))
            real(path)

        monkeypatch.setattr(_io, "_probe_write", probe)
    assert not _io.is_writable_folder(folder)


def test_export_folder_falls_back_when_the_slides_folder_is_read_only(
    dock_slide, tmp_path, monkeypatch, qtbot, threshold_segmenter
):
    """The folder is decided when exporting (opening the slide probes nothing)."""
    from napari_slidescope.sample_data import write_sample_slide

    slides, work = tmp_path / "slides", tmp_path / "work"
    slides.mkdir()
    work.mkdir()
    write_sample_slide(slides / "ro.svs", shape=(512, 768), mpp=0.5, seed=4, tile=128)
    monkeypatch.chdir(work)
    _read_only(slides, monkeypatch)
    try:
        viewer, [image], widget = dock_slide(slides / "ro.svs")
        seg = {"segmenter": threshold_segmenter(), "target_mpp": 0.5, "workers": 1}
        widget.session.run(image, "nuclei", region=(0, 0, 256, 256), nuclei_run=seg)
        qtbot.waitUntil(lambda: not widget.session.busy, timeout=60_000)
        assert widget.export("csv") is not None
        qtbot.waitUntil(lambda: not widget.exporting, timeout=60_000)
        assert (work / "ro_nuclei.csv").is_file()
        assert list(slides.iterdir()) == [slides / "ro.svs"]
        assert str(widget.export_dir.value) == str(work)
        assert widget.export_note.visible
        assert str(slides) in widget.export_note.value
        assert str(work) in widget.export_note.value
        assert "read-only" in widget.export_note.value
    finally:
        slides.chmod(0o755)


def test_export_folder_is_the_slides_own_when_writable(dock_slide, small_slide, qtbot):
    viewer, [image], widget = dock_slide(small_slide)
    assert str(widget.export_dir.value) == str(small_slide.parent)
    assert not widget.export_note.visible
    assert widget.export_note.value == ""


def test_default_export_folder_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_export_folder(str(tmp_path / "a.svs")) == (tmp_path, "")
    assert default_export_folder(None) == (tmp_path, "")
    # /proc refuses new files even to root: the current folder is used, and said
    folder, note = default_export_folder("/proc/slide.svs")
    assert folder == tmp_path
    assert note == f"/proc is read-only: exports go to {tmp_path}"


def test_a_preview_is_as_tall_as_its_image_up_to_a_bound(dock_slide, small_slide, qtbot):
    viewer, [image], widget = dock_slide(small_slide)
    widget._show_thumbnails(
        {"macro": np.zeros((431, 1280, 3), np.uint8), "label": np.zeros((900, 800, 3), np.uint8)}
    )
    qtbot.wait(50)
    assert widget.macro_image.native.height() == 72  # 431 rows, every 6th (1280 / 230)
    assert widget.label_image.native.height() == 120  # 150 rows, shown 120 px tall at most
