"""A label image of a whole slide kept on disk as a zarr pyramid, read like arrays.

A whole-slide nuclei result at 0.25-0.5 µm/px is 10^9 to 10^10 pixels: far too large for
memory, yet the viewer must show it pixel-exact when zoomed in and as a coarse overview
when zoomed out. :class:`LabelPyramid` keeps such a label image in a zarr group written
as an OME-NGFF multiscale labels image (``image-label`` metadata; NGFF 0.4 in zarr
format 2, which zarr 2 and zarr 3 both read and write, or NGFF 0.5 in zarr format 3), so
napari-ome-zarr and other NGFF readers reopen it. Chunks are square and compressed;
chunks never written (or erased to zeros) are absent from the store and cost nothing.
Level ``k`` halves level ``k - 1``: its pixel ``(i, j)`` is the level-0 pixel
``(i * 2**k + 2**k // 2, j * 2**k + 2**k // 2)`` (nearest sample), so every level shows
exactly the ids of level 0. Each level is a :class:`PyramidLevel`, an array-like
(``shape``, ``dtype``, basic slicing) that napari's multiscale layers slice.

Memory is a bounded least-recently-used cache of decoded chunks (shared by the levels),
plus one set of the chunk keys written: it does not grow with the slide's area. Writes
(:meth:`LabelPyramid.paste`) go through the cache to the store at once (zarr writes each
chunk to a temporary file and renames it: readers see a whole old or new chunk), so
eviction never writes; one lock guards the cache and one serialises writers, so worker
threads may paste while the GUI thread reads.

A pyramid is either a temporary store (deleted with the object, for a viewer's run) or
a store at a chosen ``path`` that stays (a batch result's label image), which
:meth:`LabelPyramid.open` reopens.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import write_error
from napari_slidescope._types import Box

__all__ = [
    "DEFAULT_CHUNK",
    "LabelPyramid",
    "PyramidLevel",
    "default_store_dir",
    "ngff_labels_metadata",
    "zarr_major",
]

#: Side of a chunk, in pixels of its level.
DEFAULT_CHUNK = 512
#: Bound of the decoded-chunk cache of one pyramid (64 chunks of 512 x 512 int32).
DEFAULT_CACHE_BYTES = 64 * 2**20

_Key = tuple[int, int, int]
#: Most chunks cached (empty ones take no memory but a cache entry).
_MAX_CACHED_CHUNKS = 65536
#: The decoded form of every chunk without a non-zero pixel (shared, read-only, uncounted).
_ZEROS: dict[int, np.ndarray] = {}


def default_store_dir() -> Path:
    """Folder under which pyramids are stored: ``<cache>/labels`` (see ``SLIDESCOPE_CACHE``)."""
    from napari_slidescope.sample_data import cache_dir

    return cache_dir() / "labels"


def zarr_major() -> int:
    """Major version of the installed zarr-python (2 or 3)."""
    import zarr

    return int(str(zarr.__version__).split(".")[0])


def _zeros(chunk: int) -> np.ndarray:
    arr = _ZEROS.get(chunk)
    if arr is None:
        arr = np.zeros((chunk, chunk), np.int32)
        arr.flags.writeable = False
        _ZEROS[chunk] = arr
    return arr


def ngff_labels_metadata(
    levels: int,
    *,
    mpp: tuple[float, float] | None = None,
    name: str = "labels",
    version: str = "0.4",
) -> dict[str, Any]:
    """Return the group attributes of an OME-NGFF multiscale labels image of `levels` halvings.

    Parameters
    ----------
    levels : int
        Number of datasets ``"0"``, ``"1"``, ...; dataset ``k`` is level 0 halved `k` times,
        sampling pixel ``(i * 2**k + 2**k // 2)`` of level 0 (hence its translation).
    mpp : (float, float), optional
        µm per level-0 pixel ``(y, x)``; without it the axes are in pixels (scale 1).
    name : str
        The multiscale's name.
    version : {"0.4", "0.5"}
        NGFF 0.4 keeps the metadata at the top of the attributes (zarr format 2); 0.5
        under ``"ome"`` (zarr format 3).

    Returns
    -------
    dict
    """
    sy, sx = (1.0, 1.0) if mpp is None else (float(mpp[0]), float(mpp[1]))
    unit = {"unit": "micrometer"} if mpp is not None else {}
    datasets = []
    for k in range(levels):
        f = 2**k
        datasets.append(
            {
                "path": str(k),
                "coordinateTransformations": [
                    {"type": "scale", "scale": [sy * f, sx * f]},
                    {"type": "translation", "translation": [sy * (f // 2), sx * (f // 2)]},
                ],
            }
        )
    multiscale: dict[str, Any] = {
        "name": name,
        "axes": [
            {"name": "y", "type": "space", **unit},
            {"name": "x", "type": "space", **unit},
        ],
        "datasets": datasets,
        "type": "nearest",
    }
    if version == "0.5":
        return {"ome": {"version": "0.5", "multiscales": [multiscale], "image-label": {}}}
    multiscale["version"] = "0.4"
    return {"multiscales": [multiscale], "image-label": {"version": "0.4"}}


class LabelPyramid:
    """A level-0 label image of ``shape`` and its halvings, stored as compressed zarr chunks.

    Parameters
    ----------
    shape : (int, int)
        Level-0 ``(rows, cols)``; levels are added until one fits in a chunk (two at least).
    chunk : int
        Chunk side in pixels (every level).
    root : str or PathLike, optional
        Folder to create a temporary store in (default :func:`default_store_dir`): a new
        sub-folder, deleted when the pyramid is garbage collected or Python exits.
    cache_bytes : int, optional
        Bound of the decoded chunks kept in memory (default :data:`DEFAULT_CACHE_BYTES`).
    read_chunk : int, optional
        Side of the chunk grid the levels advertise to readers (:attr:`PyramidLevel.chunks`,
        default `chunk`). napari loads whole cells of that grid and re-slices only when the
        view leaves them; giving the grid of the image the labels lie over makes napari
        re-slice both layers at the same camera moves.
    path : str or PathLike, optional
        Where to create a store that stays (instead of a temporary one under `root`): a
        zarr group that must not exist yet (a batch result's label image).
    mpp : (float, float), optional
        µm per level-0 pixel, written into the NGFF metadata (else pixel units).
    name : str
        Name of the NGFF multiscale.
    zarr_format : {2, 3}
        Zarr format of the store: 2 with NGFF 0.4 metadata (default: what zarr 2 and 3
        both read), 3 with NGFF 0.5 (needs zarr >= 3).

    Raises
    ------
    ValueError
        For a non-positive shape or chunk, or zarr format 3 with zarr 2.
    OSError
        ``cannot write PATH: CAUSE`` if the store cannot be created.

    Examples
    --------
    >>> pyr = LabelPyramid((3000, 2000), chunk=256)
    >>> pyr.paste((10, 20, 12, 22), np.full((2, 2), 7, np.int32))
    >>> int(pyr.levels[0][11, 21]), len(pyr.levels)
    (7, 5)
    """

    def __init__(
        self,
        shape: tuple[int, int],
        *,
        chunk: int = DEFAULT_CHUNK,
        root: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        read_chunk: int | None = None,
        path: str | os.PathLike[str] | None = None,
        mpp: tuple[float, float] | None = None,
        name: str = "labels",
        zarr_format: int = 2,
    ) -> None:
        h, w = (int(v) for v in shape)
        if h <= 0 or w <= 0 or chunk <= 0:
            raise ValueError(f"shape and chunk must be positive, got {shape!r} and {chunk!r}")
        if zarr_format not in (2, 3):
            raise ValueError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
        if zarr_format == 3 and zarr_major() < 3:
            raise ValueError(f"zarr format 3 needs zarr >= 3, this is zarr {zarr_major()}")
        # two levels at least: napari cannot show a multiscale layer of one level (a
        # whole-slide run on a slide smaller than a chunk failed in napari's transform)
        n = 2
        while max(h, w) > chunk * 2 ** (n - 1):
            n += 1
        f = 2 ** (n - 1)  # pad level 0 so every level halves exactly (napari's factors)
        full = (math.ceil(h / f) * f, math.ceil(w / f) * f)
        if path is None:
            folder = Path(root) if root is not None else default_store_dir()
            folder.mkdir(parents=True, exist_ok=True)
            store = folder / f"pyramid-{uuid.uuid4().hex}"
            finalizer = weakref.finalize(self, shutil.rmtree, str(store), True)
        else:
            store = Path(path)
            if store.exists():
                raise ValueError(f"{store}: a label pyramid's store must not exist yet")
            finalizer = None
        self._setup(store, full, int(chunk), n, cache_bytes, read_chunk)
        self._finalizer = finalizer
        self._written: set[_Key] | None = set()
        meta = ngff_labels_metadata(
            n, mpp=mpp, name=name, version="0.5" if zarr_format == 3 else "0.4"
        )
        try:
            self._arrays = _create(store, meta, self.level_shapes(), self.chunk, zarr_format)
        except OSError as exc:
            raise write_error(store, exc) from exc
        self._direct = [_V2Chunks.of(store / str(k), chunk) for k in range(n)]
        self.levels = [PyramidLevel(self, k) for k in range(n)]

    def _setup(
        self,
        store: Path,
        shape: tuple[int, int],
        chunk: int,
        n: int,
        cache_bytes: int | None,
        read_chunk: int | None,
    ) -> None:
        if read_chunk is not None and read_chunk <= 0:
            raise ValueError(f"read_chunk must be positive, got {read_chunk!r}")
        self.path = store
        self.shape = shape
        self.chunk = chunk
        self.nlevels = n
        self.read_chunk = int(chunk if read_chunk is None else read_chunk)
        self.dtype = np.dtype(np.int32)
        self.cache_bytes = int(DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)
        self._cache: OrderedDict[_Key, np.ndarray] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.RLock()  # the cache
        self._write_lock = threading.Lock()  # read-modify-write of chunks
        self._buffered = False
        self._dirty: set[_Key] = set()  # chunks changed in the cache, not yet in the store

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        cache_bytes: int | None = None,
        read_chunk: int | None = None,
    ) -> LabelPyramid:
        """Reopen, read-only, a label pyramid a :class:`LabelPyramid` wrote at `path`.

        Any NGFF multiscale of 2D integer arrays whose datasets halve level 0 (ceil or
        floor) with square chunks is read the same way.

        Raises
        ------
        ValueError
            Naming `path` and the problem: not a zarr group, no multiscales, levels that
            do not halve, non-square chunks, non-integer pixels.
        """
        import zarr

        from napari_slidescope.slide._ngff import ngff_metadata

        store = Path(path)
        try:
            group = zarr.open_group(store=str(store), mode="r")
            meta, _ = ngff_metadata(dict(group.attrs))
            datasets = meta["multiscales"][0]["datasets"]
            arrays: list[Any] = [group[str(d["path"])] for d in datasets]
        except Exception as exc:
            raise ValueError(f"{store}: not a readable NGFF label image ({exc})") from exc
        if not arrays or any(getattr(a, "ndim", None) != 2 for a in arrays):
            raise ValueError(f"{store}: expected 2D label arrays as levels")
        if any(np.dtype(a.dtype).kind not in "iu" for a in arrays):
            raise ValueError(f"{store}: labels must be integers, got {arrays[0].dtype}")
        chunk = int(arrays[0].chunks[0])
        if any(tuple(a.chunks) != (chunk, chunk) for a in arrays):
            raise ValueError(f"{store}: expected square chunks, got {[a.chunks for a in arrays]}")
        h, w = (int(v) for v in arrays[0].shape)
        for k, a in enumerate(arrays):
            f = 2**k
            if int(a.shape[0]) not in (h // f, -(-h // f)) or int(a.shape[1]) not in (
                w // f,
                -(-w // f),
            ):
                raise ValueError(f"{store}: level {k} {a.shape} does not halve level 0 {k} times")
        self = cls.__new__(cls)
        self._setup(store, (h, w), chunk, len(arrays), cache_bytes, read_chunk)
        self._finalizer = None
        self._written = None  # unknown: ask the store
        self._arrays = arrays
        self._direct = [_V2Chunks.of(store / str(d["path"]), chunk) for d in datasets]
        self.levels = [PyramidLevel(self, k) for k in range(len(arrays))]
        return self

    # -- geometry ---------------------------------------------------------------------------

    def level_shape(self, level: int) -> tuple[int, int]:
        """``(rows, cols)`` of a level."""
        if hasattr(self, "_arrays") and level < len(self._arrays):
            a = self._arrays[level]
            return (int(a.shape[0]), int(a.shape[1]))
        f = 2**level
        return (self.shape[0] // f, self.shape[1] // f)

    def level_shapes(self) -> list[tuple[int, int]]:
        """``(rows, cols)`` of every level, finest first."""
        f = [2**k for k in range(self.nlevels)]
        return [(self.shape[0] // v, self.shape[1] // v) for v in f]

    @property
    def nbytes_cached(self) -> int:
        """Bytes of decoded chunks held in memory now."""
        with self._lock:
            return self._cached_bytes

    @property
    def chunks_written(self) -> int:
        """Number of chunks this pyramid wrote with a non-zero pixel (0 for a reopened one)."""
        return len(self._written) if self._written is not None else 0

    # -- reading ----------------------------------------------------------------------------

    def read(self, level: int, box: Box) -> np.ndarray:
        """Return a new array of the level's pixels in ``box`` (half-open, clipped to the level)."""
        h, w = self.level_shape(level)
        y0, x0 = max(0, box[0]), max(0, box[1])
        y1, x1 = min(h, box[2]), min(w, box[3])
        out = np.zeros((max(0, y1 - y0), max(0, x1 - x0)), self.dtype)
        if out.size == 0:
            return out
        c = self.chunk
        keys = [
            (level, cy, cx)
            for cy in range(y0 // c, (y1 - 1) // c + 1)
            for cx in range(x0 // c, (x1 - 1) // c + 1)
            if self._written is None or (level, cy, cx) in self._written
        ]
        if len(keys) > 1:
            self._load_many(keys)
        for key in keys:
            _, cy, cx = key
            arr = self._get(key)
            if arr is _ZEROS.get(c):
                continue
            ty0, tx0 = max(y0, cy * c), max(x0, cx * c)
            ty1, tx1 = min(y1, (cy + 1) * c), min(x1, (cx + 1) * c)
            out[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0] = arr[
                ty0 - cy * c : ty1 - cy * c, tx0 - cx * c : tx1 - cx * c
            ]
        return out

    def _get(self, key: _Key) -> np.ndarray:
        """Return the decoded chunk (read-only; a shared zero chunk when it has no label)."""
        with self._lock:
            arr = self._cache.get(key)
            if arr is not None:
                self._cache.move_to_end(key)
                return arr
            if self._written is not None and key not in self._written:
                return _zeros(self.chunk)
            arr = self._load(key)
            self._put(key, arr)
            return arr

    def _load_many(self, keys: list[_Key]) -> None:
        """Cache the chunks of `keys` (one level) not cached yet, read in one zarr call.

        One call for the bounding box of the missing chunks instead of one per chunk:
        zarr 3 runs each call on its own event-loop thread (a hand-over that costs most on
        a busy machine) and decodes the chunks of one call concurrently.
        """
        if self._direct[keys[0][0]] is not None:  # chunk by chunk on this thread: no hand-over
            return
        with self._lock:
            missing = [k for k in keys if k not in self._cache]
            if len(missing) < 2:
                return
            level, c = missing[0][0], self.chunk
            h, w = self.level_shape(level)
            cy0, cy1 = min(k[1] for k in missing), max(k[1] for k in missing) + 1
            cx0, cx1 = min(k[2] for k in missing), max(k[2] for k in missing) + 1
            block = np.asarray(
                self._arrays[level][cy0 * c : min(h, cy1 * c), cx0 * c : min(w, cx1 * c)]
            )
            for key in missing:
                _, cy, cx = key
                ry, rx = (cy - cy0) * c, (cx - cx0) * c
                part = block[ry : ry + c, rx : rx + c]
                if not part.any():
                    arr = _zeros(c)
                else:
                    arr = np.zeros((c, c), np.int32)
                    arr[: part.shape[0], : part.shape[1]] = part
                    arr.flags.writeable = False
                self._put(key, arr)

    def _load(self, key: _Key) -> np.ndarray:
        level, cy, cx = key
        c = self.chunk
        direct = self._direct[level]
        if direct is not None:
            found = direct.read(cy, cx)
            if found is None or not found.any():
                return _zeros(c)
            arr = found.astype(np.int32)  # a new array (the decoded buffer is read-only)
            arr.flags.writeable = False
            return arr
        h, w = self.level_shape(level)
        a = self._arrays[level]
        block = np.asarray(a[cy * c : min(h, (cy + 1) * c), cx * c : min(w, (cx + 1) * c)])
        if not block.any():
            return _zeros(c)
        arr = np.zeros((c, c), np.int32)
        arr[: block.shape[0], : block.shape[1]] = block
        arr.flags.writeable = False
        return arr

    def _put(self, key: _Key, arr: np.ndarray) -> None:
        """Cache a decoded chunk and evict the oldest beyond the bound (lock held)."""
        old = self._cache.pop(key, None)
        if old is not None and old is not _ZEROS.get(self.chunk):
            self._cached_bytes -= old.nbytes
        self._cache[key] = arr
        if arr is not _ZEROS.get(self.chunk):
            self._cached_bytes += arr.nbytes
        while len(self._cache) > 1 and (
            self._cached_bytes > self.cache_bytes or len(self._cache) > _MAX_CACHED_CHUNKS
        ):
            gone_key, gone = self._cache.popitem(last=False)
            if gone is not _ZEROS.get(self.chunk):
                self._cached_bytes -= gone.nbytes
            if gone_key in self._dirty:  # buffered writes: written when evicted
                self._dirty.discard(gone_key)
                self._write(gone_key, gone)

    # -- writing ----------------------------------------------------------------------------

    def paste(self, box: Box, labels: np.ndarray) -> None:
        """Write level-0 `labels` over ``box`` where the pyramid is still 0, at every level.

        Parameters
        ----------
        box : (int, int, int, int)
            Level-0 ``(y0, x0, y1, x1)`` of ``labels`` (clipped to the pyramid).
        labels : (M, N) ndarray of int
            Ids, 0 = none; a non-zero pixel never overwrites another non-zero one.

        Raises
        ------
        ValueError
            If `labels` does not have the box's shape, or the pyramid was reopened
            read-only.
        OSError
            ``cannot write STORE: CAUSE`` (a full disk): the chunk keeps its earlier content.
        """
        labels = np.asarray(labels)
        y0, x0, y1, x1 = (int(v) for v in box)
        if labels.shape != (y1 - y0, x1 - x0):
            raise ValueError(f"labels: expected shape {(y1 - y0, x1 - x0)}, got {labels.shape}")
        self._check_writable()
        for level in range(len(self.levels)):
            f, half = 2**level, 2**level // 2
            r0, r1 = -(-(y0 - half) // f), -(-(y1 - half) // f)
            c0, c1 = -(-(x0 - half) // f), -(-(x1 - half) // f)
            h, w = self.level_shape(level)
            r0, c0, r1, c1 = max(r0, 0), max(c0, 0), min(r1, h), min(c1, w)
            if r1 <= r0 or c1 <= c0:
                continue
            sampled = labels[
                r0 * f + half - y0 : (r1 - 1) * f + half - y0 + 1 : f,
                c0 * f + half - x0 : (c1 - 1) * f + half - x0 + 1 : f,
            ]
            self._paste_level(level, (r0, c0, r1, c1), sampled)

    def _check_writable(self) -> None:
        if self._written is None:
            raise ValueError(f"{self.path}: a reopened label pyramid is read-only")

    def _paste_level(self, level: int, box: Box, values: np.ndarray) -> None:
        y0, x0, y1, x1 = box
        c = self.chunk
        for cy in range(y0 // c, (y1 - 1) // c + 1):
            for cx in range(x0 // c, (x1 - 1) // c + 1):
                ty0, tx0 = max(y0, cy * c), max(x0, cx * c)
                ty1, tx1 = min(y1, (cy + 1) * c), min(x1, (cx + 1) * c)
                src = values[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0]
                if not src.any():
                    continue
                key = (level, cy, cx)
                with self._write_lock:
                    arr = self._get(key).copy()  # readers keep seeing a whole old chunk
                    dst = arr[ty0 - cy * c : ty1 - cy * c, tx0 - cx * c : tx1 - cx * c]
                    new = (src != 0) & (dst == 0)
                    if not new.any():
                        continue
                    dst[new] = src[new]
                    self._store(key, arr)

    def _store(self, key: _Key, arr: np.ndarray) -> None:
        """Write a chunk through zarr and cache it (write lock held).

        Inside :meth:`buffered`, the chunk is only cached (marked dirty) and written when
        it leaves the cache or the block ends.
        """
        if not self._buffered:
            self._write(key, arr)
        arr.flags.writeable = False
        assert self._written is not None  # _check_writable
        with self._lock:
            if self._buffered:  # before _put: a chunk evicted at once is written there
                self._dirty.add(key)
            if arr.any():
                self._written.add(key)
                self._put(key, arr)
            else:
                self._written.discard(key)
                self._put(key, _zeros(self.chunk))

    def _write(self, key: _Key, arr: np.ndarray) -> None:
        """Write a whole chunk through zarr (no read of the old one).

        An all-zero chunk is removed from the store (zarr's ``write_empty_chunks=False``).
        A chunk that cannot be written (a full disk) raises ``OSError("cannot write
        STORE: CAUSE")`` and leaves the chunk's earlier file.
        """
        level, cy, cx = key
        c = self.chunk
        h, w = self.level_shape(level)
        ny, nx = min(h, (cy + 1) * c) - cy * c, min(w, (cx + 1) * c) - cx * c
        try:
            self._arrays[level][cy * c : cy * c + ny, cx * c : cx * c + nx] = arr[:ny, :nx]
        except OSError as exc:
            raise write_error(self.path, exc) from exc

    @contextlib.contextmanager
    def buffered(self) -> Iterator[LabelPyramid]:
        """Keep written chunks in the cache until evicted or the block ends (one writer).

        For a writer that pastes many tiles in a row (a batch's label image): a chunk of
        a coarse level that many tiles touch is written to the store once or a few times
        instead of at every paste. Readers see the cached chunks meanwhile; a chunk is
        written on the thread whose read or paste evicts it, so a GUI should not read a
        pyramid while it is being written this way. On an exception the chunks not yet
        written are dropped.
        """
        self._check_writable()
        with self._write_lock:
            self._buffered = True
        try:
            yield self
        except BaseException:
            with self._lock:
                self._buffered = False
                self._dirty.clear()
            raise
        with self._write_lock, self._lock:
            self._buffered = False
            for key in sorted(self._dirty):
                self._write(key, self._cache.get(key, _zeros(self.chunk)))
            self._dirty.clear()

    def erase(self, ids: np.ndarray) -> None:
        """Set the pixels of the given ids to 0 at every level (deleting nuclei)."""
        ids = np.asarray(ids).ravel()
        if ids.size == 0:
            return
        self._check_writable()
        assert self._written is not None
        for key in sorted(self._written):
            with self._write_lock:
                arr = self._get(key)
                hit = np.isin(arr, ids)
                if not hit.any():
                    continue
                arr = arr.copy()
                arr[hit] = 0
                self._store(key, arr)

    def close(self) -> None:
        """Drop the cache; a temporary store is deleted (it reads as zeros afterwards)."""
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
            if self._written is not None and self._finalizer is not None:
                self._written.clear()
        if self._finalizer is not None:
            self._finalizer()


class _V2Chunks:
    """Chunks of a local zarr format 2 array, read and decoded on the calling thread.

    zarr 3 runs every read on its event-loop thread and decodes in a thread pool: on a
    busy machine the hand-overs dominate (a 4 x 5 chunk viewport of nuclei labels at a
    load average of 14 on 2 cores: median 33 ms and 90th percentile 162 ms through
    ``zarr.Array``, 12.6 and 20 ms read here). A format 2 chunk is one file, its
    ``compressor``'s encoding of the C-order chunk (zarr v2 specification): read as
    zarr would read it, with zarr's own codec (numcodecs). Writes stay with zarr (whole
    chunks, temporary file then rename: a reader sees an old or a new chunk).
    """

    def __init__(self, folder: Path, codec: Any, dtype: np.dtype, sep: str, chunk: int) -> None:
        self.folder, self.codec, self.dtype, self.sep, self.chunk = folder, codec, dtype, sep, chunk

    @classmethod
    def of(cls, folder: Path, chunk: int) -> _V2Chunks | None:
        """Return the reader of the array in `folder`, or None when zarr must read it.

        None for anything but a plain local format 2 array of square `chunk` integer
        chunks, filled with 0.
        """
        import json

        import numcodecs

        try:
            meta = json.loads((folder / ".zarray").read_text(encoding="utf-8"))
            dtype = np.dtype(meta["dtype"])
            codec = numcodecs.get_codec(meta["compressor"]) if meta["compressor"] else None
        except Exception:  # noqa: BLE001 - no such file, a remote store, another format
            return None
        plain = (
            meta.get("zarr_format") == 2
            and not meta.get("filters")
            and meta.get("order", "C") == "C"
            and meta.get("fill_value") in (0, None)
            and list(meta.get("chunks", ())) == [chunk, chunk]
            and dtype.kind in "iu"
        )
        sep = meta.get("dimension_separator") or "."
        return cls(folder, codec, dtype, sep, chunk) if plain and sep in "./" else None

    def read(self, cy: int, cx: int) -> np.ndarray | None:
        """Return the decoded chunk ``(cy, cx)``; None when it was never written (all zero)."""
        try:
            raw = (self.folder / f"{cy}{self.sep}{cx}").read_bytes()
        except FileNotFoundError:
            return None
        data = raw if self.codec is None else self.codec.decode(raw)
        return np.frombuffer(data, self.dtype).reshape(self.chunk, self.chunk)


def _create(
    store: Path,
    attrs: dict[str, Any],
    shapes: list[tuple[int, int]],
    chunk: int,
    zarr_format: int,
) -> list[Any]:
    """Create the zarr group and its int32 levels (no chunk written); return the arrays.

    Chunks are zstd level 1: on 512 px chunks of nuclei labels it gave 2.4 KiB a chunk,
    0.6 ms to decode and 0.13 ms to encode, against Blosc-zstd 3 with byte shuffle 5.9
    KiB, 1.2 and 4.5 ms, Blosc-lz4 18.6 KiB, 0.4 and 1.0 ms, and zlib 1 (the former
    store) 8.6 KiB, 1.6 and 5.4 ms (benchmarks/RESULTS.md, "whole-slide label image").
    """
    import zarr

    if zarr_major() < 3:
        from numcodecs import Zstd

        # typed as zarr 3's Group, which lacks zarr 2's create_dataset
        group: Any = zarr.open_group(str(store), mode="w-")
        arrays = [
            group.create_dataset(
                str(k),
                shape=shape,
                chunks=(chunk, chunk),
                dtype="<i4",
                fill_value=0,
                compressor=Zstd(level=1),
                write_empty_chunks=False,
                dimension_separator="/",
            )  # fmt: skip
            for k, shape in enumerate(shapes)
        ]
    else:
        fmt: Any = zarr_format
        group = zarr.open_group(store=str(store), mode="w-", zarr_format=fmt)
        if zarr_format == 2:
            from numcodecs import Zstd

            codec: dict[str, Any] = {
                "compressors": Zstd(level=1),
                "chunk_key_encoding": {"name": "v2", "separator": "/"},
            }
        else:
            from zarr.codecs import ZstdCodec

            codec = {"compressors": ZstdCodec(level=1)}
        arrays = [
            group.create_array(
                str(k),
                shape=shape,
                chunks=(chunk, chunk),
                dtype="<i4",
                fill_value=0,
                config={"write_empty_chunks": False},
                **codec,
            )  # fmt: skip
            for k, shape in enumerate(shapes)
        ]
    group.attrs.update(attrs)
    return arrays


class PyramidLevel:
    """One level of a :class:`LabelPyramid` as a 2D array-like (what napari slices).

    Supports ``shape``, ``dtype``, ``ndim``, ``size``, ``chunks``, basic indexing (ints
    and slices with step 1, ``...``) and ``np.asarray`` (the whole level: small levels
    only). ``chunks`` is zarr-style (the pyramid's ``read_chunk`` per axis): napari widens
    a multiscale layer's loaded box to chunk boundaries and re-slices only when the view
    leaves it, so panning does not re-read and re-colour the labels at every camera move.
    """

    def __init__(self, pyramid: LabelPyramid, level: int) -> None:
        self._pyramid = pyramid
        self.level = level
        self.shape = pyramid.level_shape(level)
        self.dtype = pyramid.dtype
        self.ndim = 2
        self.chunks: tuple[int, int] | None = (pyramid.read_chunk, pyramid.read_chunk)

    @property
    def size(self) -> int:
        """Number of pixels."""
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the level would take as a dense array (it never is one)."""
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"PyramidLevel(level={self.level}, shape={self.shape}, dtype={self.dtype})"

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(n for n, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (2 - len(key) + 1) + key[i + 1 :]
        key = key + (slice(None),) * (2 - len(key))
        if len(key) != 2:
            raise IndexError(f"too many indices for a 2D level: {key!r}")
        box: list[tuple[int, int]] = []
        post: list[int | slice] = []
        for ax, k in enumerate(key):
            n = self.shape[ax]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step < 0:
                    return np.asarray(self)[key]
                box.append((start, max(start, stop)))
                post.append(slice(None, None, step))
            elif isinstance(k, int | np.integer):
                i = int(k) + n if int(k) < 0 else int(k)
                if not 0 <= i < n:
                    raise IndexError(f"index {k} out of range for axis {ax} of size {n}")
                box.append((i, i + 1))
                post.append(0)
            else:  # fancy indexing: not what napari does on a large level
                return np.asarray(self)[key]
        (y0, y1), (x0, x1) = box
        out = self._pyramid.read(self.level, (y0, x0, y1, x1))[tuple(post)]
        return out[()] if out.ndim == 0 else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._pyramid.read(self.level, (0, 0, *self.shape))
        return out if dtype is None else out.astype(dtype)
