"""A dock's connections to events that outlive it (the viewer's, the session's).

The viewer, its layer list and camera, and the analysis session live as long as the
viewer; a dock may be closed long before. A slot of a dock whose Qt widgets are gone
touches deleted objects (``RuntimeError: wrapped C/C++ object ... has been deleted``
inside the viewer's event). :func:`attach` connects a dock's slots and disconnects them
when the dock's Qt object is destroyed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from qtpy.QtCore import QObject

__all__ = ["attach"]

Slot = Callable[..., Any]


def attach(
    owner: QObject,
    connections: Sequence[tuple[Any, Slot]],
    *,
    callbacks: Sequence[tuple[list[Any], Slot]] = (),
) -> None:
    """Connect each ``(signal, slot)`` and add each ``(list, callback)`` until `owner` is gone.

    Parameters
    ----------
    owner : QObject
        The dock's Qt object; when it is destroyed every connection is undone.
    connections : sequence of (signal, slot)
        psygnal or napari event emitters (``.connect`` / ``.disconnect``) and their slots.
    callbacks : sequence of (list, callable)
        Callback lists the viewer calls (``viewer.mouse_drag_callbacks``) and the
        callable each gets appended.
    """
    pairs = list(connections)
    added = list(callbacks)
    for signal, slot in pairs:
        signal.connect(slot)
    for registry, callback in added:
        registry.append(callback)

    def detach(*_: Any) -> None:
        for signal, slot in pairs:
            with contextlib.suppress(TypeError, ValueError, RuntimeError):
                signal.disconnect(slot)
        for registry, callback in added:
            with contextlib.suppress(ValueError):
                registry.remove(callback)

    owner.destroyed.connect(detach)
