"""A corpus of damaged and hostile files, generated here, through every entry point.

Each file is made from an intact one (the shared slides, or synthetic slides written by
``write_sample_slide`` and tifffile) by one damage a real archive holds or an attacker
would try. A child process (``_corpus_child.py``) runs them all, each entry point under a
5 s alarm and with its address space capped at the warm process plus 1 GiB; the test
asserts what every case gave: a SlideError naming the file, or pixels identical to the
intact file's where the damage does not touch what was read, and a measured peak memory
(resident set added while the entry point ran) under 1 GiB.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile

CHILD = Path(__file__).with_name("_corpus_child.py")
ENTRIES = ("open", "lenient", "reader", "tissue")
#: Peak memory an entry point may add on any file of the corpus (measured, and the child's
#: address space is capped at its warm size plus 1 GiB as well).
PEAK_LIMIT_MIB = 1024
SRC = Path(__file__).parents[2] / "src"
_FMT = {1: "B", 3: "H", 4: "I", 13: "I", 16: "Q", 18: "Q"}


@dataclass
class Case:
    name: str
    path: Path
    intact: Path
    #: "error": open_slide must raise a SlideError; "ok": it must open (possibly warning);
    #: "any": either, as long as what is read is right
    expect: str = "any"
    #: outcomes an entry point must give exactly ("error", "warned", "same"), by entry
    want: dict[str, str] | None = None
    #: the warning of the entries that must warn names the level and the tile
    names_tile: bool = False


#: A damaged tile inside the box every entry reads: an error through the API, blank
#: with a warning naming file, level and tile when asked for leniency and in the reader.
DAMAGED_TILE = {"open": "error", "lenient": "warned", "reader": "warned"}


# --------------------------------------------------------------------------- byte surgery


class Bytes:
    """A file's bytes plus tifffile's view of its tags, for precise damage."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = bytearray(path.read_bytes())
        with tifffile.TiffFile(path) as tif:
            self.bo = tif.byteorder
            self.big = tif.is_bigtiff
            self.ifds = [p.offset for p in tif.pages]
            self.tags = []
            for p in tif.pages:
                entries = {}
                for t in p.tags.values():
                    entries[t.name] = entries[t.code] = (
                        t.offset,
                        t.valueoffset,
                        int(t.dtype),
                        t.count,
                    )
                self.tags.append(entries)

    def value_at(self, page: int, tag: str | int, index: int = 0) -> int:
        _, voff, typ, _ = self.tags[page][tag]
        fmt = self.bo + _FMT[typ]
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.data, voff + index * size)[0]

    def set_value(self, page: int, tag: str | int, value: int, index: int = 0) -> Bytes:
        _, voff, typ, _ = self.tags[page][tag]
        fmt = self.bo + _FMT[typ]
        struct.pack_into(fmt, self.data, voff + index * struct.calcsize(fmt), value)
        return self

    def set_long(self, page: int, tag: str, value: int) -> Bytes:
        """Rewrite a scalar tag as a LONG (room for values above 65,535)."""
        off = self.tags[page][tag][0]
        struct.pack_into(self.bo + "H", self.data, off + 2, 4)
        if self.big:
            struct.pack_into(self.bo + "QQ", self.data, off + 4, 1, value)
        else:
            struct.pack_into(self.bo + "II", self.data, off + 4, 1, value)
        return self

    def next_offset_pos(self, page: int) -> int:
        count_fmt, entry, _ = ("Q", 20, 8) if self.big else ("H", 12, 4)
        ntags = struct.unpack_from(self.bo + count_fmt, self.data, self.ifds[page])[0]
        return self.ifds[page] + struct.calcsize(count_fmt) + ntags * entry

    def set_next(self, page: int, offset: int, *, ndpi: bool = False) -> Bytes:
        fmt = self.bo + ("Q" if self.big or ndpi else "I")
        struct.pack_into(fmt, self.data, self.next_offset_pos(page), offset)
        return self

    def write(self, path: Path, cut: int | None = None) -> Path:
        path.write_bytes(bytes(self.data if cut is None else self.data[:cut]))
        return path


def _tile_span(b: Bytes, page: int, k: int) -> tuple[int, int]:
    key = "TileOffsets" if "TileOffsets" in b.tags[page] else "StripOffsets"
    ckey = "TileByteCounts" if key == "TileOffsets" else "StripByteCounts"
    return b.value_at(page, key, k), b.value_at(page, ckey, k)


def _chain_file(path: Path, n: int, entries: int) -> Path:
    """A classic TIFF of `n` chained minimal IFDs (each `entries` tags of 1 x 1 px)."""
    ifd = 2 + 12 * entries + 4
    buf = bytearray(8 + n * ifd)
    buf[:8] = b"II*\x00" + struct.pack("<I", 8)
    rec = np.zeros(n, dtype=[("n", "<u2"), ("e", "u1", 12 * entries), ("next", "<u4")])
    rec["n"] = entries
    tags = [(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (273, 4, 1, 8), (279, 4, 1, 1)]
    ent = b"".join(struct.pack("<HHII", *t) for t in tags[:entries])
    rec["e"] = np.frombuffer(ent, np.uint8)
    rec["next"] = 8 + ifd * np.arange(1, n + 1)
    rec["next"][-1] = 0
    buf[8:] = rec.tobytes()
    path.write_bytes(bytes(buf))
    return path


# --------------------------------------------------------------------------- bases


def _ome_pyramid(path: Path, base: np.ndarray, *, bigtiff: bool = False, description=None):
    levels = [base, base[::2, ::2], base[::4, ::4]]
    opts = {"photometric": "rgb", "tile": (256, 256), "compression": "zlib"}
    res = {"resolution": (1e4 / 0.5, 1e4 / 0.5), "resolutionunit": "CENTIMETER"}
    with tifffile.TiffWriter(path, bigtiff=bigtiff, ome=description is None) as tif:
        kw = {"metadata": {"PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5}}
        if description is not None:
            kw = {"description": description, "metadata": None}
        tif.write(levels[0], subifds=2, **opts, **res, **kw)
        for lv in levels[1:]:
            tif.write(lv, subfiletype=1, **opts, **res)
    return path


_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "LOL">'
    + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
        for i in range(1, 10)
    )
    + "]>\n"
)
_QUADRATIC = '<?xml version="1.0"?>\n<!DOCTYPE q [<!ENTITY a "' + "LOL" * 20000 + '">]>\n'
_EXTERNAL = '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY ext SYSTEM "file:///etc/passwd">]>\n'
_OME_BODY = (
    '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06">'
    '<Image ID="Image:0" Name="{ref}"><Pixels ID="Pixels:0" DimensionOrder="XYCZT" '
    'Type="uint8" SizeX="1024" SizeY="768" SizeC="3" SizeZ="1" SizeT="1" '
    'PhysicalSizeX="0.5" PhysicalSizeY="0.5"><Channel ID="Channel:0" SamplesPerPixel="3" '
    'Name="{ref}"/><TiffData/></Pixels></Image></OME>'
)


def _qptiff(path: Path, channels: np.ndarray, prolog: str, ref: str) -> Path:
    with tifffile.TiffWriter(path) as tif:
        for c, plane in enumerate(channels):
            desc = (
                prolog + "<PerkinElmer-QPI-ImageDescription><DescriptionVersion>2"
                f"</DescriptionVersion><ImageType>FullResolution</ImageType><Name>{ref}</Name>"
                f"<Objective>20x</Objective><ChannelNumber>{c}</ChannelNumber>"
                "</PerkinElmer-QPI-ImageDescription>"
            )
            tif.write(
                plane,
                tile=(256, 256),
                compression="zlib",
                description=desc,
                software="PerkinElmer-QPI",
                metadata=None,
                resolution=(1e4 / 0.5, 1e4 / 0.5),
                resolutionunit="CENTIMETER",
            )
    return path


# --------------------------------------------------------------------------- corpora


def _truncations(cases: list[Case], out: Path, src: Path, tag: str, page0_tiles: int) -> None:
    b = Bytes(src)
    size = len(b.data)
    mid_off, mid_cnt = _tile_span(b, 0, page0_tiles // 2)
    key = "TileOffsets" if "TileOffsets" in b.tags[0] else "StripOffsets"
    cuts = {
        "header": 6,
        "first-ifd": b.ifds[0] + 7,
        "tile-offsets-array": b.tags[0][key][1] + 6,
        "mid-level0-tile": mid_off + mid_cnt // 2,
        "half": size // 2,
        "last-ifd": b.ifds[-1] + 5,
        "last-bytes": size - 3,
    }
    for what, cut in cuts.items():
        cases.append(
            Case(
                f"{tag}-cut-{what}",
                b.write(out / f"{tag}-cut-{what}{src.suffix}", cut),
                src,
                "error",
            )
        )


def _damage_level0(cases: list[Case], out: Path, src: Path, tag: str, *, jpeg: bool) -> None:
    sfx = src.suffix
    size = src.stat().st_size

    def add(name: str, fn: Callable[[Bytes], Bytes], expect: str = "any") -> None:
        b = fn(Bytes(src))
        cases.append(Case(f"{tag}-{name}", b.write(out / f"{tag}-{name}{sfx}"), src, expect))

    add("offset-past-end", lambda b: b.set_value(0, "TileOffsets", size + 4096, 3), "error")
    add("offset-2^31", lambda b: b.set_value(0, "TileOffsets", 2**31 - 1, 5), "error")
    add("count-2^31", lambda b: b.set_value(0, "TileByteCounts", 2**31 - 1, 2), "error")
    add(
        "overlap",
        lambda b: b.set_value(0, "TileOffsets", b.value_at(0, "TileOffsets", 1) + 17, 2),
        "error",
    )
    add(
        "count-halved",
        lambda b: b.set_value(0, "TileByteCounts", b.value_at(0, "TileByteCounts", 4) // 2, 4),
    )
    add("width-0", lambda b: b.set_long(0, "ImageWidth", 0), "error")
    add("width-2^31", lambda b: b.set_long(0, "ImageWidth", 2**31 - 1), "error")
    add("length-2^31", lambda b: b.set_long(0, "ImageLength", 2**31 - 1), "error")
    add("tilewidth-512", lambda b: b.set_long(0, "TileWidth", 512), "error")
    add(
        "tilewidth-other",
        lambda b: b.set_long(0, "TileWidth", 256 if b.value_at(0, "TileWidth") == 240 else 240),
        "error",
    )
    add("tilelength-0", lambda b: b.set_long(0, "TileLength", 0), "error")
    add(
        "tile-65520",
        lambda b: b.set_long(0, "TileWidth", 65520).set_long(0, "TileLength", 65520),
        "error",
    )
    add(
        "bits-1",
        lambda b: (
            b.set_value(0, "BitsPerSample", 1, 0)
            .set_value(0, "BitsPerSample", 1, 1)
            .set_value(0, "BitsPerSample", 1, 2)
        ),
        "error",
    )
    add("samples-255", lambda b: b.set_value(0, "SamplesPerPixel", 255), "error")
    add("loop-to-self", lambda b: b.set_next(0, b.ifds[0]), "error")
    add("loop-to-first", lambda b: b.set_next(len(b.ifds) - 1, b.ifds[0]), "error")
    add("next-past-end", lambda b: b.set_next(0, size + 100), "error")
    add("compression-unknown", lambda b: b.set_value(0, "Compression", 34999))

    def corrupt(b: Bytes) -> Bytes:
        off, cnt = _tile_span(b, 0, 1)
        # keep the start and end markers, scramble the entropy-coded middle
        rng = np.random.default_rng(3)
        b.data[off + cnt // 3 : off + cnt - 4] = rng.integers(
            0, 256, cnt - 4 - cnt // 3, np.uint8
        ).tobytes()
        return b

    add("tile-corrupt", corrupt)

    def zero(b: Bytes) -> Bytes:
        off, cnt = _tile_span(b, 0, 0)
        b.data[off : off + cnt] = bytes(cnt)
        return b

    add("tile-zeroed", zero)


# --------------------------------------------------------------------------- damaged tiles


def _random_tile(b: Bytes, page: int, k: int, *, seed: int = 11) -> Bytes:
    off, cnt = _tile_span(b, page, k)
    b.data[off : off + cnt] = np.random.default_rng(seed).integers(0, 256, cnt, np.uint8).tobytes()
    return b


def _garbage_entropy(b: Bytes, page: int, k: int) -> Bytes:
    """Keep a JPEG tile's markers; replace its entropy-coded data by marker-free garbage
    (libjpeg decodes it into wrong pixels without an error)."""
    off, cnt = _tile_span(b, page, k)
    seg = bytes(b.data[off : off + cnt])
    sos = seg.rfind(b"\xff\xda")
    start = off + sos + 2 + struct.unpack(">H", seg[sos + 2 : sos + 4])[0]
    g = np.random.default_rng(5).integers(0, 255, off + cnt - 2 - start, np.uint8)
    g[g == 0xFF] = 0x7F
    b.data[start : off + cnt - 2] = g.tobytes()
    return b


def _frame_size(b: Bytes, page: int, k: int) -> Bytes:
    """An impossible JPEG frame size (65,000 x 65,000 px) in one tile's SOF."""
    off, cnt = _tile_span(b, page, k)
    seg = bytes(b.data[off : off + cnt])
    sof = seg.find(b"\xff\xc0")
    assert sof >= 0, "the tile has no baseline SOF marker"
    struct.pack_into(">HH", b.data, off + sof + 5, 65000, 65000)
    return b


def _zero_tile(b: Bytes, page: int, k: int) -> Bytes:
    off, cnt = _tile_span(b, page, k)
    b.data[off : off + cnt] = bytes(cnt)
    return b


def _count(b: Bytes, page: int, k: int, value: int) -> Bytes:
    key = "TileByteCounts" if "TileByteCounts" in b.tags[page] else "StripByteCounts"
    return b.set_value(page, key, value, k)


def _damaged_tiles(cases: list[Case], out: Path, src: Path, tag: str, *, jpeg: bool) -> None:
    """Tiles 1 and (when the grid allows) the first of the second row, damaged each way."""
    sfx = "".join(src.suffixes[-2:]) if src.name.endswith(".ome.tif") else src.suffix

    def add(name: str, fn: Callable[[Bytes], Bytes], want=None, names_tile=True) -> None:
        b = fn(Bytes(src))
        path = b.write(out / f"{tag}-{name}{sfx}")
        cases.append(Case(f"{tag}-{name}", path, src, "any", want or DAMAGED_TILE, names_tile))

    cut = lambda b, k: _count(b, 0, k, b.value_at(0, "TileByteCounts", k) // 2)  # noqa: E731
    add("dmg-random", lambda b: _random_tile(_random_tile(b, 0, 1), 0, 2, seed=12))
    add("dmg-zeroed", lambda b: _zero_tile(b, 0, 1))
    add("dmg-truncated", lambda b: cut(b, 1))
    add("dmg-count0", lambda b: _count(b, 0, 1, 0))
    if jpeg:
        add("dmg-entropy", lambda b: _garbage_entropy(b, 0, 1))
        add("dmg-frame-size", lambda b: _frame_size(b, 0, 1))
    # a 0 byte count on every level: tissue detection (a coarse level) meets it too
    everywhere = {**DAMAGED_TILE, "tissue": "error"}

    def count0_all(b: Bytes) -> Bytes:
        for page, tags in enumerate(b.tags):
            if "TileByteCounts" in tags and page in _level_pages(b):
                _count(b, page, 0, 0)
        return b

    with tifffile.TiffFile(src) as tif:
        nlevels = len(tif.series[0].levels)
    pages = _level_pages(Bytes(src))
    if len(pages) == nlevels:  # every level is a top-level page (not a SubIFD)
        add("dmg-count0-every-level", count0_all, everywhere)
    # a level whose Compression names no codec: level 0 refused, another left out
    refused = dict.fromkeys(ENTRIES, "error")
    add("codec-unknown-level0", lambda b: b.set_value(0, "Compression", 34999), refused, False)
    if len(pages) == nlevels > 1:
        left_out = {"open": "warned", "lenient": "warned", "reader": "warned"}
        add(
            "codec-unknown-last-level",
            lambda b: b.set_value(pages[-1], "Compression", 34999),
            left_out,
            False,
        )


def _level_pages(b: Bytes) -> list[int]:
    """Top-level pages that are pyramid levels: tiled, and each smaller than the last."""
    pages, area = [], None
    for page, tags in enumerate(b.tags):
        if "TileOffsets" not in tags:
            continue
        a = b.value_at(page, "ImageWidth") * b.value_at(page, "ImageLength")
        if area is None or a < area:
            pages.append(page)
            area = a
    return pages


def _bigtiff_svs(path: Path, svs: Path) -> Path:
    """The synthetic SVS rewritten as a BigTIFF (same pages, descriptions and JPEG)."""
    with tifffile.TiffFile(svs) as tif, tifffile.TiffWriter(path, bigtiff=True) as out:
        for page in tif.pages:
            tile = (page.tilelength, page.tilewidth) if page.is_tiled else None
            out.write(
                page.asarray(),
                tile=tile,
                photometric="rgb",
                compression="jpeg",
                compressionargs={"level": 90},
                description=page.description,
                metadata=None,
            )
    return path


def _ndpi_bands(cases: list[Case], out: Path, ndpi: Path) -> None:
    """NDPI level-0 restart bands of random bytes (with and without markers)."""
    b0 = Bytes(ndpi)
    strip = b0.value_at(0, "StripOffsets")
    mcu = [b0.value_at(0, 65426, i) for i in range(4)]
    for name, markers in (("ndpi-band-random", True), ("ndpi-band-garbage", False)):
        b = Bytes(ndpi)
        lo, hi = strip + mcu[1], strip + mcu[2] - 2  # keep the restart marker
        g = np.random.default_rng(9).integers(0, 256 if markers else 255, hi - lo, np.uint8)
        if not markers:
            g[g == 0xFF] = 0x7F
        b.data[lo:hi] = g.tobytes()
        cases.append(Case(name, b.write(out / f"{name}.ndpi"), ndpi, "any", DAMAGED_TILE, True))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> list[Case]:
    from napari_slidescope.sample_data import write_sample_slide

    out = tmp_path_factory.mktemp("hostile-synthetic")
    cases: list[Case] = []
    svs = out / "intact-sample.svs"
    write_sample_slide(svs, shape=(1536, 2048), mpp=0.5, seed=4, tile=128)
    with tifffile.TiffFile(svs) as tif:
        base = tif.pages[0].asarray()[:768, :1024]
        n0 = len(tif.pages[0].dataoffsets)
    _truncations(cases, out, svs, "svs", n0)
    _damage_level0(cases, out, svs, "svs", jpeg=True)
    _damaged_tiles(cases, out, svs, "svs", jpeg=True)
    big_svs = _bigtiff_svs(out / "intact-big.svs", svs)
    _damaged_tiles(cases, out, big_svs, "bigsvs", jpeg=True)
    # width 0 on the baseline: the macro/thumbnail must not take its place
    ome = _ome_pyramid(out / "intact.ome.tif", base)
    _truncations(cases, out, ome, "ome", 12)
    _damage_level0(cases, out, ome, "ome", jpeg=False)
    _damaged_tiles(cases, out, ome, "ome", jpeg=False)
    # a SubIFD pointing back to its parent directory: never a wrong level layout
    b = Bytes(ome)
    b.set_value(0, "SubIFDs", b.ifds[0], 0)
    loop = b.write(out / "ome-subifd-to-parent.ome.tif")
    cases.append(Case("ome-subifd-to-parent", loop, ome, "error", dict.fromkeys(ENTRIES, "error")))
    b = Bytes(ome)
    sub = b.tags[0]["SubIFDs"]
    cases.append(
        Case(
            "ome-subifd-past-end",
            b.set_value(0, "SubIFDs", len(b.data) + 10).write(out / "ome-subifd-past-end.ome.tif"),
            ome,
        )
    )
    assert sub
    big = _ome_pyramid(out / "intact-big.ome.tif", base, bigtiff=True)
    _truncations(cases, out, big, "bigtiff", 12)
    bb = Bytes(big)
    cases.append(
        Case(
            "bigtiff-offset-2^62",
            bb.set_value(0, "TileOffsets", 2**62, 1).write(out / "bigtiff-offset-2^62.ome.tif"),
            big,
            "error",
        )
    )
    bb = Bytes(big)
    bb.data[4:6] = struct.pack("<H", 4)
    cases.append(
        Case(
            "bigtiff-bad-offsetsize", bb.write(out / "bigtiff-bad-offsetsize.ome.tif"), big, "error"
        )
    )
    # wrong magic, empty, not a file
    for name, data in {
        "magic-pdf.svs": b"%PDF-1.7\n" * 100,
        "magic-ix.svs": b"IX*\x00" + bytes(2000),
        "empty.ndpi": b"",
        "magic-only.tif": b"II*\x00",
    }.items():
        (out / name).write_bytes(data)
        cases.append(Case(name, out / name, svs, "error"))
    fifo = out / "pipe.svs"
    os.mkfifo(fifo)
    cases.append(Case("fifo", fifo, svs, "error"))
    dev = out / "device.svs"
    dev.symlink_to("/dev/zero")
    cases.append(Case("device", dev, svs, "error"))
    # hostile structure: long chains, many empty IFDs, absurd tag counts and descriptions
    cases.append(Case("chain-200k-ifds", _chain_file(out / "chain.tif", 200_000, 5), svs, "error"))
    cases.append(
        Case("empty-ifds-500k", _chain_file(out / "empty-ifds.svs", 500_000, 0), svs, "error")
    )
    many = bytearray(
        b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 60000) + bytes(60000 * 12 + 4)
    )
    (out / "many-tags.svs").write_bytes(bytes(many))
    cases.append(Case("tags-60000", out / "many-tags.svs", svs, "error"))
    bd = Bytes(svs)
    off = bd.tags[0]["ImageDescription"][0]
    struct.pack_into("<II", bd.data, off + 4, 50 * 2**20, 8)
    cases.append(
        Case("description-50MiB-claimed", bd.write(out / "desc-claimed.svs"), svs, "error")
    )
    tifffile.imwrite(
        out / "desc-20MiB.tif",
        base,
        tile=(256, 256),
        description="x" * (20 * 2**20),
        metadata=None,
        photometric="rgb",
    )
    cases.append(Case("description-20MiB", out / "desc-20MiB.tif", svs, "error"))
    # XML: never expanded, never fetched
    body = _OME_BODY
    intact_x = _ome_pyramid(
        out / "intact-xml.ome.tif",
        base,
        description='<?xml version="1.0"?>\n' + body.format(ref="plain"),
    )
    for name, prolog, ref in [
        ("ome-billion-laughs", _LAUGHS, "&lol9;"),
        ("ome-quadratic", _QUADRATIC, "&a;" * 200),
        ("ome-external-entity", _EXTERNAL, "&ext;"),
    ]:
        path = _ome_pyramid(
            out / f"{name}.ome.tif", base, description=prolog + body.format(ref=ref)
        )
        cases.append(Case(name, path, intact_x, "ok"))
    planes = np.stack([base[..., 0], base[..., 1], base[..., 2]])
    intact_q = _qptiff(out / "intact.qptiff", planes, '<?xml version="1.0"?>\n', "DAPI")
    for name, prolog, ref in [
        ("qptiff-billion-laughs", _LAUGHS, "&lol9;"),
        ("qptiff-quadratic", _QUADRATIC, "&a;" * 200),
        ("qptiff-external-entity", _EXTERNAL, "&ext;"),
    ]:
        cases.append(
            Case(name, _qptiff(out / f"{name}.qptiff", planes, prolog, ref), intact_q, "ok")
        )
    return cases


@pytest.fixture(scope="module")
def shared(tmp_path_factory, shared_file) -> list[Case]:
    out = tmp_path_factory.mktemp("hostile-shared")
    cases: list[Case] = []
    svs = shared_file("CMU-1-Small-Region.svs")
    with tifffile.TiffFile(svs) as tif:
        n0 = len(tif.pages[0].dataoffsets)
    _truncations(cases, out, svs, "cmu", n0)
    _damage_level0(cases, out, svs, "cmu", jpeg=True)
    _damaged_tiles(cases, out, svs, "cmu", jpeg=True)
    # JPEG 2000 (Aperio 33005) tiles
    j2k = shared_file("TCGA-CR-7395-01A-01-TS1.svs")
    b = Bytes(j2k)
    off, cnt = _tile_span(b, 0, 1)
    b.data[off + cnt // 2 : off + cnt - 2] = bytes(range(256)) * (
        (cnt - 2 - cnt // 2) // 256
    ) + bytes((cnt - 2 - cnt // 2) % 256)
    cases.append(Case("j2k-tile-corrupt", b.write(out / "j2k-tile-corrupt.svs"), j2k))
    b = Bytes(j2k)
    b.set_value(0, "TileByteCounts", b.value_at(0, "TileByteCounts", 0) // 3, 0)
    cases.append(Case("j2k-tile-cut-short", b.write(out / "j2k-tile-cut-short.svs"), j2k))
    # NDPI: cut at every level boundary, McuStarts garbage
    ndpi = shared_file("test3-DAPI-2-387.ndpi")
    b = Bytes(ndpi)
    with tifffile.TiffFile(ndpi) as tif:
        strips = [
            (p.tags["StripOffsets"].value[0], p.tags["StripByteCounts"].value[0]) for p in tif.pages
        ]
    for lv in (0, 1, 2):
        off, cnt = strips[lv]
        cases.append(
            Case(
                f"ndpi-cut-in-level{lv}",
                b.write(out / f"ndpi-cut-in-level{lv}.ndpi", off + cnt // 2),
                ndpi,
                "error",
            )
        )
    cases.append(
        Case(
            "ndpi-cut-after-pixels",
            b.write(out / "ndpi-cut-after-pixels.ndpi", max(o + c for o, c in strips[:4])),
            ndpi,
            "error",
        )
    )
    cases.append(
        Case(
            "ndpi-cut-last-ifd",
            b.write(out / "ndpi-cut-last-ifd.ndpi", b.ifds[-1] + 30),
            ndpi,
            "error",
        )
    )
    mcu = Bytes(ndpi)
    _, voff, typ, count = mcu.tags[0][65426]
    rng = np.random.default_rng(1)
    mcu.data[voff + 40 : voff + 4 * count] = (
        rng.integers(0, 2**32 - 1, count - 10, np.uint32).astype("<u4").tobytes()
    )
    cases.append(
        Case(
            "ndpi-mcustarts-garbage", mcu.write(out / "ndpi-mcustarts-garbage.ndpi"), ndpi, "error"
        )
    )
    mcu = Bytes(ndpi)
    mcu.set_value(0, 65426, mcu.value_at(0, 65426, 20), 10)
    cases.append(
        Case(
            "ndpi-mcustarts-unordered",
            mcu.write(out / "ndpi-mcustarts-unordered.ndpi"),
            ndpi,
            "error",
        )
    )
    _ndpi_bands(cases, out, ndpi)
    lp = Bytes(ndpi).set_next(2, Bytes(ndpi).ifds[1], ndpi=True)
    cases.append(Case("ndpi-ifd-loop", lp.write(out / "ndpi-ifd-loop.ndpi"), ndpi, "error"))
    return cases


def _tiff_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
    except OSError:
        return False


def _run(cases: list[Case], tmp_path: Path) -> list[str]:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps([{"name": c.name, "path": str(c.path), "intact": str(c.intact)} for c in cases])
    )
    env = dict(os.environ, PYTHONPATH=str(SRC), MALLOC_ARENA_MAX="2")
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(manifest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60 + 20 * len(cases),
    )
    results = {}
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        if "intact_error" in row:
            pytest.fail(f"intact file cannot be read: {row}")
        results[row["case"]] = row
    failures = []
    for c in cases:
        row = results.get(c.name)
        if row is None:
            failures.append(
                f"{c.name}: no result (child died: rc={proc.returncode} {proc.stderr[-2000:]})"
            )
            continue
        for entry in ENTRIES:
            got = row[entry]
            if got == "declined" and entry == "reader" and not _tiff_magic(c.path):
                continue
            ok = got in ("error", "same", "warned")
            if entry == "open" and c.expect == "error":
                ok = got == "error"
            if c.expect == "ok" and entry == "open":
                ok = got in ("same", "warned")
            want = (c.want or {}).get(entry)
            if want is not None:
                ok = got == want
            msg = row.get(entry + "_msg", "")
            if ok and want == "warned" and c.names_tile:
                ok = bool(re.search(r"level \d+: damaged tile\(s\) \(rows \d+:\d+ cols", msg))
            if not ok:
                failures.append(f"{c.name} [{entry}]: {got} (want {want or 'any'}) {msg}")
            peak = row.get(entry + "_peak_mib")
            if peak is not None and peak >= PEAK_LIMIT_MIB:
                failures.append(f"{c.name} [{entry}]: peak memory {peak} MiB")
    measured = [row.get(f"{e}_peak_mib") for row in results.values() for e in ENTRIES]
    if os.path.exists("/proc/self/clear_refs"):  # Linux: the peak is measured, not only capped
        assert measured, "peak memory not measured"
        assert all(m is not None for m in measured), "peak memory not measured"
    return failures


def test_corpus_is_large_enough(synthetic):
    assert len(synthetic) >= 40


def test_synthetic_corpus(synthetic, tmp_path):
    failures = _run(synthetic, tmp_path)
    assert not failures, "\n".join(failures)


def test_shared_corpus(shared, tmp_path):
    failures = _run(shared, tmp_path)
    assert not failures, "\n".join(failures)


def test_random_header_mutations(tmp_path):
    """Hypothesis overwrites structure bytes of a small slide (see _fuzz_child.py)."""
    env = dict(os.environ, PYTHONPATH=str(SRC), MALLOC_ARENA_MAX="2")
    proc = subprocess.run(
        [sys.executable, str(CHILD.with_name("_fuzz_child.py")), str(tmp_path), "50"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.startswith("ok "), proc.stdout
    assert int(proc.stdout.split()[1]) >= 40, proc.stdout


# --------------------------------------------------------------------------- full disks
#
# Every writer of the project, on a disk with no room left: an OSError naming the path
# and the cause (ENOSPC), nothing half-written (no temporary file left), and the file
# that was at that path before kept as it was. The disk is a size-limited tmpfs the test
# mounts (root, or CAP_SYS_ADMIN); where it cannot, the writers that take a file path
# are tested against /dev/full and the others skip, naming the missing capability.
# Each write runs under the corpus's bounds: 5 s, and 1 GiB of added peak memory.

EARLIER = b"the earlier file, which a failed write must keep\n"
TEMP_MARKS = (".tmp", ".installing-", ".old-")


class Disk:
    """A tmpfs of `size` bytes mounted at `path` (unmounted by the fixture)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        """Write a filler file until the disk is full (ENOSPC)."""
        fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        block = b"\0" * 4096
        try:
            while True:
                os.write(fd, block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)

    def leftovers(self) -> list[Path]:
        return [p for p in self.path.rglob("*") if any(m in p.name for m in TEMP_MARKS)]


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs at `path`; None when done, else why it cannot be."""
    if not sys.platform.startswith("linux"):
        return "size-limited tmpfs mounts need Linux"
    path.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run mount ({exc})"
    if proc.returncode != 0:
        return (
            "cannot mount a size-limited tmpfs (needs root or CAP_SYS_ADMIN): "
            + proc.stderr.strip()
        )
    return None


@pytest.fixture
def disk(tmp_path):
    """A fresh 256 KiB tmpfs, or a skip naming the capability that is missing."""
    path = tmp_path / "small-disk"
    why = _mount_tmpfs(path, "256k")
    if why is not None:
        if Path("/dev/full").exists():
            pytest.skip(f"{why}; the path-taking writers are tested against /dev/full")
        pytest.skip(f"{why}, and there is no /dev/full")
    try:
        yield Disk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _bounded(fn: Callable[[], object]) -> None:
    """Run `fn` under the corpus's bounds: 5 s (SIGALRM) and 1 GiB of added peak memory."""
    import signal

    def _alarm(signum, frame):
        raise TimeoutError("the write took longer than 5 s")

    measured = False
    if os.path.exists("/proc/self/clear_refs"):
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            measured = True
        except OSError:
            pass
    rss0 = _status_kib("VmRSS") if measured else 0
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if measured:
            assert (_status_kib("VmHWM") - rss0) / 1024 < PEAK_LIMIT_MIB


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _refused(disk: Disk, target: Path, write: Callable[[], object], *, errtype=OSError, named=None):
    """Write `target` on the full `disk`: refused, naming it and ENOSPC; nothing changed."""
    (disk.path / "filler").unlink(missing_ok=True)  # room for the earlier file
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.write_bytes(EARLIER)
    before = target.read_bytes()
    disk.fill()
    with pytest.raises(errtype) as info:
        _bounded(write)
    msg = str(info.value)
    assert str(named or target) in msg, msg
    assert "No space left on device" in msg, msg
    if isinstance(info.value, OSError):
        assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert disk.leftovers() == []


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A TissueResult and a NucleiResult of a small synthetic slide."""
    from napari_slidescope import detect_tissue, segment_nuclei
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("results") / "small.svs"
    write_sample_slide(path, shape=(512, 768), mpp=0.5, seed=3, tile=128)
    tissue = detect_tissue(path)
    nuclei = segment_nuclei(path, segmenter="builtin", tissue=False)
    assert tissue.polygons
    assert nuclei.count > 0
    return tissue, nuclei


@pytest.mark.parametrize("writer", ["tissue.geojson", "nuclei.geojson", "nuclei.csv"])
def test_full_disk_result_exports(disk, results, writer):
    tissue, nuclei = results
    target = disk.path / f"out-{writer}"
    write = {
        "tissue.geojson": lambda: tissue.to_geojson(target),
        "nuclei.geojson": lambda: nuclei.to_geojson(target),
        "nuclei.csv": lambda: nuclei.to_csv(target),
    }[writer]
    _refused(disk, target, write)


@pytest.mark.parametrize("writer", ["tissue.geojson", "nuclei.geojson", "nuclei.csv"])
def test_dev_full_result_exports(results, writer):
    """A stream that cannot take the data: refused, and /dev/full stays a device."""
    import stat

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    tissue, nuclei = results
    target = Path("/dev/full")
    write = {
        "tissue.geojson": lambda: tissue.to_geojson(target),
        "nuclei.geojson": lambda: nuclei.to_geojson(target),
        "nuclei.csv": lambda: nuclei.to_csv(target),
    }[writer]
    with pytest.raises(OSError, match=r"cannot write /dev/full: No space left on device"):
        _bounded(write)
    assert stat.S_ISCHR(os.stat(target).st_mode)


def test_full_disk_batch_outputs(disk):
    pytest.importorskip("pyarrow")
    from napari_slidescope.batch import outputs
    from napari_slidescope.batch.tasks import TileOut

    slide_dir = disk.path / "slide"
    slide_dir.mkdir()
    # a part written while there is room, then each writer on the full disk
    tile = TileOut(0, 0.1, {"id": np.arange(1, 4), "area_um2": np.ones(3)}, [b"\0" * 21] * 3)
    part = outputs.write_part(slide_dir, tile, "digest")
    outputs.write_manifest(slide_dir, outputs.Manifest("slide", "/slide", "running"))
    manifest = slide_dir / "manifest.json"
    huge = outputs.Manifest("slide", "/slide", "failed", error="x" * 99999)
    _refused(disk, manifest, lambda: outputs.write_manifest(slide_dir, huge))
    rng = np.random.default_rng(0)
    big = TileOut(0, 0.2, {"id": np.arange(1, 20001), "area_um2": rng.random(20000)}, [])
    big.wkb = [rng.bytes(64) for _ in range(20000)]
    _refused(disk, part, lambda: outputs.write_part(slide_dir, big, "digest"))
    summary = disk.path / "summary.csv"
    rows = [outputs.SummaryRow("s" * 50_000, "failed")]
    _refused(disk, summary, lambda: outputs.write_summary(summary, rows))
    tissue = slide_dir / "tissue.geojson"
    ring = rng.random((20_000, 2)) * 1000
    _refused(disk, tissue, lambda: outputs.write_tissue(slide_dir, [ring], [[]]))


def test_full_disk_label_pyramid_chunk(tmp_path):
    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    path = tmp_path / "pyramid-disk"
    why = _mount_tmpfs(path, "2m")
    if why is not None:
        pytest.skip(why)
    try:
        pyr = LabelPyramid((512, 512), chunk=256, root=path, cache_bytes=0)
        first = np.zeros((256, 256), np.int32)
        first[10:20, 10:20] = 7
        pyr.paste((0, 0, 256, 256), first)
        # the level-0 chunk file of the zarr store (zarr writes a temporary file, then renames)
        chunk = next(p for p in (pyr.path / "0").rglob("*") if p.is_file() and p.name[0] != ".")
        before = chunk.read_bytes()
        Disk(path).fill()
        noise = np.random.default_rng(0).integers(1, 2**31 - 1, (256, 256), dtype=np.int32)
        with pytest.raises(OSError) as info:
            _bounded(lambda: pyr.paste((0, 0, 256, 256), noise))
        assert info.value.errno == errno.ENOSPC
        assert str(pyr.path) in str(info.value)
        assert "No space left" in str(info.value)
        assert chunk.read_bytes() == before
        assert not [p for p in pyr.path.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_full_disk_sample_slide(disk):
    from napari_slidescope.sample_data import write_sample_slide

    target = disk.path / "sample.svs"
    _refused(disk, target, lambda: write_sample_slide(target, shape=(512, 512), tile=128))


def test_full_disk_model_install(disk):
    from napari_slidescope.segmenters.instanseg import InstallError, install_models, model_folder

    models = os.environ.get("SLIDESCOPE_MODELS")
    source = Path(models) / "instanseg" if models else None
    if source is None or not (source / "brightfield_nuclei").is_dir():
        pytest.skip("SLIDESCOPE_MODELS holds no InstanSeg model to install from")
    folder = model_folder("brightfield_nuclei", disk.path)
    folder.mkdir(parents=True)
    target = folder / "instanseg.pt"
    _refused(
        disk,
        target,
        lambda: install_models(source, disk.path, models=("brightfield_nuclei",)),
        errtype=InstallError,
        named=folder,
    )
