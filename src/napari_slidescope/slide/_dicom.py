"""DICOM WSI (VL Whole Slide Microscopy Image) slides, read with wsidicom.

A slide is a folder of instances (one per pyramid level, plus label, overview and
thumbnail instances), one instance file, or a list wsidicom groups into a series. Every
level's native chunk is its DICOM tile: wsidicom hands the tile's encoded frame, decoded
here with imagecodecs when it is a JPEG stream (what TIFF slides converted without
re-encoding hold) and by wsidicom otherwise (JPEG 2000, JPEG-LS, uncompressed...). Edge
tiles are read whole and clipped here, never re-encoded. Calibration is the pyramid's
``PixelSpacing`` (wsidicom's ``mpp``); the LABEL image is ``associated["label"]`` and the
OVERVIEW image ``associated["macro"]`` (what OpenSlide and the TIFF formats call it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from napari_slidescope.slide import _tiff
from napari_slidescope.slide._source import SlideSource, missing_extra, warn_uncalibrated
from napari_slidescope.slide.errors import SlideError
from napari_slidescope.slide.formats import PLAUSIBLE_MPP, FormatInfo
from napari_slidescope.slide.source import Source


def _import_wsidicom() -> Any:
    import wsidicom

    return wsidicom


def open_dicom(source: Source) -> SlideSource:
    """Open a DICOM WSI folder, file or series (local or an fsspec URL) as a :class:`SlideSource`.

    Raises
    ------
    SlideError
        Naming the path (a URL without credentials): wsidicom missing (the ``[dicom]``
        extra), no WSI instance in the folder, instances that do not make a slide.
    """
    name = source.display
    try:
        wsidicom = _import_wsidicom()
    except ImportError:
        raise missing_extra(name, "DICOM WSI", "dicom") from None
    streams: list[Any] = []
    try:
        if source.is_remote and hasattr(wsidicom.WsiDicom, "open_streams"):
            streams = _open_streams(source)
            wsi = wsidicom.WsiDicom.open_streams(streams)
        elif source.is_remote:  # wsidicom >= 0.36 opens fsspec paths (UPath) itself
            wsi = wsidicom.WsiDicom.open(_remote_paths(source))
        else:
            wsi = wsidicom.WsiDicom.open(source.target)
    except SlideError:
        _close_all(streams)
        raise
    except wsidicom.errors.WsiDicomNotFoundError as exc:
        _close_all(streams)
        raise SlideError(
            name,
            "holds no DICOM instance of a slide (VL Whole Slide Microscopy) "
            f"({source.scrub(str(exc))})",
        ) from exc
    except Exception as exc:
        _close_all(streams)
        raise SlideError(
            name, f"cannot be opened as DICOM WSI ({source.scrub(_tiff.describe_exception(exc))})"
        ) from exc

    def close() -> None:
        wsi.close()
        _close_all(streams)

    try:
        return _source(name, wsi, close)
    except SlideError:
        close()
        raise
    except Exception as exc:
        close()
        raise SlideError(
            name, f"cannot be read as DICOM WSI ({source.scrub(_tiff.describe_exception(exc))})"
        ) from exc


def _dcm_objects(source: Source) -> tuple[Any, list[str]]:
    """Return the URL's filesystem and every ``.dcm`` object under it (or the URL itself)."""
    fs, root = source.filesystem()
    try:
        if fs.isdir(root):
            paths = sorted(
                str(p) for p in fs.ls(root, detail=False) if str(p).lower().endswith(".dcm")
            )
        else:
            paths = [root]
    except Exception as exc:
        raise SlideError(
            source.display,
            f"cannot be listed or read ({source.scrub(_tiff.describe_exception(exc))})",
        ) from exc
    if not paths:
        raise SlideError(source.display, "holds no DICOM instance of a slide (no .dcm)")
    return fs, paths


def _open_streams(source: Source) -> list[Any]:
    """Open every ``.dcm`` object under a URL (a folder) or the URL itself (one instance)."""
    fs, paths = _dcm_objects(source)
    try:
        return [fs.open(p, "rb") for p in paths]
    except Exception as exc:
        raise SlideError(
            source.display,
            f"cannot be listed or read ({source.scrub(_tiff.describe_exception(exc))})",
        ) from exc


def _remote_paths(source: Source) -> list[Any]:
    """Every ``.dcm`` object under a URL (or the URL itself) as a UPath with its options."""
    from upath import UPath

    fs, paths = _dcm_objects(source)
    return [UPath(fs.unstrip_protocol(p), **dict(source.storage_options)) for p in paths]


def _close_all(streams: list[Any]) -> None:
    for stream in streams:
        try:
            stream.close()
        except Exception:  # closing a remote file that already failed
            pass


def _source(name: str, wsi: Any, close: Any) -> SlideSource:
    levels = list(wsi.levels)
    if not levels:
        raise SlideError(name, "holds no pyramid level (no VOLUME instance)")
    info = FormatInfo("dicom")
    mpp = getattr(levels[0], "mpp", None)
    if mpp is not None:
        y, x = float(mpp.height), float(mpp.width)
        if all(PLAUSIBLE_MPP[0] <= v <= PLAUSIBLE_MPP[1] for v in (y, x)):
            info.mpp, info.calibration_source = (y, x), "DICOM PixelSpacing"
    info.magnification = _magnification(wsi)
    info.properties = _properties(wsi)
    lock = threading.Lock()
    readers = [_DicomChunks(wsi, i, lv, lock) for i, lv in enumerate(levels)]
    samples = readers[0].samples
    axes = "YXS" if samples >= 3 else "YX"
    associated: dict[str, Any] = {}
    if wsi.labels is not None:
        associated["label"] = lambda: np.asarray(wsi.read_label())
    if wsi.overviews is not None:
        associated["macro"] = lambda: np.asarray(wsi.read_overview())
    warn_uncalibrated(name, info)
    return SlideSource(info=info, levels=readers, axes=axes, associated=associated, close=close)


def _magnification(wsi: Any) -> float | None:
    try:
        for path in wsi.metadata.optical_paths or []:
            objective = getattr(path, "objective", None)
            power = getattr(objective, "objective_power", None)
            if power:
                return float(power)
    except Exception:  # metadata models differ between wsidicom versions
        return None
    return None


def _properties(wsi: Any) -> dict[str, Any]:
    props: dict[str, Any] = {}
    try:
        uids = wsi.uids
        props["dicom.study_instance_uid"] = str(uids.study_instance)
        props["dicom.series_instance_uid"] = str(uids.series_instance)
    except Exception:
        pass
    return props


class _DicomChunks(_tiff.OnDemandChunks):
    """Native chunks of one DICOM pyramid level: its tiles."""

    fast = False

    def __init__(self, wsi: Any, index: int, level: Any, lock: threading.Lock) -> None:
        self._wsi, self._index, self._lock = wsi, index, lock
        w, h = int(level.size.width), int(level.size.height)
        tw, th = int(level.tile_size.width), int(level.tile_size.height)
        first = np.asarray(self._decode(self._encoded((0, 0)), (0, 0)))
        self.samples = 1 if first.ndim == 2 else int(first.shape[2])
        self.dtype = np.dtype(first.dtype)
        if self.samples >= 3:
            self.samples = 3
            self.shape: tuple[int, ...] = (h, w, 3)
            self.chunks: tuple[int, ...] = (min(th, h), min(tw, w), 3)
        else:
            self.shape, self.chunks = (h, w), (min(th, h), min(tw, w))

    def _encoded(self, tile: tuple[int, int]) -> bytes:
        with self._lock:
            return bytes(
                self._wsi.read_encoded_tile(self._index, tile, crop_to_image_boundary=False)
            )

    def _decode(self, data: bytes, tile: tuple[int, int]) -> np.ndarray:
        if data[:2] == b"\xff\xd8":
            import imagecodecs

            try:
                return np.asarray(imagecodecs.jpeg8_decode(data))
            except Exception:  # JPEG lossless / 12-bit: wsidicom's decoders
                pass
        with self._lock:
            return np.asarray(self._wsi.read_tile(self._index, tile, crop_to_image_boundary=False))

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        out: list[np.ndarray | BaseException] = []
        for idx in indices:
            ty, tx = idx[0], idx[1]
            try:
                tile = self._decode(self._encoded((tx, ty)), (tx, ty))
            except Exception as exc:
                out.append(exc)
                continue
            rows = min(self.chunks[0], self.shape[0] - ty * self.chunks[0])
            cols = min(self.chunks[1], self.shape[1] - tx * self.chunks[1])
            if tile.ndim == 3:
                tile = tile[:, :, :3] if len(self.shape) == 3 else tile[:, :, 0]
            if tile.shape[0] < rows or tile.shape[1] < cols:
                out.append(
                    _tiff.ChunkError(f"tile {tx}, {ty} decodes to {tile.shape[:2]}, too small")
                )
                continue
            out.append(np.ascontiguousarray(tile[:rows, :cols]))
        return out
