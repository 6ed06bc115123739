"""Pyramid levels as dask arrays: imported only when a slide's ``levels`` are first used.

A level is a :class:`LevelArray`, a dask array whose graph is one lazy layer (nothing is
built per chunk). A basic slice of it (ints and step-1 slices, what napari does) returns a
:class:`RegionArray` with the same chunks a dask slice would have and a lazy graph of only
those chunks; ``np.asarray`` of a region reads it directly through the level's
:class:`~napari_slidescope.slide._levels.LevelReader`, decoding its missing native chunks
on a small module-level thread pool, with no dask scheduler in the way. ``compute()``,
``map_blocks`` and every other dask operation still work on the ordinary graph.

This module is apart from :mod:`~napari_slidescope.slide._levels` so that opening a slide
and reading it through its readers (tissue detection, ``read_region``) never imports
dask.array (about 0.7 s in a fresh process).
"""

from __future__ import annotations

from typing import Any, cast

import dask.array as da
import numpy as np
import numpy.typing as npt

from napari_slidescope.slide._levels import AxisRanges, LevelReader, _basic_selection
from napari_slidescope.slide.chunking import choose_chunks

__all__ = ["LevelArray", "RegionArray", "as_dask"]


class _RangesView:
    """Array-like over one box of a level, with some axes dropped (dask's chunk getter)."""

    def __init__(self, reader: LevelReader, box: AxisRanges, keep: tuple[bool, ...]) -> None:
        self._reader, self._box, self._keep = reader, box, keep
        self.shape = tuple(b - a for (a, b), k in zip(box, keep, strict=True) if k)
        self.dtype = reader.dtype
        self.ndim = len(self.shape)

    def read(self, sub: AxisRanges | None, *, parallel: bool) -> np.ndarray:
        parts = iter(sub) if sub is not None else None
        full: list[tuple[int, int]] = []
        for (a, b), k in zip(self._box, self._keep, strict=True):
            if k and parts is not None:
                s0, s1 = next(parts)
                full.append((a + s0, a + s1))
            else:
                full.append((a, b))
        arr = self._reader.read(tuple(full), parallel=parallel)
        drop = tuple(i for i, k in enumerate(self._keep) if not k)
        return (
            arr.reshape(tuple(n for n, k in zip(arr.shape, self._keep, strict=True) if k))
            if drop
            else arr
        )

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        sub = tuple(s.indices(n)[:2] for s, n in zip(key, self.shape, strict=True))
        return self.read(sub, parallel=False)


class LevelArray(da.Array):
    """A pyramid level: a lazy dask array whose basic slices touch only their own chunks.

    See the module docstring. Behaves as any dask array; slicing with ints and step-1
    slices returns a :class:`RegionArray`, anything else falls back to dask's slicing.
    """

    __slots__ = ()
    _reader: LevelReader

    def __getitem__(self, index: Any) -> Any:
        sel = _basic_selection(index, self.shape)
        if sel is None:
            return super().__getitem__(index)  # type: ignore[no-untyped-call]  # dask's
        box, keep = sel
        return _region(self, box, keep)

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None, **kwargs: Any
    ) -> np.ndarray:
        x = self._reader.read(tuple((0, n) for n in self.shape), parallel=True)
        return x if dtype is None else x.astype(dtype, copy=False)


class RegionArray(da.Array):
    """A basic slice of a :class:`LevelArray`; ``np.asarray`` reads it in one parallel call."""

    __slots__ = ()
    _view: _RangesView

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None, **kwargs: Any
    ) -> np.ndarray:
        x = self._view.read(None, parallel=True)
        return x if dtype is None else x.astype(dtype, copy=False)


def _region(level: LevelArray, box: AxisRanges, keep: tuple[bool, ...]) -> RegionArray:
    chunks = []
    for (a, b), axis_chunks, k in zip(box, level.chunks, keep, strict=True):
        if not k:
            continue
        c = axis_chunks[0]  # the level's chunks are regular: all equal but the last
        chunks.append(tuple(min(b, (i + 1) * c) - max(a, i * c) for i in range(a // c, -(-b // c))))
    view = _RangesView(level._reader, box, keep)
    name = f"{level.name}-{'-'.join(f'{a}.{b}' for a, b in box)}"
    arr = da.from_array(
        view,
        chunks=tuple(chunks),
        name=name,
        asarray=False,
        lock=False,
        inline_array=True,
        meta=np.empty((0,) * view.ndim, dtype=view.dtype),
    )
    arr.__class__ = RegionArray  # same layout; cheaper than building a second Array
    arr._view = view
    return cast(RegionArray, arr)


def as_dask(reader: LevelReader, budget: int, *, owner: int, level: int) -> LevelArray:
    """Return the :class:`LevelArray` over `reader`, in dask chunks of about `budget` bytes.

    Parameters
    ----------
    reader : LevelReader
        The level's reader (its spatial axes give the chunking).
    budget : int
        Dask chunk budget in bytes (see :func:`choose_chunks`).
    owner : int
        Id of the open slide (names the dask graph).
    level : int
        Level index (names the dask graph).
    """
    chunks = choose_chunks(
        reader.shape, reader.native, reader.dtype.itemsize, spatial=reader.spatial, budget=budget
    )
    arr = da.from_array(
        reader,
        chunks=chunks,
        name=f"slidescope-{owner}-level{level}",
        asarray=False,
        lock=False,
        inline_array=True,
        meta=np.empty((0,) * reader.ndim, dtype=reader.dtype),
    )
    out = LevelArray(  # type: ignore[no-untyped-call]  # dask.Array's constructor
        arr.dask, arr.name, arr.chunks, meta=np.empty((0,) * reader.ndim, reader.dtype)
    )
    out._reader = reader
    return out
