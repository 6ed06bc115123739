"""What InstanSeg costs against the built-in method on a real slide, measured in one run.

Runs ``segment_nuclei(path, region=..., segmenter=name)`` for each segmenter, interleaved
(A, B, A, B...) so that both see the same machine load, ``--repeat`` times, and prints the
median wall and CPU time of each, the nuclei found, and the ratios to the first segmenter,
with the load average. Default: a 512 x 512 px region of the real 20x slide
CMU-1-Small-Region (0.499 µm/px; InstanSeg and the built-in method both work at the
slide's own pixels there) from ``$SLIDESCOPE_TESTDATA``.

Usage::

    python benchmarks/nuclei_cost.py [--slide PATH] [--region Y0,X0,Y1,X1] [--repeat 3]
        [--segmenters builtin,instanseg:torch,instanseg:onnxruntime] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope import segment_nuclei
from napari_slidescope.segmenters import get_segmenter


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = Path(os.environ.get("SLIDESCOPE_TESTDATA", "../shared/testdata"))
    ap.add_argument("--slide", type=Path, default=data / "CMU-1-Small-Region.svs")
    ap.add_argument("--region", default="1000,800,1512,1312", help="level-0 box, or 'all'")
    ap.add_argument("--segmenters", default="builtin,instanseg")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument(
        "--cell-expansion-um",
        type=float,
        default=None,
        help="outline cells too (the fluorescence InstanSeg model: every channel in)",
    )
    args = ap.parse_args()
    region = None if args.region == "all" else tuple(int(v) for v in args.region.split(","))
    names = args.segmenters.split(",")
    # "instanseg:torch": InstanSeg with its network on that runtime; loaded outside the timing
    segs = {
        n: get_segmenter(n.split(":")[0], **({"runtime": n.split(":")[1]} if ":" in n else {}))
        for n in names
    }
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    count: dict[str, int] = {}
    labels: dict[str, Any] = {}
    print(
        f"{args.slide.name}, region {region or 'whole slide'}, {os.cpu_count()} CPUs, "
        f"workers {args.workers or 'default'}, load {_load()}",
        flush=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(args.repeat):
            for n in names:
                t0, c0 = time.perf_counter(), time.process_time()
                res = segment_nuclei(
                    args.slide,
                    region=region,
                    segmenter=segs[n],
                    workers=args.workers,
                    cell_expansion_um=args.cell_expansion_um,
                )
                wall[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
                count[n] = res.count
                labels.setdefault(n, (res.labels, res.cells))
                print(f"  run {rep + 1} {n}: {wall[n][-1]:.2f} s, load {_load()}", flush=True)
    base = names[0]
    for n in names:
        w, c = statistics.median(wall[n]), statistics.median(cpu[n])
        rw, rc = w / statistics.median(wall[base]), c / statistics.median(cpu[base])
        print(
            f"{n}: {count[n]} nuclei, median wall {w:.2f} s ({rw:.2f}x {base}'s time, "
            f"speed-up {1 / rw:.2f}x), median CPU {c:.2f} s ({rc:.2f}x, speed-up {1 / rc:.2f}x), "
            f"labels equal to {base}'s: "
            f"{all(np.array_equal(a, b) for a, b in zip(labels[n], labels[base], strict=True))}"
        )
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
