"""Side-by-side outlines of the nuclei segmenters on a real H&E slide, for looking at.

Segments one region of ``CMU-1-Small-Region.svs`` (CC0, from ``$SLIDESCOPE_TESTDATA``) with
every available segmenter through :func:`napari_slidescope.segment_nuclei` (each at its
default working resolution) and writes a PNG with the outlines drawn over the slide pixels
(no ground truth exists for this slide: the figure is for the eye; accuracy is measured by
``nuclei_accuracy.py``).

Usage::

    python benchmarks/nuclei_figure.py [--out benchmarks/figures]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from skimage import io, segmentation

from napari_slidescope import open_slide, segment_nuclei
from napari_slidescope.segmenters import available_segmenters

#: Level-0 box (y0, x0, y1, x1) of CMU-1-Small-Region.svs: dense, mixed nuclei.
REGION = (1200, 700, 1700, 1200)
COLOURS = {"builtin": (255, 40, 40), "instanseg": (0, 200, 60)}


def main(argv: list[str] | None = None) -> int:
    """Write the figure; return the exit status."""
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", "")) / "CMU-1-Small-Region.svs"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slide", type=Path, default=default)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("figures"))
    args = ap.parse_args(argv)
    if not args.slide.is_file():
        ap.error(f"--slide {args.slide} not found (set SLIDESCOPE_TESTDATA)")
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in ("builtin", "instanseg") if n in available_segmenters()]
    with open_slide(args.slide) as slide:
        rgb = slide.read_region(REGION, level=0)
        mpp = slide.mpp
    panels = []
    for name in names:
        t0 = time.perf_counter()
        # an array source gives labels in the array's own pixels, whatever the working mpp
        res = segment_nuclei(rgb, mpp=mpp, segmenter=name, tissue=False)
        dt = time.perf_counter() - t0
        assert res.labels is not None
        panel = rgb.copy()
        panel[segmentation.find_boundaries(res.labels, mode="inner")] = COLOURS[name]
        panels.append(panel)
        area = float(np.median(res.columns["area_um2"])) if res.count else float("nan")
        print(f"{name:9s} {res.count:4d} nuclei, median area {area:.1f} µm², {dt:.2f} s")
    gap = np.full((rgb.shape[0], 8, 3), 255, np.uint8)
    row = np.concatenate([p for panel in panels for p in (panel, gap)][:-1], axis=1)
    path = args.out / f"nuclei_CMU-1_{'_vs_'.join(names)}.png"
    io.imsave(path, row, check_contrast=False)
    print(f"wrote {path} (left to right: {', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
