"""Peak memory of resampling one tile (``pipeline.tiling.read_tile``), before and after (#33).

``read_tile`` bins a level by the integer part of the resampling factor, interpolates at
the working pixel centres and rounds back to the slide's dtype. This compares the
``tiling.py`` of a git revision (``--before``) with the working tree's on the same tile
of a slide, in one process: each reads the tile once (warming the decoded-tile cache, so
the figures are the resampling's, not the decoding's), then ``--runs`` times under
``tracemalloc`` (numpy reports its arrays to it). Prints the median traced peak and time
of each, their ratio, and checks that both return the same pixels.

Usage::

    python benchmarks/read_tile_memory.py SLIDE [--before REV] [--runs 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
TILING = "src/napari_slidescope/pipeline/tiling.py"

#: (working µm/px, tile size µm): the 20x working grid of the nuclei runs, and a finer one
CASES = ((0.5, 512.0), (0.37, 256.0))


def load_at(rev: str) -> object:
    """Import ``tiling.py`` as it was at `rev` (under another module name)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:{TILING}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "tiling_before.py"
    path.write_text(text)
    name = "napari_slidescope.pipeline._tiling_before"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def measure(module: object, slide: object, tile: object, plan: object, runs: int):
    read = module.read_tile  # type: ignore[attr-defined]
    read(slide, tile, plan, level=0)  # the decoded tiles into the cache
    peaks, times = [], []
    for _ in range(runs):
        tracemalloc.start()
        t0 = time.perf_counter()
        out = read(slide, tile, plan, level=0)
        times.append(time.perf_counter() - t0)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return statistics.median(peaks) / 2**20, statistics.median(times) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slide")
    ap.add_argument("--before", default="cd8ec4f", help="git revision of the baseline")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()

    from napari_slidescope import open_slide
    from napari_slidescope.pipeline import tiling

    before = load_at(a.before)
    slide = open_slide(a.slide)
    mpp0 = float(slide.mpp[0])
    print(f"{Path(a.slide).name}: level 0 {slide.shape0}, {mpp0:.3f} µm/px; before = {a.before}")
    print("| working µm/px | tile px | peak MiB before | after | ratio | ms before | after |")
    print("|---|---|---|---|---|---|---|")
    for target, tile_um in CASES:
        plan = tiling.make_plan(
            (0, 0, *slide.shape0),
            slide_mpp=mpp0,
            target_mpp=target,
            tile_size_um=tile_um,
            min_overlap_um=16.0,
        )
        tile = plan.tiles[len(plan.tiles) // 2]
        pb, tb, ob = measure(before, slide, tile, plan, a.runs)
        pa, ta, oa = measure(tiling, slide, tile, plan, a.runs)
        if not np.array_equal(ob, oa):
            raise SystemExit(f"{target} µm/px: the two versions return different pixels")
        print(
            f"| {target} | {tile.shape[0]} x {tile.shape[1]} | {pb:.1f} | {pa:.1f} | "
            f"{pa / pb:.2f} | {tb:.1f} | {ta:.1f} |"
        )
    print("pixels: identical")


if __name__ == "__main__":
    main()
