"""Structure checks run when a slide is opened: cheap, bounded, and no pixel decoded.

A damaged or hostile file must give a clear :class:`SlideError`, never plausible but wrong
pixels, a hang or a memory blow-up. Before tifffile parses anything, :func:`walk` follows
the chain of image file directories (IFDs) itself, with limits: it refuses loops, chains
that leave the file, absurd tag counts and tag values lying past the end. After tifffile
has built the series, :func:`check_page` compares every pyramid level's header with its
data layout (dimensions, bit depth, sample count, tile grid, every tile's offset and byte
count, NDPI restart-band offsets) using numpy over the offset arrays.

Hamamatsu NDPI is read as tifffile reads it: a classic TIFF with a 64-bit first-IFD offset
and, in every IFD, the high 32 bits of each entry's value after the 64-bit next-IFD offset.
Its restart bands (:func:`ndpi_bands`) take McuStartsHighBytes into account; McuStarts that
wrap past 2**32 without it are repaired, and every band layout is checked against the
restart markers in the file before a pixel is decoded.

The limits sit far above the largest real slides (about 200,000 x 100,000 pixels, a few
hundred IFDs).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_slidescope.errors import SlideError

#: Image file directories (pages) in one file, SubIFDs included.
MAX_IFDS = 4096
#: Tag entries in one IFD (a real slide page has 15-40).
MAX_TAGS = 512
#: Bytes of one ImageDescription (OME-XML of a large plate is a few MiB).
MAX_DESCRIPTION = 16 * 2**20
#: Pixels along one side of an image.
MAX_SIDE = 2**20
#: Samples per pixel of one page.
MAX_SAMPLES = 16
#: Decoded bytes of one native tile, strip or restart band.
MAX_CHUNK_BYTES = 256 * 2**20
#: Decoded bytes of an associated image (label, macro, thumbnail), decoded whole.
MAX_ASSOCIATED_BYTES = 256 * 2**20
#: Characters of one metadata string copied into ``Slide.metadata``.
MAX_PROPERTY_CHARS = 4096

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")

_TYPE_SIZES = {
    1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
    16: 8, 17: 8, 18: 8,
}  # fmt: skip
_TAG_NAMES = {
    256: "ImageWidth", 257: "ImageLength", 258: "BitsPerSample", 270: "ImageDescription",
    273: "StripOffsets", 277: "SamplesPerPixel", 278: "RowsPerStrip", 279: "StripByteCounts",
    322: "TileWidth", 323: "TileLength", 324: "TileOffsets", 325: "TileByteCounts",
    330: "SubIFDs", 347: "JPEGTables", 65426: "McuStarts",
}  # fmt: skip


def _n(value: int) -> str:
    return f"{value:,}"


def _size(nbytes: int) -> str:
    return f"{_n(nbytes)} bytes"


@dataclass
class Layout:
    """What :func:`walk` found: the IFD offsets and how the chain ended."""

    size: int
    byteorder: str
    bigtiff: bool
    ndpi: bool
    ifds: list[int] = field(default_factory=list)
    #: A sentence saying where the structure leaves the file, or None when it does not.
    truncated: str | None = None
    #: The first IFD's ImageDescription (None when absent or larger than the limit).
    description: bytes | None = None
    #: ``(offset, bytes)`` of every tag value stored outside its IFD entry (what a remote
    #: file prefetches in one burst before tifffile reads them one by one).
    values: list[tuple[int, int]] = field(default_factory=list)


def preflight(path: str) -> int:
    """Refuse what is not a regular, non-empty TIFF file before opening it; return its size.

    Raises
    ------
    SlideError
        Missing, a folder, a FIFO or device, unreadable, empty or not a TIFF.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SlideError(path, "no such file") from None
    except OSError as exc:
        raise SlideError(path, f"cannot be read ({exc.strerror or exc})") from exc
    if stat.S_ISDIR(st.st_mode):
        raise SlideError(path, "is a directory, not a slide file")
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a named pipe (FIFO)"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise SlideError(path, f"is {kind}, not a slide file; refusing to open it")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except PermissionError as exc:
        raise SlideError(path, f"cannot be read (permission denied: {exc.strerror})") from exc
    except OSError as exc:
        raise SlideError(path, f"cannot be read ({exc.strerror or exc})") from exc
    if st.st_size == 0:
        raise SlideError(path, "is empty (0 bytes)")
    if head not in TIFF_MAGIC:
        raise SlideError(path, f"is not a TIFF file (starts with {head!r}, expected a TIFF header)")
    return int(st.st_size)


def preflight_file(name: str, fh: Any, size: int) -> int:
    """:func:`preflight` for an open file object of `size` bytes (a remote file)."""
    if size == 0:
        raise SlideError(name, "is empty (0 bytes)")
    fh.seek(0)
    head = bytes(fh.read(4))
    if head not in TIFF_MAGIC:
        raise SlideError(name, f"is not a TIFF file (starts with {head!r}, expected a TIFF header)")
    return size


def walk_file(name: str, fh: Any, size: int) -> Layout:
    """:func:`walk` over an open file object (a remote file); `name` is used in messages."""
    return _Walker(name, fh, size).run()


def walk(path: str, size: int) -> Layout:
    """Follow every IFD chain (and SubIFDs) of the file with bounded work.

    Raises
    ------
    SlideError
        On a loop, more than :data:`MAX_IFDS` directories, more than :data:`MAX_TAGS` tags
        in one directory, or an ImageDescription over :data:`MAX_DESCRIPTION` bytes. A
        chain or tag value that leaves the file is reported in :attr:`Layout.truncated`.
    """
    with open(path, "rb") as fh:
        return _Walker(path, fh, size).run()


def _entry_dtype(bo: str, word: str) -> np.dtype[Any]:
    """One IFD entry: tag code, type, value count, value or offset to it."""
    return np.dtype(
        [("code", bo + "u2"), ("type", bo + "u2"), ("count", bo + word), ("value", bo + word)]
    )


class _Walker:
    def __init__(self, path: str, fh: Any, size: int) -> None:
        self.path, self.fh, self.size = path, fh, size
        self._want = getattr(fh, "want", None)
        head = self._read(0, 16)
        self.bo = "<" if head[:2] == b"II" else ">"
        version = struct.unpack(self.bo + "H", head[2:4])[0]
        self.big = version == 43
        # tifffile reads a little-endian classic TIFF named .ndpi as Hamamatsu NDPI: a
        # 64-bit first-IFD offset (bytes 4-11), and in every IFD a 64-bit next-IFD offset
        # followed by the high 32 bits of each entry's value field
        self.ndpi = not self.big and self.bo == "<" and path.lower().endswith(".ndpi")
        if len(head) < (16 if self.big else 12 if self.ndpi else 8):
            raise SlideError(
                path,
                f"is truncated: the file ends inside its TIFF header ({_size(len(head))})",
            )
        if self.big:
            offsetsize, zero = struct.unpack(self.bo + "HH", head[4:8])
            if (offsetsize, zero) != (8, 0):
                raise SlideError(path, f"has a damaged BigTIFF header (offset size {offsetsize})")
            self.first = struct.unpack(self.bo + "Q", head[8:16])[0]
            self.entry = _entry_dtype(self.bo, "u8")
            self.countsize, self.nextsize, self.inline = 8, 8, 8
        else:
            first = head[4:12] if self.ndpi else head[4:8]
            self.first = struct.unpack(self.bo + ("Q" if self.ndpi else "I"), first)[0]
            self.entry = _entry_dtype(self.bo, "u4")
            self.countsize, self.nextsize, self.inline = 2, 8 if self.ndpi else 4, 4
        self.layout = Layout(size, self.bo, self.big, self.ndpi)
        self.seen: dict[int, int] = {}
        #: Offsets of the directories of the main chain (not SubIFDs).
        self.top: set[int] = set()

    def _read(self, offset: int, n: int) -> bytes:
        self.fh.seek(offset)
        return bytes(self.fh.read(n))

    def run(self) -> Layout:
        if self.first < 8 or self.first >= self.size:
            self.layout.truncated = (
                f"the first image directory should lie at byte {_n(self.first)}, "
                f"past the end of the file ({_size(self.size)})"
                if self.first >= self.size
                else f"the header points to an invalid first image directory ({self.first})"
            )
            if self.first < 8:
                raise SlideError(self.path, f"is damaged: {self.layout.truncated}")
            raise SlideError(self.path, f"is truncated: {self.layout.truncated}")
        self._chain(self.first, top=True)
        return self.layout

    def _chain(self, offset: int, *, top: bool, parent: int | None = None) -> None:
        number = 0
        while offset:
            if offset in self.seen:
                if not top and offset in self.top:
                    # a SubIFD that is a main-chain directory (its parent, or another):
                    # tifffile would show that image again as a pyramid level
                    raise SlideError(
                        self.path,
                        f"is damaged: a SubIFD of image directory {parent} points back to "
                        f"image directory {self.seen[offset]} (byte {_n(offset)}) of the main "
                        "chain, so its pyramid levels cannot be trusted",
                    )
                if not top:  # SubIFDs are both listed and chained: a revisit ends the walk
                    return
                raise SlideError(
                    self.path,
                    f"is damaged: its chain of image directories loops back to directory "
                    f"{self.seen[offset]} (byte {_n(offset)}); the file is not a valid TIFF",
                )
            if len(self.seen) >= MAX_IFDS:
                raise SlideError(
                    self.path,
                    f"has more than {_n(MAX_IFDS)} image directories; no slide has that "
                    "many, so the file is refused as damaged or hostile",
                )
            if offset < 8:
                raise SlideError(
                    self.path,
                    f"is damaged: image directory {len(self.seen)} points to byte {offset}, "
                    "inside the file header",
                )
            if offset >= self.size:
                self._truncate(
                    f"image directory {len(self.seen)} should lie at byte {_n(offset)}, "
                    "past {end}"
                )
                return
            self.seen[offset] = len(self.seen)
            if top:
                self.top.add(offset)
            nxt = self._ifd(offset, top=top and number == 0)
            if nxt is None:
                return
            if top:
                self.layout.ifds.append(offset)
            offset = nxt
            number += 1

    def _truncate(self, what: str) -> None:
        if self.layout.truncated is None:
            self.layout.truncated = what.replace(
                "{end}", f"the end of the file ({_size(self.size)})"
            )

    def _ifd(self, offset: int, *, top: bool) -> int | None:
        fmt = self.bo + ("Q" if self.big else "H")
        raw = self._read(offset, self.countsize)
        if len(raw) < self.countsize:
            self._truncate(
                f"image directory {len(self.seen) - 1} (byte {_n(offset)}) is cut off by {{end}}"
            )
            return None
        ntags = struct.unpack(fmt, raw)[0]
        if ntags > MAX_TAGS:
            raise SlideError(
                self.path,
                f"is damaged: image directory {len(self.seen) - 1} (byte {_n(offset)}) claims "
                f"{_n(ntags)} tags (limit {MAX_TAGS})",
            )
        nbytes = ntags * self.entry.itemsize
        highsize = 4 * ntags if self.ndpi else 0  # NDPI: the high 32 bits of every value
        body = self._read(offset + self.countsize, nbytes + self.nextsize + highsize)
        if len(body) < nbytes + self.nextsize + highsize:
            self._truncate(
                f"image directory {len(self.seen) - 1} (byte {_n(offset)}) is cut off by {{end}}"
            )
            if len(body) < nbytes:
                return None
        entries = np.frombuffer(body[:nbytes], self.entry)
        values = entries["value"].astype(np.uint64)
        if self.ndpi:
            high = body[nbytes + self.nextsize : nbytes + self.nextsize + highsize]
            high = high.ljust(highsize, b"\0")  # cut off (reported above): zeros
            values |= np.frombuffer(high, "<u4").astype(np.uint64) << np.uint64(32)
        columns = (entries["code"], entries["type"], entries["count"], values)
        for row, (code, typ, count, value) in enumerate(
            zip(*(c.tolist() for c in columns), strict=True)
        ):
            itemsize = _TYPE_SIZES.get(typ, 0)
            total = count * itemsize
            name = _TAG_NAMES.get(code, f"tag {code}")
            if code == 270 and total > MAX_DESCRIPTION:
                raise SlideError(
                    self.path,
                    f"has an ImageDescription of {_size(total)} (limit "
                    f"{_size(MAX_DESCRIPTION)}); refusing it as damaged or hostile",
                )
            if total > self.inline and value + total > self.size:
                self._truncate(
                    f"the {name} of image directory {len(self.seen) - 1} "
                    f"({_size(total)} at byte {_n(value)}) runs past {{end}}"
                )
                continue
            if total > self.inline:
                self.layout.values.append((int(value), int(total)))
                if self._want is not None:  # a remote file: fetched with its next round
                    self._want(int(value), int(total))
            if code == 270 and top and self.layout.description is None and total:
                if total > self.inline:
                    self.layout.description = self._read(value, total)
            if code == 330 and itemsize in (4, 8) and total:
                if total > self.inline:
                    if count > MAX_IFDS:
                        raise SlideError(
                            self.path, f"claims {_n(count)} SubIFDs (limit {MAX_IFDS})"
                        )
                    subs = self._read(value, total)
                elif self.ndpi and count == 1:  # one offset, with its high 32 bits
                    subs, itemsize = struct.pack("<Q", value), 8
                else:  # the offsets are stored inline in the entry
                    start = (row + 1) * self.entry.itemsize - self.inline
                    subs = body[start : start + total]
                dtype = np.dtype(self.bo + ("u8" if itemsize == 8 else "u4"))
                for sub in np.frombuffer(subs, dtype).tolist():
                    self._chain(int(sub), top=False, parent=self.seen.get(offset))
        if len(body) < nbytes + self.nextsize:
            return None
        tail = body[nbytes : nbytes + self.nextsize]
        return int(struct.unpack(self.bo + ("Q" if self.nextsize == 8 else "I"), tail)[0])


# --------------------------------------------------------------------------- pages


@dataclass
class PageReport:
    """Problems of one page: ``errors`` contradict the data, ``cut`` tiles lie past the end."""

    errors: list[str] = field(default_factory=list)
    cut: int = 0
    total: int = 0
    #: native chunks whose byte count is 0 (missing from the file)
    empty: int = 0


_VALID_BITS = {"u": (8, 16, 32), "i": (8, 16, 32), "f": (16, 32, 64)}


def check_page(page: Any, size: int) -> PageReport:
    """Compare one page's header with its data layout; no pixel is read.

    Parameters
    ----------
    page : tifffile.TiffPage
        A pyramid level page (the keyframe of a level).
    size : int
        File size in bytes.

    Returns
    -------
    PageReport
        ``errors`` are sentences naming what contradicts; ``cut`` counts native chunks
        whose bytes lie past the end of the file (a truncated copy).
    """
    rep = PageReport()
    frame = page
    page = page.keyframe  # a TiffFrame shares its keyframe's header; only offsets differ
    h, w = int(page.imagelength), int(page.imagewidth)
    if h <= 0 or w <= 0:
        rep.errors.append(f"image size {w} x {h} px has a zero dimension")
        return rep
    if h > MAX_SIDE or w > MAX_SIDE:
        rep.errors.append(
            f"image size {_n(w)} x {_n(h)} px is absurd (limit {_n(MAX_SIDE)} px per side)"
        )
        return rep
    samples = int(page.samplesperpixel)
    if not 1 <= samples <= MAX_SAMPLES:
        rep.errors.append(f"{samples} samples per pixel is absurd (limit {MAX_SAMPLES})")
        return rep
    photometric = int(getattr(page.photometric, "value", page.photometric))
    if photometric in (2, 6) and samples not in (3, 4):  # RGB, YCbCr
        rep.errors.append(f"an RGB image cannot have {samples} samples per pixel")
        return rep
    bits = page.bitspersample
    kind = np.dtype(page.dtype).kind if page.dtype is not None else "?"
    if kind not in _VALID_BITS or bits not in _VALID_BITS[kind]:
        rep.errors.append(
            f"{bits} bits per sample ({'float' if kind == 'f' else 'integer'}) is not an "
            "image a slide holds (8, 16 or 32-bit integers, 16/32/64-bit floats)"
        )
        return rep
    tiled = bool(page.is_tiled)
    tags = page.tags
    key = "TileOffsets" if tiled and "TileOffsets" in tags else "StripOffsets"
    counts_key = "TileByteCounts" if key == "TileOffsets" else "StripByteCounts"
    if key not in tags or counts_key not in tags:
        rep.errors.append(f"the {key} or {counts_key} tag is missing")
        return rep
    raw_offsets = tags[key].value
    raw_counts = tags[counts_key].value
    nraw = len(raw_offsets) if isinstance(raw_offsets, tuple | list | np.ndarray) else 1
    ncounts = len(raw_counts) if isinstance(raw_counts, tuple | list | np.ndarray) else 1
    if frame is not page:
        nraw, ncounts = len(frame.dataoffsets), len(frame.databytecounts)
    planes = samples if int(getattr(page.planarconfig, "value", page.planarconfig)) == 2 else 1
    itemsize = np.dtype(page.dtype).itemsize
    mcu = page.is_ndpi and 65426 in tags
    if key == "TileOffsets" and not mcu:
        th, tw = int(tags["TileLength"].value), int(tags["TileWidth"].value)
        if th <= 0 or tw <= 0 or th % 16 or tw % 16:
            rep.errors.append(f"tile size {tw} x {th} px is not a positive multiple of 16")
            return rep
        expected = -(-h // th) * -(-w // tw) * planes
        chunk = th * tw * itemsize * (samples // planes)
        what = f"{tw} x {th} px tiles"
    else:
        rps = int(tags["RowsPerStrip"].value) if "RowsPerStrip" in tags else h
        rps = min(max(rps, 1), h)
        expected = -(-h // rps) * planes
        chunk = rps * w * itemsize * (samples // planes)
        what = f"strips of {rps} rows"
    if mcu:
        expected, chunk = 1, 0  # checked as restart bands below
    if nraw != expected or ncounts != nraw:
        rep.errors.append(
            f"its {_n(w)} x {_n(h)} px image in {what} needs {_n(expected)} data segments, "
            f"but the file lists {_n(nraw)} offsets and {_n(ncounts)} byte counts "
            "(the tile size or dimensions disagree with the data layout)"
        )
        return rep
    if chunk > MAX_CHUNK_BYTES:
        rep.errors.append(
            f"one {what[:-1] if what.endswith('s') else what} decodes to {_size(chunk)} "
            f"(limit {_size(MAX_CHUNK_BYTES)})"
        )
        return rep
    if mcu:
        band = int(page.tilelength) * int(page.tilewidth) * itemsize * samples
        if band > MAX_CHUNK_BYTES:
            rep.errors.append(f"one restart band decodes to {_size(band)}")
            return rep
        try:
            offsets, counts = ndpi_bands(page)
        except _Damaged as exc:
            rep.errors.append(str(exc))
            return rep
    if frame is not page or not mcu:  # tiles, strips, and a TiffFrame's own offsets
        offsets = np.asarray(frame.dataoffsets, np.int64)
        counts = np.asarray(frame.databytecounts, np.int64)
    rep.total = int(offsets.size)
    present = counts > 0
    if np.any(counts < 0) or np.any(offsets[present] < 8):
        rep.errors.append("some tile offsets or byte counts are negative or point into the header")
        return rep
    ends = offsets + counts
    rep.cut = int(np.count_nonzero(present & (ends > size)))
    rep.empty = int(offsets.size - np.count_nonzero(present))
    if mcu and frame is page:  # restart bands follow each other (checked): none overlaps
        return rep
    # partial overlaps (identical duplicates are a legitimate way to share a blank tile)
    order = np.argsort(offsets[present], kind="stable")
    so, se = offsets[present][order], ends[present][order]
    if so.size > 1:
        same = (so[1:] == so[:-1]) & (se[1:] == se[:-1])
        overlap = (so[1:] < se[:-1]) & ~same
        if np.any(overlap):
            k = int(np.count_nonzero(overlap))
            rep.errors.append(
                f"{_n(k)} data segment{' overlaps' if k == 1 else 's overlap'} the next one "
                "(damaged tile offsets or byte counts)"
            )
    return rep


class _Damaged(ValueError):
    """A contradiction in a page's layout (the message is the sentence to show)."""


#: Restart bands per NDPI level whose start is checked against the restart marker before
#: it when the slide is opened, besides those where the offsets cross a 4 GiB boundary.
MCU_SAMPLES = 16
#: Bands where the offsets cross a 4 GiB boundary that are checked (a 1 TiB strip has 256).
MAX_MCU_CROSSINGS = 1024
#: What McuStarts wrap at when a file has no McuStartsHighBytes (a test sets it smaller).
MCU_WRAP = 2**32

# Checked bands per page (pages are checked when opened and again per pyramid level).
_BANDS: weakref.WeakKeyDictionary[Any, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def mcu_starts(
    low: np.ndarray, high: np.ndarray | None, strip_bytes: int
) -> tuple[np.ndarray, bool]:
    """Return the restart-band starts (from the strip's first byte) and whether they wrapped.

    Parameters
    ----------
    low : (N,) ndarray of int64
        McuStarts (tag 65426): the low 32 bits of each start.
    high : (N,) ndarray of int64 or None
        McuStartsHighBytes (tag 65432): the high 32 bits, if the file has the tag.
    strip_bytes : int
        The strip's byte count.

    Returns
    -------
    starts : (N,) ndarray of int64
        ``low + high * 2**32``; where the strip is longer than :data:`MCU_WRAP` bytes, the
        high bytes are missing or all 0 and `low` decreases somewhere, `low` unwrapped
        (one more :data:`MCU_WRAP` at each decrease: no band is that long).
    wrapped : bool
        Whether `low` was unwrapped (the caller verifies the result in the file).

    Examples
    --------
    >>> mcu_starts(np.array([10, 2**32 - 5, 7]), None, 2**32 + 100)
    (array([        10, 4294967291, 4294967303]), True)
    """
    starts = low if high is None else low + (high << 32)
    if strip_bytes <= MCU_WRAP or (high is not None and high.any()):
        return starts, False
    down = np.diff(low) < 0
    if not down.any():
        return starts, False
    return low + np.concatenate([[0], np.cumsum(down)]) * MCU_WRAP, True


def ndpi_bands(page: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return the file offsets and byte counts of an NDPI page's restart bands, checked.

    McuStarts (tag 65426) holds where each band's entropy-coded data starts in the page's
    one JPEG strip, its low 32 bits; McuStartsHighBytes (65432) the high 32 bits, where
    the strip is longer than 4 GiB. Some scanners' files have no 65432 (or zeros in it)
    and McuStarts that wrap past 2**32 (Bio-Formats issues 4082, 4083); tifffile then
    hands out wrong offsets and negative byte counts. No band is 4 GiB long (a band is
    limited to :data:`MAX_CHUNK_BYTES`), so every decrease is one wrap: the offsets are
    repaired, and, like every band layout, accepted only if the band after each 4 GiB
    boundary and :data:`MCU_SAMPLES` others start right after the restart marker the JPEG
    stream puts before them (RST0 to RST7 in turn), the check OpenSlide makes. The page's
    ``dataoffsets`` and ``databytecounts`` are replaced by the repaired ones, so every
    reader (direct decoder, zarr store) reads the right bytes.

    Parameters
    ----------
    page : tifffile.TiffPage
        A page of an NDPI file with McuStarts.

    Returns
    -------
    offsets, counts : (N,) ndarray of int64
        Where each band's bytes lie in the file, in band order (row by row).

    Raises
    ------
    ValueError
        A sentence saying what is damaged (the band offsets contradict the strip, the
        image size or the markers in the file).
    """
    with contextlib.suppress(TypeError):
        done = _BANDS.get(page)
        if done is not None:
            return done
    tags = page.tags
    strip_off, strip_cnt = (
        int(np.ravel(tags[code].value)[0]) for code in ("StripOffsets", "StripByteCounts")
    )
    low = np.asarray(tags[65426].value).astype(np.int64).ravel()
    not_bands = "its NDPI restart-band offsets (McuStarts) do not describe the JPEG strip"
    if low.size == 0:
        raise _Damaged(not_bands)
    high = None
    if 65432 in tags:
        high = np.asarray(tags[65432].value).astype(np.int64).ravel()
        if high.size != low.size:
            raise _Damaged(
                f"its McuStartsHighBytes lists {_n(high.size)} values for {_n(low.size)} "
                "restart bands"
            )
    starts, wrapped = mcu_starts(low, high, strip_cnt)
    # tifffile >= 2026.11 leaves the strip whole when it finds McuStarts invalid (as wrapped
    # ones are): the bands are then set up here, from the repaired offsets, as tifffile
    # sets them up for valid ones (the JPEG header before the first band gives their size)
    rebuilt = page.jpegheader is None
    if rebuilt:
        if not 0 < int(starts[0]) <= MAX_CHUNK_BYTES or int(starts[0]) >= strip_cnt:
            raise _Damaged(not_bands)
        ndpi_jpeg_tile = getattr(tifffile_module(), "ndpi_jpeg_tile", None)
        header = _read_ranges(page, [strip_off], int(starts[0]))[0]
        try:
            if ndpi_jpeg_tile is None:
                raise ValueError("this tifffile has no ndpi_jpeg_tile")
            page.tilelength, page.tilewidth, page.jpegheader = ndpi_jpeg_tile(header)
        except (ValueError, IndexError, struct.error) as exc:
            raise _Damaged(f"{not_bands} ({exc})") from None
    h, w = int(page.imagelength), int(page.imagewidth)
    across = -(-w // int(page.tilewidth))
    nbands = -(-h // int(page.tilelength)) * across
    if nbands != low.size:
        raise _Damaged(
            f"its image needs {_n(nbands)} NDPI restart bands, but McuStarts lists {_n(low.size)}"
        )
    lengths = np.diff(starts, append=strip_cnt)
    if starts[0] <= 0 or np.any(lengths <= 0) or int(lengths.max()) > MAX_CHUNK_BYTES:
        raise _Damaged(
            "its NDPI restart-band offsets (McuStarts) point outside the image strip "
            f"({_n(strip_cnt)} bytes at byte {_n(strip_off)}), are out of order or make "
            f"a band longer than {_size(MAX_CHUNK_BYTES)}"
        )
    wraps = starts // MCU_WRAP
    crossings = np.flatnonzero(wraps[1:] != wraps[:-1])[:MAX_MCU_CROSSINGS] + 1
    spread = np.linspace(1, nbands - 1, min(MCU_SAMPLES, nbands - 1)).astype(np.int64)
    check = np.unique(np.concatenate([crossings, spread]))
    offsets = strip_off + starts
    # bands past the end of a truncated copy are counted as cut by the caller
    check = check[offsets[check] <= int(page.parent.filehandle.size)]
    found = _read_ranges(page, (offsets[check] - 2).tolist(), 2)
    for band, got in zip(check.tolist(), found, strict=True):
        want = bytes((0xFF, 0xD0 + (band - 1) % 8))
        if got != want:
            where = (
                f"band {_n(band)} (row {_n(band // across)}, column {_n(band % across)}) "
                f"should follow restart marker {want.hex().upper()} at byte "
                f"{_n(int(offsets[band]) - 2)}, but {got.hex().upper() or 'nothing'} is there"
            )
            if wrapped:
                raise _Damaged(
                    "its NDPI restart-band offsets (McuStarts) wrap past 4 GiB with no "
                    "McuStartsHighBytes, and repairing them does not land on the restart "
                    f"markers: {where}"
                )
            raise _Damaged(f"its NDPI restart-band offsets (McuStarts) are damaged: {where}")
    if wrapped or rebuilt:
        page.dataoffsets = tuple(offsets.tolist())
        page.databytecounts = tuple(lengths.tolist())
    with contextlib.suppress(TypeError):  # an object without weak references: not kept
        _BANDS[page] = offsets, lengths
    return offsets, lengths


def tifffile_module() -> Any:
    """Return tifffile's implementation module (its NDPI helpers are not all exported)."""
    import tifffile

    return getattr(tifffile, "tifffile", tifffile)


def _read_ranges(page: Any, offsets: list[int], n: int) -> list[bytes]:
    """Read `n` bytes at each offset of the page's file (a remote file: in one round)."""
    fh = page.parent.filehandle
    cat_ranges = getattr(getattr(fh, "_fh", None), "cat_ranges", None)
    if callable(cat_ranges):  # a RemoteFile: all ranges fetched at once
        return [bytes(b) for b in cat_ranges(offsets, [n] * len(offsets))]
    out = []
    with fh.lock:
        for offset in offsets:
            fh.seek(offset)
            out.append(bytes(fh.read(n)))
    return out


def cap_text(value: Any, limit: int = MAX_PROPERTY_CHARS) -> Any:
    """Return `value` with strings cut to `limit` characters (and a note of what was cut)."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"... [{_n(len(value) - limit)} characters not copied]"
    if isinstance(value, bytes) and len(value) > limit:
        return value[:limit]
    return value
