"""A label image of a whole slide kept on disk as a chunked pyramid, read like arrays.

A whole-slide nuclei result at 0.25-0.5 µm/px is 10^9 to 10^10 pixels: far too large for
memory, yet the viewer must show it pixel-exact when zoomed in and as a coarse overview
when zoomed out. :class:`LabelPyramid` keeps such a label image as square chunks, each
stored zlib-compressed in its own file under a cache folder; chunks never written are
all zeros and cost nothing. Level ``k`` halves level ``k - 1``: its pixel ``(i, j)`` is
the level-0 pixel ``(i * 2**k + 2**k // 2, j * 2**k + 2**k // 2)`` (nearest sample), so
every level shows exactly the ids of level 0. Each level is a :class:`PyramidLevel`, an
array-like (``shape``, ``dtype``, basic slicing) that napari's multiscale layers slice.

Memory is a bounded least-recently-used cache of decompressed chunks (shared by the
levels), plus one set of the chunk keys written: it does not grow with the slide's area.
Writes (:meth:`LabelPyramid.paste`) go through the cache to disk at once, so eviction
never writes; one lock guards the cache, so a worker thread may paste while the GUI
thread reads.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import uuid
import weakref
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import write_error
from napari_slidescope._types import Box

__all__ = ["DEFAULT_CHUNK", "LabelPyramid", "PyramidLevel", "default_store_dir"]

#: Side of a chunk, in pixels of its level.
DEFAULT_CHUNK = 512
#: Bound of the decompressed-chunk cache of one pyramid (64 chunks of 512 x 512 int32).
DEFAULT_CACHE_BYTES = 64 * 2**20

_Key = tuple[int, int, int]


def default_store_dir() -> Path:
    """Folder under which pyramids are stored: ``<cache>/labels`` (see ``SLIDESCOPE_CACHE``)."""
    from napari_slidescope.sample_data import cache_dir

    return cache_dir() / "labels"


class LabelPyramid:
    """A level-0 label image of ``shape`` and its halvings, stored as compressed chunks.

    Parameters
    ----------
    shape : (int, int)
        Level-0 ``(rows, cols)``; levels are added until one fits in a chunk.
    chunk : int
        Chunk side in pixels (every level).
    root : str or PathLike, optional
        Folder to create the store in (default :func:`default_store_dir`). The store is a
        new sub-folder, deleted when the pyramid is garbage collected or Python exits.
    cache_bytes : int, optional
        Bound of the decompressed chunks kept in memory (default
        :data:`DEFAULT_CACHE_BYTES`).
    read_chunk : int, optional
        Side of the chunk grid the levels advertise to readers (:attr:`PyramidLevel.chunks`,
        default `chunk`). napari loads whole cells of that grid and re-slices only when the
        view leaves them; giving the grid of the image the labels lie over makes napari
        re-slice both layers at the same camera moves.

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
    ) -> None:
        h, w = (int(v) for v in shape)
        if h <= 0 or w <= 0 or chunk <= 0:
            raise ValueError(f"shape and chunk must be positive, got {shape!r} and {chunk!r}")
        if read_chunk is not None and read_chunk <= 0:
            raise ValueError(f"read_chunk must be positive, got {read_chunk!r}")
        self.read_chunk = int(chunk if read_chunk is None else read_chunk)
        n = 1
        while max(h, w) > chunk * 2 ** (n - 1):
            n += 1
        f = 2 ** (n - 1)  # pad level 0 so every level halves exactly (napari's factors)
        self.shape = (math.ceil(h / f) * f, math.ceil(w / f) * f)
        self.chunk = int(chunk)
        self.dtype = np.dtype(np.int32)
        folder = Path(root) if root is not None else default_store_dir()
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"pyramid-{uuid.uuid4().hex}"
        self.path.mkdir()
        self._cache: OrderedDict[_Key, np.ndarray] = OrderedDict()
        self.cache_bytes = int(DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)
        self._written: set[_Key] = set()
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        self.levels = [PyramidLevel(self, k) for k in range(n)]

    # -- geometry ---------------------------------------------------------------------------

    def level_shape(self, level: int) -> tuple[int, int]:
        """``(rows, cols)`` of a level."""
        f = 2**level
        return (self.shape[0] // f, self.shape[1] // f)

    @property
    def nbytes_cached(self) -> int:
        """Bytes of decompressed chunks held in memory now."""
        with self._lock:
            return sum(a.nbytes for a in self._cache.values())

    @property
    def chunks_written(self) -> int:
        """Number of chunk files in the store."""
        return len(self._written)

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
        for cy in range(y0 // c, (y1 - 1) // c + 1):
            for cx in range(x0 // c, (x1 - 1) // c + 1):
                key = (level, cy, cx)
                if key not in self._written:
                    continue
                ty0, tx0 = max(y0, cy * c), max(x0, cx * c)
                ty1, tx1 = min(y1, (cy + 1) * c), min(x1, (cx + 1) * c)
                with self._lock:
                    arr = self._get(key)
                    out[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0] = arr[
                        ty0 - cy * c : ty1 - cy * c, tx0 - cx * c : tx1 - cx * c
                    ]
        return out

    def _file(self, key: _Key) -> Path:
        return self.path / f"{key[0]}_{key[1]}_{key[2]}.z"

    def _get(self, key: _Key) -> np.ndarray:
        """Return the decompressed chunk (call with the lock held)."""
        arr = self._cache.get(key)
        if arr is not None:
            self._cache.move_to_end(key)
            return arr
        c = self.chunk
        if key in self._written:
            raw = zlib.decompress(self._file(key).read_bytes())
            arr = np.frombuffer(raw, self.dtype).reshape(c, c).copy()
        else:
            arr = np.zeros((c, c), self.dtype)
        self._cache[key] = arr
        self._evict()
        return arr

    def _evict(self) -> None:
        total = sum(a.nbytes for a in self._cache.values())
        while total > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            total -= old.nbytes

    # -- writing ----------------------------------------------------------------------------

    def paste(self, box: Box, labels: np.ndarray) -> None:
        """Write level-0 `labels` over ``box`` where the pyramid is still 0, at every level.

        Parameters
        ----------
        box : (int, int, int, int)
            Level-0 ``(y0, x0, y1, x1)`` of ``labels`` (clipped to the pyramid).
        labels : (M, N) ndarray of int
            Ids, 0 = none; a non-zero pixel never overwrites another non-zero one.
        """
        labels = np.asarray(labels)
        y0, x0, y1, x1 = (int(v) for v in box)
        if labels.shape != (y1 - y0, x1 - x0):
            raise ValueError(f"labels: expected shape {(y1 - y0, x1 - x0)}, got {labels.shape}")
        for level in range(len(self.levels)):
            f, half = 2**level, 2**level // 2
            r0, r1 = -(-(y0 - half) // f), -(-(y1 - half) // f)
            c0, c1 = -(-(x0 - half) // f), -(-(x1 - half) // f)
            h, w = self.level_shape(level)
            r0, c0, r1, c1 = max(r0, 0), max(c0, 0), min(r1, h), min(c1, w)
            if r1 <= r0 or c1 <= c0:
                continue
            rows = np.arange(r0, r1) * f + half - y0
            cols = np.arange(c0, c1) * f + half - x0
            sampled = labels[rows[:, None], cols[None, :]]
            self._paste_level(level, (r0, c0, r1, c1), sampled)

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
                with self._lock:
                    arr = self._get(key).copy()  # readers keep seeing a whole old chunk
                    dst = arr[ty0 - cy * c : ty1 - cy * c, tx0 - cx * c : tx1 - cx * c]
                    new = (src != 0) & (dst == 0)
                    if not new.any():
                        continue
                    dst[new] = src[new]
                self._store(key, arr)

    def _store(self, key: _Key, arr: np.ndarray) -> None:
        """Write a chunk file (temporary file then rename) and cache it.

        Not through ``_io.atomic_write``: the store is a cache that dies with the process,
        so the rename (readers see a whole old or new chunk) is kept and the fsync skipped.
        A chunk that cannot be written (a full disk) raises ``OSError("cannot write
        CHUNK: CAUSE")`` and leaves the chunk's earlier file.
        """
        data = zlib.compress(arr.tobytes(), 1)
        target = self._file(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path, suffix=".tmp")
        except OSError as exc:
            raise write_error(target, exc) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except OSError as exc:  # a full disk: the chunk file keeps its earlier content
            Path(tmp).unlink(missing_ok=True)
            raise write_error(target, exc) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self._written.add(key)
            self._cache[key] = arr
            self._cache.move_to_end(key)
            self._evict()

    def erase(self, ids: np.ndarray) -> None:
        """Set the pixels of the given ids to 0 at every level (deleting nuclei)."""
        ids = np.asarray(ids).ravel()
        if ids.size == 0:
            return
        for key in sorted(self._written):
            with self._lock:
                arr = self._get(key)
                hit = np.isin(arr, ids)
                if not hit.any():
                    continue
                arr = arr.copy()
                arr[hit] = 0
            self._store(key, arr)

    def close(self) -> None:
        """Delete the store now (the pyramid reads as zeros afterwards)."""
        with self._lock:
            self._cache.clear()
            self._written.clear()
        self._finalizer()


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
