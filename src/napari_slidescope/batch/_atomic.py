"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_path", "atomic_write", "write_bytes_atomic", "write_text_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``.

    Whatever the block writes to the temporary path is flushed to disk (``fsync``)
    and renamed onto ``path`` (``os.replace``, atomic on POSIX and Windows); on an
    exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    # a fresh name (not mkstemp: its file would keep mode 0600 after the rename)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """``open(path, mode)`` that writes to a temporary file renamed onto ``path`` on success."""
    if "r" in mode or "a" in mode or "+" in mode:
        raise ValueError(f"mode: expected a write mode ('w', 'wb'), got {mode!r}")
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as fh:
        yield fh


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a text file atomically (UTF-8)."""
    with atomic_write(path, "w") as fh:
        fh.write(text)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a binary file atomically."""
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
