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


def _entry(code: int, dtype: int, values) -> tuple[int, int, int, bytes]:
    if dtype == ASCII:
        data = values.encode("ascii") + b"\0"
        return code, dtype, len(data), data
    values = list(np.atleast_1d(values))
    if dtype == RATIONAL:
        return code, dtype, len(values) // 2, struct.pack(f"<{len(values)}I", *map(int, values))
    return code, dtype, len(values), struct.pack(f"<{len(values)}{_FMT[dtype]}", *values)


def _ifd(entries: list, at: int, next_ifd: int) -> bytes:
    entries = sorted(entries)
    n = len(entries)
    values = bytearray()
    table = bytearray()
    value_pos = at + 2 + 12 * n + 8 + 4 * n
    for code, dtype, count, data in entries:
        if dtype != ASCII and len(data) <= 4:
            field = data.ljust(4, b"\0")
        else:
            if (value_pos + len(values)) % 2:
                values += b"\0"
            field = struct.pack("<I", value_pos + len(values))
            values += data
        table += struct.pack("<HHI", code, dtype, count) + field
    return (
        struct.pack("<H", n)
        + bytes(table)
        + struct.pack("<Q", next_ifd)
        + b"\0" * (4 * n)  # high bits of every value field: files under 4 GiB
        + bytes(values)
    )


def write_ndpi(
    path: str | Path,
    levels: list[np.ndarray],
    *,
    band_width: int,
    mpp: float = 0.454,
    magnification: float = 20.0,
) -> Path:
    """Write ``levels`` (RGB uint8, level 0 first) as an NDPI-like file; return its path.

    Every level's width must be a multiple of ``band_width`` (or smaller than it) and of 8,
    and its height a multiple of 8 (one restart band is 8 rows high at 4:4:4).
    """
    path = Path(path)
    pages = []
    for k, rgb in enumerate(levels):
        h, w = rgb.shape[:2]
        bw = min(band_width, w)
        if w % bw or bw % 8 or h % 8:
            raise ValueError(f"level {k}: {w} x {h} does not split into 8 x {bw} bands")
        jpeg = _jpeg(np.ascontiguousarray(rgb), bw // 8)
        starts = mcu_starts(jpeg)
        if len(starts) != (h // 8) * (w // bw):
            raise AssertionError(f"level {k}: {len(starts)} restart intervals")
        pages.append((jpeg, w, h, magnification / 2**k, 2**k, starts))
    with open(path, "wb") as fh:
        fh.write(b"II" + struct.pack("<H", 42) + struct.pack("<Q", 0) + b"\0" * 4)
        offsets = []
        for jpeg, *_ in pages:
            offsets.append(fh.tell())
            fh.write(jpeg + b"\0" * (len(jpeg) % 2))
        entries = []
        for (jpeg, w, h, lens, ds, starts), off in zip(pages, offsets, strict=True):
            px_per_cm = int(round(1e4 / (mpp * ds)))
            entries.append(
                [
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
                    _entry(65426, LONG, starts.astype(np.uint32)),
                ]
            )
        pos = fh.tell()
        at = []
        for e in entries:
            at.append(pos)
            size = len(_ifd(e, 0, 0))
            pos += size + size % 2
        for k, e in enumerate(entries):
            block = _ifd(e, at[k], at[k + 1] if k + 1 < len(at) else 0)
            fh.write(block + b"\0" * (len(block) % 2))
        fh.seek(4)
        fh.write(struct.pack("<Q", at[0]))
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
