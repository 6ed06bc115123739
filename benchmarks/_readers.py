"""The readers the reader benchmarks compare: ours, OpenSlide, tiffslide, fastslide,
napari-tiff, plain zarr, and the single-core decode floor, behind one small interface."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


class Reader:
    """One way of reading viewports; `prepare` is untimed, `read` is timed."""

    name = "?"

    def __init__(self, path: Path) -> None:
        self.path = path

    def levels(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def prepare(self, level: int, y: int, x: int, h: int, w: int) -> None:
        """Untimed work before a read (the floor reads its raw segments here)."""

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Release the file."""


class Ours(Reader):
    name = "ours"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        from napari_slidescope import open_slide

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.slide = open_slide(path)
        # a multichannel slide's levels are (C, Y, X): read every channel of the box
        self.cyx = tuple(self.slide.levels[0].shape[1:]) == tuple(self.slide.level_shapes[0])

    def levels(self) -> list[tuple[int, int]]:
        return self.slide.level_shapes

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        lv = self.slide.levels[level]
        return np.asarray(lv[:, y : y + h, x : x + w] if self.cyx else lv[y : y + h, x : x + w])

    def close(self) -> None:
        self.slide.close()


class OursRegion(Ours):
    """Ours through ``Slide.read_region`` (level-0 box, read on the calling thread)."""

    name = "ours-region"

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        dy, dx = self.slide.downsamples[level]
        y0, x0 = round(y * dy), round(x * dx)
        return self.slide.read_region((y0, x0, y0 + round(h * dy), x0 + round(w * dx)), level=level)


class Baseline(Ours):
    """Ours as it is on ``main`` (levels + ``np.asarray``), imported as ``napari_slidescope_base``.

    Made by ``reader_fair.py --baseline DIR`` from a copy of main's ``src/napari_slidescope``
    with the package renamed, so both versions (and their tile caches) live in one process.
    """

    name = "baseline"

    def __init__(self, path: Path) -> None:
        Reader.__init__(self, path)
        from napari_slidescope_base import open_slide  # type: ignore[import-not-found]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.slide = open_slide(path)
        self.cyx = tuple(self.slide.levels[0].shape[1:]) == tuple(self.slide.level_shapes[0])


class OursLayer(Ours):
    """Ours through the napari layer path: the npe2 reader's layer data, sliced and read
    inside napari's own dask context (``configure_dask``), as napari's slice request does."""

    name = "ours-layer"

    def __init__(self, path: Path) -> None:
        Reader.__init__(self, path)
        from napari.utils._dask_utils import configure_dask

        from napari_slidescope._napari.reader import read_slide

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = read_slide(str(path))[0][0]
        self.data = data if isinstance(data, list) else [data]
        self.indexer = configure_dask(self.data)
        # a multichannel slide is one (C, Y, X) array split by napari's channel_axis
        self.cyx = self.data[0].ndim == 3 and self.data[0].shape[-1] not in (3, 4)

    def levels(self) -> list[tuple[int, int]]:
        return [tuple(int(n) for n in d.shape[int(self.cyx) :][:2]) for d in self.data]  # type: ignore[misc]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        lv = self.data[level]
        with self.indexer():
            return np.asarray(lv[:, y : y + h, x : x + w] if self.cyx else lv[y : y + h, x : x + w])

    def close(self) -> None:
        self.data = []


class OpenSlideReader(Reader):
    name = "openslide"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        import openslide

        self.osr = openslide.OpenSlide(str(path))
        self.ds = [float(d) for d in self.osr.level_downsamples]

    def levels(self) -> list[tuple[int, int]]:
        return [(h, w) for w, h in self.osr.level_dimensions]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        d = self.ds[level]
        return np.asarray(self.osr.read_region((round(x * d), round(y * d)), level, (w, h)))

    def close(self) -> None:
        self.osr.close()


class TiffSlideReader(Reader):
    name = "tiffslide"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        import tiffslide

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.ts = tiffslide.TiffSlide(str(path))
        self.ds = [float(d) for d in self.ts.level_downsamples]

    def levels(self) -> list[tuple[int, int]]:
        return [(h, w) for w, h in self.ts.level_dimensions]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        d = self.ds[level]
        return self.ts.read_region((round(x * d), round(y * d)), level, (w, h), as_array=True)

    def close(self) -> None:
        self.ts.close()


class FastSlideReader(Reader):
    """fastslide (C++ reader with its own tile cache); ``read_region`` takes level-native
    (x, y) and (width, height) and returns an image whose ``numpy()`` is an RGB array."""

    name = "fastslide"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        import fastslide

        self.fs = fastslide.FastSlide.from_file_path(str(path))

    def levels(self) -> list[tuple[int, int]]:
        return [(int(h), int(w)) for w, h in self.fs.level_dimensions]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        return np.asarray(self.fs.read_region((x, y), level, (w, h)).numpy())

    def close(self) -> None:
        self.fs.close()


class NapariTiffReader(Reader):
    name = "napari-tiff"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        from napari_tiff.napari_tiff_reader import reader_function

        data = reader_function(str(path))[0][0]
        self.data = data if isinstance(data, list) else [data]

    def levels(self) -> list[tuple[int, int]]:
        return [tuple(int(n) for n in d.shape[:2]) for d in self.data]  # type: ignore[misc]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        return np.asarray(self.data[level][y : y + h, x : x + w])


class ZarrReader(Reader):
    name = "zarr"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        import tifffile
        import zarr

        self.tif = tifffile.TiffFile(path)
        series = max(self.tif.series, key=lambda s: s.size)
        node = zarr.open(series.aszarr(), mode="r")
        if isinstance(node, zarr.Array):
            self.z = [node]
        else:
            keys = sorted(node.array_keys(), key=lambda k: -int(np.prod(node[k].shape)))
            self.z = [node[k] for k in keys]

    def levels(self) -> list[tuple[int, int]]:
        return [tuple(int(n) for n in z.shape[:2]) for z in self.z]  # type: ignore[misc]

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        return self.z[level][y : y + h, x : x + w]

    def close(self) -> None:
        self.tif.close()


class Floor(Reader):
    """Single-thread decode of exactly the native chunks a viewport touches."""

    name = "floor"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        import tifffile

        self.tif = tifffile.TiffFile(path)
        series = max(self.tif.series, key=lambda s: s.size)
        self.pages = [lv.keyframe for lv in series.levels]
        self.raw: list[tuple[bytes, int]] = []

    def levels(self) -> list[tuple[int, int]]:
        return [(p.imagelength, p.imagewidth) for p in self.pages]

    def prepare(self, level: int, y: int, x: int, h: int, w: int) -> None:
        p = self.pages[level]
        th, tw = (p.tilelength, p.tilewidth) if p.is_tiled else (p.rowsperstrip, p.imagewidth)
        across = -(-p.imagewidth // tw)
        segs = [
            r * across + c
            for r in range(y // th, -(-(y + h) // th))
            for c in range(x // tw, -(-(x + w) // tw))
        ]
        self.kw = {}
        if p.jpegtables is not None:
            self.kw["jpegtables"] = p.jpegtables
        if p.jpegheader is not None:
            self.kw["jpegheader"] = p.jpegheader
        self.decode = p.decode
        self.raw = list(
            self.tif.filehandle.read_segments(
                [p.dataoffsets[s] for s in segs], [p.databytecounts[s] for s in segs], segs
            )
        )

    def read(self, level: int, y: int, x: int, h: int, w: int) -> Any:
        decode, kw = self.decode, self.kw
        for data, index in self.raw:
            decode(data, index, **kw)

    def close(self) -> None:
        self.tif.close()


READERS: dict[str, Callable[[Path], Reader]] = {
    "ours": Ours,
    "ours-layer": OursLayer,
    "ours-region": OursRegion,
    "baseline": Baseline,
    "openslide": OpenSlideReader,
    "tiffslide": TiffSlideReader,
    "fastslide": FastSlideReader,
    "napari-tiff": NapariTiffReader,
    "zarr": ZarrReader,
    "floor": Floor,
}
