"""The Qt half of the damaged-tile overlay: reports from decoder threads to the main thread.

A slide's :class:`~napari_slidescope.slide.DamageLog` reports damaged tiles on whatever
thread decoded them; :func:`watch` queues each report through a Qt signal to the main
thread, where :mod:`napari_slidescope._napari.damage` outlines the tiles and notifies once.
"""

from __future__ import annotations

import weakref
from typing import Any

from napari_slidescope._napari.damage import notify, outline

__all__ = ["watch"]


def watch(viewer: Any, slide: Any) -> Any:
    """Outline `slide`'s damaged tiles in `viewer` and notify once; return the watcher.

    Returns None (the library then warns as usual) when Qt is not available. The
    watcher is kept alive by the slide.
    """
    try:
        from qtpy.QtCore import QObject, Qt, Signal
    except ImportError:  # pragma: no cover - napari without a Qt binding
        return None

    class _Watcher(QObject):
        reported = Signal(object)

        def __init__(self) -> None:
            super().__init__()
            self._viewer = weakref.ref(viewer)
            self._slide = weakref.ref(slide)
            self._name = f"{slide.path.name} damaged tiles"
            self._owner = getattr(slide, "_owner", None)
            self._notified = False
            self.count = 0
            self.reported.connect(self._on_reported, Qt.ConnectionType.QueuedConnection)

        def _on_reported(self, tiles: list[Any]) -> None:
            viewer, slide = self._viewer(), self._slide()
            if viewer is None or slide is None:
                return
            self.count += len(tiles)
            if not self._notified:
                self._notified = True
                notify(slide, tiles, self._name)
            outline(viewer, slide, tiles, self._name, self._owner)

    watcher = _Watcher()
    slide._damage_watcher = watcher  # lives as long as the slide
    slide.damage.connect(watcher.reported.emit, replaces_warning=True)
    return watcher
