"""Write small Hamamatsu-NDPI-like files for the tests (after ../shared/tools/make_ndpi.py).

The layout is what tifffile and OpenSlide parse as NDPI: a classic little-endian header
with a 64-bit offset to the first IFD; each IFD with a 64-bit next-IFD offset followed by
the high 32 bits of every entry's value field; each pyramid level one JPEG strip with a
restart marker every ``band_width`` pixels, whose entropy-coded intervals the McuStarts tag
(65426) locates; the Hamamatsu tags that make tifffile report ``is_ndpi``.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image

SHORT, LONG, RATIONAL, ASCII, SLONG, FLOAT = 3, 4, 5, 2, 9, 11
_IFD_ROOM = 64 * 1024  # bytes kept for the IFDs before the image data (``ifds_first``)
_FMT = {SHORT: "H", LONG: "I", SLONG: "i", FLOAT: "f"}


def _jpeg(rgb: np.ndarray, restart_blocks: int, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(
        buf, "JPEG", quality=quality, subsampling=0, restart_marker_blocks=restart_blocks
    )
    return buf.getvalue()


def mcu_starts(jpeg: bytes) -> np.ndarray:
    """Offsets (from the JPEG's first byte) of each restart interval's entropy-coded data."""
    i = 2
    while True:
        marker = jpeg[i + 1]
        seglen = struct.unpack(">H", jpeg[i + 2 : i + 4])[0]
        if marker == 0xDA:
            sos_end = i + 2 + seglen
            break
        i += 2 + seglen
    body = np.frombuffer(jpeg, np.uint8)[sos_end:]
    rst = np.nonzero((body[:-1] == 0xFF) & (body[1:] >= 0xD0) & (body[1:] <= 0xD7))[0]
    return np.concatenate([[sos_end], sos_end + rst + 2]).astype(np.int64)


def _entry(code: int, dtype: int, values) -> tuple[int, int, int, bytes, int]:
    """One IFD entry: code, type, count, value bytes and the high 32 bits of an inline LONG."""
    if dtype == ASCII:
        data = values.encode("ascii") + b"\0"
        return code, dtype, len(data), data, 0
    values = list(np.atleast_1d(values))
    if dtype == RATIONAL:
        return code, dtype, len(values) // 2, struct.pack(f"<{len(values)}I", *map(int, values)), 0
    if dtype == LONG and len(values) == 1 and int(values[0]) >= 2**32:  # NDPI: 64-bit inline
        return code, dtype, 1, struct.pack("<I", int(values[0]) & 0xFFFFFFFF), int(values[0]) >> 32
    return code, dtype, len(values), struct.pack(f"<{len(values)}{_FMT[dtype]}", *values), 0


def _ifd(entries: list, at: int, next_ifd: int) -> bytes:
    """An NDPI IFD at byte `at`: entries, 64-bit next offset, high bits, then the values."""
    entries = sorted(entries)
    n = len(entries)
    values = bytearray()
    table = bytearray()
    highs = []
    value_pos = at + 2 + 12 * n + 8 + 4 * n
    for code, dtype, count, data, high in entries:
        if dtype != ASCII and len(data) <= 4:
            field = data.ljust(4, b"\0")
        else:
            if (value_pos + len(values)) % 2:
                values += b"\0"
            pos = value_pos + len(values)
            field, high = struct.pack("<I", pos & 0xFFFFFFFF), pos >> 32
            values += data
        table += struct.pack("<HHI", code, dtype, count) + field
        highs.append(high)
    return (
        struct.pack("<H", n)
        + bytes(table)
        + struct.pack("<Q", next_ifd)
        + struct.pack(f"<{n}I", *highs)  # high 32 bits of every value field
        + bytes(values)
    )


def _segments(jpeg: bytes) -> tuple[bytes, bytes]:
    """(header through SOS, entropy-coded data without EOI) of a baseline JPEG."""
    i = 2
    while jpeg[i + 1] != 0xDA:
        i += 2 + struct.unpack(">H", jpeg[i + 2 : i + 4])[0]
    sos_end = i + 2 + struct.unpack(">H", jpeg[i + 2 : i + 4])[0]
    return jpeg[:sos_end], jpeg[sos_end:-2]


def spliced_jpeg(rgb: np.ndarray, band_width: int, quality: int = 90) -> tuple[bytes, np.ndarray]:
    """One JPEG of `rgb` made of separately encoded 8-row bands, as NDP.scan writes them.

    Each 8 x `band_width` band is encoded alone (same tables, a restart interval of one
    band) and the entropy-coded data are joined with RST0..RST7 in turn, so the image may
    be wider or taller than a JPEG frame can say: a dimension past 65535 is written 0 in
    the SOF, as NDP.scan does. Returns the JPEG and the pixels it decodes to (each band's
    own decode, with libjpeg-turbo as tifffile decodes it).
    """
    import imagecodecs

    h, w = rgb.shape[:2]
    header = None
    datas = []
    decoded = np.empty_like(rgb)
    for y in range(0, h, 8):
        for x in range(0, w, band_width):
            band = _jpeg(np.ascontiguousarray(rgb[y : y + 8, x : x + band_width]), band_width // 8)
            head, data = _segments(band)
            if header is None:
                header = head
            elif head != header:
                raise AssertionError("bands encoded with different headers")
            datas.append(data)
            decoded[y : y + 8, x : x + band_width] = imagecodecs.jpeg8_decode(band)
    assert header is not None
    sof = header.index(b"\xff\xc0")
    head = bytearray(header)
    head[sof + 5 : sof + 9] = struct.pack(">HH", h if h <= 0xFFFF else 0, w if w <= 0xFFFF else 0)
    body = b"".join(d + bytes((0xFF, 0xD0 + i % 8)) for i, d in enumerate(datas[:-1]))
    return bytes(head) + body + datas[-1] + b"\xff\xd9", decoded


def write_ndpi(
    path: str | Path,
    levels: list[np.ndarray],
    *,
    band_width: int,
    mpp: float = 0.454,
    magnification: float = 20.0,
    hole: int = 0,
    spliced: bool = False,
    mcu_high: bool = False,
    wrap: int | None = None,
    edit_mcu=None,
    ifds_first: bool = False,
) -> Path:
    """Write ``levels`` (RGB uint8, level 0 first) as an NDPI-like file; return its path.

    Every level's width must be a multiple of ``band_width`` (or smaller than it) and of 8,
    and its height a multiple of 8 (one restart band is 8 rows high at 4:4:4).

    `hole` leaves that many bytes unwritten (a sparse hole) after the header, so that
    with ``hole >= 2**32`` every strip, offset table and IFD lies past 4 GiB, reached
    through the 64-bit header offset and the high bytes of the IFD entries (where the
    offset's low 32 bits point, the hole holds ``FF FF``, as image data would). `spliced`
    encodes each band alone (:func:`spliced_jpeg`; widths past 65535 px). `mcu_high`
    writes McuStartsHighBytes (65432). `wrap` stores McuStarts modulo `wrap` with no
    high bytes (wrapped McuStarts; the tests shrink the 2**32 the reader unwraps at).
    ``edit_mcu(level, low, high) -> (low, high)`` changes the stored arrays (damage).
    `ifds_first` puts the IFDs before the image data (a cut copy then keeps them).
    """
    path = Path(path)
    pages = []
    for k, rgb in enumerate(levels):
        h, w = rgb.shape[:2]
        bw = min(band_width, w)
        if w % bw or bw % 8 or h % 8:
            raise ValueError(f"level {k}: {w} x {h} does not split into 8 x {bw} bands")
        if spliced:
            jpeg = spliced_jpeg(np.ascontiguousarray(rgb), bw)[0]
        else:
            jpeg = _jpeg(np.ascontiguousarray(rgb), bw // 8)
        starts = mcu_starts(jpeg)
        if len(starts) != (h // 8) * (w // bw):
            raise AssertionError(f"level {k}: {len(starts)} restart intervals")
        pages.append((jpeg, w, h, magnification / 2**k, 2**k, starts))
    with open(path, "wb") as fh:
        fh.write(b"II" + struct.pack("<H", 42) + struct.pack("<Q", 0) + b"\0" * 4)
        fh.seek(16 + hole + (_IFD_ROOM if ifds_first else 0))
        offsets = []
        for jpeg, *_ in pages:
            offsets.append(fh.tell())
            fh.write(jpeg + b"\0" * (len(jpeg) % 2))
        entries = []
        for k, ((jpeg, w, h, lens, ds, starts), off) in enumerate(zip(pages, offsets, strict=True)):
            px_per_cm = int(round(1e4 / (mpp * ds)))
            low, high = starts % 2**32, starts >> 32
            if wrap is not None:
                low, high = starts % wrap, None
            elif not mcu_high:
                high = None
            if edit_mcu is not None:
                low, high = edit_mcu(k, low, high)
            extra = [] if high is None else [_entry(65432, LONG, np.asarray(high, np.uint32))]
            entries.append(
                extra
                + [
                    _entry(256, LONG, w),
                    _entry(257, LONG, h),
                    _entry(258, SHORT, [8, 8, 8]),
                    _entry(259, SHORT, 7),
                    _entry(262, SHORT, 6),
                    _entry(271, ASCII, "Hamamatsu"),
                    _entry(272, ASCII, "NanoZoomer"),
                    _entry(273, LONG, off),
                    _entry(277, SHORT, 3),
                    _entry(278, LONG, h),
                    _entry(279, LONG, len(jpeg)),
                    _entry(282, RATIONAL, [px_per_cm, 1]),
                    _entry(283, RATIONAL, [px_per_cm, 1]),
                    _entry(296, SHORT, 3),
                    _entry(530, SHORT, [1, 1]),
                    _entry(65420, SHORT, 1),
                    _entry(65421, FLOAT, float(lens)),
                    _entry(65422, SLONG, 0),
                    _entry(65423, SLONG, 0),
                    _entry(65424, SLONG, 0),
                    _entry(65426, LONG, np.asarray(low, np.uint32)),
                ]
            )
        pos = 16 + hole if ifds_first else fh.tell()
        at = []
        for e in entries:
            at.append(pos)
            size = len(_ifd(e, 0, 0))
            pos += size + size % 2
        if ifds_first and pos > 16 + hole + _IFD_ROOM:
            raise ValueError("the IFDs do not fit before the image data")
        fh.seek(at[0])
        for k, e in enumerate(entries):
            block = _ifd(e, at[k], at[k + 1] if k + 1 < len(at) else 0)
            fh.write(block + b"\0" * (len(block) % 2))
        fh.seek(4)
        fh.write(struct.pack("<Q", at[0]))
        alias = at[0] % 2**32
        if at[0] >= 2**32 and 16 <= alias < 16 + hole:
            # where a reader taking the offset as 32 bits lands, something that is no
            # IFD (in a real file: image data), so that it fails as it does on those
            fh.seek(alias)
            fh.write(b"\xff\xff")
    return path


def textured_rgb(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Smooth H&E-coloured texture with sharp dots, so JPEG keeps detail worth comparing."""
    rng = np.random.default_rng(seed)
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 0.5 + 0.25 * np.sin(yy / 37.0) * np.cos(xx / 53.0)
    rgb = np.stack([230 - 60 * base, 160 - 90 * base, 200 - 50 * base], axis=-1)
    dots = rng.integers(0, h * w, size=max(1, h * w // 400))
    rgb.reshape(-1, 3)[dots] = (80, 40, 120)
    return np.clip(rgb, 0, 255).astype(np.uint8)
