"""Reading pyramid levels fast however many chunks a level has.

napari shows a level by slicing its dask array to the visible box and calling
``np.asarray`` on the slice. A plain ``da.from_array`` level walks its whole task graph on
every such call (about 1 s for a level of a million chunks) and decodes through one zarr
request per native chunk. Here instead :class:`LevelReader` turns a box of level pixels
into the native chunks (tiles, strips, NDPI restart bands) it touches, takes the ones it
can from the shared decoded-tile cache (:mod:`napari_slidescope.slide.cache`), decodes the
others with the adapter in :mod:`napari_slidescope.slide._tiff` (on a small module-level
thread pool), and copies only the requested pixels out.

A slide keeps one reader per level; its dask arrays
(:mod:`napari_slidescope.slide._dask_levels`) are built over the readers the first time
``Slide.levels`` is used, so that opening a slide and reading it through the readers
(tissue detection, ``read_region``) never imports dask.array.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from napari_slidescope.errors import SlideError, SlidescopeWarning
from napari_slidescope.slide import _tiff
from napari_slidescope.slide.cache import tile_cache

if TYPE_CHECKING:
    import tifffile

OnError = Literal["raise", "blank"]
#: One half-open ``(start, stop)`` range per array axis (not the project's 2-D `_types.Box`).
AxisRanges = tuple[tuple[int, int], ...]

#: Native chunks decoded per raw read (bounds the compressed bytes held at once).
_BATCH = 64

#: Fewest missing native chunks a parallel read hands to the thread pool: below that, the
#: hand-off costs about what it saves, and a pool thread the scheduler preempts mid-batch
#: on a busy machine stalls the read (a pan step of 5 new 256 px tiles read 1.65 ms on the
#: pool, 1.43 ms on the calling thread alone, load 13 on 2 cores).
_MIN_PARALLEL = 8

#: Most native chunks whose compressed bytes one remote read fetches at once (larger reads
#: fetch batch by batch, each batch's chunks at once).
_BURST = 1024

_POOL_PREFIX = "slidescope-decode"
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def decode_workers() -> int:
    """Threads used to decode one viewport: the CPUs this process may use, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(decode_workers(), thread_name_prefix=_POOL_PREFIX)
    return _pool


_uid_lock = threading.Lock()
_uid = itertools.count(1)


def new_owner() -> int:
    """Return a fresh id that keys one open slide's entries in the tile cache."""
    with _uid_lock:
        return next(_uid)


#: A damaged native chunk shown blank: (level, ((row0, row1), (col0, col1))) in level px.
DamagedTile = tuple[int, tuple[tuple[int, int], tuple[int, int]]]
DamageListener = Callable[[list[DamagedTile]], None]


class DamageLog:
    """The native tiles of one open slide that were shown blank because they are damaged.

    Every :class:`LevelReader` of a slide opened with ``on_error="blank"`` reports here.
    The first report warns once for the whole file (a :class:`SlidescopeWarning` naming
    the file, the level and the tiles), unless a listener connected with
    ``replaces_warning=True`` (the napari reader's, which notifies in the viewer
    instead) takes the warning over; every report is passed to the listeners, from
    whatever thread decoded the tile.

    Parameters
    ----------
    path : str
        The file, for messages.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._tiles: dict[DamagedTile, str] = {}
        self._warned = False
        self._listeners: list[DamageListener] = []
        self._replaced = False

    def tiles(self) -> list[DamagedTile]:
        """Return every damaged tile shown blank so far, in the order they were met."""
        with self._lock:
            return list(self._tiles)

    def reasons(self) -> dict[DamagedTile, str]:
        """Return why each damaged tile could not be decoded."""
        with self._lock:
            return dict(self._tiles)

    def connect(self, listener: DamageListener, *, replaces_warning: bool = False) -> None:
        """Call `listener` with the new damaged tiles of every later report.

        The tiles already logged are passed to it at once. With `replaces_warning` the
        listener tells the user itself and the log no longer warns.
        """
        with self._lock:
            self._listeners.append(listener)
            self._replaced = self._replaced or replaces_warning
            known = list(self._tiles)
        if known:
            listener(known)

    def report(self, level: int, bad: list[tuple[DamagedTile, str]]) -> None:
        """Log damaged native chunks of `level` (their level-pixel boxes and reasons)."""
        new: list[DamagedTile] = []
        with self._lock:
            for key, reason in bad:
                if key not in self._tiles:
                    self._tiles[key] = reason
                    new.append(key)
            first = bool(new) and not self._warned
            self._warned = self._warned or first
            listeners, replaced = list(self._listeners), self._replaced
        if not new:
            return
        if first and not replaced:
            # no registry: the same file opened again warns again (warnings.warn would
            # stay silent for a message already shown from the same line)
            warnings.warn_explicit(
                damage_message(self.path, new, self.reasons()[new[0]]),
                SlidescopeWarning,
                __file__,
                DamageLog.report.__code__.co_firstlineno,
                module=__name__,
                registry=None,
            )
        for listener in listeners:
            listener(new)


def damage_message(path: str, tiles: list[DamagedTile], reason: str = "") -> str:
    """One sentence naming the file, the level and the first damaged tiles (and why)."""
    level = tiles[0][0]
    shown = ", ".join(
        f"rows {r0}:{r1} cols {c0}:{c1}" for lv, ((r0, r1), (c0, c1)) in tiles[:4] if lv == level
    )
    more = f" and {len(tiles) - 4} more" if len(tiles) > 4 else ""
    return (
        f"{path}: level {level}: damaged tile(s) ({shown}{more}) cannot be decoded"
        f"{reason} and are shown blank; they are not glass. Later damaged tiles of this "
        "file are not warned about again (Slide.damage lists them all)."
    )


class LevelReader:
    """Reads boxes of one level from its native chunks, through the shared tile cache.

    Parameters
    ----------
    source : NativeChunks
        The adapter's native-chunk reader of this level.
    path : str
        The file, for messages.
    level : int
        Level index, for messages and cache keys.
    on_error : {"raise", "blank"}
        A native chunk that fails to decode raises a :class:`SlideError` naming the file,
        level and pixels, or (``"blank"``) reads as zeros and is reported to `damage`
        (which warns once per file).
    owner : int
        Id of the open slide (see :func:`new_owner`).
    spatial : (int, int)
        Indices of the row and column axes.
    damage : DamageLog, optional
        Where damaged chunks shown blank are reported (a fresh log when None).
    """

    def __init__(
        self,
        source: _tiff.NativeChunks,
        *,
        path: str,
        level: int,
        on_error: OnError,
        owner: int,
        spatial: tuple[int, int] = (0, 1),
        damage: DamageLog | None = None,
    ) -> None:
        self._source = source
        self.shape: tuple[int, ...] = tuple(source.shape)
        self.dtype = np.dtype(source.dtype)
        self.ndim = len(self.shape)
        self.native: tuple[int, ...] = tuple(source.chunks)
        self._path, self._level, self._on_error = path, level, on_error
        self._key = (owner, level)
        self._spatial = self.spatial = spatial
        self.damage = damage if damage is not None else DamageLog(path)

    # dask's getter calls this for each chunk: decode on the calling (dask) thread
    def __getitem__(self, key: Any) -> np.ndarray:
        sel = _basic_selection(key, self.shape)
        if sel is None:  # strides, index arrays...: read their bounding box, let numpy index it
            hull, rel = _hull(key, self.shape)
            return np.asarray(self.read(hull, parallel=False)[rel])
        box, keep = sel
        out = self.read(box, parallel=False)
        if all(keep):
            return out
        return out.reshape(tuple(n for n, k in zip(out.shape, keep, strict=True) if k))

    def read(self, box: AxisRanges, *, parallel: bool) -> np.ndarray:
        """Return the pixels of `box` (one ``(start, stop)`` per axis, clipped to the level).

        Parameters
        ----------
        box : tuple of (int, int)
            Half-open pixel range of each axis.
        parallel : bool
            Decode missing native chunks on the module's thread pool as well as on the
            calling thread (when at least ``_MIN_PARALLEL`` are missing); False decodes on
            the calling thread only.
        """
        box = tuple(
            (min(max(a, 0), n), min(max(b, a, 0), n))
            for (a, b), n in zip(box, self.shape, strict=True)
        )
        out = np.empty(tuple(b - a for a, b in box), dtype=self.dtype)
        if out.size == 0:
            return out
        grid = [range(a // c, -(-b // c)) for (a, b), c in zip(box, self.native, strict=True)]
        cache = tile_cache()
        cached, missing = [], []
        for idx in itertools.product(*grid):
            chunk = cache.get((*self._key, idx))
            if chunk is None:
                missing.append(idx)
            else:
                cached.append((idx, chunk))
        # a remote file: every missing tile's bytes in one concurrent burst, then decoding
        raw = self._source.fetch(missing) if 1 < len(missing) <= _BURST else None
        fill = self._fill if raw is None else functools.partial(self._fill, raw=raw)
        workers = decode_workers() if parallel else 1
        if workers > 1 and len(missing) >= _MIN_PARALLEL and not _in_pool():
            # Work sharing: the caller and up to workers - 1 pool threads take small batches
            # from one queue, so a pool thread that gets no CPU (a busy machine) costs nothing.
            size = max(1, min(_BATCH, -(-len(missing) // (4 * workers))))
            job = _Job([missing[i : i + size] for i in range(0, len(missing), size)])
            pool = _get_pool()
            for _ in range(min(workers, len(job)) - 1):
                pool.submit(job.run, fill, out, box)
            for idx, chunk in cached:  # while the pool decodes
                self._paste(out, box, idx, chunk)
            job.run(fill, out, box)
            bad = job.wait()
        else:
            for idx, chunk in cached:
                self._paste(out, box, idx, chunk)
            bad = fill(out, box, missing) if missing else []
        if bad:
            self._warn_blank(bad)
        return out

    def _fill(
        self,
        out: np.ndarray,
        box: AxisRanges,
        indices: list[tuple[int, ...]],
        raw: dict[tuple[int, ...], bytes] | None = None,
    ) -> list[tuple[DamagedTile, str]]:
        """Decode `indices` into `out`; return the native chunks shown blank and why."""
        cache = tile_cache()
        bad: list[tuple[DamagedTile, str]] = []
        for start in range(0, len(indices), _BATCH):
            batch = indices[start : start + _BATCH]
            for idx, chunk in zip(batch, self._source.read(batch, raw), strict=True):
                if isinstance(chunk, BaseException):
                    chunk_box = self._chunk_box(idx)
                    where = _fmt(chunk_box)
                    reason = (
                        f": {chunk}"
                        if isinstance(chunk, _tiff.ChunkError)
                        else f" ({_tiff.describe_exception(chunk)})"
                    )
                    if self._on_error == "raise":
                        raise SlideError(
                            self._path, f"level {self._level}: cannot decode pixels {where}{reason}"
                        ) from chunk
                    yi, xi = self._spatial
                    bad.append(((self._level, (chunk_box[yi], chunk_box[xi])), reason))
                    chunk = np.zeros(
                        tuple(b - a for a, b in self._chunk_box(idx)), dtype=self.dtype
                    )
                else:
                    cache.put((*self._key, idx), chunk)
                self._paste(out, box, idx, chunk)
        return bad

    def _chunk_box(self, idx: tuple[int, ...]) -> AxisRanges:
        return tuple(
            (i * c, min((i + 1) * c, n))
            for i, c, n in zip(idx, self.native, self.shape, strict=True)
        )

    def _paste(
        self, out: np.ndarray, box: AxisRanges, idx: tuple[int, ...], chunk: np.ndarray
    ) -> None:
        dst, src = [], []
        for (a, b), i, c in zip(box, idx, self.native, strict=True):
            lo, hi = max(a, i * c), min(b, (i + 1) * c)
            dst.append(slice(lo - a, hi - a))
            src.append(slice(lo - i * c, hi - i * c))
        out[tuple(dst)] = chunk[tuple(src)]

    def _warn_blank(self, bad: list[tuple[DamagedTile, str]]) -> None:
        self.damage.report(self._level, bad)


class _Job:
    """A queue of batches of native chunks that several threads decode into one array."""

    def __init__(self, batches: list[list[tuple[int, ...]]]) -> None:
        self._batches = collections.deque(batches)
        self._cv = threading.Condition()
        self._busy = 0
        self._errors: list[BaseException] = []
        self._bad: list[tuple[DamagedTile, str]] = []

    def __len__(self) -> int:
        return len(self._batches)

    def run(self, fill: Any, out: np.ndarray, box: AxisRanges) -> None:
        """Decode batches until the queue is empty (or a batch failed)."""
        while True:
            with self._cv:
                if not self._batches or self._errors:
                    return
                batch = self._batches.popleft()
                self._busy += 1
            try:
                bad = fill(out, box, batch)
            except BaseException as exc:
                with self._cv:
                    self._errors.append(exc)
                    self._busy -= 1
                    self._cv.notify_all()
                return
            with self._cv:
                self._bad += bad
                self._busy -= 1
                self._cv.notify_all()

    def wait(self) -> list[tuple[DamagedTile, str]]:
        """Wait until no batch is left or in flight; raise the first error, else return blanks."""
        with self._cv:
            self._cv.wait_for(lambda: self._busy == 0 and (not self._batches or self._errors))
            if self._errors:
                raise self._errors[0]
            return self._bad


def _in_pool() -> bool:
    return threading.current_thread().name.startswith(_POOL_PREFIX)


def _fmt(box: AxisRanges) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _basic_selection(
    index: Any, shape: tuple[int, ...]
) -> tuple[AxisRanges, tuple[bool, ...]] | None:
    """Return (box, kept axes) for ints and step-1 slices, else None (dask handles it)."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        if sum(i is Ellipsis for i in index) > 1:
            return None
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(index) + 1)
        index = index[:at] + fill + index[at + 1 :]
    if len(index) > len(shape):
        return None
    index = index + (slice(None),) * (len(shape) - len(index))
    box, keep = [], []
    for i, n in zip(index, shape, strict=True):
        if isinstance(i, slice):
            if i.step not in (None, 1):
                return None
            a, b, _ = i.indices(n)
            if b <= a:
                return None
            box.append((a, b))
            keep.append(True)
        elif isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)):
            k = int(i)
            if not -n <= k < n:
                return None  # let dask raise its IndexError
            k %= n
            box.append((k, k + 1))
            keep.append(False)
        else:
            return None
    return tuple(box), tuple(keep)


def _hull(key: Any, shape: tuple[int, ...]) -> tuple[AxisRanges, tuple[Any, ...]]:
    """Return the bounding box of an index and the same index relative to that box."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1 :]
    key = key + (slice(None),) * (len(shape) - len(key))
    box: list[tuple[int, int]] = []
    rel: list[Any] = []
    for k, n in zip(key, shape, strict=True):
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            idx = range(start, stop, step)
            if len(idx) == 0:
                box.append((0, 0))
                rel.append(slice(0, 0))
            else:
                lo, hi = min(idx[0], idx[-1]), max(idx[0], idx[-1]) + 1
                box.append((lo, hi))
                end = idx[-1] - lo + (1 if step > 0 else -1)
                rel.append(slice(idx[0] - lo, end if end >= 0 else None, step))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k) % n if -n <= int(k) < n else int(k)
            box.append((i, i + 1))
            rel.append(0)
        else:
            arr = np.asarray(k)
            if arr.dtype.kind in "iu" and arr.size:
                arr = np.where(arr < 0, arr + n, arr)
                lo, hi = int(arr.min()), int(arr.max()) + 1
                box.append((lo, hi))
                rel.append(arr - lo)
            else:
                box.append((0, n))
                rel.append(k)
    return tuple(box), tuple(rel)


def level_reader(
    series_level: tifffile.TiffPageSeries | None,
    zarr_level: Callable[[], Any],
    axes: str,
    *,
    path: str,
    level: int,
    on_error: OnError,
    owner: int,
    fetch: _tiff.Fetch | None = None,
    damage: DamageLog | None = None,
    adapt: Callable[[_tiff.NativeChunks], _tiff.NativeChunks] | None = None,
) -> tuple[LevelReader, str]:
    """Return the reader of one TIFF level; drop singleton axes other than C, Y, X, S.

    Parameters
    ----------
    series_level : TiffPageSeries or None
        The tifffile level (for the direct decoder); None uses the zarr path only.
    zarr_level : callable
        Returns the level through the tifffile zarr store (called only for the zarr path).
    axes : str
        tifffile's axes of the level.
    fetch : callable, optional
        A remote file's ``cat_ranges``: a read fetches all its missing tiles at once.
    adapt : callable, optional
        Turns the stored level's native-chunk reader into the one shown (a BIF level
        stitched, :class:`~._bif.StitchedChunks`).

    Returns
    -------
    reader : LevelReader
    axes : str
        ``"YXS"``, ``"CYX"`` or ``"YX"``.
    """
    keep = [ax for ax in axes if ax in "CYXS"]
    if "Y" not in keep or "X" not in keep:
        raise SlideError(path, f"has no 2-D image plane (axes {axes!r})")
    out_axes = "".join(keep)
    if out_axes not in ("YXS", "CYX", "YX"):
        raise SlideError(path, f"has unsupported axes {axes!r}")
    shape = tuple(series_level.shape) if series_level is not None else zarr_level().shape
    if len(shape) != len(axes):  # tifffile's shape and axes disagree: ask zarr
        shape = zarr_level().shape
    extra = [ax for ax, n in zip(axes, shape, strict=True) if ax not in "CYXS" and n > 1]
    if extra:
        warnings.warn(
            f"{path}: axes {extra} are not supported; showing index 0 of each",
            SlidescopeWarning,
            stacklevel=4,
        )
    index = tuple(slice(None) if ax in "CYXS" else 0 for ax in axes)
    source = (
        _tiff.native_chunks(series_level, index, zarr_level, fetch=fetch)
        if series_level is not None
        else _tiff.zarr_chunks(zarr_level(), index)
    )
    if adapt is not None:
        source = adapt(source)
    reader = native_reader(
        source, out_axes, path=path, level=level, on_error=on_error, owner=owner, damage=damage
    )
    return reader, out_axes


def native_reader(
    source: _tiff.NativeChunks,
    axes: str,
    *,
    path: str,
    level: int,
    on_error: OnError,
    owner: int,
    damage: DamageLog | None = None,
) -> LevelReader:
    """Return the reader of any native-chunk source (TIFF, DICOM, OME-Zarr, OpenSlide).

    Parameters
    ----------
    source : NativeChunks
        Reads the level's native chunks; its shape is in `axes` order.
    axes : {"YXS", "CYX", "YX"}
        Axes of `source`.
    damage : DamageLog, optional
        Where tiles shown blank are recorded (the slide's ``damage``).
    """
    return LevelReader(
        source,
        path=path,
        level=level,
        on_error=on_error,
        owner=owner,
        spatial=(axes.index("Y"), axes.index("X")),
        damage=damage,
    )
