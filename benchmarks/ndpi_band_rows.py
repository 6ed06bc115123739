"""NDPI levels read in spans of band rows (one libjpeg call each) against band by band.

One process opens the slide and reads the level nearest ``--mpp`` (default 8 µm/px, the
working resolution of tissue detection) through ``Slide.read_level_scaled`` at each
``--scale``, the two ways interleaved in every run:

* **spans**: runs of whole band rows decoded as one JPEG stream each (this code);
* **bands**: every restart band decoded on its own (``jpeg_band_rows`` answering None,
  which is what a level without spans does);

and, for the floor, **one call**: the whole level's JPEG decoded by one libjpeg call on
one thread (simplejpeg; a level taller than a JPEG frame may say is skipped). It prints
medians of wall and CPU seconds (the process's, all threads), their ratios, and checks
that the two reads give the same pixels. The load average is printed: the machine may be
busy.

Usage::

    python benchmarks/ndpi_band_rows.py /work/bench-data/huge.ndpi --runs 5
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import psutil


def _timed(fn):
    proc = psutil.Process()
    c0, t0 = proc.cpu_times(), time.perf_counter()
    out = fn()
    c1 = proc.cpu_times()
    return out, time.perf_counter() - t0, (c1.user + c1.system) - (c0.user + c0.system)


def _one_call(path: Path, level: int):
    """The level's whole JPEG (header frame set to the level) decoded in one call, or None."""
    import simplejpeg
    import tifffile

    with tifffile.TiffFile(path) as tif:
        page = tif.series[0].levels[level].pages[0]
        h, w = page.shape[:2]
        header = page.jpegheader
        if header is None or h > 0xFFFF or w > 0xFFFF:
            return None
        offsets, counts = np.asarray(page.dataoffsets), np.asarray(page.databytecounts)
        fh = tif.filehandle
        fh.seek(int(offsets[0]))
        data = fh.read(int(counts.sum()))
    sof = header.index(b"\xff\xc0") + 5
    stream = header[:sof] + struct.pack(">HH", h, w) + header[sof + 4 :] + data + b"\xff\xd9"
    return lambda: simplejpeg.decode_jpeg(stream, colorspace="RGB", strict=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mpp", type=float, default=8.0)
    ap.add_argument("--scale", type=int, nargs="*", default=[1])
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from napari_slidescope.slide import _tiff, open_slide

    spans = _tiff._PageChunks.jpeg_band_rows
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with open_slide(args.slide) as slide:
        level = slide.level_for_mpp(args.mpp)
        h, w = slide.level_shapes[level]
        print(f"{args.slide.name}: level {level}, {h} x {w} px")
        one = _one_call(args.slide, level)
        for scale in args.scale:
            box = (0, 0, h, w)
            rows: dict[str, list[tuple[float, float]]] = {"spans": [], "bands": [], "one": []}
            got = {}
            for run in range(args.runs):
                order = ["spans", "bands"] if run % 2 == 0 else ["bands", "spans"]
                for name in order:
                    _tiff._PageChunks.jpeg_band_rows = (  # type: ignore[method-assign]
                        spans if name == "spans" else (lambda self, r0, r1: None)
                    )
                    read = functools.partial(slide.read_level_scaled, level, box, scale)
                    got[name], wall, cpu = _timed(read)
                    rows[name].append((wall, cpu))
                if one is not None and scale == 1:
                    rows["one"].append(_timed(one)[1:])
            _tiff._PageChunks.jpeg_band_rows = spans  # type: ignore[method-assign]
            same = np.array_equal(got["spans"], got["bands"])
            print(f"\n1/{scale}: {got['spans'].shape}, spans == bands: {same}")
            med = {}
            for name, rs in rows.items():
                if not rs:
                    continue
                med[name] = (
                    statistics.median(r[0] for r in rs),
                    statistics.median(r[1] for r in rs),
                )
                print(f"  {name:5s}: {med[name][0]:.3f} s ({med[name][1]:.3f} CPU s)")
            b, s = med["bands"], med["spans"]
            print(f"  bands / spans: {b[0] / s[0]:.1f}x wall, {b[1] / s[1]:.1f}x CPU")
    print(f"\nload average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
