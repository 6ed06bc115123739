"""The class-list editor both classifier docks share: classes, signals, dialogs, errors."""

import pytest

pytestmark = pytest.mark.gui


def _editor(qtbot):
    from napari_slidescope._qt.class_list import ClassList

    palette = [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    editor = ClassList("Classes", lambda name, taken: palette[len(taken) % len(palette)])
    qtbot.addWidget(editor)
    seen: list[tuple] = []
    editor.changed.connect(lambda kind, old, new: seen.append((kind, old, new)))
    return editor, seen


def test_changes_are_announced_after_the_list_shows_them(qtbot):
    editor, seen = _editor(qtbot)
    states = []
    editor.changed.connect(lambda *_: states.append(editor.classes()))
    editor.add_class(" Tumor ", (200, 0, 0))
    editor.add_class("Stroma")  # the dock's palette rule gives the colour
    assert editor.classes() == {"Tumor": (200, 0, 0), "Stroma": (4, 5, 6)}
    assert editor.current_class == "Stroma"
    editor.rename_class("Tumor", "Tumour")
    editor.set_color("Stroma", (0, 255, 0))
    editor.remove_class("Tumour")
    assert seen == [
        ("added", None, "Tumor"),
        ("added", None, "Stroma"),
        ("renamed", "Tumor", "Tumour"),
        ("recoloured", "Stroma", "Stroma"),
        ("removed", "Tumour", None),
    ]
    assert states[2] == {"Tumour": (200, 0, 0), "Stroma": (4, 5, 6)}  # order kept
    assert states[-1] == {"Stroma": (0, 255, 0)}
    assert [editor.list.item(k).text() for k in range(editor.list.count())] == ["Stroma"]
    # classes() is a copy: changing it changes nothing
    editor.classes()["Other"] = (0, 0, 0)
    assert "Other" not in editor


def test_bad_edits_raise_and_change_nothing(qtbot):
    editor, seen = _editor(qtbot)
    editor.set_classes({"A": (1, 1, 1), "B": (2, 2, 2)})
    assert editor.current_class == "A"
    seen.clear()
    for bad in (
        lambda: editor.add_class("A"),
        lambda: editor.add_class("  "),
        lambda: editor.rename_class("A", "B"),
        lambda: editor.rename_class("Z", "C"),
        lambda: editor.set_color("Z", (0, 0, 0)),
        lambda: editor.remove_class("Z"),
    ):
        with pytest.raises(ValueError):
            bad()
    assert seen == []
    assert editor.classes() == {"A": (1, 1, 1), "B": (2, 2, 2)}


def test_buttons_use_dialogs_and_report_failures(qtbot, monkeypatch):
    from qtpy.QtGui import QColor

    from napari_slidescope._qt import class_list

    editor, seen = _editor(qtbot)
    editor.add_class("A")
    failures: list[str] = []
    editor.failed.connect(failures.append)
    answers = iter([("B", True), ("A", True), ("C", True), ("", True)])
    monkeypatch.setattr(
        class_list.QInputDialog, "getText", staticmethod(lambda *a, **k: next(answers))
    )
    monkeypatch.setattr(
        class_list.QColorDialog, "getColor", staticmethod(lambda *a, **k: QColor(9, 8, 7))
    )
    editor.add_button.click()  # B
    editor.add_button.click()  # A again: said, not raised
    assert failures and "already used" in failures[0]
    editor.select_class("A")
    editor.rename_button.click()  # A -> C
    editor.rename_button.click()  # an empty name: nothing happens
    editor.color_button.click()
    assert editor.classes() == {"C": (9, 8, 7), "B": (4, 5, 6)}
    editor.remove_button.click()
    assert editor.classes() == {"B": (4, 5, 6)}
    assert [k for k, *_ in seen] == ["added", "added", "renamed", "recoloured", "removed"]


def test_both_docks_use_the_one_editor(make_napari_viewer):
    from napari_slidescope._qt.cell_classifier_dock import CellClassifierWidget
    from napari_slidescope._qt.class_list import ClassList
    from napari_slidescope._qt.regions_dock import RegionsWidget

    viewer = make_napari_viewer()
    for dock in (CellClassifierWidget(viewer), RegionsWidget(viewer)):
        assert isinstance(dock.class_editor, ClassList)
        dock.add_class("Extra")
        assert dock.classes == dock.class_editor.classes()
        assert dock.current_class == "Extra"
        dock.rename_class("Extra", "More")
        dock.select_class(next(iter(dock.classes)))
        assert dock.current_class == next(iter(dock.classes))
        dock.remove_class("More")
        assert "More" not in dock.classes


def test_a_loaded_classifier_s_colours_join_the_list(qtbot):
    editor, seen = _editor(qtbot)
    editor.set_classes({"A": (1, 1, 1), "B": (2, 2, 2)})
    seen.clear()
    editor.take_colors({"B": (9, 9, 9), "C": (3, 3, 3)})
    assert editor.classes() == {"A": (1, 1, 1), "B": (9, 9, 9), "C": (3, 3, 3)}
    assert seen == [("recoloured", "B", "B"), ("added", None, "C")]


def test_replacing_the_classes_announces_the_old_ones_removed(qtbot):
    editor, seen = _editor(qtbot)
    editor.set_classes({"A": (1, 1, 1), "B": (2, 2, 2)})
    seen.clear()
    editor.set_classes({"B": (3, 3, 3), "C": (4, 4, 4)})
    assert seen == [
        ("removed", "A", None),
        ("removed", "B", None),
        ("added", None, "B"),
        ("added", None, "C"),
    ]
    assert editor.classes() == {"B": (3, 3, 3), "C": (4, 4, 4)}
    assert editor.current_class == "B"
    assert [editor.list.item(k).text() for k in range(editor.list.count())] == ["B", "C"]
