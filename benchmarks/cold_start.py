"""Cold start: a fresh process imports the package, opens a slide and detects its tissue.

Each repetition is a new Python process (nothing cached but the file in the page cache),
timing ``import napari_slidescope``, ``open_slide`` and ``detect_tissue`` on the whole
slide. Two ways of reading the working level, interleaved:

* **direct**: as the code is (``slide.read_pixels``: the level's region read through the
  tile pool, no dask scheduler);
* **dask-threads**: the previous read, ``region.compute(scheduler="threads")`` (dask's
  scheduler lookup imports ``distributed`` when installed).

Usage::

    python benchmarks/cold_start.py [--reps 5] [--slide PATH]

Default slide: the 30720 x 23040 NDPI-like ``_slides.ndpi_30k()``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import napari_slidescope as ns
if sys.argv[1] == "dask-threads":
    import numpy as np
    import napari_slidescope.slide as s_
    s_.read_pixels = lambda r: np.asarray(r.compute(scheduler="threads"))
t1 = time.perf_counter()
slide = ns.open_slide(sys.argv[2])
t2 = time.perf_counter()
tissue = ns.detect_tissue(slide)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t3 - t0, tissue.area_um2, "distributed" in sys.modules)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--slide", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.slide or _slides.ndpi_30k()
    modes = ["direct", "dask-threads"]
    rows: dict[str, list[list[float]]] = {m: [] for m in modes}
    areas: dict[str, set[float]] = {m: set() for m in modes}
    load0 = os.getloadavg()[0]
    for i in range(args.reps):
        for m in modes[i % 2 :] + modes[: i % 2]:
            out = subprocess.run(
                [sys.executable, "-W", "ignore", "-c", CHILD, m, str(path)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            rows[m].append([float(v) for v in out[:4]])
            areas[m].add(round(float(out[4])))
    print(
        f"{path.name}, {args.reps} fresh processes per mode, load {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}; median seconds"
    )
    print(f"{'mode':>13} {'import':>7} {'open':>7} {'tissue':>7} {'total':>7}  tissue area µm²")
    for m in modes:
        med = [statistics.median(col) for col in zip(*rows[m], strict=True)]
        print(f"{m:>13} " + " ".join(f"{v:7.3f}" for v in med) + f"  {sorted(areas[m])}")
    a = statistics.median(r[3] for r in rows["direct"])
    b = statistics.median(r[3] for r in rows["dask-threads"])
    print(f"total, direct / dask-threads: {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
