"""Peak resident memory while reading, against the decoded-tile cache's bound.

Each case runs in a fresh process that pans through random viewports of the SVS-like slide
and samples its RSS every 2 ms. Run by ``reader_speed.py`` (its memory rows), or alone::

    python benchmarks/reader_memory.py [--regions 60] [--size 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402

RSS_CHILD = r"""
import json, sys, threading, time, warnings
import numpy as np, psutil
sys.path.insert(0, {bench!r})
from napari_slidescope import open_slide
from napari_slidescope.slide.cache import set_cache_bytes, tile_cache
import _common as rs
path, bound, n, s = {path!r}, {bound}, {n}, {s}
set_cache_bytes(bound)
proc = psutil.Process()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    slide = open_slide(path)
lv = slide.levels[0]
np.asarray(lv[:s, :s])  # imports, thread pool, first allocations
set_cache_bytes(0); set_cache_bytes(bound)  # empty, free slabs unmapped too
gc = __import__("gc"); gc.collect()
base = proc.memory_info().rss
peak = [base]
done = False
def watch():
    while not done:
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.002)
t = threading.Thread(target=watch, daemon=True); t.start()
rng = np.random.default_rng(5)
h, w = lv.shape[:2]
growing, full = [], []
for i in range(n):
    y, x = int(rng.integers(0, h - s - 2 * s)), int(rng.integers(0, w - s - 2 * s))
    for yy, xx in rs.pan_path(y, x, s)[:9]:
        was_full = tile_cache().nbytes >= 0.98 * tile_cache().limit  # full at its limit
        t0 = time.perf_counter()
        np.asarray(lv[yy:yy + s, xx:xx + s])
        (full if was_full else growing).append(time.perf_counter() - t0)
done = True; t.join()
med = lambda v: float(np.median(v)) * 1e3 if v else float("nan")
print(json.dumps(dict(base=base, peak=peak[0], bound=bound, cached=tile_cache().nbytes,
                      growing=med(growing), n_growing=len(growing),
                      full=med(full), n_full=len(full))))
"""


def bench_rss(
    path: Path, cases: list[tuple[int, dict[str, str]]], args: argparse.Namespace
) -> list[dict]:
    """Peak RSS in a fresh process per (cache bound, extra environment) case."""
    out = []
    for bound, env in cases:
        code = RSS_CHILD.format(
            bench=str(Path(__file__).resolve().parent),
            path=str(path),
            bound=bound,
            n=max(20, args.regions),
            s=args.size,
        )
        res = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **env},
        )
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row["env"] = " ".join(f"{k}={v}" for k, v in env.items()) or "-"
        out.append(row)
    return out


CASES = [
    (256 * 2**20, {}),
    (64 * 2**20, {}),
    (256 * 2**20, {"MALLOC_ARENA_MAX": "1"}),
    (64 * 2**20, {"MALLOC_ARENA_MAX": "1"}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", type=int, default=60, help="pans per process (default 60)")
    ap.add_argument("--size", type=int, default=1024, help="viewport side in px (default 1024)")
    rows = bench_rss(_slides.svs_40k(), CASES, ap.parse_args(argv))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
