"""Tissue area inside one box of a whole-slide mask (``summary._box_area``): ours vs a baseline.

A random 5880 x 3168 mask (huge.ndpi's working grid, 32 level-0 px a pixel) and four
boxes: the whole slide, a 2048 px box with fractional edges, a 4096 px tile and a strip
as wide as the slide. Each function runs ``--runs`` times per box; prints the medians,
the ratio and the areas (which must agree with each other and with the cell-by-cell sum
of ``_boxes_coverage``).

Usage::

    PYTHONPATH=src python benchmarks/box_area.py --baseline /work/main/src --runs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _baseline(src: Path):
    spec = importlib.util.spec_from_file_location(
        "baseline_summary", src / "napari_slidescope" / "pipeline" / "summary.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_summary"] = module  # (its dataclasses look themselves up)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the src folder to compare")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    from napari_slidescope.pipeline import summary as ours

    base = _baseline(a.baseline)
    mask = np.random.default_rng(0).random((5880, 3168)) > 0.5
    ds, org = (32.0, 32.0), (0.0, 0.0)
    boxes = {
        "whole slide": (0, 0, 188160, 101376),
        "2048 px box": (50000.5, 40000.3, 52048.7, 42048.1),
        "4096 px tile": (4096, 8192, 8192, 12288),
        "slide-wide strip": (1000, 0, 3000, 101376),
    }
    print(f"load average: {os.getloadavg()}")
    for name, box in boxes.items():
        times: dict[str, list[float]] = {"ours": [], "base": []}
        areas = {}
        for _ in range(a.runs):
            for key, mod in (("base", base), ("ours", ours)):
                t = time.perf_counter()
                areas[key] = mod._box_area(mask, org, ds, box)
                times[key].append(time.perf_counter() - t)
        exact = float(base._boxes_coverage(mask.shape, org, ds, [box])[mask].sum())
        m = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name:17s} base {1e3 * m['base']:8.2f} ms  ours {1e3 * m['ours']:7.2f} ms  "
            f"base/ours {m['base'] / m['ours']:7.1f}x  areas {areas['base']!r} / "
            f"{areas['ours']!r} (cell by cell {exact!r})"
        )


if __name__ == "__main__":
    main()
