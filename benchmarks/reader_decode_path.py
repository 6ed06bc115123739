"""One strict decode against check + decode, and against fastslide, on random SVS viewports.

Random 1024 x 1024 level-0 viewports of the 24000 x 30000 SVS-like slide (``_slides.svs_24k``,
YCbCr JPEG tiles), read interleaved (the order rotates) by:

* **one-pass**: the reader as it is (YCbCr and grey JPEG tiles decoded once by libjpeg-turbo
  in strict mode, ``_tiff.decode_jpeg_strict``);
* **two-pass**: the same slide with that path switched off (the strict 1/8-scale check of
  ``_tiff.check_jpeg`` plus tifffile's decode, what RGB-coded JPEG tiles still get);
* **fastslide** ``read_region`` (its tile cache left on).

Our decoded-tile cache is emptied before each of our reads, so every viewport decodes all
its tiles (the random-viewport case on a slide much larger than the cache).

Usage::

    python benchmarks/reader_decode_path.py [--viewports 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--viewports", type=int, default=60)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import fastslide

    from napari_slidescope import open_slide
    from napari_slidescope.slide.cache import tile_cache

    path = _slides.svs_24k()
    one, two = open_slide(path), open_slide(path)
    for r in two._readers:
        r._source._strict_colorspace = None
    fs = fastslide.FastSlide.from_file_path(str(path))
    s = args.size
    h, w = one.shape0
    rng = np.random.default_rng(5)
    boxes = [
        (int(rng.integers(0, h - s)), int(rng.integers(0, w - s))) for _ in range(args.viewports)
    ]

    def ours(slide):
        level = slide.levels[0]

        def read(y, x):
            tile_cache().clear()
            return np.asarray(level[y : y + s, x : x + s])

        return read

    readers = {
        "one-pass": ours(one),
        "two-pass": ours(two),
        "fastslide": lambda y, x: fs.read_region((x, y), 0, (s, s)).numpy(),
    }
    for f in readers.values():
        for y, x in boxes[:6]:
            f(y, x)
    times: dict[str, list[float]] = {n: [] for n in readers}
    names = list(readers)
    load0 = os.getloadavg()[0]
    for i, (y, x) in enumerate(boxes):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            readers[n](y, x)
            times[n].append(time.perf_counter() - t0)
    med = {n: 1e3 * float(np.median(v)) for n, v in times.items()}
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {args.viewports} viewports")
    for n, v in med.items():
        print(f"{n:>10}: {v:6.2f} ms")
    print(f"one-pass / two-pass: {med['one-pass'] / med['two-pass']:.2f}")
    print(f"one-pass / fastslide: {med['one-pass'] / med['fastslide']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
