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

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _dicomweb, _tiff
from napari_slidescope.slide._backend import BackendSlide, missing_extra
from napari_slidescope.slide._network import classify, default_retries, default_timeout
from napari_slidescope.slide.formats import PLAUSIBLE_MPP, FormatInfo, warn_uncalibrated
from napari_slidescope.slide.source import Source, scrub


def _import_wsidicom() -> Any:
    import wsidicom

    return wsidicom


def open_dicom(source: Source, *, timeout: float | None = None) -> BackendSlide:
    """Open a DICOM WSI folder, file or series (local, an fsspec URL or a DICOMweb series).

    Parameters
    ----------
    source : Source
        A local folder or file, an fsspec URL of one, or a ``dicomweb+http(s)://`` URL
        (see :mod:`._dicomweb`).
    timeout : float, optional
        Seconds one DICOMweb request may take (default ``$SLIDESCOPE_REMOTE_TIMEOUT``).

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
    if _dicomweb.is_dicomweb(source):
        return _open_web(source, wsidicom, timeout=timeout)
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


def _open_web(source: Source, wsidicom: Any, *, timeout: float | None) -> BackendSlide:
    """Open a series on a DICOMweb server; every failure a SlideError naming the URL."""
    name = source.display
    url = _dicomweb.parse(source)
    seconds = default_timeout() if timeout is None else float(timeout)
    secrets = _dicomweb.secrets(source)

    def failed(exc: BaseException, what: str) -> SlideError:
        if isinstance(exc, SlideError):
            return exc
        text = classify(exc, seconds).problem
        if text.startswith("cannot be read ("):
            text = f"{what} ({_tiff.describe_exception(exc)})"
        return SlideError(name, scrub(source.scrub(text), secrets))

    try:
        web = _dicomweb.client(source, url, timeout=seconds, retries=default_retries())
        series = _dicomweb.series_of(web, url, name)
        client = _web_client(wsidicom, web)
        wsi = wsidicom.WsiDicom.open_web(client, url.study, [series])
    except (AttributeError, StopIteration, wsidicom.errors.WsiDicomNotFoundError) as exc:
        # wsidicom's web source finds no level instance (an empty QIDO answer)
        raise SlideError(
            name,
            "holds no DICOM instance of a slide (VL Whole Slide Microscopy) in that series",
        ) from exc
    except Exception as exc:
        raise failed(exc, "cannot be opened as DICOM WSI over DICOMweb") from exc

    def close() -> None:
        wsi.close()
        web._session.close()

    try:
        return _source(name, wsi, close, network=failed)
    except SlideError:
        close()
        raise
    except Exception as exc:
        close()
        raise failed(exc, "cannot be read as DICOM WSI over DICOMweb") from exc


def _web_client(wsidicom: Any, web: Any) -> Any:
    """Return wsidicom's DICOMweb client over `web`, asking for no frames without a request.

    wsidicom's encoded-frame cache asks its client for the frames it does not hold. When it
    holds every frame of a burst (tiles the shared decoded-tile cache dropped, their bytes
    still in wsidicom's cache: any slide read longer than that cache holds) the list is
    empty, and the request ``.../frames/`` is answered 404: the read failed. An empty list
    gets an empty answer here instead.
    """

    class _Client(wsidicom.WsiDicomWebClient):  # type: ignore[misc]  # wsidicom is Any here
        def get_frames(
            self,
            study_uid: Any,
            series_uid: Any,
            instance_uid: Any,
            frame_indices: Any,
            transfer_syntax: Any,
        ) -> Any:
            frames = list(frame_indices)
            if not frames:
                return iter(())
            return super().get_frames(study_uid, series_uid, instance_uid, frames, transfer_syntax)

    return _Client(web)


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


def _source(name: str, wsi: Any, close: Any, network: Any = None) -> BackendSlide:
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
    readers = [_DicomChunks(wsi, i, lv, lock, network) for i, lv in enumerate(levels)]
    samples = readers[0].samples
    axes = "YXS" if samples >= 3 else "YX"
    associated: dict[str, Any] = {}
    if wsi.labels is not None:
        associated["label"] = _associated(wsi.read_label, network)
    if wsi.overviews is not None:
        associated["macro"] = _associated(wsi.read_overview, network)
    warn_uncalibrated(name, info)
    return BackendSlide(info=info, levels=readers, axes=axes, associated=associated, close=close)


def _associated(read: Any, network: Any) -> Any:
    def load() -> np.ndarray:
        try:
            return np.asarray(read())
        except Exception as exc:
            if network is None:
                raise
            raise network(exc, "cannot read the image") from exc

    return load


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
    """Native chunks of one DICOM pyramid level: its tiles.

    `network` (a DICOMweb series) turns a failed request into the SlideError naming the
    URL, raised from :meth:`fetch` and :meth:`read` (never a blank tile), and makes a read
    ask for all the tiles it misses in one WADO-RS request.
    """

    fast = False

    def __init__(
        self, wsi: Any, index: int, level: Any, lock: threading.Lock, network: Any = None
    ) -> None:
        self._wsi, self._index, self._lock, self._network = wsi, index, lock, network
        self._level = level
        w, h = int(level.size.width), int(level.size.height)
        tw, th = int(level.tile_size.width), int(level.tile_size.height)
        described = self._described() if network is not None else None
        if described is None:  # decode the first tile: what the decoder gives is the truth
            first = np.asarray(self._decode(self._encoded((0, 0)), (0, 0)))
            described = (1 if first.ndim == 2 else int(first.shape[2]), np.dtype(first.dtype))
        self.samples, self.dtype = described
        if self.samples >= 3:
            self.samples = 3
            self.shape: tuple[int, ...] = (h, w, 3)
            self.chunks: tuple[int, ...] = (min(th, h), min(tw, w), 3)
        else:
            self.shape, self.chunks = (h, w), (min(th, h), min(tw, w))

    def _described(self) -> tuple[int, np.dtype[Any]] | None:
        """Return samples and dtype from the level's metadata (no frame asked for), if known."""
        try:
            data = self._level.get_instance().image_data
            samples, bits = int(data.samples_per_pixel), int(data.bits)
        except Exception:  # metadata models differ between wsidicom versions
            return None
        if samples not in (1, 3) or bits not in (8, 16):
            return None
        return samples, np.dtype(np.uint8 if bits == 8 else np.uint16)

    def _encoded(self, tile: tuple[int, int]) -> bytes:
        try:
            with self._lock:
                return bytes(
                    self._wsi.read_encoded_tile(self._index, tile, crop_to_image_boundary=False)
                )
        except Exception as exc:
            if self._network is None:
                raise
            raise self._network(exc, f"cannot read tile {tile}") from exc

    def _decode(self, data: bytes, tile: tuple[int, int]) -> np.ndarray:
        if data[:2] == b"\xff\xd8":
            import imagecodecs

            try:
                return np.asarray(imagecodecs.jpeg8_decode(data))
            except Exception:  # JPEG lossless / 12-bit: wsidicom's decoders
                pass
        with self._lock:
            return np.asarray(self._wsi.read_tile(self._index, tile, crop_to_image_boundary=False))

    def fetch(self, indices: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], bytes] | None:
        """Fetch every tile of `indices` in one WADO-RS request (DICOMweb); else None."""
        if self._network is None or not indices:
            return None
        try:
            from wsidicom.geometry import Point

            instance = self._level.get_instance()
            tiles = [Point(int(idx[1]), int(idx[0])) for idx in indices]
            with self._lock:
                frames = instance.image_data.get_encoded_tiles(
                    tiles, instance.default_z, instance.default_path
                )
                datas = [bytes(f) for f in frames]
        except Exception as exc:
            raise self._network(exc, "cannot read tiles") from exc
        return dict(zip(indices, datas, strict=True))

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        if raw is None and self._network is not None and len(indices) > 1:
            raw = self.fetch(indices)  # a network failure raises: never a blank tile
        out: list[np.ndarray | BaseException] = []
        for idx in indices:
            ty, tx = idx[0], idx[1]
            data = None if raw is None else raw.get(idx)
            try:
                if data is None:
                    data = self._encoded((tx, ty))
                tile = self._decode(data, (tx, ty))
            except SlideError:
                raise
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
