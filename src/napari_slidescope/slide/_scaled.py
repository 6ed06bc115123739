"""Reading a JPEG level at 1/2, 1/4 or 1/8 of its size, scaled in the DCT domain.

libjpeg-turbo decodes a JPEG at ``M/8`` of its size by running a smaller inverse DCT
on each 8 x 8 block's low frequencies: at 1/2 a block becomes the 4 x 4 picture of
its coarse content, within a grey level or so of the 2 x 2 block means of the full
decode (``tests/slide/test_scaled.py``), for less work than the full decode and a
quarter of the memory. Tissue detection reads its working image this way where the
nearest pyramid level is finer than the working resolution (an Aperio level at
4 µm/px read at 1/2 for 8 µm/px).

Every segment is decoded once, strictly (simplejpeg, which raises on libjpeg's
"corrupt data" warnings): a corrupt tile is refused as the level reader refuses it
(:class:`~napari_slidescope.slide.errors.SlideError` naming the file, level and pixels,
or a blank tile reported to the slide's damage log). An RGB-coded JPEG (Aperio's, whose
component ids do not say RGB) is told its colours by an Adobe marker with transform 0,
which makes libjpeg decode it exactly as tifffile does with its explicit colour space.

Tile rows are decoded on threads (libjpeg-turbo releases the GIL) straight into the one
output array: no full-resolution tile and no whole-level temporary is kept. An NDPI level
read across its width is decoded in spans of band rows, one libjpeg call each (the bands'
bytes lie end to end: ``_PageChunks.jpeg_band_rows``), the same pixels as band by band in
a third of the time (the 5880 x 3168 px level of a scanner-size NDPI holds 24,255 bands).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _tiff

if TYPE_CHECKING:
    from napari_slidescope.slide._levels import LevelReader

__all__ = ["SCALES", "read_scaled", "scales"]

#: Scale denominators libjpeg decodes in the DCT domain (besides 1).
SCALES = (2, 4, 8)

#: An APP14 "Adobe" marker with transform 0: the three components are R, G, B.
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"


def scales(reader: LevelReader) -> tuple[int, ...]:
    """Scale denominators `reader`'s level can be decoded at: ``(1,)`` or ``(1, 2, 4, 8)``.

    ``(1, 2, 4, 8)`` for a level of 8-bit JPEG tiles or NDPI restart bands in colours
    libjpeg decodes (YCbCr, RGB-coded, grey) whose native chunk divides by 8.
    """
    source = reader._source
    colorspace = getattr(source, "jpeg_colorspace", None)
    if colorspace is None:
        return (1,)
    rows, cols = (reader.native[a] for a in reader.spatial)
    if rows % 8 or cols % 8:
        return (1,)
    return (1, *SCALES)


def read_scaled(
    reader: LevelReader,
    box: tuple[int, int, int, int],
    scale: int,
    *,
    check: Callable[[], None] | None = None,
    workers: int = 1,
) -> np.ndarray:
    """Return a box of a level decoded at ``1 / scale`` of its size.

    Parameters
    ----------
    reader : LevelReader
        The level (its :func:`scales` must hold `scale`).
    box : (int, int, int, int)
        ``(y0, x0, y1, x1)`` in level pixels, inside the level, with ``y0`` and ``x0``
        multiples of `scale`.
    scale : {1, 2, 4, 8}
        Output pixel ``(i, j)`` shows level pixels ``[i*scale, (i+1)*scale)`` (rows, and
        the same for columns) from the box's corner; 1 decodes at full size (the pixels
        of the level reader, without its tile cache).
    check : callable, optional
        Called before each tile row is decoded (raises to stop the read: cancellation).
    workers : int
        Threads decoding tile rows (the caller's thread is one of them).

    Returns
    -------
    (ceil((y1 - y0) / scale), ceil((x1 - x0) / scale), samples) ndarray of uint8
        ``samples`` is 3 (RGB) or 1 (grey).

    Raises
    ------
    SlideError
        A tile is damaged and the slide was opened with ``on_error="raise"``.
    ValueError
        `scale` is not one the level decodes at, or the box is not aligned to it.
    """
    if scale not in scales(reader) or len(scales(reader)) == 1:
        raise ValueError(f"level {reader._level} cannot be decoded at 1/{scale}")
    y0, x0, y1, x1 = box
    if y0 % scale or x0 % scale:
        raise ValueError(f"box {box!r} does not start on a multiple of {scale}")
    yi, xi = reader.spatial
    ch, cw = reader.native[yi], reader.native[xi]
    colorspace = reader._source.jpeg_colorspace  # type: ignore[attr-defined]
    samples = 1 if colorspace == "GRAY" else 3
    out = np.zeros((-(-(y1 - y0) // scale), -(-(x1 - x0) // scale), samples), np.uint8)
    if out.size == 0:
        return out
    first, last = y0 // ch, -(-y1 // ch)
    cols = list(range(x0 // cw, -(-x1 // cw)))
    job = _Rows(reader, out, box, scale, cols, check)
    units = _units(reader, first, last, cols, scale)
    n = max(1, min(workers, len(units)))
    if n == 1:
        for u in units:
            job.unit(*u)
    else:
        it = iter(units)
        lock = threading.Lock()

        def run() -> None:
            while not job.failed:
                with lock:
                    u = next(it, None)
                if u is None:
                    return
                try:
                    job.unit(*u)
                except BaseException as exc:
                    job.fail(exc)
                    return

        with ThreadPoolExecutor(n - 1, thread_name_prefix="slidescope-scaled") as pool:
            futures = [pool.submit(run) for _ in range(n - 1)]
            run()
            for f in futures:
                f.result()
        if job.error is not None:
            raise job.error
    if job.bad:
        reader._warn_blank(job.bad)
    return out


#: Pixels (at the read's scale) of one NDPI band-row span decoded in one call: a few
#: MiB of temporary output, and enough spans for the threads and for cancellation.
SPAN_PIXELS = 1 << 20


def _units(
    reader: LevelReader, first: int, last: int, cols: list[int], scale: int
) -> list[tuple[int, int, bool]]:
    """Return the read's units of work: ``(r0, r1, span)``, tile rows ``[r0, r1)``.

    A span (an NDPI level read across all its band columns) is decoded in one libjpeg
    call (``jpeg_band_rows``), starting on a multiple of the source's step: it may begin
    a few band rows above the box (those are decoded and not pasted). Else one unit per
    tile row.
    """
    source = reader._source
    step = getattr(source, "band_rows_step", None)
    yi, xi = reader.spatial
    ch, cw = reader.native[yi], reader.native[xi]
    across = -(-reader.shape[xi] // cw)
    if step is None or len(cols) != across or last - first < 2:
        return [(r, r + 1, False) for r in range(first, last)]
    per_row = max(1, ch * cw * across // (scale * scale))
    rows = max(step, SPAN_PIXELS // per_row // step * step)
    rows = min(rows, 0xFFFF // ch // step * step) or step
    start = first // step * step
    return [(r, min(r + rows, last), True) for r in range(start, last, rows)]


class _Rows:
    """The tile rows of one scaled read: decode, paste, collect damaged tiles."""

    def __init__(
        self,
        reader: LevelReader,
        out: np.ndarray,
        box: tuple[int, int, int, int],
        scale: int,
        cols: list[int],
        check: Callable[[], None] | None,
    ) -> None:
        self.reader, self.out, self.box, self.scale = reader, out, box, scale
        self.cols, self.check = cols, check
        self.colorspace: str = reader._source.jpeg_colorspace  # type: ignore[attr-defined]
        self.frame: tuple[int, int] = reader._source.frame  # type: ignore[attr-defined]
        self.bad: list[Any] = []
        self.error: BaseException | None = None
        self.failed = False
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
            self.failed = True

    def unit(self, r0: int, r1: int, span: bool) -> None:
        """Decode tile rows ``[r0, r1)`` into the output: as one span, or row by row."""
        if span:
            if self.check is not None:
                self.check()
            if self.span(r0, r1):
                return
            y0, y1 = self.box[0], self.box[2]
            ch = self.reader.native[self.reader.spatial[0]]
            r0, r1 = max(r0, y0 // ch), min(r1, -(-y1 // ch))
        for r in range(r0, r1):
            self.row(r)

    def span(self, r0: int, r1: int) -> bool:
        """Decode band rows ``[r0, r1)`` in one call; False when that cannot be.

        Then (bands missing or damaged, the file unreadable) the caller decodes them band
        by band, which reports or refuses each bad band as any read does. A span decodes
        to the pixels of its bands decoded one by one: the same entropy-coded data, each
        restart interval's DC prediction reset by its marker, and no chroma upsampling
        across band edges (``band_rows_step`` takes only levels without subsampling).
        """
        reader, s = self.reader, self.scale
        yi, xi = reader.spatial
        ch, cw = reader.native[yi], reader.native[xi]
        stream = reader._source.jpeg_band_rows(r0, r1)  # type: ignore[attr-defined]
        if stream is None:
            return False
        across = -(-reader.shape[xi] // cw)
        h, w = reader.shape[yi], reader.shape[xi]
        y0, x0, y1, x1 = self.box
        # the span's rows of a box as wide as the level: libjpeg writes them in place
        direct = (
            x0 == 0
            and x1 == w == across * cw
            and y0 <= r0 * ch
            and r1 * ch <= min(y1, h)
            and self.out.flags.c_contiguous
        )
        into = self.out[(r0 * ch - y0) // s : (r1 * ch - y0) // s] if direct else None
        try:
            tile = _decode(stream, self.colorspace, s, ((r1 - r0) * ch, across * cw), into)
        except _tiff.ChunkError:
            if into is not None:
                into[...] = 0  # what libjpeg wrote before it stopped; the bands decode anew
            return False
        if into is None or not np.shares_memory(tile, into):
            self._paste(tile, r0 * ch, 0, min((r1 - r0) * ch, h - r0 * ch), w)
        return True

    def _paste(self, tile: np.ndarray, ty0: int, tx0: int, rows: int, ncols: int) -> None:
        """Paste a decoded piece of level rows ``[ty0, ty0 + rows)``, columns from `tx0`."""
        s = self.scale
        y0, x0, y1, x1 = self.box
        ly0, ly1 = max(y0, ty0), min(y1, ty0 + rows)
        lx0, lx1 = max(x0, tx0), min(x1, tx0 + ncols)
        if ly1 <= ly0 or lx1 <= lx0:
            return
        oy0, oy1 = (ly0 - y0) // s, -(-(ly1 - y0) // s)
        ox0, ox1 = (lx0 - x0) // s, -(-(lx1 - x0) // s)
        sy0, sx0 = (ly0 - ty0) // s, (lx0 - tx0) // s
        self.out[oy0:oy1, ox0:ox1] = tile[sy0 : sy0 + oy1 - oy0, sx0 : sx0 + ox1 - ox0]

    def row(self, r: int) -> None:
        """Decode tile row `r` of the box into the output."""
        if self.check is not None:
            self.check()
        reader, s = self.reader, self.scale
        yi, xi = reader.spatial
        ch, cw = reader.native[yi], reader.native[xi]
        h, w = reader.shape[yi], reader.shape[xi]
        indices = [_index(reader, r, c) for c in self.cols]
        streams = reader._source.jpeg_streams(indices)  # type: ignore[attr-defined]
        bad = []
        for c, idx, stream in zip(self.cols, indices, streams, strict=True):
            rows, ncols = min(ch, h - r * ch), min(cw, w - c * cw)
            try:
                if isinstance(stream, BaseException):
                    raise stream
                tile = _decode(stream, self.colorspace, s, self.frame)
            except _tiff.ChunkError as exc:
                reason = f": {exc}"
                if reader._on_error == "raise":
                    where = _where(reader, idx)
                    raise SlideError(
                        reader._path, f"level {reader._level}: cannot decode pixels {where}{reason}"
                    ) from exc
                chunk_box = reader._chunk_box(idx)
                bad.append(((reader._level, (chunk_box[yi], chunk_box[xi])), reason))
                continue  # the output is zeros there, as the level reader's blank tile
            need = (-(-rows // s), -(-ncols // s))
            if tile.shape[0] < need[0] or tile.shape[1] < need[1]:  # a short frame: padded
                full = np.zeros((*need, tile.shape[2]), np.uint8)
                full[: tile.shape[0], : tile.shape[1]] = tile[: need[0], : need[1]]
                tile = full
            # the tile's level rows [r*ch, r*ch + rows) clipped to the box
            self._paste(tile, r * ch, c * cw, rows, ncols)
        if bad:
            with self._lock:
                self.bad += bad


def _index(reader: LevelReader, r: int, c: int) -> tuple[int, ...]:
    idx = [0] * len(reader.shape)
    yi, xi = reader.spatial
    idx[yi], idx[xi] = r, c
    return tuple(idx)


def _where(reader: LevelReader, idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in reader._chunk_box(idx)) + "]"


def _decode(
    stream: bytes,
    colorspace: str,
    scale: int,
    frame: tuple[int, int],
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Decode one whole JPEG stream at ``1 / scale``, strictly, to (rows, cols, samples).

    With `into` (a C-contiguous uint8 array of exactly that shape), libjpeg writes there
    (the array returned is then a view of it).
    """
    import simplejpeg

    if colorspace == "RGB-coded":
        stream = b"".join((stream[:2], _ADOBE_RGB, stream[2:]))
    try:
        rows, cols = simplejpeg.decode_jpeg_header(stream)[:2]
        if rows > frame[0] or cols > frame[1]:
            raise _tiff.ChunkError(
                f"its JPEG frame is {cols:,} x {rows:,} px, larger than the "
                f"{frame[1]:,} x {frame[0]:,} px tile it should hold"
            )
        want = (math.ceil(rows / scale), math.ceil(cols / scale))
        space = "GRAY" if colorspace == "GRAY" else "RGB"
        samples = 1 if space == "GRAY" else 3
        place: dict[str, Any] = {}
        if into is not None and into.shape == (*want, samples) and into.flags.c_contiguous:
            place["buffer"] = into
        tile: np.ndarray = (
            simplejpeg.decode_jpeg(stream, colorspace=space, strict=True, **place)
            if scale == 1
            else simplejpeg.decode_jpeg(
                stream,
                colorspace=space,
                min_height=want[0],
                min_width=want[1],
                min_factor=scale,
                strict=True,
                **place,
            )
        )
    except ValueError as exc:
        if isinstance(exc, _tiff.ChunkError):
            raise
        raise _tiff.ChunkError(f"its JPEG data is corrupt ({exc})") from exc
    if tile.shape[:2] != want:
        raise _tiff.ChunkError(
            f"its JPEG frame decodes to {tile.shape[1]} x {tile.shape[0]} px at 1/{scale}, "
            f"not {want[1]} x {want[0]}"
        )
    return tile if tile.ndim == 3 else tile[:, :, np.newaxis]
