"""Cancelling a run: a ``threading.Event`` passed as ``cancel=`` and checked at every stage.

Tissue detection checks it between the strips it reads and between its analysis steps,
the nuclei set-up between tissue detection, each sample tile it reads and the
segmenter's preparation, and the tiled runner while it waits for the next finished tile.
A set event makes the run raise :class:`Cancelled` within a fraction of a second of the
check it reaches; tiles already yielded stay with the caller.
"""

from __future__ import annotations

import threading

from napari_slidescope.errors import Cancelled

__all__ = ["Cancelled", "check_cancel"]


def check_cancel(cancel: threading.Event | None, stage: str) -> None:
    """Raise :class:`Cancelled` when `cancel` is set.

    Parameters
    ----------
    cancel : threading.Event or None
        The run's cancel flag; None never cancels.
    stage : str
        Named in the exception.

    Raises
    ------
    Cancelled
    """
    if cancel is not None and cancel.is_set():
        raise Cancelled(stage)
