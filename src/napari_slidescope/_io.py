"""Writing files so that a reader sees the old file or the new one, never half of one.

Every file the project writes goes through :func:`atomic_write`: the data goes to a
temporary file in the destination folder, is flushed and fsynced, then renamed onto the
target with :func:`os.replace` (atomic on POSIX and Windows within one file system). A
process killed mid-write leaves the previous file, or no file, plus at most a stray
``.<name>.*.tmp`` next to it; never a truncated target.

A write that fails (a full disk, ENOSPC, shows at the latest when the data is flushed
or fsynced) raises ``OSError("cannot write PATH: CAUSE")`` with the original errno and
leaves the earlier file. A target that is a device or a pipe (``/dev/stdout``,
``/dev/full``) is written in place and its write errors are raised the same way; it is
never replaced by a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "atomic_copy", "is_writable_folder", "one_line"]


def one_line(exc: BaseException, *, typed: bool = False, limit: int | None = None) -> str:
    """Say what went wrong in one line: an exception's message (and notes), spaces collapsed.

    Parameters
    ----------
    exc : BaseException
        The exception.
    typed : bool
        Start with the exception's type and add its notes (``"ValueError: bad value
        note"``), for logs and failure records; else the message alone (its type when it
        has none), for a user who reads what to do.
    limit : int, optional
        Longest text; a longer one is cut and ends with ``"…"``.

    Examples
    --------
    >>> one_line(ValueError("a   b "))
    'a b'
    >>> one_line(KeyError(), typed=False)
    'KeyError'
    >>> one_line(OSError("disk full"), typed=True)
    'OSError: disk full'
    """
    if typed:
        text = " ".join([f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", [])])
    else:
        text = str(exc)
    text = " ".join(text.split()) or type(exc).__name__
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _folder_error(folder: Path, exc: OSError) -> OSError:
    if not folder.exists():
        reason = "the folder does not exist"
    elif not folder.is_dir():
        reason = "it is not a folder"
    elif not os.access(folder, os.W_OK):
        reason = "the folder is not writable"
    else:
        reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"cannot write into {folder}: {reason}")


def is_writable_folder(folder: str | os.PathLike[str]) -> bool:
    """Return whether a file can be created in `folder` now.

    The permission bits (:func:`os.access`) answer for most folders, but not all: root
    passes them everywhere, and a read-only network share, an ACL or a folder such as
    ``/proc`` may refuse a file the bits allow. So a folder that passes them is probed by
    creating (and removing) an empty hidden file in it.

    Parameters
    ----------
    folder : str or PathLike
        The folder to check.

    Returns
    -------
    bool
        False when `folder` is missing, not a folder, or refuses a new file.

    Examples
    --------
    >>> import tempfile
    >>> is_writable_folder(tempfile.gettempdir())
    True
    >>> is_writable_folder("/no/such/folder")
    False
    """
    path = Path(folder)
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        return False
    try:
        _probe_write(path)
    except OSError:
        return False
    return True


def _probe_write(folder: Path) -> None:
    """Create and remove an empty hidden file in `folder` (raises OSError when refused)."""
    fd, tmp = _create_temp(folder, "slidescope-probe")
    os.close(fd)
    tmp.unlink()


#: errno values that mean "the data could not be stored" (a full or failing disk).
_WRITE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EFBIG", "EIO", "EROFS")
    if hasattr(errno, name)
)


def write_error(path: str | os.PathLike[str], exc: OSError) -> OSError:
    """Return `exc` restated as ``cannot write PATH: CAUSE`` (same type and errno)."""
    cause = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno == errno.ENOSPC:
        cause = f"{cause} (the disk is full)"
    new = type(exc)(exc.errno, f"cannot write {os.fspath(path)}: {cause}")
    return new


def _create_temp(folder: Path, name: str) -> tuple[int, Path]:
    """Create ``.<name>.<random>.tmp`` exclusively, mode 0666 less the umask (as open())."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file in {folder}")


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "wb",
    *,
    encoding: str | None = None,
    newline: str | None = None,
) -> Iterator[IO[Any]]:
    """Open a temporary file beside `path`; on success move it onto `path` atomically.

    Parameters
    ----------
    path : str or PathLike
        The file to (re)write.
    mode : {"wb", "w"}
        Binary or text mode.
    encoding, newline : str, optional
        As for :func:`open` in text mode (``encoding`` defaults to UTF-8).

    Yields
    ------
    file object
        Write to it; when the ``with`` block ends without an exception the data is
        flushed, fsynced and renamed onto `path`. On an exception the temporary file
        is removed and `path` is left as it was.

    Raises
    ------
    FileNotFoundError, PermissionError, OSError
        If the destination folder is missing, not a folder or not writable; the
        message names the folder. If the data cannot be stored (a full disk, ENOSPC; an
        I/O error): ``cannot write PATH: CAUSE``, the temporary file removed and an
        earlier file at `path` left as it was.
    IsADirectoryError
        If `path` is a folder.
    ValueError
        If `mode` is not ``"wb"`` or ``"w"``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_write(target, "w") as fh:
    ...     _ = fh.write("hello")
    >>> target.read_text()
    'hello'
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode: expected 'wb' or 'w', got {mode!r}")
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        st = os.stat(target)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {target}: it is a folder")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # a device or pipe (/dev/stdout, /dev/full): written in place, never replaced by
        # a regular file; its errors are the write's
        with _stream(target, mode, encoding, newline) as stream:
            yield stream
        return
    try:
        fd, tmp = _create_temp(folder, target.name)
    except OSError as exc:
        raise _folder_error(folder, exc) from exc
    try:
        # open() by name with the descriptor already made, so fh.name is the path
        if mode == "wb":
            fh: IO[Any] = open(tmp, "wb", opener=lambda _p, _f: fd)
        else:
            fh = open(
                tmp, "w", encoding=encoding or "utf-8", newline=newline, opener=lambda _p, _f: fd
            )
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in _WRITE_ERRNOS or _is_ours(exc, tmp):
            raise write_error(target, exc) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


def _is_ours(exc: OSError, tmp: Path) -> bool:
    """Return True when `exc` names the temporary file (an error of the write itself)."""
    return exc.filename is not None and os.fspath(exc.filename) == os.fspath(tmp)


@contextlib.contextmanager
def _stream(
    target: Path, mode: str, encoding: str | None, newline: str | None
) -> Iterator[IO[Any]]:
    try:
        if mode == "wb":
            fh: IO[Any] = open(target, "wb")  # noqa: SIM115
        else:
            fh = open(target, "w", encoding=encoding or "utf-8", newline=newline)  # noqa: SIM115
    except OSError as exc:
        raise write_error(target, exc) from exc
    try:
        with fh:
            yield fh
            fh.flush()
            try:
                os.fsync(fh.fileno())
            except OSError as exc:  # devices and pipes cannot be synced: nothing to keep
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                    raise
    except OSError as exc:
        raise write_error(target, exc) from exc


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable where the platform allows opening a folder."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy the file `src` onto `dst` through :func:`atomic_write`; return `dst`.

    Parameters
    ----------
    src, dst : str or PathLike
        Source file and destination file.

    Returns
    -------
    Path
    """
    import shutil

    with open(src, "rb") as fin, atomic_write(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return Path(dst)
