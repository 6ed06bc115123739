"""The tifffile / zarr adapter: every call into tifffile and zarr goes through here.

tifffile comes in two generations that users have both:

* tifffile 2026.3.x (what pip resolves on Python 3.11): ``aszarr()`` returns a store whose
  multiscale group carries NGFF-0.1-style ``attrs['multiscales']`` (zarr format 2 layout);
* newer tifffile (Python >= 3.12): a zarr v3 store with NGFF 0.5 metadata under
  ``attrs['ome']['multiscales']``.

:func:`open_levels` hides the difference and returns one zarr array per pyramid level.

Reading pixels goes through :func:`native_chunks`: one object per level that reads and
decodes *native* chunks (tiles, strips, NDPI restart bands) by their grid index. Where the
level is a plain tiled or stripped page (SVS, NDPI, OME, generic pyramids, QPTIFF channel
pages) it reads the raw segments with ``FileHandle.read_segments`` and decodes them with
``TiffPage.decode``, exactly what the zarr store does per chunk but without zarr's
per-request machinery; everywhere else it asks the zarr array for the chunk's box. Both
give the pixels tifffile decodes, and both are safe to call from several threads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tifffile

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _check

if TYPE_CHECKING:
    import zarr

TIFF_MAGIC = _check.TIFF_MAGIC

TiffFile = tifffile.TiffFile
TiffPageSeries = tifffile.TiffPageSeries

#: A remote file's ``cat_ranges(offsets, counts)``: many byte ranges fetched at once.
Fetch = Callable[[Sequence[int], Sequence[int]], list[bytes]]


def has_tiff_magic(path: str | os.PathLike[str]) -> bool:
    """Return True when the file starts with a classic or BigTIFF header (reads 4 bytes)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in TIFF_MAGIC
    except OSError:
        return False


def describe_exception(exc: BaseException) -> str:
    """Return ``"Type: message"`` (or just the type when the message is empty)."""
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def open_tiff(
    path: str | os.PathLike[str], *, on_error: str = "raise", remote: Any = None
) -> tuple[tifffile.TiffFile, _check.Layout, list[str]]:
    """Open a TIFF file after checking its structure; every failure is a :class:`SlideError`.

    Parameters
    ----------
    path : str or PathLike
        The file.
    on_error : {"raise", "blank"}
        ``"raise"``: a chain of image directories that leaves the file (a truncated copy)
        is an error. ``"blank"``: tifffile stops there and the note is returned.

    Returns
    -------
    tif : tifffile.TiffFile
    layout : Layout
        What the IFD walk found (file size, truncation).
    notes : list of str
        What the caller must warn about (what was left out or ignored).
    remote : RemoteFile, optional
        Parse this remote file instead (`path` is then its name without credentials); the
        caller closes it. The tag values the IFDs point to (tile offset tables...) are
        fetched at once, before tifffile reads them one after the other.
    """
    path = os.fspath(path)
    if remote is None:
        size = _check.preflight(path)
        layout = _check.walk(path, size)
    else:
        size = _check.preflight_file(path, remote, remote.size)
        layout = _check.walk_file(path, remote, size)
        remote.prefetch(layout.values)
        remote.seek(0)  # tifffile takes the position as the file's start
    notes: list[str] = []
    if layout.truncated is not None and on_error != "raise":
        notes.append(f"truncated: {layout.truncated}")
    # (in "raise" mode the caller raises after counting what the cut took away)
    flags: dict[str, Any] = {}
    if layout.description is not None and b"<!DOCTYPE" in layout.description:
        # DTDs declare entities (billion laughs, external files): no XML of this file is
        # parsed, by tifffile or by us, whatever the runtime's expat would allow
        flags = {f"is_{name}": False for name in _XML_FLAGS}
        notes.append("its XML metadata declares a DTD or entities and was ignored")
    damage = f"is truncated: {layout.truncated}" if layout.truncated else "is a damaged TIFF"
    try:
        with _parsing():
            tif = tifffile.TiffFile(path if remote is None else remote, **flags)
    except SlideError:
        raise
    except Exception as exc:  # tifffile raises many types on damaged files
        raise SlideError(path, f"{damage} ({describe_exception(exc)})") from exc
    try:
        first = tif.pages.first
        errors = _check.check_page(first, size).errors
        if errors:  # before tifffile's series code meets e.g. a zero width
            raise SlideError(path, f"is damaged: first image: {'; '.join(errors)}")
        # a list now: from tifffile 2026.11, ``tif.series`` is a lazy view whose pages are
        # parsed (and may raise on a damaged file) only when it is first evaluated
        with _parsing():
            series = list(tif.series)
    except SlideError:
        tif.close()
        raise
    except Exception as exc:
        tif.close()
        raise SlideError(
            path, f"{damage}: its images cannot be listed ({describe_exception(exc)})"
        ) from exc
    if not series:
        tif.close()
        raise SlideError(path, "contains no image")
    return tif, layout, notes


#: What tifffile >= 2026.11 logs for an NDPI page whose McuStarts it finds invalid (those
#: that wrap past 4 GiB with no high bytes): it then leaves the strip whole, and the
#: structure check rebuilds the bands from repaired offsets or refuses the file with an
#: error naming the problem (``_check.ndpi_bands``). The warning is noise to our users.
_MCU_NOTE = "ignoring NDPI McuStarts"
_quiet = threading.local()


class _RepairedBands(logging.Filter):
    """Drop tifffile's McuStarts warning logged while this thread parses a file here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_quiet, "depth", 0) and _MCU_NOTE in record.getMessage())


logging.getLogger("tifffile").addFilter(_RepairedBands())


@contextlib.contextmanager
def _parsing() -> Iterator[None]:
    """While tifffile parses pages for us: its McuStarts warning is not passed on."""
    _quiet.depth = getattr(_quiet, "depth", 0) + 1
    try:
        yield
    finally:
        _quiet.depth -= 1


#: tifffile flags whose series parse an ImageDescription as XML.
_XML_FLAGS = ("ome", "scn", "philips", "indica", "metaseries")


#: Slide dialects we recognise, in order of precedence (an SVS may also look generic).
SLIDE_FLAGS = ("svs", "ndpi", "qpi", "scn", "bif", "ome", "philips")


def format_flags(tif: tifffile.TiffFile) -> set[str]:
    """Return the slide dialect flags that apply, e.g. ``{'svs'}``, ``{'ndpi'}``, ``{'ome'}``.

    Only the slide flags are evaluated: ``TiffFile.flags`` evaluates every flag, and some
    (``is_mdgel``) re-read pages, which costs tens of ms on a 1M-tile level.
    """
    return {flag for flag in SLIDE_FLAGS if getattr(tif, f"is_{flag}", False)}


def series_levels(series: tifffile.TiffPageSeries) -> list[tifffile.TiffPageSeries]:
    """Return the pyramid levels of a series, level 0 first."""
    return list(series.levels)


def first_page(series: tifffile.TiffPageSeries) -> tifffile.TiffPage:
    """Return the key page of a series (holds tags and the native chunk shape)."""
    return series.keyframe


def multiscale_paths(attrs: Mapping[str, Any]) -> list[str] | None:
    """Return the dataset paths of an NGFF multiscale group, level 0 first, or None.

    Understands NGFF 0.5 (``attrs['ome']['multiscales']``, zarr v3 stores) and the older
    layout with ``attrs['multiscales']`` at the top level (zarr format 2 stores).
    """
    meta = attrs.get("ome", attrs)
    if not isinstance(meta, Mapping):
        return None
    multiscales = meta.get("multiscales")
    if not multiscales:
        return None
    datasets = multiscales[0].get("datasets", [])
    paths = [str(d["path"]) for d in datasets if isinstance(d, Mapping) and "path" in d]
    return paths or None


def open_levels(series: tifffile.TiffPageSeries, path: str) -> list[zarr.Array[Any]]:
    """Open the zarr arrays of every level of a series (no pixel is decoded).

    zarr is imported here, not with the module: the direct decoder of :func:`native_chunks`
    reads most slides without it (importing it costs a fresh process about 0.35 s).
    """
    import zarr

    try:
        # maxworkers given: tifffile would otherwise walk every tile offset to choose it
        # (tens of ms on a 1M-tile level); our level reader parallelises decoding itself.
        store = series.aszarr(maxworkers=1)
        node = zarr.open(store, mode="r")
    except Exception as exc:
        raise SlideError(path, f"cannot map the image into a zarr store ({exc})") from exc
    if isinstance(node, zarr.Array):
        return [node]
    arrays = {k: a for k, a in node.arrays()}
    paths = multiscale_paths(dict(node.attrs)) or sorted(
        arrays, key=lambda k: -int(np.prod(arrays[k].shape))
    )
    return [arrays[p] for p in paths]


def read_page(page: tifffile.TiffPage | tifffile.TiffPageSeries) -> np.ndarray:
    """Decode a whole (small) page, e.g. an associated label or macro image."""
    pixels: np.ndarray = page.asarray()
    return pixels


def tag_value(page: Any, name: str, default: Any = None) -> Any:
    """Return the value of a TIFF tag by name, or `default`."""
    tag = page.tags.get(name)
    return default if tag is None else tag.value


_BASE_DECODE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    RuntimeError,
    OSError,
    IndexError,
    tifffile.TiffFileError,
)


@functools.cache
def decode_error_types() -> tuple[type[BaseException], ...]:
    """Exception types a damaged tile raises while decoding."""
    import imagecodecs

    types: list[type[BaseException]] = list(_BASE_DECODE_ERRORS)
    for name in dir(imagecodecs):
        obj = getattr(imagecodecs, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            types.append(obj)
    return tuple(types)


def is_decode_error(exc: BaseException) -> bool:
    """Return True when `exc` is what a damaged tile raises while decoding.

    The common types are checked first: :func:`decode_error_types` lists imagecodecs'
    exception types, which loads every codec module (about 0.07 s in a fresh process),
    so it is asked only for an exception none of them matches.
    """
    return isinstance(exc, _BASE_DECODE_ERRORS) or isinstance(exc, decode_error_types())


def codec_problem(page: Any) -> str | None:
    """Why the pixels of `page` cannot be decoded by any codec installed, or None.

    Looks the page's Compression tag up in tifffile's decoders (imagecodecs); no pixel
    is decoded.
    """
    raw = page.keyframe.tags.get("Compression")
    code = int(raw.value) if raw is not None else 1
    try:
        tifffile.TIFF.DECOMPRESSORS[code]
    except KeyError:
        return f"its Compression tag names codec {code}, which no installed decoder knows"
    except Exception as exc:  # a known codec whose decoder is not installed
        return f"its codec {code} cannot be decoded here ({describe_exception(exc)})"
    return None


#: TIFF compression codes whose segments are whole JPEG or JPEG 2000 streams.
_EOI_CODECS = (7, 33003, 33004, 33005, 34712)


class ChunkError(ValueError):
    """A native chunk whose bytes are missing or damaged (the reader names file and level)."""


def _jpeg_stream(data: bytes, tables: bytes | None, header: bytes | None) -> bytes:
    """Return a TIFF JPEG segment as a whole JPEG stream (with its tables or NDPI header)."""
    if header is not None:
        return b"".join((header, data, b"\xff\xd9"))
    if tables is not None and len(tables) > 4 and data[:2] == b"\xff\xd8":
        return b"".join((tables[:-2], data[2:]))
    return data


#: An APP14 "Adobe" segment with transform 0: tells libjpeg that the three components are
#: R, G and B, to be decoded with no colour transform (what tifffile asks libjpeg for,
#: explicitly, on a photometric-RGB page without JFIF markers: Aperio's encoding).
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"

#: JPEG markers that carry no length (SOI, EOI, RSTn, TEM).
_BARE_MARKERS = frozenset((0x01, 0xD8, 0xD9, *range(0xD0, 0xD8)))


def _jpeg_header(data: bytes, start: int, *, stop_at_sos: bool) -> tuple[int, int, int] | None:
    """Walk a JPEG stream's markers from `start`: the frame's (rows, cols, components).

    Returns None when a marker says how its colours are coded (a JFIF APP0 or an Adobe
    APP14 segment), when the markers do not parse, or (with `stop_at_sos`) when no start
    of scan follows a frame header. Without `stop_at_sos` (a table stream) the walk ends
    at EOI and the frame is (0, 0, 0).
    """
    frame = (0, 0, 0)
    i, n = start, len(data)
    while i + 2 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _BARE_MARKERS:
            if marker == 0xD9 and not stop_at_sos:
                return frame
            i += 2
            continue
        if i + 4 > n:
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2 or i + 2 + length > n:
            return None
        seg = data[i + 4 : i + 2 + length]
        if (marker == 0xE0 and seg[:4] == b"JFIF") or (marker == 0xEE and seg[:5] == b"Adobe"):
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and len(seg) >= 6:
            frame = ((seg[1] << 8) | seg[2], (seg[3] << 8) | seg[4], seg[5])
        elif marker == 0xDA:
            return frame if stop_at_sos and frame[2] else None
        i += 2 + length
    return None


def rgb_tables_ok(tables: bytes | None) -> bool:
    """Return True when a page's JPEGTables leave the colour coding to the tiles.

    That is: no tables, or an SOI .. EOI stream of tables without a JFIF or Adobe
    marker. Only then can :func:`decode_rgb_jpeg_strict` mark a tile's stream as RGB.
    """
    if tables is None:
        return True
    if len(tables) < 4 or tables[:2] != b"\xff\xd8" or tables[-2:] != b"\xff\xd9":
        return False
    return _jpeg_header(tables, 2, stop_at_sos=False) is not None


def decode_rgb_jpeg_strict(
    data: bytes, tables: bytes | None, *, frame: tuple[int, int] | None
) -> np.ndarray | None:
    """Decode an RGB-coded JPEG segment (no colour transform) once, strictly, or return None.

    Aperio writes RGB JPEG tiles (TIFF photometric 2) whose component identifiers (0, 1, 2)
    and missing JFIF / Adobe markers would make libjpeg infer YCbCr; tifffile therefore
    tells libjpeg the stream is RGB. Here the stream is spliced with the page's tables and
    an Adobe APP14 segment with transform 0 (libjpeg's own signal for "RGB, no transform")
    after its SOI, so that libjpeg-turbo in strict mode (simplejpeg) decodes it in one
    pass into tifffile's pixels (same library, islow DCT, fancy upsampling), and corrupt
    entropy data raises instead of decoding into wrong pixels.

    Parameters
    ----------
    data : bytes
        The tile as stored (an abbreviated JPEG stream when the page has tables).
    tables : bytes, optional
        The page's JPEGTables, already accepted by :func:`rgb_tables_ok`.
    frame : (int, int), optional
        The native tile's (rows, cols): a larger JPEG frame is refused before decoding.

    Returns
    -------
    (rows, cols, 3) ndarray of uint8, or None
        None when the tile's markers do not allow the splice (a JFIF or Adobe marker of
        its own, not three components, unparsable markers): the caller then decodes it
        the general way (strict check, then tifffile).

    Raises
    ------
    ChunkError
        The frame is larger than `frame`, or the data is corrupt.
    """
    import simplejpeg

    if data[:2] != b"\xff\xd8":
        return None
    head = _jpeg_header(data, 2, stop_at_sos=True)
    if head is None or head[2] != 3:
        return None
    rows, cols = head[0], head[1]
    if frame is not None and (rows > frame[0] or cols > frame[1]):
        raise ChunkError(
            f"its JPEG frame is {cols:,} x {rows:,} px, larger than the "
            f"{frame[1]:,} x {frame[0]:,} px tile it should hold"
        )
    if tables is not None and len(tables) > 4:
        stream = b"".join((tables[:-2], _ADOBE_RGB, data[2:]))
    else:
        stream = b"".join((data[:2], _ADOBE_RGB, data[2:]))
    try:
        out: np.ndarray = simplejpeg.decode_jpeg(stream, colorspace="RGB", strict=True)
    except ValueError as exc:
        raise ChunkError(f"its JPEG data is corrupt ({exc})") from exc
    return out


def _sof_offset(header: bytes) -> int | None:
    """Offset of the baseline frame header's payload (its precision byte) in a JPEG header.

    The payload is precision, rows, cols (two bytes each), components, then three bytes
    per component (id, sampling factors, table). None when the markers before the start
    of scan do not parse or hold no baseline (SOF0) frame.
    """
    i, n = 2, len(header)
    if header[:2] != b"\xff\xd8":
        return None
    while i + 4 <= n:
        if header[i] != 0xFF:
            return None
        marker = header[i + 1]
        if marker in _BARE_MARKERS:
            i += 2
            continue
        length = (header[i + 2] << 8) | header[i + 3]
        if length < 2:
            return None
        if marker == 0xC0:
            return i + 4 if i + 2 + length <= n and length >= 8 else None
        if marker == 0xDA:
            return None
        i += 2 + length
    return None


def _check_frame(simplejpeg: Any, stream: bytes, frame: tuple[int, int] | None) -> None:
    if frame is not None:
        rows, cols = simplejpeg.decode_jpeg_header(stream)[:2]
        if rows > frame[0] or cols > frame[1]:
            raise ChunkError(
                f"its JPEG frame is {cols:,} x {rows:,} px, larger than the "
                f"{frame[1]:,} x {frame[0]:,} px tile it should hold"
            )


def check_jpeg(
    data: bytes,
    tables: bytes | None = None,
    header: bytes | None = None,
    *,
    frame: tuple[int, int] | None = None,
) -> None:
    """Raise :class:`ChunkError` when a JPEG segment's entropy-coded data is corrupt.

    libjpeg (through imagecodecs) decodes garbage in place of a tile's Huffman-coded
    data without an error, into plausible blocks of wrong pixels; it only warns. This
    decodes the segment once more with libjpeg-turbo in strict mode (simplejpeg), which
    raises on those warnings, at 1/8 scale (the whole entropy-coded stream is decoded,
    the inverse DCT mostly skipped: about half the time of a full decode). Segments whose
    colours libjpeg infers right (YCbCr and grey) or can be told in the stream (RGB-coded
    tiles without JFIF or Adobe markers, Aperio's encoding) skip this:
    :func:`decode_jpeg_strict` and :func:`decode_rgb_jpeg_strict` decode them once, strictly.

    Parameters
    ----------
    data : bytes
        The segment as stored (an abbreviated JPEG stream, or an NDPI restart band).
    tables : bytes, optional
        The page's JPEGTables (SVS and other tiled JPEG TIFFs).
    header : bytes, optional
        The NDPI JPEG header a restart band is decoded with.
    frame : (int, int), optional
        The native tile's (rows, cols): a JPEG frame larger than that is refused before
        anything is decoded (an impossible frame size would allocate gigabytes).
    """
    import simplejpeg

    stream = _jpeg_stream(data, tables, header)
    try:
        _check_frame(simplejpeg, stream, frame)
        simplejpeg.decode_jpeg(
            stream, colorspace="GRAY", min_height=1, min_width=1, min_factor=8, strict=True
        )
    except ValueError as exc:
        if isinstance(exc, ChunkError):
            raise
        raise ChunkError(f"its JPEG data is corrupt ({exc})") from exc


def decode_jpeg_strict(
    data: bytes,
    tables: bytes | None,
    header: bytes | None,
    *,
    colorspace: str,
    frame: tuple[int, int] | None,
) -> np.ndarray:
    """Decode a JPEG segment once, strictly, to ``(rows, cols, samples)`` uint8.

    For segments whose colour transform libjpeg infers from the stream itself: YCbCr
    (TIFF photometric 6, decoded to ``"RGB"``) and grey (``"GRAY"``). The pixels equal
    tifffile's (the same libjpeg-turbo, islow DCT and fancy upsampling), corrupt entropy
    data raises instead of decoding into wrong pixels (strict mode), and it is one decode
    where :func:`check_jpeg` plus tifffile's decode are two (a 1024 x 1024 SVS viewport
    reads about a third faster: ``benchmarks/reader_speed.py``).

    Raises
    ------
    ChunkError
        The frame is larger than `frame`, or the data is corrupt.
    """
    import simplejpeg

    stream = _jpeg_stream(data, tables, header)
    try:
        _check_frame(simplejpeg, stream, frame)
        out: np.ndarray = simplejpeg.decode_jpeg(stream, colorspace=colorspace, strict=True)
    except ValueError as exc:
        if isinstance(exc, ChunkError):
            raise
        raise ChunkError(f"its JPEG data is corrupt ({exc})") from exc
    return out if out.ndim == 3 else out[:, :, np.newaxis]


class NativeChunks(Protocol):
    """Reads native chunks of one level by grid index (axes of the level as shown)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fast: bool

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        """Return each native chunk (clipped to the level) or the error decoding it raised.

        `raw` holds the compressed bytes :meth:`fetch` already brought (remote files).
        """
        ...

    def fetch(self, indices: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], bytes] | None:
        """Fetch the compressed bytes of many chunks at once (remote files), else None."""
        ...


class OnDemandChunks:
    """Base of the native-chunk readers with nothing to prefetch.

    The zarr path here and the DICOM, OME-Zarr and OpenSlide backends read each chunk
    when it is asked for; only the direct TIFF decoder fetches a remote file's bytes ahead.
    """

    def fetch(self, indices: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], bytes] | None:
        """Nothing to prefetch: :meth:`read` brings each chunk (on the reader's threads)."""
        return None


def native_chunks(
    level: tifffile.TiffPageSeries,
    index: tuple[int | slice, ...],
    zarr_level: Callable[[], Any],
    *,
    fetch: Fetch | None = None,
) -> NativeChunks:
    """Return the native-chunk reader of one level.

    Parameters
    ----------
    level : TiffPageSeries
        The pyramid level (``series.levels[i]``).
    index : tuple of int or slice
        Selection of the shown axes in the level's (squeezed) shape: ``slice(None)``
        keeps an axis, ``0`` drops it.
    zarr_level : callable
        Returns the same level opened through the tifffile zarr store; called only when
        the level's layout needs the zarr path (so zarr is not imported otherwise).
    fetch : callable, optional
        ``fetch(offsets, counts) -> list of bytes``: fetches many segments at once (a remote
        file's :meth:`~napari_slidescope.slide.remote.RemoteFile.cat_ranges`). Its errors
        are raised, never turned into blank tiles.

    Returns
    -------
    NativeChunks
        The direct page decoder when the level's layout allows it, else a reader that asks
        the zarr array for each chunk.
    """
    try:
        fast = _PageChunks.create(level, index, fetch)
    except Exception:  # any surprise in the layout: use the general path
        fast = None
    return fast if fast is not None else _ZarrChunks(zarr_level(), index)


def zarr_chunks(z: Any, index: tuple[int | slice, ...]) -> NativeChunks:
    """Return a native-chunk reader that asks the zarr array for each chunk."""
    return _ZarrChunks(z, index)


def _kept(values: Sequence[int], index: tuple[int | slice, ...]) -> tuple[int, ...]:
    return tuple(int(v) for v, i in zip(values, index, strict=True) if isinstance(i, slice))


class _ZarrChunks(OnDemandChunks):
    """Native chunks read through the zarr array, one request per chunk."""

    fast = False

    def __init__(self, z: Any, index: tuple[int | slice, ...]) -> None:
        self._z = z
        self._index = index
        self.shape = _kept(z.shape, index)
        self.chunks = tuple(
            min(c, n) for c, n in zip(_kept(z.chunks, index), self.shape, strict=True)
        )
        self.dtype = np.dtype(z.dtype)

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        out: list[np.ndarray | BaseException] = []
        for idx in indices:
            box = iter(
                slice(i * c, min((i + 1) * c, n))
                for i, c, n in zip(idx, self.chunks, self.shape, strict=True)
            )
            key = tuple(next(box) if isinstance(i, slice) else i for i in self._index)
            try:
                out.append(np.asarray(self._z[key]))
            except Exception as exc:
                if not is_decode_error(exc):
                    raise
                out.append(exc)
        return out


class _PageChunks:
    """Native chunks decoded straight from the TIFF pages with ``TiffPage.decode``.

    Handles a level that is one page shown as ``YXS`` or ``YX`` (tiles, strips or NDPI
    restart bands), or one ``YX`` page per channel shown as ``CYX``.
    """

    fast = True

    def __init__(
        self,
        pages: list[Any],
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        dtype: np.dtype[Any],
        *,
        tiled: bool,
        fetch: Fetch | None = None,
    ) -> None:
        self.shape, self.chunks, self.dtype = shape, chunks, dtype
        self._fetch = fetch
        self._pages = pages
        self._keyframe = pages[0].keyframe
        self._channels = len(shape) == 3 and len(pages) > 1
        self._spatial = (1, 2) if self._channels else (0, 1)
        h, w = (shape[a] for a in self._spatial)
        ch, cw = (chunks[a] for a in self._spatial)
        self._tiles_across = -(-w // cw) if tiled else 1
        self._nodata = self._keyframe.nodata
        self._decode = self._keyframe.decode  # resolves (and caches) the decode closure
        self._kwargs: list[dict[str, Any]] = []
        for page in pages:
            kwargs: dict[str, Any] = {}
            if getattr(page, "jpegtables", None) is not None:
                kwargs["jpegtables"] = page.jpegtables
            if self._keyframe.jpegheader is not None:
                kwargs["jpegheader"] = self._keyframe.jpegheader
            self._kwargs.append(kwargs)
        self._offsets = [page.dataoffsets for page in pages]
        self._counts = [page.databytecounts for page in pages]
        fh = pages[0].parent.filehandle
        fh.set_lock(True)
        self._fh = fh
        self._size = int(fh.size)
        compression = int(getattr(self._keyframe.compression, "value", 1))
        # a whole JPEG / JPEG 2000 stream per segment ends with an end marker (FFD9);
        # a byte count cut short would otherwise decode as plausible garbage
        self._eoi = compression in _EOI_CODECS and self._keyframe.jpegheader is None
        # libjpeg decodes garbage entropy data without an error (it only warns): every
        # 8-bit JPEG segment is checked by a strict entropy-decoding pass as well
        self._jpeg = compression == 7 and int(self._keyframe.bitspersample) == 8
        # ... and where libjpeg infers the colours from the stream (YCbCr, grey), decoded by
        # that strict pass alone: one decode instead of two (an RGB-coded JPEG, as Aperio
        # writes some, needs tifffile's explicit colour space)
        photometric = int(getattr(self._keyframe.photometric, "value", -1))
        nsamples = int(self._keyframe.samplesperpixel)
        self._strict_colorspace = (
            "RGB"
            if self._jpeg and photometric == 6 and nsamples == 3
            else "GRAY"
            if self._jpeg and photometric == 1 and nsamples == 1
            else None
        )
        # an RGB-coded JPEG (photometric 2, no JFIF: Aperio's encoding) is decoded in one
        # strict pass too, its stream marked RGB (decode_rgb_jpeg_strict); a tile whose
        # markers do not allow that falls back to the check + tifffile's decode
        self._rgb_coded = (
            self._jpeg
            and photometric == 2
            and nsamples == 3
            and int(self._keyframe.planarconfig) == 1
            and not self._keyframe.extrasamples
            and not self._keyframe.is_jfif
            and self._keyframe.jpegheader is None
            and all(rgb_tables_ok(getattr(p, "jpegtables", None)) for p in pages)
        )
        kf = self._keyframe
        self._frame = (
            (int(kf.tilelength), int(kf.tilewidth))
            if tiled
            else (int(kf.rowsperstrip), int(kf.imagewidth))
        )

    @classmethod
    def create(
        cls,
        level: tifffile.TiffPageSeries,
        index: tuple[int | slice, ...],
        fetch: Fetch | None = None,
    ) -> _PageChunks | None:
        """Return the direct decoder for `level`, or None if its layout needs the zarr path.

        The level's shape is tifffile's (squeezed) series shape, which its zarr store
        reports too; the native chunk is the page's tile or strip, which is the zarr
        store's chunk for the layouts taken here (``tests/slide/test_fast_read.py``
        checks both against zarr on every test slide).
        """
        if getattr(level, "transform", None) is not None:
            return None
        pages: list[Any] = list(level.pages)
        if not pages or any(p is None or p.keyframe is None for p in pages):
            return None
        key: Any = pages[0].keyframe
        if any(p.parent.filehandle is not key.parent.filehandle for p in pages):
            return None
        full = tuple(int(n) for n in level.shape)
        if len(full) != len(index):
            return None
        if any(isinstance(i, int) and n != 1 for i, n in zip(index, full, strict=True)):
            return None  # dropped axes with more than one plane: leave them to zarr
        shape = _kept(full, index)
        nsep, depth, h, w, samples = key.shaped
        if nsep != 1 or depth != 1 or key.is_tiled and key.tiledepth != 1:
            return None
        tiled = bool(key.is_tiled)
        native = (key.tilelength, key.tilewidth) if tiled else (key.rowsperstrip, w)
        want_shape: tuple[int, ...]
        want_chunks: tuple[int, ...]
        if len(shape) == 3 and len(pages) == 1 and samples > 1:  # YXS
            want_shape, want_chunks = (h, w, samples), (*native, samples)
        elif len(shape) == 2 and len(pages) == 1 and samples == 1:  # YX
            want_shape, want_chunks = (h, w), native
        elif len(shape) == 3 and len(pages) > 1 and samples == 1:  # CYX, a page per channel
            if any(p.shaped != key.shaped for p in pages):
                return None
            want_shape, want_chunks = (len(pages), h, w), (1, *native)
        else:
            return None
        chunks = tuple(min(c, n) for c, n in zip(want_chunks, want_shape, strict=True))
        if shape != want_shape or tuple(key.chunks)[:2] != tuple(native):
            return None
        nsegments = -(-h // native[0]) * (-(-w // native[1]) if tiled else 1)
        if any(
            len(p.dataoffsets) != nsegments or len(p.databytecounts) != nsegments for p in pages
        ):
            return None
        return cls(pages, shape, chunks, np.dtype(level.dtype), tiled=tiled, fetch=fetch)

    def _segment(self, idx: tuple[int, ...]) -> tuple[int, int]:
        """(page, segment number) of a native chunk."""
        ya, xa = self._spatial
        page = idx[0] if self._channels else 0
        return page, idx[ya] * self._tiles_across + idx[xa]

    def fetch(self, indices: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], bytes] | None:
        if self._fetch is None:
            return None
        where = [self._segment(idx) for idx in indices]
        datas = self._fetch(
            [int(self._offsets[p][s]) for p, s in where],
            [int(self._counts[p][s]) for p, s in where],
        )
        return dict(zip(indices, datas, strict=True))

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        if raw is None and self._fetch is not None:
            raw = self.fetch(indices)  # a network failure raises: never a blank tile
        per_page: dict[int, list[tuple[int, int]]] = {}
        for n, idx in enumerate(indices):
            page, seg = self._segment(idx)
            per_page.setdefault(page, []).append((n, seg))
        out: list[np.ndarray | BaseException] = [None] * len(indices)  # type: ignore[list-item]
        for page, all_items in per_page.items():
            offsets, counts = self._offsets[page], self._counts[page]
            # a 0 byte count is a missing tile; kept out of read_segments, which would
            # hand the following segments the wrong bytes (tifffile 2026.3)
            items = []
            for n, seg in all_items:
                if counts[seg] > 0:
                    items.append((n, seg))
                    continue
                try:
                    self._check_bytes(None, offsets[seg], counts[seg])
                except ChunkError as exc:
                    out[n] = exc
            if not items:
                continue
            segs = [s for _, s in items]
            if raw is not None:
                got = [(raw.get(indices[n]), k) for k, (n, _) in enumerate(items)]
                self._decode_all(got, items, indices, page, out)
                continue
            try:
                segments = list(
                    self._fh.read_segments(
                        [offsets[s] for s in segs],
                        [counts[s] for s in segs],
                        list(range(len(segs))),
                        lock=self._fh.lock,
                    )
                )
            except Exception as exc:  # closed, deleted on a network share, I/O error
                failed = ChunkError(f"cannot read the file ({describe_exception(exc)})")
                failed.__cause__ = exc
                for n, _ in items:
                    out[n] = failed
                continue
            self._decode_all(segments, items, indices, page, out)
        return out

    def _decode_all(
        self,
        segments: Any,
        items: list[tuple[int, int]],
        indices: Sequence[tuple[int, ...]],
        page: int,
        out: list[np.ndarray | BaseException],
    ) -> None:
        offsets, counts = self._offsets[page], self._counts[page]
        for data, k in segments:
            n, seg = items[k]
            try:
                self._check_bytes(data, offsets[seg], counts[seg])
                out[n] = self._decode_one(data, seg, indices[n], self._kwargs[page])
            except MemoryError as exc:
                out[n] = ChunkError(f"not enough memory to decode ({describe_exception(exc)})")
            except Exception as exc:
                if not is_decode_error(exc):
                    raise
                out[n] = exc

    def _check_bytes(self, data: bytes | None, offset: int, count: int) -> None:
        if count <= 0:
            raise ChunkError(
                f"its byte count is {count} (at byte {offset:,}): the tile is missing from the file"
            )
        if offset + count > self._size:
            raise ChunkError(
                f"its {count:,} bytes at byte {offset:,} lie past the end of the file "
                f"({self._size:,} bytes): the file is truncated"
            )
        if data is None or len(data) < count:
            got = 0 if data is None else len(data)
            raise ChunkError(
                f"only {got:,} of its {count:,} bytes could be read: "
                "the file was changed or cut short since it was opened"
            )
        if self._eoi and data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
            raise ChunkError(
                "its compressed stream is shorter than its markers say (no end-of-image "
                "marker): the tile's byte count or data is damaged"
            )

    def _decode_one(
        self, data: bytes | None, seg: int, idx: tuple[int, ...], kwargs: dict[str, Any]
    ) -> np.ndarray:
        ya, xa = self._spatial
        rows = min(self.chunks[ya], self.shape[ya] - idx[ya] * self.chunks[ya])
        cols = min(self.chunks[xa], self.shape[xa] - idx[xa] * self.chunks[xa])
        samples = self.shape[2] if not self._channels and len(self.shape) == 3 else 1
        if data is None or not data:
            return np.full(self._chunk_shape(rows, cols, samples), self._nodata, self.dtype)
        if self._strict_colorspace is not None:
            tile = decode_jpeg_strict(
                data,
                kwargs.get("jpegtables"),
                kwargs.get("jpegheader"),
                colorspace=self._strict_colorspace,
                frame=self._frame,
            )
        elif self._rgb_coded and (
            (rgb := decode_rgb_jpeg_strict(data, kwargs.get("jpegtables"), frame=self._frame))
            is not None
        ):
            tile = rgb
        else:
            if self._jpeg:  # before decoding: a forged frame size must not allocate anything
                check_jpeg(
                    data, kwargs.get("jpegtables"), kwargs.get("jpegheader"), frame=self._frame
                )
            decoded = self._decode(data, seg, **kwargs)[0]
            if decoded is None:
                return np.full(self._chunk_shape(rows, cols, samples), self._nodata, self.dtype)
            tile = decoded[0]  # (length, width, samples)
        if tile.shape[0] < rows or tile.shape[1] < cols:  # short data: tifffile pads with nodata
            full = np.full((rows, cols, tile.shape[2]), self._nodata, self.dtype)
            full[: tile.shape[0], : tile.shape[1]] = tile[:rows, :cols]
            tile = full
        tile = tile[:rows, :cols]
        if self._channels:
            return tile[np.newaxis, :, :, 0]
        return tile if len(self.shape) == 3 else tile[:, :, 0]

    def _chunk_shape(self, rows: int, cols: int, samples: int) -> tuple[int, ...]:
        if self._channels:
            return (1, rows, cols)
        return (rows, cols, samples) if len(self.shape) == 3 else (rows, cols)

    # -- the hook of the DCT-scaled reader (napari_slidescope.slide._scaled) --

    @property
    def jpeg_colorspace(self) -> str | None:
        """How the scaled reader decodes this level's 8-bit JPEG segments, or None.

        ``"RGB"`` (YCbCr-coded colour), ``"GRAY"``, or ``"RGB-coded"`` (an RGB
        photometric JPEG, as Aperio writes some: libjpeg must be told the colours are RGB);
        None for any other level (not JPEG, not 8-bit, other colours).
        """
        if not self._jpeg or self._channels:
            return None
        if self._strict_colorspace is not None:
            return self._strict_colorspace
        photometric = int(getattr(self._keyframe.photometric, "value", -1))
        rgb = photometric == 2 and int(self._keyframe.samplesperpixel) == 3
        return "RGB-coded" if rgb else None

    def jpeg_streams(self, indices: Sequence[tuple[int, ...]]) -> list[bytes | BaseException]:
        """Each native chunk as a whole JPEG stream (its tables or NDPI header spliced in).

        The bytes are checked as :meth:`read` checks them (missing, past the end of the
        file, cut short): a chunk that fails is returned as its :class:`ChunkError`.
        """
        where = [self._segment(idx) for idx in indices]
        spans = [(int(self._offsets[p][s]), int(self._counts[p][s])) for p, s in where]
        datas: list[bytes | None] = [None] * len(indices)
        ok = [n for n, (o, c) in enumerate(spans) if c > 0 and o + c <= self._size]
        failed: ChunkError | None = None
        try:
            if ok and self._fetch is not None:  # a remote file: the ranges at once
                got = self._fetch([spans[n][0] for n in ok], [spans[n][1] for n in ok])
                for n, fetched in zip(ok, got, strict=True):
                    datas[n] = fetched
            elif ok:
                segments = self._fh.read_segments(
                    [spans[n][0] for n in ok], [spans[n][1] for n in ok], ok, lock=self._fh.lock
                )
                for segment, n in segments:
                    datas[n] = segment
        except OSError as exc:  # closed, deleted on a network share, I/O error
            failed = ChunkError(f"cannot read the file ({describe_exception(exc)})")
            failed.__cause__ = exc
        out: list[bytes | BaseException] = []
        for (page, _), (offset, count), data in zip(where, spans, datas, strict=True):
            if failed is not None:
                out.append(failed)
                continue
            try:
                self._check_bytes(data, offset, count)
            except ChunkError as exc:
                out.append(exc)
                continue
            kwargs = self._kwargs[page]
            assert data is not None
            out.append(_jpeg_stream(data, kwargs.get("jpegtables"), kwargs.get("jpegheader")))
        return out

    @property
    def frame(self) -> tuple[int, int]:
        """(rows, cols) of the native chunk's frame (a larger JPEG frame is refused)."""
        return self._frame

    @functools.cached_property
    def band_rows_step(self) -> int | None:
        """Band rows a :meth:`jpeg_band_rows` span starts on a multiple of, or None.

        An NDPI level is one JPEG whose restart intervals are its bands; the intervals
        of whole band rows lie end to end in the file, so a run of band rows is one
        JPEG stream of the level's own entropy-coded data: one libjpeg call in place of
        one per band (a 96 x 8 px band costs about as much to set up as to decode).
        libjpeg numbers restart markers 0-7 from the start of a scan, so a span starts
        on a band whose index is a multiple of 8. Only for levels whose pixels do not
        depend on the span: 8-bit YCbCr or grey JPEG without chroma subsampling (no
        upsampling across band edges), one page, not wider than a JPEG frame may be.
        None for any other level.
        """
        header = self._keyframe.jpegheader
        if header is None or self._channels or self._strict_colorspace is None:
            return None
        sof = _sof_offset(header)
        if sof is None:
            return None
        ncomp = header[sof + 5]
        sampling = header[sof + 7 : sof + 7 + 3 * ncomp : 3]
        if len(sampling) != ncomp or any(f != 0x11 for f in sampling):
            return None
        ch, cw = (self.chunks[a] for a in self._spatial)
        if self._tiles_across * cw > 0xFFFF or (ch, cw) != self._frame:
            return None
        return 8 // math.gcd(self._tiles_across, 8)

    def jpeg_band_rows(self, r0: int, r1: int) -> bytes | None:
        """Band rows ``[r0, r1)`` of an NDPI level as one JPEG stream, or None.

        `r0` is a multiple of :attr:`band_rows_step`. The stream is the level's JPEG
        header with its frame set to the span (``(r1 - r0) * band rows`` x the level's
        band columns) and the bands' bytes as stored, end to end. None where that cannot
        be (no step; bands missing, not end to end, past the end of the file; the file
        unreadable): the caller then decodes band by band, which reports each bad band.
        """
        step = self.band_rows_step
        if step is None or r0 % step or r1 <= r0:
            return None
        ch, cw = (self.chunks[a] for a in self._spatial)
        if (r1 - r0) * ch > 0xFFFF:
            return None
        across = self._tiles_across
        offsets, counts = self._band_arrays
        s0, s1 = r0 * across, min(r1 * across, offsets.size)
        if s0 >= s1:
            return None
        off, cnt = offsets[s0:s1], counts[s0:s1]
        first, end = int(off[0]), int(off[-1] + cnt[-1])
        if cnt.min() <= 0 or end > self._size or np.any(off[1:] != off[:-1] + cnt[:-1]):
            return None
        try:
            if self._fetch is not None:
                data = self._fetch([first], [end - first])[0]
            else:
                data = next(
                    iter(self._fh.read_segments([first], [end - first], [0], lock=self._fh.lock))
                )[0]
        except Exception:  # unreadable: the band-by-band read says what failed
            return None
        if data is None or len(data) != end - first:
            return None
        header = self._keyframe.jpegheader
        sof = _sof_offset(header)
        assert sof is not None  # band_rows_step found it
        size = struct.pack(">HH", (r1 - r0) * ch, across * cw)
        return b"".join((header[: sof + 1], size, header[sof + 5 :], data, b"\xff\xd9"))

    @functools.cached_property
    def _band_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.asarray(self._offsets[0], np.int64),
            np.asarray(self._counts[0], np.int64),
        )
