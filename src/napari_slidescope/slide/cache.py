"""The decoded-tile cache shared by every open slide, level and layer.

Panning reuses most native chunks (tiles, NDPI restart bands) of the previous
viewport, and switching layers or levels back and forth reuses them too, so the
reader keeps recently decoded native chunks in one least-recently-used cache whose
size in bytes never exceeds its bound.

The bound defaults to :data:`DEFAULT_CACHE_BYTES`; the ``SLIDESCOPE_CACHE_BYTES``
environment variable (read when the cache is first used) or :func:`set_cache_bytes`
changes it; ``0`` disables caching.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from napari_slidescope.slide.chunking import parse_bytes

#: Default bound of the decoded-tile cache: 256 MiB. A 4K screen of NDPI restart bands
#: (the worst case: a band is decoded whole, 3840 px wide) is about 50 MiB.
DEFAULT_CACHE_BYTES = 256 * 2**20

#: What the cache may hold before it has seen a chunk it evicted asked for again (it then
#: grows towards its bound): a 4K screen of 256 x 256 RGB tiles is about 30 MiB.
GROW_START_BYTES = 32 * 2**20

#: Environment variable that overrides the default bound (bytes, or with a KiB/MiB suffix).
CACHE_BYTES_ENV = "SLIDESCOPE_CACHE_BYTES"


class TileCache:
    """A thread-safe LRU cache of decoded native chunks, bounded in bytes.

    Parameters
    ----------
    maxbytes : int
        Upper bound of :attr:`nbytes` plus :attr:`free_nbytes`. An array larger than the
        bound is never stored.

    Notes
    -----
    :meth:`put` stores a read-only *copy* of the array, in memory the cache owns: chunks of
    at least :data:`SLAB_MIN_BYTES` live in their own anonymous memory maps (slabs). A slab
    whose chunk is evicted (or cleared, or discarded) while nobody else holds it goes to a
    pool of free slabs for the next chunk of the same size, so steady panning reuses memory
    that is already resident; a slab the bound has no room for is unmapped at once. The
    memory behind the cache is thus the bound at most, whichever thread decoded the chunks.
    (Arrays from ``malloc`` would go back to the allocator arena of the thread that decoded
    them, where a chunk decoded on another thread cannot reuse them: with several decoding
    threads the process then held freed tiles well beyond the bound.) Resident memory is the
    bound plus what callers still hold, plus the decoding threads' scratch.

    The cache grows towards the bound only as far as it pays: it starts at
    :data:`GROW_START_BYTES` (its *limit*) and remembers the keys of the chunks it evicts;
    asking again for a chunk it evicted (a chunk a larger cache would have held: zooming
    back, panning back) raises the limit by twice that chunk's size, up to the bound. A new
    slab costs a page fault per 4 KiB page the first time it is written (several times a
    tile's copy, and on a virtual machine up to half a tile's decode), which a workload that
    never comes back to a chunk (random viewports over a slide much larger than the cache)
    would otherwise pay for every chunk until the bound is full, for no hit.
    """

    def __init__(self, maxbytes: int) -> None:
        if maxbytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {maxbytes!r}")
        self._maxbytes = int(maxbytes)
        self._limit = min(self._maxbytes, GROW_START_BYTES)
        self._ghosts: OrderedDict[Hashable, int] = OrderedDict()
        self._ghost_nbytes = 0
        self._nbytes = 0
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._free: dict[int, list[np.ndarray]] = {}
        self._free_nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.reused = 0

    @property
    def maxbytes(self) -> int:
        """The bound in bytes."""
        return self._maxbytes

    @property
    def nbytes(self) -> int:
        """Bytes of chunks currently held (never more than :attr:`maxbytes`)."""
        return self._nbytes

    @property
    def limit(self) -> int:
        """Bytes the cache may hold now: grows from :data:`GROW_START_BYTES` to the bound."""
        return self._limit

    @property
    def free_nbytes(self) -> int:
        """Bytes of free slabs kept for reuse (``nbytes + free_nbytes <= maxbytes``)."""
        return self._free_nbytes

    @property
    def held_nbytes(self) -> int:
        """Bytes held in chunks and free slabs, read at one instant (at most :attr:`maxbytes`).

        :attr:`nbytes` + :attr:`free_nbytes` read one after the other, while other threads
        read through the cache, need not be a total the cache ever held.
        """
        with self._lock:
            return self._nbytes + self._free_nbytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> np.ndarray | None:
        """Return the (read-only) array stored under `key`, marking it recently used, or None."""
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                size = self._ghosts.pop(key, None)
                if size is not None:  # evicted earlier: a larger cache would have hit
                    self._ghost_nbytes -= size
                    self._limit = min(self._maxbytes, self._limit + 2 * size)
                    self._trim_ghosts()
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: np.ndarray) -> None:
        """Store a copy of `value` under `key`, evicting least recently used arrays."""
        value = np.asarray(value)
        size = int(value.nbytes)
        if size > self._maxbytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._release(old)
                del old
            self._limit = max(self._limit, size)
            slab = self._take(size)
            while slab is None and self._nbytes + self._free_nbytes + size > self._limit:
                other = next((n for n in self._free if n != size), None)
                if other is not None:  # free slabs of other sizes make room first
                    self._pop_free(other)  # and are unmapped
                elif self._items:  # then least recently used chunks
                    gone, evicted = self._items.popitem(last=False)
                    self._remember(gone, int(evicted.nbytes))
                    self._release(evicted)
                    del evicted
                    slab = self._take(size)
                else:  # the rest is reserved by puts in flight on other threads
                    return
            self._nbytes += size  # reserved now, so concurrent puts stay in bound
        if slab is None:
            slab = _new_slab(size)
        stored = slab[:size].view(value.dtype).reshape(value.shape)
        stored[...] = value  # copied without the lock: the slab is this call's alone
        stored.flags.writeable = False
        with self._lock:
            if key in self._items:  # another thread stored the same chunk meanwhile
                self._nbytes -= size
            else:
                self._items[key] = stored

    def _remember(self, key: Hashable, size: int) -> None:
        """Keep the key of an evicted chunk while the cache may still grow (lock held)."""
        if self._limit < self._maxbytes:
            self._ghosts[key] = size
            self._ghost_nbytes += size
            self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        """Forget the oldest evicted keys beyond what the cache could still grow by."""
        room = self._maxbytes - self._limit
        while self._ghosts and self._ghost_nbytes > room:
            _, size = self._ghosts.popitem(last=False)
            self._ghost_nbytes -= size

    def _take(self, size: int) -> np.ndarray | None:
        """Pop a free slab of `size` bytes for reuse, or None (lock held)."""
        if size not in self._free:
            return None
        self.reused += 1
        return self._pop_free(size)

    def _pop_free(self, size: int) -> np.ndarray:
        """Remove one free slab of `size` bytes from the pool and return it (lock held)."""
        pool = self._free[size]
        slab = pool.pop()
        if not pool:
            del self._free[size]
        self._free_nbytes -= size
        return slab

    def _release(self, arr: np.ndarray) -> None:
        """Account for a chunk leaving the cache; pool its slab if nobody holds it (lock held).

        ``arr`` must be referenced only by the caller's name (plus this argument).
        """
        size = int(arr.nbytes)
        self._nbytes -= size
        base = arr.base
        # the cache's own references: the caller's name, this argument and getrefcount's;
        # more means a caller of get() still holds the chunk or a view of its slab
        if (
            isinstance(base, np.ndarray)
            and base.nbytes == size
            and sys.getrefcount(arr) <= 3
            and sys.getrefcount(base) <= 3
        ):
            self._free.setdefault(size, []).append(base)
            self._free_nbytes += size

    def resize(self, maxbytes: int) -> None:
        """Change the bound, evicting least recently used arrays and free slabs if needed."""
        if maxbytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {maxbytes!r}")
        with self._lock:
            self._maxbytes = int(maxbytes)
            self._limit = min(self._maxbytes, max(self._limit, GROW_START_BYTES))
            self._trim_ghosts()
            while self._items and self._nbytes > self._limit:
                _, evicted = self._items.popitem(last=False)
                self._release(evicted)
                del evicted
            self._trim_free()

    def discard(self, owner: Hashable) -> None:
        """Drop every array whose key is a tuple starting with `owner` (a closed slide).

        When no chunk is left (the last open slide was closed), the free slabs are
        unmapped too: the cache then holds no memory at all.
        """
        with self._lock:
            for key in [k for k in self._items if isinstance(k, tuple) and k[:1] == (owner,)]:
                arr = self._items.pop(key)
                self._release(arr)
                del arr
            for key in [k for k in self._ghosts if isinstance(k, tuple) and k[:1] == (owner,)]:
                self._ghost_nbytes -= self._ghosts.pop(key)
            if not self._items:
                self._free.clear()
                self._free_nbytes = 0

    def clear(self) -> None:
        """Drop every chunk (keeping free slabs, within the bound) and reset the counters."""
        with self._lock:
            while self._items:
                _, arr = self._items.popitem()
                self._release(arr)
                del arr
            self.hits = self.misses = self.reused = 0

    def _trim_free(self) -> None:
        """Unmap free slabs until chunks and free slabs fit the limit (lock held)."""
        while self._free and self._nbytes + self._free_nbytes > self._limit:
            self._pop_free(next(iter(self._free)))

    def __repr__(self) -> str:
        return (
            f"<TileCache {self._nbytes}/{self._maxbytes} bytes, {len(self._items)} chunks, "
            f"{self._free_nbytes} bytes of free slabs>"
        )


#: Chunks of at least this many bytes get a memory map of their own (smaller ones are
#: plain arrays: the kernel's limit on the number of maps, 65530 by default, must not be
#: reached by a cache full of tiny tiles).
SLAB_MIN_BYTES = 64 * 2**10


#: Flags of a slab's memory map: private, anonymous, and (Linux) populated at once, so that
#: the kernel maps all its pages in one call instead of one page fault per 4 KiB page when
#: the chunk is copied in (about 40 % less time per new 192 KiB slab while the cache grows,
#: on the 2-core VM of ``benchmarks/RESULTS.md``).
_SLAB_FLAGS: int | None = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
    else None  # Windows: the default anonymous map
)


def _new_slab(size: int) -> np.ndarray:
    """Return `size` bytes of fresh uint8 memory the cache can hand back to the system."""
    if size < SLAB_MIN_BYTES:
        return np.empty(size, np.uint8)
    if _SLAB_FLAGS is None:
        return np.frombuffer(mmap.mmap(-1, size), np.uint8)
    return np.frombuffer(mmap.mmap(-1, size, flags=_SLAB_FLAGS), np.uint8)


_cache: TileCache | None = None
_cache_lock = threading.Lock()


def default_cache_bytes() -> int:
    """Return the bound from ``$SLIDESCOPE_CACHE_BYTES`` or :data:`DEFAULT_CACHE_BYTES`."""
    env = os.environ.get(CACHE_BYTES_ENV)
    if not env:
        return DEFAULT_CACHE_BYTES
    if env.strip() == "0":
        return 0
    return parse_bytes(env)


def tile_cache() -> TileCache:
    """Return the process-wide decoded-tile cache (created on first use)."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                _cache = TileCache(default_cache_bytes())
    return _cache


def set_cache_bytes(maxbytes: int | str) -> None:
    """Set the bound of the shared decoded-tile cache (``0`` disables it).

    Parameters
    ----------
    maxbytes : int or str
        Bytes, e.g. ``2**28`` or ``"256 MiB"``.

    Examples
    --------
    >>> set_cache_bytes("64 MiB")  # doctest: +SKIP
    """
    n = 0 if maxbytes in (0, "0") else parse_bytes(maxbytes)
    tile_cache().resize(n)
