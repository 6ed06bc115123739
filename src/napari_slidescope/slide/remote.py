"""Reading a slide's bytes over a network: few round trips, bounded time, clear errors.

:class:`RemoteFile` is the seekable file object tifffile parses a remote TIFF through, and
the fetcher the level readers take tile bytes from:

* Opening costs one round trip for the size, the first :data:`HEAD_BYTES` and the last
  :data:`TAIL_BYTES` (a suffix range; all three asked for concurrently), where most
  writers put the directories and tag values; header reads outside them fetch
  :data:`BLOCK_BYTES`-aligned blocks, kept in a small cache; :meth:`RemoteFile.prefetch`
  fetches many header ranges (tile offset tables) at once.
* :meth:`RemoteFile.cat_ranges` fetches many byte ranges (a viewport's tiles) in one
  concurrent burst, merging ranges that touch or nearly touch.
* Every request runs under a timeout; transient failures (refused or dropped connection,
  a body cut short, a stall past the timeout, HTTP 429 / 5xx) are retried with
  exponential backoff, a bounded number of times: every request is a read, so idempotent.
  A stall is retried only once the server has answered this file: a server that accepts
  connections and never answers fails within one timeout, not (retries + 1) of them.
  Anything else (403, 404, ...) fails at once. Every failure is a :class:`SlideError`
  naming the URL without credentials and the problem: no tile is ever made up.
* The object's ETag at open is remembered; over http(s) and s3 every later ranged read
  asks for it (``If-Match``, unless the ETag is weak) and checks the answer's, so an
  object replaced while the slide is open is a :class:`SlideError` ("changed on the
  server since it was opened"), never a mix of two files' bytes.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _dicomweb, _tiff
from napari_slidescope.slide._network import (
    BACKOFF,
    CHANGED,
    CONCURRENCY,
    RETRIES_ENV,
    TIMEOUT_ENV,
    Failure,
    classify,
    default_retries,
    default_timeout,
)
from napari_slidescope.slide.source import DICOMWEB_SCHEMES, Source

__all__ = [
    "BLOCK_BYTES",
    "HEAD_BYTES",
    "RETRIES_ENV",
    "TIMEOUT_ENV",
    "RemoteFile",
    "default_retries",
    "stat_remote",
    "default_timeout",
]

#: Bytes asked for with the size when a remote slide is opened: the TIFF header, the first
#: IFDs and, in most slides, their descriptions and small tag values.
HEAD_BYTES = 1 * 2**20
#: Bytes at the end of the object fetched with the first header read past the head.
TAIL_BYTES = 256 * 2**10
#: Header reads outside what is cached fetch aligned blocks of this size.
BLOCK_BYTES = 512 * 2**10
#: Bound of the header block cache of one open remote file.
CACHE_BYTES = 64 * 2**20
#: Ranges closer than this are fetched as one request (the gap is read and dropped).
MERGE_GAP = 4 * 2**10
#: A merged request is not grown past this many bytes.
MERGE_MAX = 8 * 2**20


def _same_etag(a: str, b: str) -> bool:
    """Weak comparison of two ETags (``W/"x"`` and ``"x"`` are the same)."""
    return a.removeprefix("W/").strip() == b.removeprefix("W/").strip()


class RemoteFile:
    """A read-only, seekable file over an fsspec URL (what tifffile parses), and a fetcher.

    Parameters
    ----------
    source : Source
        A remote source (see :func:`napari_slidescope.slide.source.resolve`).
    timeout : float, optional
        Seconds one request may take; default :func:`default_timeout`.
    retries : int, optional
        Retries of a transient failure; default :func:`default_retries`.

    Raises
    ------
    SlideError
        Naming the URL without credentials and the problem, when the object cannot be
        found, read or reached.
    """

    mode = "rb"

    def __init__(
        self,
        source: Source,
        *,
        timeout: float | None = None,
        retries: int | None = None,
        head: bool = True,
    ) -> None:
        self.source = source
        self.display = source.display
        self.name = source.name
        self.timeout = default_timeout() if timeout is None else float(timeout)
        if not self.timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        self.retries = default_retries() if retries is None else int(retries)
        self._fs, self._path = source.filesystem()
        self._async = bool(getattr(self._fs, "async_impl", False))
        self._pool: ThreadPoolExecutor | None = None
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._extents: list[tuple[int, bytes]] = []
        self._lock = threading.RLock()
        self._pos = 0
        self.closed = False
        self.requests = 0
        #: Whether any request to this file has been answered (a stall is retried only then).
        self._answered = False
        #: The ETag the object had when opened: every later read must find the same one
        #: (asked with If-Match and checked in the answer, over http(s) and s3).
        self._etag: str | None = None
        self._seen: list[str] = []  # ETags of the answers to the opening round
        self._wanted: list[tuple[int, int]] = []  # header ranges to fetch with the next round
        self._native = (
            self._fs.protocol
            if isinstance(self._fs.protocol, str)
            else (self._fs.protocol[0] if self._fs.protocol else "")
        )
        calls: list[Callable[[], Any]] = [lambda: self._info()]
        if head:
            calls.append(lambda: self._cat(0, HEAD_BYTES))
            if self._async:  # a suffix range: the size is not known yet
                calls.append(lambda: self._suffix(TAIL_BYTES))
        info, first, last = (*self._run(calls), b"", b"")[:3]
        if info.get("type") == "directory":
            if head:
                raise SlideError(self.display, "is a folder, not a slide file")
            self.size, self.stamp = 0, _stamp(info, 0)  # a folder-like slide (OME-Zarr...)
            return
        size = info.get("size")
        if size is None:  # the server gave no length: ask for it
            raise SlideError(self.display, "the server does not say the object's size")
        self.size = int(size)
        if head and len(first) < min(self.size, HEAD_BYTES):
            raise SlideError(
                self.display,
                f"the server sent {len(first):,} of the first {min(self.size, HEAD_BYTES):,} "
                "bytes: the connection was cut mid-response",
            )
        self.stamp = _stamp(info, self.size)
        # the ETag ranged answers carry (some servers' HEAD answers differ in form); two
        # answers of the opening round that disagree: the object changed meanwhile
        seen = [t for t in self._seen if t]
        self._seen.clear()
        if any(not _same_etag(t, seen[0]) for t in seen):
            raise SlideError(self.display, "changed on the server while it was being opened")
        self._etag = seen[0] if seen else self.stamp["etag"]
        self._extents.append((0, bytes(first)))
        if last:
            if len(last) > min(self.size, TAIL_BYTES):
                raise SlideError(
                    self.display,
                    "the server ignores byte-range requests (it sent the whole object); "
                    "slides need a server that answers Range requests",
                )
            self._extents.append((self.size - len(last), bytes(last)))
        # the first header read past the head also fetches the tail, where many writers
        # put the last directories (macro, label) and their tag values
        self._tail = [
            b
            for b in range(
                max(HEAD_BYTES, self.size - TAIL_BYTES) // BLOCK_BYTES, -(-self.size // BLOCK_BYTES)
            )
            if b * BLOCK_BYTES >= HEAD_BYTES and not last
        ]

    # -- concurrency ------------------------------------------------------------------------

    def _run(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run fetch thunks concurrently with retries; return their results in order."""
        if self._async:
            from fsspec.asyn import sync

            return list(sync(self._fs.loop, self._gather, calls))
        if len(calls) == 1:
            return [self._retry_sync(calls[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(min(CONCURRENCY, 8))
        return list(self._pool.map(self._retry_sync, calls))

    async def _gather(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(call: Callable[[], Any]) -> Any:
            async with gate:
                return await self._retry_async(call)

        return list(await asyncio.gather(*(one(c) for c in calls)))

    async def _retry_async(self, call: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            try:
                self.requests += 1
                result = await asyncio.wait_for(call(), self.timeout)
                self._answered = True
                return result
            except Exception as exc:  # classified below
                failure = classify(exc, self.timeout)
                if not self._worth_retrying(failure, attempt):
                    raise self._error(failure, attempt) from exc
            await asyncio.sleep(BACKOFF * 2**attempt)
            attempt += 1

    def _retry_sync(self, call: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            try:
                self.requests += 1
                result = call()
                self._answered = True
                return result
            except Exception as exc:  # classified below
                failure = classify(exc, self.timeout)
                if not self._worth_retrying(failure, attempt):
                    raise self._error(failure, attempt) from exc
            time.sleep(BACKOFF * 2**attempt)
            attempt += 1

    def _worth_retrying(self, failure: Failure, attempt: int) -> bool:
        """Transient failures are retried; a stall only once the server has answered.

        A server that accepts connections and never answers (hung, or not the server meant)
        would otherwise hold the caller for (retries + 1) timeouts: two minutes by default.
        """
        if not failure.transient or attempt >= self.retries:
            return False
        return self._answered or not failure.stall

    def _error(self, failure: Failure, retried: int) -> SlideError:
        if failure.stall and not self._answered:
            return SlideError(
                self.display,
                self.source.scrub(failure.problem)
                + f"; the server has not answered (`timeout=` or ${TIMEOUT_ENV} allows more)",
            )
        tries = f" (after {retried + 1} attempts)" if retried else ""
        return SlideError(self.display, self.source.scrub(failure.problem) + tries)

    # -- requests (each returns an awaitable on async filesystems) --------------------------

    def _info(self) -> Any:
        if self._async:
            return self._fs._info(self._path)
        return self._fs.info(self._path)

    def _cat(self, start: int, end: int) -> Any:
        if self._async:

            async def get() -> bytes:
                data = await self._ranged(f"bytes={start}-{end - 1}", start, end)
                return self._checked(data, start, end)

            return get()
        return self._checked(self._fs.cat_file(self._path, start=start, end=end), start, end)

    def _suffix(self, n: int) -> Any:
        """Ask for the last `n` bytes (fewer when the object is smaller) as a suffix range."""

        async def get() -> bytes:
            return bytes(await self._ranged(f"bytes=-{n}", -n, None))

        return get()

    async def _ranged(self, spec: str, start: int, end: int | None) -> bytes:
        """GET one byte range; over http(s) and s3 the answer must carry the opened ETag."""
        if self._native in ("http", "https"):
            return await self._ranged_http(spec)
        if self._native in ("s3", "s3a"):
            return await self._ranged_s3(spec)
        return bytes(await self._fs._cat_file(self._path, start=start, end=end))

    def _check_etag(self, got: Any) -> None:
        if not got:
            return
        got = str(got)
        if self._etag is None:
            self._seen.append(got)  # the opening round: compared once the size is known
        elif not _same_etag(got, self._etag):
            raise Failure(CHANGED, False)

    async def _ranged_http(self, spec: str) -> bytes:
        fs = self._fs
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        headers["Range"] = spec
        if self._etag and not self._etag.startswith("W/"):  # If-Match compares strongly
            headers["If-Match"] = self._etag
        session = await fs.set_session()
        async with session.get(fs.encode_url(self._path), headers=headers, **kw) as r:
            if r.status == 412:
                raise Failure(CHANGED, False)
            fs._raise_not_found_for_status(r, self._path)
            self._check_etag(r.headers.get("ETag"))
            return bytes(await r.read())

    async def _ranged_s3(self, spec: str) -> bytes:
        fs = self._fs
        bucket, key, version = fs.split_path(self._path)
        kw: dict[str, Any] = {**getattr(fs, "req_kw", {}), "Bucket": bucket, "Key": key}
        kw["Range"] = spec
        if version:
            kw["VersionId"] = version
        if self._etag:
            kw["IfMatch"] = self._etag
        resp = await fs._call_s3("get_object", **kw)
        try:
            self._check_etag(resp.get("ETag"))
            return bytes(await resp["Body"].read())
        finally:
            resp["Body"].close()

    def _checked(self, data: bytes, start: int, end: int) -> bytes:
        size = getattr(self, "size", None)
        want = end - start if size is None else max(0, min(end, size) - start)
        if len(data) < want and (size is not None or start > 0):
            raise Failure(
                f"the server sent {len(data):,} of the {want:,} bytes asked for at byte "
                f"{start:,}: the connection was cut mid-response",
                True,
            )
        if len(data) > end - start:  # a server that ignored the Range header
            raise Failure(
                "the server ignores byte-range requests (it sent the whole object); "
                "slides need a server that answers Range requests",
                False,
            )
        return bytes(data)

    # -- ranges -----------------------------------------------------------------------------

    def cat_ranges(self, offsets: Sequence[int], counts: Sequence[int]) -> list[bytes]:
        """Fetch many byte ranges at once (adjacent ones merged); one bytes per range.

        Ranges are clipped to the object; a zero count gives ``b""``.

        Raises
        ------
        SlideError
            When a range cannot be fetched after the retries the failure allows.
        """
        wanted = sorted(
            (int(o), int(o) + int(c), i)
            for i, (o, c) in enumerate(zip(offsets, counts, strict=True))
            if c > 0
        )
        out = [b""] * len(offsets)
        groups: list[tuple[int, int, list[tuple[int, int, int]]]] = []
        for start, end, i in wanted:
            end = min(end, self.size)
            if start >= end:
                continue
            if groups and start - groups[-1][1] <= MERGE_GAP and end - groups[-1][0] <= MERGE_MAX:
                g0, g1, members = groups[-1]
                members.append((start, end, i))
                groups[-1] = (g0, max(g1, end), members)
            else:
                groups.append((start, end, [(start, end, i)]))
        if not groups:
            return out
        datas = self._run([functools.partial(self._cat, g0, g1) for g0, g1, _ in groups])
        for (g0, _, members), data in zip(groups, datas, strict=True):
            view = memoryview(data)
            for start, end, i in members:
                out[i] = bytes(view[start - g0 : end - g0])
        return out

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Bring the header blocks covering `ranges` (offset, count) into the cache at once."""
        need: set[int] = set()
        for offset, count in ranges:
            if count <= 0 or self._cached(offset, offset + count) is not None:
                continue
            first, last = offset // BLOCK_BYTES, (min(offset + count, self.size) - 1) // BLOCK_BYTES
            need.update(b for b in range(first, last + 1) if b not in self._blocks)
        self._fetch_blocks(sorted(need))

    def _fetch_blocks(self, blocks: list[int]) -> None:
        if not blocks:
            return
        runs: list[list[int]] = []
        for b in blocks:
            if runs and b == runs[-1][-1] + 1 and len(runs[-1]) * BLOCK_BYTES < MERGE_MAX:
                runs[-1].append(b)
            else:
                runs.append([b])
        starts = [r[0] * BLOCK_BYTES for r in runs]
        ends = [min((r[-1] + 1) * BLOCK_BYTES, self.size) for r in runs]
        datas = self.cat_ranges(starts, [e - s for s, e in zip(starts, ends, strict=True)])
        with self._lock:
            for run, data in zip(runs, datas, strict=True):
                for k, b in enumerate(run):
                    self._blocks[b] = data[k * BLOCK_BYTES : (k + 1) * BLOCK_BYTES]
                    self._blocks.move_to_end(b)
            while len(self._blocks) * BLOCK_BYTES > CACHE_BYTES:
                self._blocks.popitem(last=False)

    def want(self, offset: int, count: int) -> None:
        """Note a header range needed later (a tile offset table the IFD walk found).

        It is fetched with the next header read that misses the cache, in the same round
        of requests, instead of a round of its own after the walk.
        """
        if count > 0 and self._cached(offset, offset + count) is None:
            with self._lock:
                self._wanted.append((offset, count))

    def _wanted_blocks(self) -> set[int]:
        """Blocks of the wanted ranges not cached yet (the list is emptied), within a budget."""
        out: set[int] = set()
        for offset, count in self._wanted:
            first = offset // BLOCK_BYTES
            last = (min(offset + count, self.size) - 1) // BLOCK_BYTES
            more = {b for b in range(first, last + 1) if b not in self._blocks}
            if (len(out) + len(more)) * BLOCK_BYTES > CACHE_BYTES // 2:
                break  # the rest waits for prefetch()
            out |= more
        self._wanted = []
        return out

    def _cached(self, start: int, end: int) -> bytes | None:
        for e0, data in self._extents:
            if e0 <= start and end <= e0 + len(data):
                return data[start - e0 : end - e0]
        return None

    def pread(self, offset: int, n: int) -> bytes:
        """Return up to `n` bytes at `offset` (fewer at the end of the object)."""
        end = min(offset + max(n, 0), self.size)
        if offset >= end:
            return b""
        hit = self._cached(offset, end)
        if hit is not None:
            return hit
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        with self._lock:
            missing = [b for b in range(first, last + 1) if b not in self._blocks]
            if missing and self._tail:
                missing = sorted(set(missing) | {b for b in self._tail if b not in self._blocks})
                self._tail = []
            if missing and self._wanted:
                missing = sorted(set(missing) | self._wanted_blocks())
        self._fetch_blocks(missing)
        with self._lock:
            parts = []
            for b in range(first, last + 1):
                block = self._blocks.get(b)
                if block is None:  # evicted meanwhile by a huge read: fetch again
                    self._fetch_blocks([b])
                    block = self._blocks[b]
                self._blocks.move_to_end(b)
                parts.append(block)
        data = b"".join(parts)
        return data[offset - first * BLOCK_BYTES : end - first * BLOCK_BYTES]

    # -- the file protocol tifffile uses ------------------------------------------------------

    def read(self, n: int = -1) -> bytes:
        """Read `n` bytes (all to the end when negative) from the current position."""
        with self._lock:
            if n is None or n < 0:
                n = self.size - self._pos
            data = self.pread(self._pos, n)
            self._pos += len(data)
            return data

    def readinto(self, buffer: Any) -> int:
        """Read into a writable buffer; return the number of bytes read."""
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move the position (``whence`` 0: start, 1: current, 2: end)."""
        with self._lock:
            base = {0: 0, 1: self._pos, 2: self.size}[whence]
            self._pos = max(0, base + int(offset))
            return self._pos

    def tell(self) -> int:
        """Return the current position."""
        return self._pos

    def seekable(self) -> bool:
        """Return True: the file is seekable."""
        return True

    def readable(self) -> bool:
        """Return True: the file is readable."""
        return True

    def close(self) -> None:
        """Drop the cached blocks (the fsspec filesystem stays, shared by fsspec)."""
        self.closed = True
        with self._lock:
            self._blocks.clear()
            self._extents.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __repr__(self) -> str:
        return f"<RemoteFile {self.display} {getattr(self, 'size', '?')} bytes>"


def stat_remote(
    source: Source, *, timeout: float | None = None, retries: int | None = None
) -> dict[str, Any]:
    """Ask the store about an object: ``size``, ``etag``, ``version_id``, ``last_modified``.

    A folder (an OME-Zarr or DICOM prefix) gives size 0 and what the store says of it; a
    DICOMweb series size 0 and a hash of its instance UIDs as ``etag``.
    One request (with the timeout and retries of :class:`RemoteFile`); what the store
    does not say is None.

    Raises
    ------
    SlideError
        As :class:`RemoteFile`.
    """
    if source.protocol in DICOMWEB_SCHEMES:  # a DICOMweb series: its instance UIDs
        seconds = default_timeout() if timeout is None else float(timeout)
        tries = default_retries() if retries is None else int(retries)
        try:
            return _dicomweb.stamp(source, timeout=seconds, retries=tries)
        except SlideError:
            raise
        except Exception as exc:
            problem = classify(exc, seconds).problem
            if problem.startswith("cannot be read ("):
                problem = f"cannot be read ({_tiff.describe_exception(exc)})"
            raise SlideError(source.display, source.scrub(problem)) from exc
    remote = RemoteFile(source, timeout=timeout, retries=retries, head=False)
    remote.close()
    return remote.stamp


def _stamp(info: dict[str, Any], size: int) -> dict[str, Any]:
    """Return what identifies the object's content, from what the store says about it."""
    etag = info.get("ETag") or info.get("etag")
    version = info.get("VersionId") or info.get("version_id") or info.get("generation")
    modified = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
    headers = info.get("headers") or {}
    if isinstance(headers, dict):
        low = {str(k).lower(): v for k, v in headers.items()}
        etag = etag or low.get("etag")
        modified = modified or low.get("last-modified")
    return {
        "size": size,
        "etag": None if etag is None else str(etag),
        "version_id": None if version is None else str(version),
        "last_modified": None if modified is None else str(modified),
    }
