"""Reading tiles: one tile, an ordered iterator with read-ahead, a PyTorch dataset.

A tile's exact footprint (:meth:`TileTable.footprints`, a fraction of a level-0 pixel in
general) is mapped onto the level the table chose, the level pixels covering it are read
through the slide's public API (``Slide.read_level``: every source ``open_slide`` opens),
and resampled to ``tile_px`` by *exact pixel-area averaging*: each output pixel is the
mean of the level pixels under it, weighted by the area each covers (a box filter, as
OpenCV's ``INTER_AREA`` when shrinking; antialiased; a whole-number ratio on a pixel boundary
is the block mean), separably, as a few banded gathers per axis (about 2x PIL's ``BOX``
resize, which weighs source pixels 0 or 1 by their centres); ratio 1 is a plain crop. The part of a
tile that hangs over the slide's edge is glass (255) on brightfield RGB slides, 0 on
others, as ``Slide.read_region`` fills it.
"""

from __future__ import annotations

import math
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from napari_slidescope.tiles.tiling import TileTable

__all__ = ["TileDataset", "area_resize", "iter_tiles", "read_tile"]

TORCH_EXTRA = 'pip install "napari-slidescope[torch]"'


def _area_weights(
    start: float, step: float, n_out: int, n_in: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return the band of source pixels under each output pixel and their area weights.

    Output pixel ``i`` averages the source interval ``[start + i*step, start + (i+1)*step)``;
    it overlaps at most ``ceil(step) + 1`` source pixels: ``index[i, k]`` is the k-th of
    them (clamped into the image where its weight is 0) and ``weight[i, k]`` the fraction of
    the interval it covers (a row sums to 1 inside the image).
    """
    a = start + step * np.arange(n_out, dtype=np.float64)[:, None]
    b = a + step
    first = np.floor(a + 1e-9)
    k = max(1, int(np.max(np.ceil(b - 1e-9) - first)))  # ceil(step) + 1 at most
    j = first.astype(np.int64) + np.arange(k)[None, :]
    w = np.clip(np.minimum(b, j + 1) - np.maximum(a, j), 0.0, None) / step
    w[(j < 0) | (j >= n_in)] = 0.0
    return np.clip(j, 0, n_in - 1), w.astype(np.float32)


def area_resize(
    image: np.ndarray, start: tuple[float, float], step: tuple[float, float], size: int
) -> np.ndarray:
    """Resample the window of `image` starting at `start` to ``size x size`` by pixel area.

    Parameters
    ----------
    image : (M, N, C) ndarray
        Source pixels.
    start : (float, float)
        Top-left of the window in source pixels (fractions allowed).
    step : (float, float)
        Source pixels per output pixel (rows, columns).
    size : int
        Output side.

    Returns
    -------
    (size, size, C) ndarray of image's dtype (rounded for integers)

    Examples
    --------
    >>> img = np.arange(16, dtype=np.uint8).reshape(4, 4, 1)
    >>> area_resize(img, (0, 0), (2, 2), 2)[..., 0].tolist()
    [[2, 4], [10, 12]]
    """
    (sy, sx), (ky, kx) = start, step
    h, w, c = image.shape
    if ky == kx == 1 and sy == int(sy) and sx == int(sx):
        out: np.ndarray = image[int(sy) : int(sy) + size, int(sx) : int(sx) + size]
        if out.shape[:2] == (size, size):
            return out
    # separable and banded: each output row (then column) is a weighted sum of the few
    # source rows under it, one vectorised gather per band position; the column pass runs
    # on the transposed rows so that its gathers are contiguous too
    jy, wy = _area_weights(sy, ky, size, h)
    jx, wx = _area_weights(sx, kx, size, w)
    rows = image[jy[:, 0]] * wy[:, 0, None, None]
    for k in range(1, jy.shape[1]):
        rows += image[jy[:, k]] * wy[:, k, None, None]
    across = np.ascontiguousarray(rows.transpose(1, 0, 2))
    cols = across[jx[:, 0]] * wx[:, 0, None, None]
    for k in range(1, jx.shape[1]):
        cols += across[jx[:, k]] * wx[:, k, None, None]
    mean = cols.transpose(1, 0, 2)
    if np.issubdtype(image.dtype, np.integer):
        info = np.iinfo(image.dtype)
        np.rint(mean, out=mean)
        np.clip(mean, info.min, info.max, out=mean)
    resized: np.ndarray = np.ascontiguousarray(mean, dtype=image.dtype)
    return resized


def _hwc(pixels: np.ndarray, axes: str) -> np.ndarray:
    if axes == "YXS":
        return pixels
    if axes == "CYX":
        return np.moveaxis(pixels, 0, -1)
    return pixels[..., None]


def _snap(v: float) -> float:
    r = round(v)
    return float(r) if abs(v - r) < 1e-6 * max(1.0, abs(v)) else v


def read_tile(slide: Any, tiles: TileTable, i: int) -> np.ndarray:
    """Read tile `i` (position in `tiles`) at the table's µm/px.

    Returns
    -------
    (tile_px, tile_px, C) ndarray
        The slide's dtype, channels last (uint8 RGB for brightfield slides).
    """
    c = tiles.columns
    level = int(c["level"][i])
    return _read(slide, level, float(c["y_um"][i]), float(c["x_um"][i]), tiles)


def _read(slide: Any, level: int, y_um: float, x_um: float, tiles: TileTable) -> np.ndarray:
    mpp0 = tiles.slide_mpp
    dy, dx = slide.downsamples[level]
    # exact footprint in the level's pixels
    fy, fx = y_um / mpp0[0] / dy, x_um / mpp0[1] / dx
    ky, kx = tiles.mpp / mpp0[0] / dy, tiles.mpp / mpp0[1] / dx
    # µm -> pixels in floating point: a whole number a rounding error away is that number
    fy, fx, ky, kx = (_snap(v) for v in (fy, fx, ky, kx))
    size = tiles.tile_px
    eps = 1e-6
    ly0, lx0 = int(math.floor(fy + eps)), int(math.floor(fx + eps))
    ly1 = int(math.ceil(fy + ky * size - eps))
    lx1 = int(math.ceil(fx + kx * size - eps))
    h, w = slide.level_shapes[level]
    pixels = _hwc(slide.read_level(level, (ly0, lx0, min(ly1, h), min(lx1, w))), slide.axes)
    if pixels.shape[0] < ly1 - ly0 or pixels.shape[1] < lx1 - lx0:
        fill = 255 if slide.is_rgb and not getattr(slide, "fluorescence", False) else 0
        pad = ((0, ly1 - ly0 - pixels.shape[0]), (0, lx1 - lx0 - pixels.shape[1]), (0, 0))
        pixels = np.pad(pixels, pad, constant_values=fill)
    return area_resize(pixels, (fy - ly0, fx - lx0), (ky, kx), size)


def iter_tiles(
    slide: Any,
    tiles: TileTable,
    *,
    read_ahead: int = 8,
    threads: int | None = None,
) -> Iterator[tuple[dict[str, Any], np.ndarray]]:
    """Yield ``(tile_row, image)`` for every tile of `tiles`, in table order.

    Reading runs on a thread pool at most `read_ahead` tiles ahead of the consumer, so
    memory stays bounded whatever the number of tiles (decoding releases the GIL).

    Parameters
    ----------
    slide : Slide
        The slide `tiles` was cut from.
    tiles : TileTable
        The tiles.
    read_ahead : int
        Tiles read but not yet consumed, at most.
    threads : int, optional
        Reader threads (default: the CPU count, at most 8).

    Yields
    ------
    tile_row : dict
        :meth:`TileTable.row` of the tile.
    image : (tile_px, tile_px, C) ndarray
        As :func:`read_tile`.
    """
    if read_ahead < 1:
        raise ValueError(f"read_ahead must be at least 1, got {read_ahead!r}")
    n_threads = threads or min(8, os.cpu_count() or 1)
    pending: queue.SimpleQueue[Future[np.ndarray]] = queue.SimpleQueue()
    with ThreadPoolExecutor(n_threads, thread_name_prefix="slidescope-tiles") as pool:
        ahead = 0
        submitted = 0
        n = len(tiles)
        try:
            for i in range(n):
                while submitted < n and ahead < read_ahead:
                    pending.put(pool.submit(read_tile, slide, tiles, submitted))
                    submitted += 1
                    ahead += 1
                image = pending.get().result()
                ahead -= 1
                yield tiles.row(i), image
        finally:
            while not pending.empty():
                pending.get().cancel()


OUTPUTS = ("uint8_hwc", "float_chw")


class TileDataset:
    """A PyTorch map-style dataset over the tiles of one slide or many.

    Each DataLoader worker opens the slides itself, on first use: pickling the dataset
    (what DataLoader does to start its workers) carries the slides' paths and the tiles'
    positions only, never pixels or an open file. Importing it needs no torch; getting an
    item does (``[torch]`` extra).

    Parameters
    ----------
    sources : (path, TileTable) or list of them
        The slides (local paths or URLs) and their tiles.
    transform : callable, optional
        Applied to each tile's ``(H, W, C)`` uint8 array before conversion (colour
        normalisation, augmentation); may return an ndarray or a tensor.
    output : {"uint8_hwc", "float_chw"}
        ``"uint8_hwc"``: the tile as a uint8 ``(H, W, C)`` tensor; ``"float_chw"``: float32
        ``(C, H, W)`` in 0..1 (after `transform`, when it returns an ndarray).
    storage_options : dict, optional
        Passed to :func:`~napari_slidescope.slide.open_slide` for URLs. They are pickled
        with the dataset (each worker opens the slides with them): keep secret keys out
        and in the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, which
        s3fs reads in each worker).

    Notes
    -----
    An item is ``(image, slide_index, tile_id)``.

    Examples
    --------
    >>> ds = TileDataset([("a.svs", tiles_a), ("b.svs", tiles_b)])  # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4)  # doctest: +SKIP
    """

    def __init__(
        self,
        sources: tuple[Any, TileTable] | Sequence[tuple[Any, TileTable]],
        *,
        transform: Callable[[np.ndarray], Any] | None = None,
        output: str = "uint8_hwc",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output: expected one of {OUTPUTS}, got {output!r}")
        if isinstance(sources, tuple) and len(sources) == 2 and isinstance(sources[1], TileTable):
            sources = [sources]
        self.paths: list[str] = []
        self.tables: list[TileTable] = []
        for path, table in sources:
            if not isinstance(table, TileTable):
                raise TypeError(f"{path}: expected a TileTable, got {type(table).__name__}")
            self.paths.append(str(path))
            self.tables.append(table)  # numpy columns and a few numbers: small to pickle
        counts = np.array([len(t) for t in self.tables], np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(counts)])
        self.transform = transform
        self.output = output
        self.storage_options = storage_options
        self._slides: dict[int, Any] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_slides"] = {}  # open slides stay in the process that opened them
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _slide(self, k: int) -> Any:
        if self._pid != os.getpid():  # a forked worker: the parent's handles are not ours
            self._slides, self._pid = {}, os.getpid()
        with self._lock:
            slide = self._slides.get(k)
            if slide is None:
                from napari_slidescope.slide import open_slide

                slide = open_slide(self.paths[k], storage_options=self.storage_options)
                self._slides[k] = slide
        return slide

    def locate(self, index: int) -> tuple[int, int]:
        """``(slide_index, row in that slide's table)`` of dataset item `index`."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} tiles")
        index %= len(self)
        k = int(np.searchsorted(self._offsets, index, side="right") - 1)
        return k, int(index - self._offsets[k])

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        try:
            import torch
        except ImportError as e:
            raise ImportError(f"TileDataset needs PyTorch: {TORCH_EXTRA}") from e
        k, i = self.locate(index)
        table = self.tables[k]
        image: Any = read_tile(self._slide(k), table, i)
        if self.transform is not None:
            image = self.transform(image)
        if isinstance(image, np.ndarray):
            image = torch.from_numpy(np.ascontiguousarray(image))
            if self.output == "float_chw":
                image = image.permute(2, 0, 1).float().div_(255.0)
        return image, k, int(table.columns["id"][i])

    def close(self) -> None:
        """Close the slides this process opened."""
        for slide in self._slides.values():
            slide.close()
        self._slides = {}
