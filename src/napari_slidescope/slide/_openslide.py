"""Formats only OpenSlide reads (MIRAX, Hamamatsu VMS/VMU, Sakura...), read with OpenSlide.

Any slide OpenSlide opens can also be read this way with ``backend="openslide"``. Each
level's native chunk is OpenSlide's own tile of that level (the
``openslide.level[N].tile-width`` / ``-height`` properties), so dask chunks are whole
tiles and the decoded-tile cache holds what OpenSlide decodes once. Pixels are OpenSlide's:
premultiplied RGBA composited over the slide's background colour (white when it has
none), without its ICC profile applied. On levels whose downsample is not a whole number
(an SVS level of 2.0005) OpenSlide resamples at sub-pixel offsets, so those levels differ
slightly from the file's stored pixels; level 0 and whole-number levels do not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _tiff
from napari_slidescope.slide._backend import BackendSlide, missing_extra
from napari_slidescope.slide.formats import (
    PLAUSIBLE_MPP,
    FormatInfo,
    positive_float,
    warn_uncalibrated,
)

#: Tile size assumed for a level whose tile size OpenSlide does not report.
_DEFAULT_TILE = 512

#: Most pixels read in one OpenSlide call when neighbouring tiles are merged.
_MERGE_PIXELS = 4096 * 4096


def open_openslide(path: str | os.PathLike[str]) -> BackendSlide:
    """Open a slide with OpenSlide as a :class:`BackendSlide`.

    Raises
    ------
    SlideError
        Naming the path: OpenSlide missing (the ``[openslide]`` extra), a file
        OpenSlide does not recognise, or one it cannot open.
    """
    name = os.fspath(path)
    try:
        import openslide
    except ImportError:
        raise missing_extra(name, "a slide read through OpenSlide", "openslide") from None
    if not os.path.exists(name):
        raise SlideError(name, "does not exist")
    try:
        osr = openslide.OpenSlide(name)
    except openslide.OpenSlideUnsupportedFormatError as exc:
        raise SlideError(name, "is not a slide format OpenSlide reads") from exc
    except Exception as exc:
        raise SlideError(
            name, f"cannot be opened by OpenSlide ({_tiff.describe_exception(exc)})"
        ) from exc
    try:
        return _source(name, osr)
    except Exception as exc:
        osr.close()
        if isinstance(exc, SlideError):
            raise
        raise SlideError(
            name, f"cannot be read through OpenSlide ({_tiff.describe_exception(exc)})"
        ) from exc


def _source(name: str, osr: Any) -> BackendSlide:
    props = dict(osr.properties)
    info = FormatInfo(str(props.get("openslide.vendor") or "openslide"))
    info.properties = props
    mx, my = (
        positive_float(props.get("openslide.mpp-x")),
        positive_float(props.get("openslide.mpp-y")),
    )
    if mx and my and all(PLAUSIBLE_MPP[0] <= v <= PLAUSIBLE_MPP[1] for v in (mx, my)):
        info.mpp, info.calibration_source = (my, mx), "OpenSlide mpp-x / mpp-y"
    info.magnification = positive_float(props.get("openslide.objective-power"))
    bg = _background(props.get("openslide.background-color"))
    levels = [_OpenSlideChunks(osr, i, props, bg) for i in range(int(osr.level_count))]
    associated: dict[str, Callable[[], np.ndarray]] = {
        str(key): partial(_associated, osr, key, bg) for key in osr.associated_images
    }
    warn_uncalibrated(name, info)
    return BackendSlide(
        info=info, levels=levels, axes="YXS", associated=associated, close=osr.close
    )


def _associated(osr: Any, key: str, bg: np.ndarray) -> np.ndarray:
    return _composite(np.asarray(osr.associated_images[key]), bg)


def _background(value: Any) -> np.ndarray:
    try:
        v = int(str(value), 16)
    except (TypeError, ValueError):
        v = 0xFFFFFF
    return np.array([v >> 16 & 255, v >> 8 & 255, v & 255], dtype=np.float32)


def _composite(rgba: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """RGB of an (unpremultiplied) RGBA image over the background colour."""
    if rgba.ndim != 3 or rgba.shape[2] != 4:
        return rgba
    alpha = rgba[:, :, 3]
    if alpha.min() == 255:
        return np.ascontiguousarray(rgba[:, :, :3])
    a = alpha[:, :, None].astype(np.float32) / 255
    out = rgba[:, :, :3].astype(np.float32) * a + bg * (1 - a)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


class _OpenSlideChunks(_tiff.OnDemandChunks):
    """Native chunks of one OpenSlide level: OpenSlide's tiles of that level."""

    fast = False

    def __init__(self, osr: Any, level: int, props: dict[str, Any], bg: np.ndarray) -> None:
        self._osr, self._level, self._bg = osr, level, bg
        w, h = (int(v) for v in osr.level_dimensions[level])
        self._ds = float(osr.level_downsamples[level])
        tw = int(props.get(f"openslide.level[{level}].tile-width", _DEFAULT_TILE))
        th = int(props.get(f"openslide.level[{level}].tile-height", _DEFAULT_TILE))
        self.shape = (h, w, 3)
        self.chunks = (max(1, min(th, h)), max(1, min(tw, w)), 3)
        self.dtype = np.dtype(np.uint8)

    def _read_box(self, y0: int, x0: int, y1: int, x1: int) -> np.ndarray:
        loc = (round(x0 * self._ds), round(y0 * self._ds))
        region = self._osr.read_region(loc, self._level, (x1 - x0, y1 - y0))
        return _composite(np.asarray(region), self._bg)

    def _box(self, idx: tuple[int, ...]) -> tuple[int, int, int, int]:
        (ch, cw, _), (h, w, _) = self.chunks, self.shape
        return idx[0] * ch, idx[1] * cw, min((idx[0] + 1) * ch, h), min((idx[1] + 1) * cw, w)

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        if not indices:
            return []
        rows = sorted({i[0] for i in indices})
        cols = sorted({i[1] for i in indices})
        whole = (
            len(rows) * len(cols) == len(set(indices))
            and rows[-1] - rows[0] + 1 == len(rows)
            and cols[-1] - cols[0] + 1 == len(cols)
        )
        # a rectangle of tiles: one OpenSlide call, then cut it up (only where the level's
        # downsample is whole: elsewhere each call resamples at its own sub-pixel offset,
        # and a tile must read the same alone or with its neighbours)
        if whole and self._ds.is_integer():
            y0, x0, _, _ = self._box((rows[0], cols[0], 0))
            _, _, y1, x1 = self._box((rows[-1], cols[-1], 0))
            if (y1 - y0) * (x1 - x0) <= _MERGE_PIXELS:
                try:
                    block = self._read_box(y0, x0, y1, x1)
                except Exception as exc:
                    return [exc] * len(indices)
                out: list[np.ndarray | BaseException] = []
                for idx in indices:
                    a, b, c, d = self._box(idx)
                    out.append(np.ascontiguousarray(block[a - y0 : c - y0, b - x0 : d - x0]))
                return out
        result: list[np.ndarray | BaseException] = []
        for idx in indices:
            try:
                result.append(self._read_box(*self._box(idx)))
            except Exception as exc:
                result.append(exc)
        return result
