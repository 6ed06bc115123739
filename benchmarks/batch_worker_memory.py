"""A batch worker's memory over one slide, for several bounds of the decoded-tile cache.

    python benchmarks/batch_worker_memory.py --size 8192 --cache 256MiB 64MiB 32MiB

One fresh process per bound (``SLIDESCOPE_CACHE_BYTES``) runs the batch task functions
as a worker does, without dask: the slide task, then one nuclei task per tile with tissue,
in plan order, one thread. It prints that process's RSS every 20 tiles and at the end, the
peak RSS, and the time, on a synthetic H&E slide of ``--size`` px square at 0.25 µm/px
(``write_sample_slide``, 256 px JPEG tiles). A cache larger than what a batch reuses
shows as RSS that keeps growing tile after tile; the worker's own bound is
``napari_slidescope.batch.tasks.WORKER_CACHE_BYTES``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

TILE_UM = 128.0


def child(path: str) -> None:
    """Run the tasks over the slide in this process; print one JSON line."""
    import psutil

    from napari_slidescope.batch.params import BatchParams
    from napari_slidescope.batch.tasks import nuclei_task, slide_task
    from napari_slidescope.slide.cache import tile_cache

    proc = psutil.Process()
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    params = BatchParams(segmenter="builtin", tile_size_um=TILE_UM)
    t0 = time.perf_counter()
    info = slide_task(path, stamp, params)
    rss = []
    traced0 = None
    for k, i in enumerate(info.tiles):
        nuclei_task(path, stamp, params, info, [i])
        if k % 20 == 0:
            rss.append(proc.memory_info().rss / 2**20)
        if k == 19 and os.environ.get("TRACE"):
            tracemalloc.start()
            traced0 = (proc.memory_info().rss, tracemalloc.get_traced_memory()[0])
    rss.append(proc.memory_info().rss / 2**20)
    if traced0 is not None:  # Python objects allocated since tile 20 and still held
        traced = tracemalloc.get_traced_memory()[0] - traced0[1]
        traced_rss = proc.memory_info().rss - traced0[0]
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    out = {
        "tiles": len(info.tiles),
        "rss": rss,
        "peak": peak,
        "seconds": time.perf_counter() - t0,
        "cache_max": tile_cache().maxbytes / 2**20,
    }
    if traced0 is not None:
        out["traced_kib"] = traced / 1024
        out["rss_growth_mib"] = traced_rss / 2**20
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="slide side, px (default 8192)")
    ap.add_argument("--cache", nargs="+", default=["256MiB", "64MiB", "32MiB"], help="cache bounds")
    ap.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also trace Python allocations from tile 20 to the end (slower)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    from napari_slidescope.sample_data import write_sample_slide

    tmp = Path(tempfile.mkdtemp(prefix="batch-mem-"))
    slide = tmp / "slide.svs"
    write_sample_slide(slide, shape=(args.size, args.size), mpp=0.25, seed=11, tile=256)
    load0, start = os.getloadavg()[0], time.time()
    rows = []
    for bound in args.cache:
        env = {**os.environ, "SLIDESCOPE_CACHE_BYTES": bound, "PYTHONWARNINGS": "ignore"}
        if args.tracemalloc:
            env["TRACE"] = "1"
        cmd = [sys.executable, __file__, "--child", str(slide)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows.append((bound, json.loads(proc.stdout.strip().splitlines()[-1])))
        print(f"{bound}: done", file=sys.stderr, flush=True)
    print("## A batch worker's memory over one slide\n")
    print(f"Command: `python benchmarks/batch_worker_memory.py {' '.join(sys.argv[1:])}`  ")
    print(
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}; load average "
        f"(1 min) {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end. Slide "
        f"{args.size} x {args.size} px at 0.25 µm/px, {rows[0][1]['tiles']} tiles with "
        f"tissue of {TILE_UM:g} µm, builtin segmenter, one process per cache bound.\n"
    )
    traced = args.tracemalloc
    head = "| tile cache bound | RSS every 20 tiles, MiB | end RSS MiB | peak RSS MiB | seconds |"
    if traced:
        head += " RSS growth from tile 20, MiB | of it Python objects (tracemalloc), KiB |"
    print(head)
    print("|---|---|---|---|---|" + ("---|---|" if traced else ""))
    for bound, r in rows:
        path = ", ".join(f"{x:.0f}" for x in r["rss"][:-1])
        line = f"| {bound} | {path} | {r['rss'][-1]:.0f} | {r['peak']:.0f} | {r['seconds']:.1f} |"
        if traced:
            line += f" {r['rss_growth_mib']:.0f} | {r['traced_kib']:.0f} |"
        print(line)


if __name__ == "__main__":
    main()
