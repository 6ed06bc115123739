"""The class-list editor both classifier docks share: names and colours of the classes.

The "Cell classifier" and "Tissue regions" docks each let the user name classes, give them
colours and pick the one that clicks or strokes teach. The list, its Add / Rename / Colour /
Remove buttons and their dialogs are the same in both; only what follows a change differs
(a dock's examples follow a rename, and go with a removed class). So the editor is one
widget that keeps the classes and says what changed through :attr:`ClassList.changed`;
each dock connects its own consequences to that signal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from qtpy.QtCore import Signal
from qtpy.QtGui import QColor, QIcon, QPixmap
from qtpy.QtWidgets import (
    QColorDialog,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

__all__ = ["RGB", "ClassList", "ClassListOwner", "class_icon"]

RGB = tuple[int, int, int]


def class_icon(rgb: RGB) -> QIcon:
    """Return a small square of colour `rgb` (0-255), the swatch beside a class name."""
    pix = QPixmap(14, 14)
    pix.fill(QColor(*rgb))
    return QIcon(pix)


class ClassList(QWidget):
    """A list of named, coloured classes with Add, Rename, Colour and Remove buttons.

    The classes are kept in the order they were added (the order classifiers number them).
    Every change made here, from a button or from code, is announced once by
    :attr:`changed` *after* the list and :meth:`classes` show it, so that a dock's slot
    sees the new state.

    Parameters
    ----------
    title : str
        The label above the list.
    default_color : callable
        ``default_color(name, classes)`` gives the colour of a new class `name` added without
        one, beside the `classes` already listed (each dock has its own palette rule).
    height : int
        The list's largest height in pixels.
    parent : QWidget, optional
        The owning widget.

    Attributes
    ----------
    changed : Signal(str, object, object)
        ``(kind, old, new)``: ``("added", None, name)``, ``("renamed", old, new)``,
        ``("recoloured", name, name)`` or ``("removed", name, None)``.
    selected : Signal(object)
        The selected class's name (None when the list is empty), whenever it changes.
    failed : Signal(str)
        A button's action could not be done (a name empty or already used); the message
        says why, for the dock's status line.
    """

    changed = Signal(str, object, object)
    selected = Signal(object)
    failed = Signal(str)

    def __init__(
        self,
        title: str,
        default_color: Callable[[str, Mapping[str, RGB]], RGB],
        *,
        height: int = 90,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._classes: dict[str, RGB] = {}
        self._default_color = default_color
        self.list = QListWidget()
        self.list.setMaximumHeight(height)
        self.add_button = QPushButton("Add")
        self.rename_button = QPushButton("Rename")
        self.color_button = QPushButton("Colour")
        self.remove_button = QPushButton("Remove")

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel(title))
        lay.addWidget(self.list)
        row = QHBoxLayout()
        for b in (self.add_button, self.rename_button, self.color_button, self.remove_button):
            row.addWidget(b)
        lay.addLayout(row)

        self.add_button.clicked.connect(self._on_add)
        self.rename_button.clicked.connect(self._on_rename)
        self.color_button.clicked.connect(self._on_color)
        self.remove_button.clicked.connect(self._on_remove)
        self.list.currentItemChanged.connect(lambda *_: self.selected.emit(self.current_class))

    # -- the classes ----------------------------------------------------------------------
    def classes(self) -> dict[str, RGB]:
        """Return the classes in their order: name -> (r, g, b), 0-255 (a copy)."""
        return dict(self._classes)

    def color(self, name: str) -> RGB:
        """Return the colour of class `name`."""
        return self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def add_class(self, name: str, color: RGB | None = None) -> str:
        """Add a class and select it; return its name (stripped).

        Raises
        ------
        ValueError
            If the name is empty or already used.
        """
        name = name.strip()
        if not name or name in self._classes:
            raise ValueError(f"class name {name!r}: empty or already used")
        rgb = color if color is not None else self._default_color(name, self.classes())
        self._classes[name] = (int(rgb[0]), int(rgb[1]), int(rgb[2]))
        item = QListWidgetItem(class_icon(self._classes[name]), name)
        self.list.addItem(item)
        self.list.setCurrentItem(item)
        self.changed.emit("added", None, name)
        return name

    def rename_class(self, old: str, new: str) -> None:
        """Rename class `old` to `new`, keeping its place and colour.

        Raises
        ------
        ValueError
            If `old` is not a class, or `new` is empty or another class's name.
        """
        new = new.strip()
        if old not in self._classes or not new or (new in self._classes and new != old):
            raise ValueError(f"cannot rename {old!r} to {new!r}")
        self._classes = {(new if k == old else k): v for k, v in self._classes.items()}
        for item in self._items():
            if item.text() == old:
                item.setText(new)
        self.changed.emit("renamed", old, new)

    def set_color(self, name: str, rgb: RGB) -> None:
        """Change the colour of class `name`.

        Raises
        ------
        ValueError
            If `name` is not a class.
        """
        if name not in self._classes:
            raise ValueError(f"no class {name!r} to colour (classes: {list(self._classes)})")
        self._classes[name] = (int(rgb[0]), int(rgb[1]), int(rgb[2]))
        for item in self._items():
            if item.text() == name:
                item.setIcon(class_icon(self._classes[name]))
        self.changed.emit("recoloured", name, name)

    def remove_class(self, name: str) -> None:
        """Remove class `name` (the next one is selected).

        Raises
        ------
        ValueError
            If `name` is not a class.
        """
        if name not in self._classes:
            raise ValueError(f"no class {name!r} to remove (classes: {list(self._classes)})")
        self._classes.pop(name)
        for k, item in enumerate(self._items()):
            if item.text() == name:
                self.list.takeItem(k)
                break
        self.changed.emit("removed", name, None)

    def set_classes(self, classes: Mapping[str, RGB]) -> None:
        """Replace every class by `classes` (in order) and select the first.

        Each class replaced is announced as ``"removed"`` and each new one as ``"added"``,
        as if removed and added one by one (a dock's slot drops what went with the old
        classes, as for the Remove button).
        """
        for name in list(self._classes):
            self.remove_class(name)
        for name, rgb in classes.items():
            self.add_class(name, rgb)
        if self.list.count():
            self.list.setCurrentRow(0)

    def take_colors(self, colors: Mapping[str, RGB]) -> None:
        """Give the classes of `colors` (name -> rgb) those colours, adding the missing ones.

        What a loaded classifier does to the list: its classes join it, in its colours.
        """
        for name, rgb in colors.items():
            if name in self._classes:
                self.set_color(name, rgb)
            else:
                self.add_class(name, rgb)

    def select_class(self, name: str) -> None:
        """Select class `name` (nothing happens when there is none of that name)."""
        for k, item in enumerate(self._items()):
            if item.text() == name:
                self.list.setCurrentRow(k)

    @property
    def current_class(self) -> str | None:
        """The selected class (None when the list is empty)."""
        item = self.list.currentItem()
        return None if item is None else item.text()

    def _items(self) -> list[QListWidgetItem]:
        items = (self.list.item(k) for k in range(self.list.count()))
        return [item for item in items if item is not None]

    # -- the buttons ----------------------------------------------------------------------
    def _on_add(self) -> None:
        name, ok = QInputDialog.getText(self, "Add class", "Name")
        if ok and name.strip():
            self._try(self.add_class, name)

    def _on_rename(self) -> None:
        old = self.current_class
        if old is None:
            return
        new, ok = QInputDialog.getText(self, "Rename class", "Name", text=old)
        if ok and new.strip():
            self._try(self.rename_class, old, new)

    def _on_color(self) -> None:
        name = self.current_class
        if name is None:
            return
        color = QColorDialog.getColor(QColor(*self._classes[name]), self, f"Colour of {name}")
        if color.isValid():
            self.set_color(name, (color.red(), color.green(), color.blue()))

    def _on_remove(self) -> None:
        name = self.current_class
        if name is not None:
            self.remove_class(name)

    def _try(self, fn: Callable[..., object], *args: str) -> None:
        try:
            fn(*args)
        except ValueError as exc:
            self.failed.emit(str(exc))


class ClassListOwner:
    """The class methods a dock with a :class:`ClassList` offers scripts, tests and the guide.

    Each delegates to the dock's ``class_editor``; what the dock does after a change is its
    slot on ``class_editor.changed``.
    """

    class_editor: ClassList
    #: The dock's status line: where the file actions' errors are said.
    status: QLabel
    #: The errors :meth:`_report` says in the status line (others propagate).
    _REPORTED: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)
    save_classifier: Callable[[str], Any]
    load_classifier: Callable[[str], Any]

    def _on_save(self) -> None:
        self._ask_file(True, "Save classifier", "Classifier (*.npz)", self.save_classifier)

    def _on_load(self) -> None:
        self._ask_file(False, "Load classifier", "Classifier (*.npz)", self.load_classifier)

    def _ask_file(self, save: bool, title: str, filters: str, then: Callable[[str], Any]) -> None:
        """Ask for a file to save to (or to open); call `then` with it, if one was chosen."""
        ask = QFileDialog.getSaveFileName if save else QFileDialog.getOpenFileName
        path, _ = ask(self if isinstance(self, QWidget) else None, title, "", filters)
        if path:
            self._report(then, path)

    def _report(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call `fn`; an error a user can act on goes to the status line (returns None)."""
        try:
            return fn(*args)
        except self._REPORTED as exc:
            self.status.setText(str(exc))
            return None

    @property
    def classes(self) -> dict[str, RGB]:
        """The classes in their order: name -> (r, g, b), 0-255 (a copy)."""
        return self.class_editor.classes()

    def add_class(self, name: str, color: RGB | None = None) -> None:
        """Add a class and select it (the dock's palette gives a colour when none is given)."""
        self.class_editor.add_class(name, color)

    def rename_class(self, old: str, new: str) -> None:
        """Rename a class; the dock's examples of it follow."""
        self.class_editor.rename_class(old, new)

    def set_color(self, name: str, rgb: RGB) -> None:
        """Change a class's colour."""
        self.class_editor.set_color(name, rgb)

    def remove_class(self, name: str) -> None:
        """Remove a class and the dock's examples of it."""
        self.class_editor.remove_class(name)

    def select_class(self, name: str) -> None:
        """Make `name` the class that new examples (clicks, shapes) teach."""
        self.class_editor.select_class(name)

    @property
    def current_class(self) -> str | None:
        """The selected class (None when there is none)."""
        return self.class_editor.current_class
