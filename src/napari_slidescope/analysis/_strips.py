"""Row strips of a whole-slide image, worked on by a few threads.

A working image of tissue detection holds 10-20 Mpx; every step over it is a numpy or
scipy pass that releases the GIL, so the image's row strips can be worked on by two
or more cores at once. The strips are a fixed partition of the rows (their size does
not depend on the number of threads), so a reduction summed strip by strip gives the
same bits on every machine.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["WORKERS", "map_parallel", "row_strips", "submit"]

T = TypeVar("T")
R = TypeVar("R")

#: Threads the strips are worked on by (the cores, at most four: the passes are
#: memory-bound past that).
WORKERS = max(1, min(4, os.cpu_count() or 1))
#: Pixels per strip: small enough to spread over the threads, large enough that numpy's
#: per-call cost is a small part of a pass.
STRIP_PIXELS = 1 << 18

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there, start anew."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="slidescope-strips")
        return _pool


def row_strips(rows: int, cols: int, pixels: int | None = None) -> list[slice]:
    """Slices of ``range(rows)`` of about `pixels` pixels each (a fixed partition).

    `pixels` defaults to :data:`STRIP_PIXELS`.
    """
    step = max(1, (STRIP_PIXELS if pixels is None else pixels) // max(cols, 1))
    return [slice(y, min(y + step, rows)) for y in range(0, rows, step)]


def map_parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, the items on :data:`WORKERS` threads.

    `fn` must not wait on other work of this pool (the pool is shared and bounded).
    """
    items = list(items)
    if WORKERS == 1 or len(items) < 2:
        return [fn(item) for item in items]
    return list(_executor().map(fn, items))


def submit(fn: Callable[[], R]) -> Future[R]:
    """Run `fn` on the pool (to overlap it with work on the calling thread)."""
    return _executor().submit(fn)
