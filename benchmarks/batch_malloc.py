"""What glibc's malloc settings cost the batch tasks: CPU time and resident memory over a run.

    python benchmarks/batch_malloc.py --size 4096 --passes 3

dask's Nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (its config
``distributed.nanny.pre-spawn-environ``). Setting that variable switches off glibc's
dynamic mmap threshold, so every temporary array above 128 KiB is mmap'd and unmapped
again: a page fault per 4 KiB page touched. This script runs the batch engine's own task
functions (``slide_task``, then ``nuclei_task`` tile by tile, one thread, no dask) over a
synthetic slide in a fresh process per setting, ``--passes`` times over all the tiles, and
prints the process's user and system CPU seconds, minor page faults and its RSS after each
pass (a heap that keeps growing over passes is what dask's setting guards against).
Settings are alternated, ``--reps`` times each; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "glibc defaults, no variable (the engine's local cluster)": {},
    "dask Nanny default": {"MALLOC_TRIM_THRESHOLD_": "65536"},
    "fixed thresholds": {
        "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
        "MALLOC_TRIM_THRESHOLD_": str(64 * 2**20),
    },
}

CHILD = r"""
import json, resource, sys, time
from napari_slidescope.batch.params import BatchParams, stamp_slide
from napari_slidescope.batch.tasks import nuclei_task, slide_task

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

path, passes, tile_um = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
params = BatchParams(segmenter="builtin", tile_size_um=tile_um)
stamp = stamp_slide(path).key
info = slide_task(path, stamp, params)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
after = []
for _ in range(passes):
    for i in info.tiles:
        nuclei_task(path, stamp, params, info, [i])
    after.append(rss())
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "wall": time.perf_counter() - t0,
    "user": r1.ru_utime - r0.ru_utime,
    "sys": r1.ru_stime - r0.ru_stime,
    "minflt": r1.ru_minflt - r0.ru_minflt,
    "rss_after_pass": after,
    "tiles": len(info.tiles),
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="slide side, px (default 4096)")
    ap.add_argument("--passes", type=int, default=3, help="passes over the tiles (default 3)")
    ap.add_argument("--reps", type=int, default=2, help="runs per setting (default 2)")
    ap.add_argument("--tile-um", type=float, default=128.0, help="tile size, µm (default 128)")
    args = ap.parse_args()

    from napari_slidescope.sample_data import write_sample_slide

    slide = Path(tempfile.mkdtemp(prefix="malloc-bench-")) / "S.svs"
    write_sample_slide(slide, shape=(args.size, args.size), mpp=0.25, seed=11, tile=256)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    load0, t_start = os.getloadavg(), time.time()
    runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
    for rep in range(args.reps):
        for name, env in SETTINGS.items():
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(slide), str(args.passes), str(args.tile_um)],
                env={**base, **env},
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"rep {rep} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    load1 = os.getloadavg()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    tiles = runs[next(iter(SETTINGS))][0]["tiles"]
    print("### Malloc settings of the workers\n")
    print("Command: `python benchmarks/batch_malloc.py " + " ".join(sys.argv[1:]) + "`  ")
    print(
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, "
        f"{(time.time() - t_start) / 60:.1f} min; load average {load0[0]:.1f} at start, "
        f"{load1[0]:.1f} at end (shared 2-core machine).  "
    )
    print(
        f"One process per setting runs the batch task functions (no dask) over a "
        f"{args.size} x {args.size} synthetic slide at 0.25 µm/px: the slide task, then "
        f"{tiles} nuclei tasks of one {args.tile_um:g} µm tile, {args.passes} passes; "
        f"medians of {args.reps} runs per setting, settings alternated.\n"
    )
    cols = " | ".join(f"RSS after pass {i + 1} MiB" for i in range(args.passes))
    print(f"| setting | wall s | user s | system s | minor faults | {cols} |")
    print("|---|---|---|---|---|" + "---|" * args.passes)
    for name, env in SETTINGS.items():
        rss = [
            statistics.median(r["rss_after_pass"][i] for r in runs[name])
            for i in range(args.passes)
        ]
        label = name if not env else f"{name} `{' '.join(f'{k}={v}' for k, v in env.items())}`"
        print(
            f"| {label} | {med(name, 'wall'):.1f} | {med(name, 'user'):.1f} | "
            f"{med(name, 'sys'):.1f} | {med(name, 'minflt'):,.0f} | "
            + " | ".join(f"{x:.0f}" for x in rss)
            + " |"
        )


if __name__ == "__main__":
    main()
