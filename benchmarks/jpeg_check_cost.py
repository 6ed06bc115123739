"""What the strict JPEG check costs when tiles are decoded (cold tile cache).

Reads a level-0 region of a JPEG slide on one thread with the decoded-tile cache emptied
before every pass, with the check (`_tiff.check_jpeg`, a strict libjpeg-turbo pass at
1/8 scale) and with it replaced by a no-op, interleaved pass by pass; prints the median
time of each and their ratio. Usage::

    python benchmarks/jpeg_check_cost.py [SLIDE] [--passes N]

SLIDE defaults to $SLIDESCOPE_TESTDATA/CMU-1-Small-Region.svs (240-px Aperio JPEG tiles).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from napari_slidescope import open_slide
from napari_slidescope.slide import _tiff
from napari_slidescope.slide.cache import tile_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", ".")) / "CMU-1-Small-Region.svs"
    ap.add_argument("slide", nargs="?", default=str(default))
    ap.add_argument("--passes", type=int, default=9)
    args = ap.parse_args()
    real = _tiff.check_jpeg
    times: dict[str, list[float]] = {"with check": [], "without": []}
    with open_slide(args.slide) as slide:
        h, w = slide.shape0
        box = (0, 0, min(h, 2048), min(w, 2048))
        n = len(slide._readers[0]._source._offsets[0])  # native tiles of level 0
        for _ in range(args.passes):
            for name, fn in (("with check", real), ("without", lambda *a, **k: None)):
                _tiff.check_jpeg = fn
                tile_cache().clear()
                t0 = time.perf_counter()
                slide.read_region(box)
                times[name].append(time.perf_counter() - t0)
    _tiff.check_jpeg = real
    print(f"{Path(args.slide).name}: level-0 region {box}, {n} tiles in the level, one thread")
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for k, v in med.items():
        print(f"  {k:<11} median {v:7.1f} ms over {args.passes} passes")
    print(f"  ratio with/without: {med['with check'] / med['without']:.2f}")


if __name__ == "__main__":
    main()
