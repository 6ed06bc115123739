"""What one 256 x 256 tile costs: decoding it, and putting it in a new or a reused cache slab.

Per tile of a slide's level 0 (the compressed bytes read beforehand, untimed), interleaved
round by round, median over rounds of the per-tile mean of the thread's CPU time
(``time.thread_time``: user and system time, page faults included; unlike wall time it does
not count the time other jobs of a shared machine hold the core):

* **one pass**: our decode as it is (``_PageChunks._decode_one``: one strict libjpeg-turbo
  decode for YCbCr, grey and RGB-coded tiles);
* **check + tifffile**: the strict 1/8-scale check (``_tiff.check_jpeg``) plus tifffile's
  ``TiffPage.decode``, what RGB-coded (Aperio) tiles cost before;
* **tifffile**: ``TiffPage.decode`` alone (no damage check: what tiffslide and zarr do);

and the copy of a decoded tile into the tile cache's memory:

* **new slab**: a fresh anonymous memory map of the tile's size, as the cache made one for
  every tile while growing (the first write faults its pages in);
* **new slab, MAP_POPULATE**: the same mapped with its pages populated at once (the cache now);
* **reused slab**: an already-written one (the cache once full, or within its limit).

Usage::

    python benchmarks/reader_tile_costs.py SLIDE [SLIDE...] [--tiles 120] [--rounds 7]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slides", nargs="+")
    ap.add_argument("--tiles", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from napari_slidescope import open_slide
    from napari_slidescope.slide import _tiff

    print(f"load average {os.getloadavg()[0]:.1f} at start\n")
    rows = []
    for path in args.slides:
        slide = open_slide(path)
        src = slide._readers[0]._source
        page = src._pages[0]
        n = min(args.tiles, len(page.dataoffsets))
        first = len(page.dataoffsets) // 2 - n // 2
        segs = list(range(first, first + n))
        raw = list(
            page.parent.filehandle.read_segments(
                [page.dataoffsets[s] for s in segs], [page.databytecounts[s] for s in segs], segs
            )
        )
        kw = src._kwargs[0]
        across = src._tiles_across
        idx = [(s // across, s % across, 0) for s in segs]
        tile = np.asarray(src._decode_one(raw[0][0], raw[0][1], idx[0], kw))

        def one_pass() -> None:
            for (data, s), i in zip(raw, idx, strict=True):
                src._decode_one(data, s, i, kw)

        def check_tifffile() -> None:
            for data, s in raw:
                _tiff.check_jpeg(data, kw.get("jpegtables"), kw.get("jpegheader"))
                page.decode(data, s, **kw)

        def tifffile_alone() -> None:
            for data, s in raw:
                page.decode(data, s, **kw)

        keep: list[object] = []

        def slab(flags: int) -> None:
            for _ in range(n):
                m = mmap.mmap(-1, tile.nbytes, flags=flags)
                np.frombuffer(m, np.uint8).reshape(tile.shape)[...] = tile
                keep.append(m)

        plain = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        populate = plain | getattr(mmap, "MAP_POPULATE", 0)
        reused = np.empty_like(tile)

        def reuse() -> None:
            for _ in range(n):
                reused[...] = tile

        cases = {
            "one pass (ours)": one_pass,
            "check + tifffile (before, RGB-coded)": check_tifffile,
            "tifffile alone (no check)": tifffile_alone,
            "copy into a new slab": lambda: slab(plain),
            "copy into a new slab, MAP_POPULATE": lambda: slab(populate),
            "copy into a reused slab": reuse,
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.thread_time()
                cases[k]()
                times[k].append((time.thread_time() - t0) / n)
                keep.clear()
        label = f"`{Path(path).name}` ({'RGB-coded' if src._rgb_coded else 'YCbCr'})"
        for k in names:
            rows.append([label, k, f"{1e6 * statistics.median(times[k]):.0f}"])
        slide.close()
    print(table(rows, ["slide", "per 256 x 256 tile", "CPU µs"]))
    print(f"\nload average {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
