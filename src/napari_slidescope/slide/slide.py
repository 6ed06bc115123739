"""The :class:`Slide` object and :func:`open_slide`, the public way to open a slide."""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from napari_slidescope._units import as_pair
from napari_slidescope.errors import SlideError, SlidescopeWarning
from napari_slidescope.slide import _bif, _check, _levels, _registry, _scaled, _tiff, level_choice
from napari_slidescope.slide._backend import BackendSlide
from napari_slidescope.slide.cache import tile_cache
from napari_slidescope.slide.chunking import default_chunk_bytes, parse_bytes
from napari_slidescope.slide.formats import FormatInfo, associated_name, describe
from napari_slidescope.slide.source import Source, UrlPath, resolve

if TYPE_CHECKING:
    import dask.array as da
    import tifffile

    from napari_slidescope.slide.remote import RemoteFile

OnError = Literal["raise", "blank"]


class _Associated(Mapping[str, np.ndarray]):
    """Associated images (label, macro, thumbnail...), decoded on first access."""

    def __init__(self, loaders: dict[str, Callable[[], np.ndarray]]) -> None:
        self._loaders = loaders
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self._loaders[name]()
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def __repr__(self) -> str:
        return f"<associated images {sorted(self._loaders)}>"


class _BaseSlide:
    """Geometry helpers shared by :class:`Slide` and :class:`ArraySlide`."""

    axes: str
    mpp: tuple[float, float] | None
    _level_list: list[da.Array] | None = None

    @property
    def levels(self) -> list[da.Array]:
        """Pyramid levels as dask arrays, level 0 first."""
        if self._level_list is None:
            self._level_list = self._make_levels()
        return self._level_list

    @levels.setter
    def levels(self, value: list[da.Array]) -> None:
        self._level_list = list(value)

    def _make_levels(self) -> list[da.Array]:
        """Build the levels on first use (a slide that has them from the start has none)."""
        raise AttributeError(f"{type(self).__name__} has no levels")

    @property
    def is_rgb(self) -> bool:
        """True for RGB(A) slides with axes ``"YXS"``."""
        return self.axes == "YXS"

    @property
    def _yx(self) -> tuple[int, int]:
        return self.axes.index("Y"), self.axes.index("X")

    @property
    def level_shapes(self) -> list[tuple[int, int]]:
        """(rows, cols) of each level."""
        yi, xi = self._yx
        return [(int(lv.shape[yi]), int(lv.shape[xi])) for lv in self.levels]

    @property
    def shape0(self) -> tuple[int, int]:
        """(rows, cols) of level 0."""
        return self.level_shapes[0]

    @property
    def downsamples(self) -> list[tuple[float, float]]:
        """(y, x) level-0 pixels per pixel of each level, from exact shapes."""
        h0, w0 = self.shape0
        return [(h0 / h, w0 / w) for h, w in self.level_shapes]

    def level_mpp(self, level: int) -> tuple[float, float] | None:
        """Micrometres per pixel (y, x) of `level`, or None without calibration."""
        if self.mpp is None:
            return None
        dy, dx = self.downsamples[level]
        return (self.mpp[0] * dy, self.mpp[1] * dx)

    def nearest_level(self, target_mpp: float) -> int:
        """Return the level whose pixel size is nearest to `target_mpp` (log scale).

        Ties go to the finer level; the rule is
        :func:`~napari_slidescope.slide.level_choice.nearest_level`. Without calibration,
        `target_mpp` is read as a downsample factor relative to level 0.
        """
        if not target_mpp > 0:
            raise ValueError(f"target_mpp must be positive, got {target_mpp!r}")
        base = self.mpp[1] if self.mpp is not None else 1.0
        target = target_mpp / base
        return level_choice.nearest_level(self.downsamples, (target, target))

    def level_for_mpp(self, target_mpp: float) -> int:
        """Return the level nearest to `target_mpp`: a synonym of :meth:`nearest_level`."""
        return self.nearest_level(target_mpp)

    def read_region(
        self,
        region: tuple[int, int, int, int],
        *,
        level: int = 0,
        fill: float | None = None,
    ) -> np.ndarray:
        """Read the pixels of `level` covering the level-0 box `region` ``(y0, x0, y1, x1)``.

        Reads on the calling thread. The result keeps the slide's axes order and always
        has the box's shape at `level` (``ceil(y1 / dy) - floor(y0 / dy)`` rows, alike for
        columns).

        A box partly outside the slide is padded: the part outside holds no pixels and is
        filled with `fill`, so array indices stay relative to the box (as OpenSlide's
        ``read_region`` keeps its size) and nothing shifts at the slide's edges. The
        default fill is what an empty part of a slide looks like: white glass (255) for a
        brightfield RGB slide, no signal (0) for fluorescence and multichannel slides, so
        it reads as background, never as tissue. A box with no part on the slide raises
        instead of returning an all-fill (or empty) array that could pass for a result.

        Parameters
        ----------
        region : (int, int, int, int)
            Level-0 box ``(y0, x0, y1, x1)``, half-open.
        level : int
            Pyramid level to read.
        fill : float, optional
            Value of the pixels outside the slide (default: see above).

        Returns
        -------
        ndarray
            The slide's dtype and axes, the box's shape at `level`.

        Raises
        ------
        ValueError
            If the box is empty, malformed, or lies wholly outside the slide (the message
            names the box and the slide's level-0 size).
        """
        try:
            y0, x0 = (int(math.floor(float(v))) for v in region[:2])
            y1, x1 = (int(math.ceil(float(v))) for v in region[2:])
        except (TypeError, ValueError):
            raise ValueError(
                f"region must be (y0, x0, y1, x1) in level-0 pixels, got {region!r}"
            ) from None
        name = str(getattr(self, "path", "slide"))
        if y1 <= y0 or x1 <= x0:
            raise ValueError(f"{name}: region {region!r} is empty: need y1 > y0 and x1 > x0")
        h0, w0 = self.shape0
        if y1 <= 0 or x1 <= 0 or y0 >= h0 or x0 >= w0:
            raise ValueError(
                f"{name}: region {region!r} lies wholly outside the slide "
                f"(level 0 is {h0} x {w0} px)"
            )
        inner = self.level_box((max(y0, 0), max(x0, 0), min(y1, h0), min(x1, w0)), level)
        pixels = self._read_level_box(inner, level)
        if 0 <= y0 and 0 <= x0 and y1 <= h0 and x1 <= w0:
            return pixels
        dy, dx = self.downsamples[level]
        fy0 = int(math.floor(y0 / dy)) if y0 < 0 else inner[0]
        fx0 = int(math.floor(x0 / dx)) if x0 < 0 else inner[1]
        fy1 = int(math.ceil(y1 / dy)) if y1 > h0 else inner[2]
        fx1 = int(math.ceil(x1 / dx)) if x1 > w0 else inner[3]
        if fill is None:
            fill = 255 if self.is_rgb and not getattr(self, "fluorescence", False) else 0
        yi, xi = self._yx
        shape = list(pixels.shape)
        shape[yi], shape[xi] = fy1 - fy0, fx1 - fx0
        out = np.full(shape, fill, dtype=pixels.dtype)
        index: list[slice] = [slice(None)] * len(shape)
        index[yi] = slice(inner[0] - fy0, inner[0] - fy0 + pixels.shape[yi])
        index[xi] = slice(inner[1] - fx0, inner[1] - fx0 + pixels.shape[xi])
        out[tuple(index)] = pixels
        return out

    def level_box(self, region: tuple[int, int, int, int], level: int) -> tuple[int, int, int, int]:
        """Return the `level` pixel box covering the level-0 box `region`, clipped."""
        y0, x0, y1, x1 = region
        dy, dx = self.downsamples[level]
        h, w = self.level_shapes[level]
        ly0 = min(max(int(math.floor(y0 / dy)), 0), h)
        lx0 = min(max(int(math.floor(x0 / dx)), 0), w)
        ly1 = min(max(int(math.ceil(y1 / dy)), ly0), h)
        lx1 = min(max(int(math.ceil(x1 / dx)), lx0), w)
        return ly0, lx0, ly1, lx1

    def read_level(self, level: int, box: tuple[int, int, int, int]) -> np.ndarray:
        """Read a box of one level's pixels (a file's slide: without dask).

        Parameters
        ----------
        level : int
            Pyramid level, ``0 <= level < len(slide.levels)``.
        box : (int, int, int, int)
            ``(y0, x0, y1, x1)`` in that level's pixels, half-open, ``0 <= y0 <= y1``
            and ``0 <= x0 <= x1``; clipped to the level's size.

        Returns
        -------
        ndarray
            The pixels, in the slide's axes (``(rows, cols, 3)`` for RGB, ``(C, rows,
            cols)`` for multichannel).

        Raises
        ------
        ValueError
            If the level does not exist or the box is not four integers in that order.
        """
        return self._read_level(self._level_box(level, box), int(level))

    def _read_level(self, box: tuple[int, int, int, int], level: int) -> np.ndarray:
        """Read a checked level box (the slide's own way: a file's slide overrides it)."""
        return self._read_level_box(box, level)

    def level_scales(self, level: int) -> tuple[int, ...]:
        """Scale denominators :meth:`read_level_scaled` reads `level` at: ``(1,)`` here.

        A file's slide whose level is 8-bit JPEG says ``(1, 2, 4, 8)``.
        """
        self._level_box(level, (0, 0, 0, 0))
        return (1,)

    def read_level_scaled(
        self,
        level: int,
        box: tuple[int, int, int, int],
        scale: int,
        *,
        check: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """Read a box of one level at ``1 / scale`` of its size (JPEG: in the DCT domain).

        Parameters
        ----------
        level : int
            Pyramid level.
        box : (int, int, int, int)
            ``(y0, x0, y1, x1)`` in that level's pixels, clipped to the level; ``y0`` and
            ``x0`` multiples of `scale`.
        scale : int
            One of :meth:`level_scales`: output pixel ``(i, j)`` shows the level's
            ``scale x scale`` block from ``(y0 + i*scale, x0 + j*scale)``, about its mean
            (libjpeg's scaled inverse DCT; partial edge blocks included). On a JPEG level
            even 1 decodes straight into the output, not through the shared tile cache
            (which a one-off read of a whole level would only flush): the pixels of
            :meth:`read_level`.
        check : callable, optional
            Called between tile rows; raising stops the read (cancellation).

        Returns
        -------
        ndarray
            ``(ceil(rows / scale), ceil(cols / scale)[, samples])``, in the slide's axes
            as :meth:`read_level` (``YXS`` or ``YX`` levels).

        Raises
        ------
        ValueError
            If `scale` is not one of :meth:`level_scales` or the box is not aligned to it.
        SlideError
            A damaged tile, as :meth:`read_level`.
        """
        scales = self.level_scales(level)
        if scale == 1 and scales == (1,):
            return self.read_level(level, box)
        if scale not in scales:
            raise ValueError(
                f"level {level} cannot be read at 1/{scale} (only {self.level_scales(level)})"
            )
        return self._read_level_scaled(self._level_box(level, box), int(level), scale, check)

    def _read_level_scaled(
        self,
        box: tuple[int, int, int, int],
        level: int,
        scale: int,
        check: Callable[[], None] | None,
    ) -> np.ndarray:
        raise NotImplementedError  # only reached through a subclass's level_scales

    def _level_box(self, level: Any, box: Any) -> tuple[int, int, int, int]:
        """Check ``read_level``'s arguments; return the box clipped to the level."""
        name = getattr(getattr(self, "path", None), "name", None) or type(self).__name__
        shapes = self.level_shapes
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
            raise ValueError(f"{name}: level must be an integer, got {level!r}")
        if not 0 <= int(level) < len(shapes):
            raise ValueError(
                f"{name}: level {level!r} does not exist (levels 0 to {len(shapes) - 1})"
            )
        values = list(box) if isinstance(box, (tuple, list, np.ndarray)) else []
        if len(values) != 4 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"{name}: box must be four integers (y0, x0, y1, x1), got {box!r}")
        y0, x0, y1, x1 = (int(v) for v in values)
        if not (0 <= y0 <= y1 and 0 <= x0 <= x1):
            raise ValueError(
                f"{name}: box {tuple(values)!r} must have 0 <= y0 <= y1 and 0 <= x0 <= x1"
            )
        h, w = shapes[int(level)]
        return min(y0, h), min(x0, w), min(y1, h), min(x1, w)

    def _read_level_box(self, box: tuple[int, int, int, int], level: int) -> np.ndarray:
        """Read a box of `level` pixels (inside the level) on the calling thread."""
        ly0, lx0, ly1, lx1 = box
        index: list[slice] = [slice(None)] * len(self.axes)
        yi, xi = self._yx
        index[yi], index[xi] = slice(ly0, ly1), slice(lx0, lx1)
        return np.asarray(self.levels[level][tuple(index)].compute(scheduler="synchronous"))


class Slide(_BaseSlide):
    """An open whole-slide image: lazy dask levels over the tifffile zarr store.

    Use :func:`open_slide` to make one. A Slide is a context manager; closing it releases
    the file handle.

    Attributes
    ----------
    path : Path or UrlPath
        The file (a :class:`~napari_slidescope.slide.source.UrlPath` for a URL: its
        ``str()`` is the URL without credentials).
    source : Source
        Where the bytes come from (:mod:`napari_slidescope.slide.source`).
    levels : list of dask.array.Array
        Pyramid levels, level 0 first, each reading the file's native tiles; built (and
        dask.array imported) on first use.
    axes : str
        ``"YXS"`` (RGB), ``"CYX"`` (multichannel) or ``"YX"``.
    mpp : (float, float) or None
        Micrometres per pixel (y, x) at level 0, or None when the file has no calibration.
    format : str
        ``"svs"``, ``"ndpi"``, ``"ome"``, ``"qptiff"``, ``"scn"``, ``"bif"``, ``"philips"``,
        ``"generic"``, ``"dicom"``, ``"ome-zarr"`` or, through OpenSlide, OpenSlide's
        vendor name (``"mirax"``, ``"hamamatsu"``, ``"aperio"``...).
    backend : str
        What reads the pixels: ``"tifffile"``, ``"dicom"`` (wsidicom), ``"ome-zarr"``
        (zarr) or ``"openslide"``.
    magnification : float or None
        Objective magnification the slide was scanned at.
    channel_names : list of str
        Channel names (multichannel and fluorescence slides), else empty.
    associated : Mapping[str, ndarray]
        Label, macro, thumbnail... images, decoded on access.
    metadata : dict
        Format, sizes, calibration, vendor properties and associated image names.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Source,
        *,
        chunk_bytes: int | str | None = None,
        on_error: OnError = "raise",
        backend: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.source = resolve(path, storage_options)
        self.path: Path | UrlPath = self.source.path
        if on_error not in ("raise", "blank"):
            raise ValueError(f"on_error must be 'raise' or 'blank', got {on_error!r}")
        budget = default_chunk_bytes() if chunk_bytes is None else parse_bytes(chunk_bytes)
        self._budget = budget
        self._readers: list[_levels.LevelReader] = []
        self._level_list = None
        self._level_lock = threading.Lock()
        self._owner = _levels.new_owner()
        #: Damaged tiles shown blank (``on_error="blank"``), see :class:`DamageLog`.
        self.damage = _levels.DamageLog(self.source.display)
        self._tif: Any = None
        self._remote: RemoteFile | None = None
        self._backend_slide: BackendSlide | None = None
        kind = _registry.choose_backend(self.source, backend)
        self.backend = kind
        if kind != "tifffile":
            self._backend_slide = _registry.open_source(kind, self.source, timeout=timeout)
            try:
                self._open_backend(self._backend_slide, budget, on_error)
            except BaseException:
                self.close()
                raise
            return
        if self.source.is_remote:
            # deferred: remote.py imports asyncio (and fsspec), which local slides never need
            from napari_slidescope.slide.remote import RemoteFile

            self._remote = RemoteFile(self.source, timeout=timeout)
        try:
            self._tif, layout, notes = _tiff.open_tiff(
                self.source.display, on_error=on_error, remote=self._remote
            )
        except BaseException:
            self.close()
            raise
        try:
            self._open(budget, on_error, layout, notes)
        except SlideError:
            self.close()
            raise
        except MemoryError as exc:
            self.close()
            raise SlideError(
                self.source.display,
                "cannot be opened: its header asks for more memory than there is",
            ) from exc
        except Exception as exc:
            self.close()
            raise SlideError(
                self.source.display,
                f"cannot be opened as a slide ({self.source.scrub(_tiff.describe_exception(exc))})",
            ) from exc

    def _open(
        self, budget: int, on_error: OnError, layout: _check.Layout, notes: list[str]
    ) -> None:
        path = self.source.display
        fetch = None if self._remote is None else self._remote.cat_ranges
        all_series = list(self._tif.series)
        main = _check_series(path, all_series, layout, on_error, notes)
        axes = main.axes
        info: FormatInfo = describe(self._tif, main, path)
        empty: dict[int, int] = {}
        keep = _check_levels(path, main, layout, on_error, notes, empty)
        if layout.truncated is not None and on_error == "raise":
            raise SlideError(path, f"is truncated: {layout.truncated}")
        # tifffile's zarr store has one array per level of the series (tifffile builds
        # it from ``series.levels``): zarr is opened only for a level the direct decoder
        # does not take
        series_levels: list[tifffile.TiffPageSeries | None] = list(_tiff.series_levels(main))
        zarrs = _LazyZarrs(main, path)
        if len(keep) != len(series_levels):  # levels that cannot be delivered are left out
            series_levels = [series_levels[i] for i in keep]
        # the file's level index of each level shown (for what _check_levels counted)
        original = keep
        self.format = info.format
        self.mpp = info.mpp
        self.magnification = info.magnification
        self.fluorescence = info.fluorescence
        self.calibration_source = info.calibration_source
        self.axes = ""
        self._readers = []
        stitch = self._bif_stitch(info, series_levels, axes)
        for i, lv in enumerate(series_levels):
            reader, self.axes = _levels.level_reader(
                lv,
                partial(zarrs.level, original[i]),
                axes,
                path=path,
                level=i,
                on_error=on_error,
                owner=self._owner,
                fetch=fetch,
                damage=self.damage,
                adapt=stitch[i],
            )
            self._readers.append(reader)
            missing = empty.get(original[i], 0)
            if missing and not reader._source.fast:
                # the zarr fallback reads a 0-byte tile as fill value, without a word
                what = f"{missing:,} level-{i} tiles have a byte count of 0 (missing)"
                if on_error == "raise":
                    raise SlideError(path, f"is damaged: {what}")
                notes.append(f"{what} and are shown blank")
        nch = self._readers[0].shape[0] if self.axes == "CYX" else 0
        self.channel_names = list(info.channel_names) if nch else []
        if nch and len(self.channel_names) != nch:
            self.channel_names = [f"channel {c}" for c in range(nch)]
        self.channel_colors = info.channel_colors if len(info.channel_colors) == nch else []
        loaders: dict[str, Callable[[], np.ndarray]] = {}
        for number, s in enumerate(all_series):
            if s is main:
                continue
            name = associated_name(info.format, s, number)
            problem = _associated_problem(s, layout.size)
            if problem is not None:
                notes.append(f"the {name} image ({problem})")
                continue
            loaders[name] = partial(_read_associated, path, name, s)
        self.associated: Mapping[str, np.ndarray] = _Associated(loaders)
        self.metadata: dict[str, Any] = self._describe(path, info.properties, loaders)
        self.problems = list(notes)
        if notes:
            warnings.warn(
                f"{path}: opened with parts left out: {'; '.join(notes)}",
                SlidescopeWarning,
                stacklevel=4,
            )

    def _bif_stitch(self, info: FormatInfo, levels: list[Any], axes: str) -> list[Any]:
        """Per level, what stitches a BIF level's overlapping tiles (None: shown as stored)."""
        none: list[Any] = [None] * len(levels)
        if info.format != "bif":
            return none
        path = self.source.display
        plan, why, overlap = _bif.level0_plan(self._tif, path)  # read once per open
        if any(round(v) for v in overlap):
            info.properties["ventana.tile_overlap_yx"] = f"{overlap[0]:g}, {overlap[1]:g}"
        if why is not None:
            warnings.warn(
                f"{path}: level-0 tiles overlap their neighbours by {overlap[0]:g} x "
                f"{overlap[1]:g} px (rows x columns, the scanner's mean) but are not stitched: "
                f"{why}; they are shown side by side as stored",
                SlidescopeWarning,
                stacklevel=5,
            )
        if plan is None or not axes.startswith("YX") or not levels:
            return none
        width0 = levels[0].shape[1]
        return [
            partial(
                _bif.StitchedChunks,
                plan=plan,
                downsample=max(1, round(width0 / z.shape[1])),
                owner=self._owner,
            )
            for z in levels
        ]

    def _describe(
        self, path: str, properties: Mapping[str, Any], associated: Iterable[str]
    ) -> dict[str, Any]:
        """Return :attr:`metadata`, once the levels and calibration are set (any backend)."""
        return {
            "format": self.format,
            "backend": self.backend,
            "path": path,
            "shape": self.shape0,
            "level_shapes": self.level_shapes,
            "downsamples": self.downsamples,
            "mpp": self.mpp,
            "calibration_source": self.calibration_source,
            "magnification": self.magnification,
            "fluorescence": self.fluorescence,
            "channel_names": self.channel_names,
            "properties": {k: _check.cap_text(v) for k, v in properties.items()},
            "associated": sorted(associated),
            "axes": self.axes,
            "dtype": str(self._readers[0].dtype),
        }

    def _open_backend(self, src: BackendSlide, budget: int, on_error: OnError) -> None:
        """Set the slide up from a non-TIFF backend's levels and metadata."""
        path = self.source.display
        info = src.info
        self.format = info.format
        self.mpp = info.mpp
        self.magnification = info.magnification
        self.fluorescence = info.fluorescence
        self.calibration_source = info.calibration_source
        self.axes = src.axes
        self._readers = [
            _levels.native_reader(
                native,
                src.axes,
                path=path,
                level=i,
                on_error=on_error,
                owner=self._owner,
                damage=self.damage,
            )
            for i, native in enumerate(src.levels)
        ]
        nch = self._readers[0].shape[0] if self.axes == "CYX" else 0
        self.channel_names = list(info.channel_names) if nch else []
        if nch and len(self.channel_names) != nch:
            self.channel_names = [f"channel {c}" for c in range(nch)]
        self.channel_colors = info.channel_colors if len(info.channel_colors) == nch else []
        self.associated = _Associated(dict(src.associated))
        self.metadata = self._describe(path, info.properties, src.associated)
        self.problems = list(src.notes)
        if src.notes:
            warnings.warn(
                f"{path}: opened with parts left out: {'; '.join(src.notes)}",
                SlidescopeWarning,
                stacklevel=4,
            )

    def _make_levels(self) -> list[da.Array]:
        """Build the dask levels over the readers (and import dask.array) on first use.

        Opening a slide makes one reader per level; the dask arrays over them wait until
        something asks for ``slide.levels``, so that opening a slide and reading it through
        :meth:`read_region`, :meth:`read_level` or tissue detection stays quick in a fresh
        process.
        """
        with self._level_lock:
            if self._level_list is None:
                # deferred: _dask_levels imports dask.array (see the docstring)
                from napari_slidescope.slide._dask_levels import as_dask

                self._level_list = [
                    as_dask(r, self._budget, owner=self._owner, level=i)
                    for i, r in enumerate(self._readers)
                ]
            return self._level_list

    @property
    def level_shapes(self) -> list[tuple[int, int]]:
        """(rows, cols) of each level."""
        yi, xi = self._yx
        return [(int(r.shape[yi]), int(r.shape[xi])) for r in self._readers]

    def _read_level(self, box: tuple[int, int, int, int], level: int) -> np.ndarray:
        """Read a checked level box without dask (nor importing it).

        The missing tiles are decoded on the reader's thread pool as well as the calling
        thread, through the shared tile cache.
        """
        ly0, lx0, ly1, lx1 = box
        reader = self._readers[level]
        full = [(0, n) for n in reader.shape]
        yi, xi = self._yx
        full[yi], full[xi] = (ly0, ly1), (lx0, lx1)
        return reader.read(tuple(full), parallel=True)

    def level_scales(self, level: int) -> tuple[int, ...]:
        """Scale denominators :meth:`read_level_scaled` reads `level` at.

        ``(1, 2, 4, 8)`` for a level of 8-bit JPEG tiles or NDPI restart bands (libjpeg
        decodes them scaled in the DCT domain), else ``(1,)``.
        """
        self._level_box(level, (0, 0, 0, 0))
        if self.axes == "CYX":
            return (1,)
        return _scaled.scales(self._readers[int(level)])

    def _read_level_scaled(
        self,
        box: tuple[int, int, int, int],
        level: int,
        scale: int,
        check: Callable[[], None] | None,
    ) -> np.ndarray:
        out = _scaled.read_scaled(
            self._readers[level], box, scale, check=check, workers=_levels.decode_workers()
        )
        return out[:, :, 0] if self.axes == "YX" else out

    @property
    def remote_stamp(self) -> dict[str, Any] | None:
        """Return what the store said of a URL's object when opened, else None.

        A dict of ``size``, ``etag``, ``version_id``, ``last_modified`` (None where the
        store gives none); None for a local file.
        """
        return None if self._remote is None else dict(self._remote.stamp)

    def close(self) -> None:
        """Release the file handle (the dask levels can no longer be computed)."""
        tif = getattr(self, "_tif", None)
        if tif is not None:
            tif.close()
        src = getattr(self, "_backend_slide", None)
        if src is not None:
            src.close()
        remote = getattr(self, "_remote", None)
        if remote is not None:
            remote.close()
        owner = getattr(self, "_owner", None)
        if owner is not None:
            tile_cache().discard(owner)

    def _read_level_box(self, lbox: tuple[int, int, int, int], level: int) -> np.ndarray:
        """Read a box of `level` pixels through the shared decoded-tile cache."""
        ly0, lx0, ly1, lx1 = lbox
        reader = self._readers[level]
        box = [(0, n) for n in reader.shape]
        yi, xi = self._yx
        box[yi], box[xi] = (ly0, ly1), (lx0, lx1)
        return reader.read(tuple(box), parallel=False)

    def __enter__(self) -> Slide:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mpp = f"{self.mpp[1]:.4g} µm/px" if self.mpp else "uncalibrated"
        return (
            f"<Slide {self.path.name!r} {self.format} {self.shape0[0]}x{self.shape0[1]} "
            f"{self.axes} levels={len(self._readers)} {mpp}>"
        )


class ArraySlide(_BaseSlide):
    """An in-memory image presented with the :class:`Slide` interface (one level).

    Parameters
    ----------
    array : (M, N, 3) ndarray of uint8
        An RGB image (or any array-like with a shape and dtype, e.g. a dask array).
    mpp : float or (float, float) or None
        Micrometres per pixel; None means uncalibrated (pixel units).
    name : str
        Display name used in messages.
    """

    format = "array"
    magnification = None
    fluorescence = False
    channel_names: list[str] = []  # noqa: RUF012

    def __init__(
        self, array: Any, *, mpp: float | tuple[float, float] | None, name: str = "array"
    ) -> None:
        if array.ndim == 3 and array.shape[-1] in (3, 4):
            self.axes = "YXS"
        elif array.ndim == 2:
            self.axes = "YX"
        else:
            raise ValueError(
                f"{name}: expected an (M, N, 3) RGB or (M, N) image, got shape {array.shape}"
            )
        self.path = Path(name)
        self.mpp = None if mpp is None else as_pair(mpp, f"{name}: mpp")
        import dask.array as da

        self._level_list = [array if isinstance(array, da.Array) else da.from_array(array)]
        self.associated: Mapping[str, np.ndarray] = {}
        self.metadata = {"format": "array", "shape": self.shape0, "mpp": self.mpp}

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ArraySlide:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_slide(
    path_or_url: str | os.PathLike[str] | Source,
    *,
    storage_options: Mapping[str, Any] | None = None,
    chunk_bytes: int | str | None = None,
    on_error: OnError = "raise",
    backend: str | None = None,
    timeout: float | None = None,
) -> Slide:
    """Open a whole-slide image lazily, from a local path or any fsspec URL.

    Parameters
    ----------
    path_or_url : str or PathLike or Source
        An Aperio SVS, Hamamatsu NDPI, OME-TIFF, QPTIFF, Leica SCN, Ventana BIF or
        generic (pyramidal) TIFF file; a folder of DICOM WSI instances (or one instance
        file); an OME-Zarr image (``.zarr`` folder, NGFF 0.4 or 0.5); or a file only
        OpenSlide reads (MIRAX ``.mrxs``, Hamamatsu ``.vms`` / ``.vmu``...). A local
        path, or a URL (``https://``, ``s3://``, ``gs://``, ``az://``, any scheme fsspec
        knows; needs the ``remote`` extra) for TIFF slides, OME-Zarr and DICOM folders.
    storage_options : Mapping, optional
        Passed to the fsspec filesystem of a URL (credentials, endpoint, ``anon``...);
        never printed. Credentials may equally come from the environment and config
        files the backend reads.
    chunk_bytes : int or str, optional
        Dask chunk budget in bytes (``4194304`` or ``"4 MiB"``). Default: the
        ``SLIDESCOPE_CHUNK_BYTES`` environment variable, else 4 MiB.
    on_error : {"raise", "blank"}
        What a tile whose compressed bytes are corrupt does when read: ``"raise"`` a
        :class:`SlideError` naming the file, level and tile (the default, so analysis never
        runs on invented pixels), or ``"blank"``: return zeros for that native tile only
        and warn once per file, naming the level and the tiles (what the napari reader
        uses, so panning keeps working; it outlines the tiles on the canvas). A tile whose
        byte count is 0 is damaged too. Either way ``slide.damage`` lists the damaged
        tiles shown blank. A level whose compression no installed codec decodes is left
        out with a warning naming it, or refused when it is level 0. A network failure
        always raises, whatever `on_error` says.
    backend : {"tifffile", "dicom", "ome-zarr", "openslide"}, optional
        Read through this backend instead of the one the path implies (e.g.
        ``"openslide"`` for an SVS file). DICOM needs the ``[dicom]`` extra, OpenSlide
        the ``[openslide]`` extra.
    timeout : float, optional
        Seconds one network request may take (URLs only); default
        ``$SLIDESCOPE_REMOTE_TIMEOUT``, else 30. Transient failures are retried
        ``$SLIDESCOPE_REMOTE_RETRIES`` times (default 3) with exponential backoff.

    Returns
    -------
    Slide
        Use it as a context manager, or call ``close()``.

    Notes
    -----
    ``np.asarray(slide.levels[i][y0:y1, x0:x1])`` (what napari does) reads the box directly,
    decoding its native tiles on every core, whatever the number of dask chunks in the level.
    Decoded tiles are kept in one cache shared by all open slides, bounded in bytes (256 MiB
    by default; ``$SLIDESCOPE_CACHE_BYTES`` or
    :func:`napari_slidescope.slide.cache.set_cache_bytes` changes it); it grows towards
    that bound as tiles it evicted are read again.

    Raises
    ------
    SlideError
        If the file is missing, unreadable, empty, not a TIFF, truncated or damaged; for
        a URL with an unknown scheme, and when a server or store refuses, is not found,
        cuts a response short or does not answer within the timeout (naming the URL
        without credentials and the problem).

    Examples
    --------
    >>> with open_slide("CMU-1.svs") as slide:  # doctest: +SKIP
    ...     slide.levels[0].shape, slide.mpp
    ((32914, 46000, 3), (0.499, 0.499))
    >>> slide = open_slide("s3://bucket/a.svs", storage_options={"anon": True})  # doctest: +SKIP
    """
    return Slide(
        path_or_url,
        chunk_bytes=chunk_bytes,
        on_error=on_error,
        storage_options=storage_options,
        backend=backend,
        timeout=timeout,
    )


def _check_series(
    path: str,
    all_series: list[tifffile.TiffPageSeries],
    layout: _check.Layout,
    on_error: OnError,
    notes: list[str],
) -> tifffile.TiffPageSeries:
    """Choose the main image series after checking the baseline's header.

    The first series is what every slide format puts first (its baseline image): when
    its header contradicts itself the file is damaged, and another series (a macro
    image) must not silently take its place.
    """
    first = all_series[0]
    rep = _check.check_page(_tiff.first_page(first), layout.size)
    if rep.errors:
        raise SlideError(path, f"is damaged: main image: {'; '.join(rep.errors)}")
    return max(all_series, key=lambda s: _area(s))


def _check_levels(
    path: str,
    main: tifffile.TiffPageSeries,
    layout: _check.Layout,
    on_error: OnError,
    notes: list[str],
    empty: dict[int, int] | None = None,
) -> list[int]:
    """Check every pyramid level; return the indices of the levels to show.

    `empty` receives, per level index, the number of native chunks with no bytes.
    """
    keep: list[int] = []
    prev: tuple[int, int] | None = None
    for i, level in enumerate(_tiff.series_levels(main)):
        errors: list[str] = []
        cut = total = 0
        for page in level.pages:
            if page is None:
                continue
            rep = _check.check_page(page, layout.size)
            errors += rep.errors
            cut += rep.cut
            if empty is not None:
                empty[i] = empty.get(i, 0) + rep.empty
            total += rep.total
        key = level.pages[0] if level.pages else None
        if not errors and key is not None:
            codec = _tiff.codec_problem(key)
            if codec is not None:
                errors.append(codec)
        shape = _level_shape(level)
        if not errors and prev is not None and shape is not None:
            if shape[0] * shape[1] >= prev[0] * prev[1]:
                errors.append(
                    f"it is {shape[1]:,} x {shape[0]:,} px, not smaller than the level "
                    f"before it ({prev[1]:,} x {prev[0]:,} px): the pyramid's layout is "
                    "damaged"
                )
        if errors:
            if i == 0:
                raise SlideError(path, f"is damaged: level 0: {'; '.join(errors)}")
            notes.append(f"pyramid level {i} ({'; '.join(errors)})")
            continue
        prev = shape
        if cut:
            what = (
                f"{cut:,} of {total:,} level-{i} tiles lie past the end of the file "
                f"({layout.size:,} bytes)"
            )
            if on_error == "raise":
                raise SlideError(path, f"is truncated: {what}")
            if i == 0:
                notes.append(f"truncated: {what} and are shown blank")
            else:
                notes.append(f"pyramid level {i} (truncated: {what})")
                continue
        keep.append(i)
    return keep


def _level_shape(level: tifffile.TiffPageSeries) -> tuple[int, int] | None:
    """(rows, cols) of a pyramid level, or None when its axes have no Y and X."""
    shape = dict(zip(level.axes, level.shape, strict=True))
    if "Y" not in shape or "X" not in shape:
        return None
    return int(shape["Y"]), int(shape["X"])


def _associated_problem(series: tifffile.TiffPageSeries, size: int) -> str | None:
    """Why an associated image cannot be delivered, or None."""
    try:
        page = _tiff.first_page(series)
        rep = _check.check_page(page, size)
        nbytes = int(np.prod(series.shape)) * np.dtype(series.dtype).itemsize
    except Exception as exc:
        return f"unreadable header: {_tiff.describe_exception(exc)}"
    if rep.errors:
        return "; ".join(rep.errors)
    if rep.cut:
        return f"truncated: {rep.cut:,} of {rep.total:,} segments lie past the end of the file"
    if nbytes > _check.MAX_ASSOCIATED_BYTES:
        return f"{nbytes:,} bytes decoded is absurd for an associated image"
    return None


def _read_associated(path: str, name: str, series: tifffile.TiffPageSeries) -> np.ndarray:
    try:
        return _tiff.read_page(series)
    except Exception as exc:
        raise SlideError(
            path, f"the {name} image cannot be decoded ({_tiff.describe_exception(exc)})"
        ) from exc


def _area(series: tifffile.TiffPageSeries) -> int:
    shape = dict(zip(series.axes, series.shape, strict=True))
    return int(shape.get("Y", 0)) * int(shape.get("X", 0))


class _LazyZarrs:
    """The zarr arrays of a series' levels, opened (and zarr imported) on first need."""

    def __init__(self, series: tifffile.TiffPageSeries, path: str) -> None:
        self._series, self._path = series, path
        self._arrays: list[Any] | None = None
        self._lock = threading.Lock()

    def level(self, i: int) -> Any:
        """Return the zarr array of the series' level `i` (the file's level index)."""
        with self._lock:
            if self._arrays is None:
                self._arrays = _tiff.open_levels(self._series, self._path)
        if i >= len(self._arrays):
            raise SlideError(
                self._path,
                f"level {i} is missing from tifffile's zarr store of the image "
                f"({len(self._arrays)} levels)",
            )
        return self._arrays[i]
