"""Progress callbacks: one record, :class:`Progress`, handed to every ``progress`` callable.

A long run reports where it stands by calling ``progress(record)`` with one argument: a
frozen record with ``done`` and ``total`` (:class:`Progress`;
:func:`~napari_slidescope.batch.analyze_slides` hands a
:class:`~napari_slidescope.batch.BatchProgress`, which says more). Callbacks written for
the former two-argument form, ``progress(done, total)``, keep working:
:func:`progress_caller` sees from a callable's signature which form it takes.

Examples
--------
>>> seen = []
>>> call = progress_caller(seen.append)
>>> call(3, 8)
>>> seen
[Progress(done=3, total=8)]
>>> call = progress_caller(lambda done, total: seen.append(done / total))
>>> call(4, 8)
>>> seen[-1]
0.5
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Progress", "ProgressCallback", "progress_caller"]


@dataclass(frozen=True)
class Progress:
    """Where a run stands: the argument of a ``progress`` callback.

    Attributes
    ----------
    done : int
        Units finished (tiles for :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`).
    total : int
        Units to do; 0 when there is nothing to do.
    """

    done: int
    total: int

    @property
    def fraction(self) -> float:
        """``done / total`` in [0, 1] (1.0 when there is nothing to do)."""
        return 1.0 if self.total <= 0 else min(1.0, self.done / self.total)


#: A progress callback: called with one :class:`Progress` (or a record that says more).
ProgressCallback = Callable[[Progress], Any]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _two_arguments(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a two-argument ``progress(done, total)`` callback (the former form).

    Two required positional parameters, or none but ``*args`` (``print``), as those were
    called before :class:`Progress`; anything else takes the record.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the record
        return False
    required = [p for p in params if p.kind in _POSITIONAL and p.default is p.empty]
    star = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    return len(required) >= 2 or (not required and star)


def progress_caller(
    progress: Callable[..., Any] | None,
) -> Callable[[int, int], None] | None:
    """Return ``call(done, total)`` that calls `progress` in the form it takes, or None.

    Parameters
    ----------
    progress : callable or None
        ``progress(Progress)`` (the library's form), or ``progress(done, total)``.

    Raises
    ------
    TypeError
        If `progress` is neither None nor callable.
    """
    if progress is None:
        return None
    if not callable(progress):
        raise TypeError(f"progress: expected a callable or None, got {progress!r}")
    two = _two_arguments(progress)

    def call(done: int, total: int) -> None:
        if two:
            progress(done, total)
        else:
            progress(Progress(done, total))

    return call
