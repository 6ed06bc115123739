"""Qt helpers that keep a dock readable: wrapping labels, a bounded width, click filters."""

from __future__ import annotations

from collections.abc import Callable

from magicgui.widgets import Label
from qtpy.QtCore import QEvent, QObject, Qt
from qtpy.QtWidgets import QLabel, QScrollArea, QSizePolicy, QWidget

__all__ = ["MAX_WIDTH", "ClickFilter", "FitWidth", "wrap"]

#: Widest the widget grows (px): long names and messages wrap or elide instead.
MAX_WIDTH = 420


def wrap(label: Label) -> None:
    """Let a label wrap and never ask for more width than the dock has."""
    native = label.native
    if isinstance(native, QLabel):
        native.setWordWrap(True)
        native.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    native.setMinimumWidth(50)


class ClickFilter(QObject):
    """Call `callback` when the watched widget is clicked."""

    def __init__(self, callback: Callable[[], object]) -> None:
        super().__init__()
        self._callback = callback

    def eventFilter(self, obj: QObject | None, event: QEvent | None) -> bool:  # noqa: N802
        if event is not None and event.type() == QEvent.Type.MouseButtonRelease:
            self._callback()
            return True
        return False


class FitWidth(QObject):
    """Keep a scroll area as wide as its form needs, with a vertical scroll bar beside it.

    At most :data:`MAX_WIDTH` unless the form cannot be narrower (a large font): the form
    is never cut off at the side. Refitted whenever the form's layout changes.
    """

    def __init__(self, scroll: QScrollArea, inner: QWidget) -> None:
        super().__init__()
        self._scroll, self._inner = scroll, inner

    def fit(self) -> None:
        bar = self._scroll.verticalScrollBar()
        # what the scroll area takes beside the form: the bar and the frame on both sides
        extent = (bar.sizeHint().width() if bar is not None else 0) + 2 * self._scroll.frameWidth()
        need = self._inner.minimumSizeHint().width() + extent
        widest = max(MAX_WIDTH, need)
        self._scroll.setMinimumWidth(need)
        self._scroll.setMaximumWidth(widest)
        self._inner.setMaximumWidth(widest - extent)

    def eventFilter(self, obj: QObject | None, event: QEvent | None) -> bool:  # noqa: N802
        if event is not None and event.type() in self._REFIT:
            self.fit()
        return False

    # the form's layout changed, or a style sheet (napari's theme) changed the frame or bar
    _REFIT = (QEvent.Type.LayoutRequest, QEvent.Type.StyleChange, QEvent.Type.Polish)
