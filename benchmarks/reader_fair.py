"""Viewport reads against every peer in one interleaved harness, cold caches, many runs.

Answers "does ours lead in *any* fair harness", not only in ``reader_speed.py``'s (whose
warm-up fills our decoded-tile cache before measuring). Each run is a fresh process: every
reader opens the slide, reads three viewports untimed (imports, thread pools), and then

* **random**: ``--regions`` random level-0 viewports (``--size`` px square), all readers
  reading the same box one after the other, the order rotating from box to box;
* **pan**: ``--pans`` sequences of 24 viewports each shifted by a quarter screen (8 right,
  8 down, 8 left), readers interleaved step by step, the first screen untimed.

Every reader keeps its default cache, cold at the start of a run (ours 256 MiB, fastslide
1 GiB, OpenSlide 32 MiB): a run is what a user's session, or another harness, sees.
Runs alternate quiet and ``--busy`` (a process spinning a pure-Python loop at the same
priority, i.e. one of the two cores taken). Reported: per reader the median over runs of
the run medians (lowest-highest run median in brackets), and ours over the fastest peer
*per run* (median and range over runs); the same for the process CPU time per read (all
threads: robust to a machine that other jobs keep busy).

Readers (``_readers.py``): **ours** (``np.asarray(slide.levels[0][y0:y1, x0:x1])``, the
napari / dask path), **ours-region** (``Slide.read_region``, on the calling thread),
**baseline** (ours as on ``main``, when ``--baseline DIR`` holds a renamed copy, see
``_readers.Baseline``), **fastslide**, **tiffslide**, **openslide**, **napari-tiff**.

Usage::

    python benchmarks/reader_fair.py SLIDE [SLIDE...] [--runs 5] [--regions 30] [--pans 1]
        [--busy 0,1] [--readers ours,ours-region,fastslide,tiffslide,openslide,napari-tiff]
        [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import pan_path, table, warm_page_cache  # noqa: E402
from _readers import READERS  # noqa: E402

PEERS = ("fastslide", "tiffslide", "openslide", "napari-tiff")


def timed(reader: Any, y: int, x: int, s: int, cpu: list[float]) -> float:
    """Wall seconds of one level-0 read; its CPU seconds (all threads) go to `cpu`."""
    c0, t0 = time.process_time(), time.perf_counter()
    reader.read(0, y, x, s, s)
    t1, c1 = time.perf_counter(), time.process_time()
    cpu.append(c1 - c0)
    return t1 - t0
DEFAULT_READERS = "ours,ours-region,fastslide,tiffslide,openslide,napari-tiff"


def one_run(path: Path, names: list[str], args: argparse.Namespace, seed: int) -> dict:
    """Random viewports and pans, readers interleaved; returns per-reader lists of seconds."""
    warnings.simplefilter("ignore")
    readers = {n: READERS[n](path) for n in names}
    h, w = readers["ours"].levels()[0]
    s = args.size
    rng = np.random.default_rng(seed)
    for r in readers.values():  # imports, thread pools, first allocations
        for _ in range(3):
            y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
            r.read(0, y, x, s, s)
    rnd: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.regions):
        y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
        k = i % len(names)
        for n in names[k:] + names[:k]:
            rnd[n].append(timed(readers[n], y, x, s, cpu[n]))
    pan: dict[str, list[float]] = {n: [] for n in names}
    pan_cpu: dict[str, list[float]] = {n: [] for n in names}
    span = 8 * (s // 4)
    for p in range(args.pans):
        y0, x0 = int(rng.integers(0, h - s - span)), int(rng.integers(0, w - s - span))
        steps = pan_path(y0, x0, s)
        for n in names:
            readers[n].read(0, *steps[0], s, s)
        for i, (y, x) in enumerate(steps[1:]):
            k = (i + p) % len(names)
            for n in names[k:] + names[:k]:
                pan[n].append(timed(readers[n], y, x, s, pan_cpu[n]))
    for r in readers.values():
        r.close()
    return {"random": rnd, "pan": pan, "random-cpu": cpu, "pan-cpu": pan_cpu}


def child(args: argparse.Namespace) -> int:
    out = one_run(Path(args.slides[0]), args.readers.split(","), args, args.seed)
    print(json.dumps(out))
    return 0


def summarise(runs: list[dict], kind: str, names: list[str]) -> list[list[str]]:
    meds = {n: [1e3 * statistics.median(r[kind][n]) for r in runs if r[kind][n]] for n in names}
    peers = [n for n in names if n in PEERS]
    rows = []
    for n in names:
        m = meds[n]
        if not m:
            continue
        row = [
            f"**{n}**" if n.startswith("ours") else n,
            f"{statistics.median(m):.1f} ({min(m):.1f}-{max(m):.1f})",
        ]
        if n.startswith("ours") or n == "baseline":
            ratios = [
                r[kind][n] and statistics.median(r[kind][n]) / min(
                    statistics.median(r[kind][p]) for p in peers
                )
                for r in runs
            ]
            row.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        else:
            row.append("")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slides", nargs="+")
    ap.add_argument("--runs", type=int, default=5, help="runs per condition (default 5)")
    ap.add_argument("--regions", type=int, default=30, help="random viewports per run")
    ap.add_argument("--pans", type=int, default=1, help="pan sequences (24 steps) per run")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--busy", default="0,1", help="comma list of busy-core counts (0, 1)")
    ap.add_argument("--readers", default=DEFAULT_READERS)
    ap.add_argument("--baseline", default=None, help="folder holding napari_slidescope_base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write every run's times here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    names = args.readers.split(",")
    env = dict(os.environ)
    if args.baseline:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH"), args.baseline) if p
        )
        if "baseline" not in names:
            names.insert(1, "baseline")
    busy_levels = [int(b) for b in args.busy.split(",")]
    everything: dict[str, dict[int, list[dict]]] = {}
    for slide in args.slides:
        warm_page_cache(Path(slide))
        results: dict[int, list[dict]] = {b: [] for b in busy_levels}
        loads = []
        for run in range(args.runs):
            for b in busy_levels:  # quiet and busy runs alternate
                spin = [
                    subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(b)
                ]
                try:
                    loads.append(os.getloadavg()[0])
                    cmd = [sys.executable, __file__, slide, "--child", "--readers", ",".join(names)]
                    cmd += ["--regions", str(args.regions), "--pans", str(args.pans)]
                    cmd += ["--size", str(args.size), "--seed", str(args.seed + run)]
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                finally:
                    for p in spin:
                        p.kill()
                        p.wait()
                results[b].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"# {Path(slide).name} run {run} busy {b} done", file=sys.stderr)
        everything[slide] = results
        if args.json:
            args.json.write_text(json.dumps(everything))
        print(f"\n### `{Path(slide).name}`\n")
        print(
            f"{time.strftime('%H:%M UTC', time.gmtime())}, load average during the runs "
            f"{min(loads):.1f}-{max(loads):.1f}; {args.runs} runs per condition, each "
            f"{args.regions} random viewports + {24 * args.pans} pan steps of "
            f"{args.size} px; ms, median of run medians (range of run medians); "
            "`/ fastest peer` is ours over the fastest peer of the same run; "
            "CPU ms: process CPU time (all threads) per read.\n"
        )
        for b in busy_levels:
            for kind in ("random", "pan") if args.pans else ("random",):
                label = "quiet" if b == 0 else f"{b} core busy"
                print(f"{kind}, {label}:\n")
                rows = summarise(results[b], kind, names)
                cpu = summarise(results[b], f"{kind}-cpu", names)
                rows = [r + c[1:] for r, c in zip(rows, cpu, strict=True)]
                head = ["reader", f"{kind} ms", "/ fastest peer", "CPU ms", "/ fastest peer"]
                print(table(rows, head) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
