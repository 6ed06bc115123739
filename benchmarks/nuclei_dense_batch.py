"""Dense tissue through ``slidescope batch``: the run against the segmenter's own time (#33).

For each source tree (``--src``: this checkout's ``src`` and, as the baseline, another
one such as the untouched main branch), interleaved ``--repeat`` times, runs::

    python -m napari_slidescope.batch batch --workers N --segmenter S -o TMP SLIDE

and measures its wall time, the CPU seconds of the whole process tree (the command, the
dask workers; ``RUSAGE_CHILDREN`` once all are reaped), the peak RSS of each process
(sampled every 0.2 s with psutil; the largest dask worker is reported) and the nuclei of
``summary.csv``. Then, in this process, on one thread, the segmenter's own time on the
same pixels: for every tile of the slide's plan (or ``--segmenter-tiles`` of them, evenly
spread), ``segmenter.predict`` and ``segmenter.postprocess`` on the tile as read (reading,
ownership, measurements, outlines and outputs excluded), scaled to all tiles.

Prints medians, CPU-ms per nucleus, the run's CPU over the segmenter's CPU, the ratios to
the first ``--src`` and the load average.

Usage::

    python benchmarks/nuclei_dense_batch.py SLIDE --src src,/work/main/src [--repeat 5]
        [--workers 2] [--segmenter builtin] [--segmenter-tiles 8]
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_batch(slide: Path, src: str, workers: int, segmenter: str) -> dict[str, Any]:
    """One batch run with the package from `src`; its figures."""
    import psutil

    out = Path(tempfile.mkdtemp(prefix="dense-batch-", dir=os.environ.get("DENSE_TMP")))
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "napari_slidescope.batch", "batch", "--workers", str(workers)]
    cmd += ["--segmenter", segmenter, "--no-progress", "-o", str(out), str(slide)]
    peak: dict[int, tuple[float, str]] = {}
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    rss = p.memory_info().rss / 2**20
                    if rss > peak.get(p.pid, (0.0, ""))[0]:
                        kind = "root" if p.pid == proc.pid else " ".join(p.cmdline()[1:3])
                        peak[p.pid] = (rss, kind)
                except psutil.Error:
                    pass
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = proc.communicate()[0].decode(errors="replace")
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    cpu = _children_cpu() - cpu0
    if proc.returncode:
        raise SystemExit(f"batch failed ({proc.returncode}):\n{log}")
    with open(out / "summary.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    # every process under the command is a dask worker (or multiprocessing's small helpers)
    workers_rss = [r for pid, (r, kind) in peak.items() if pid != proc.pid]
    rows = sum(1 for _ in _parquet_rows(out))
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": wall,
        "cpu": cpu,
        "nuclei": int(row["nuclei"]),
        "parquet_rows": rows,
        "tissue_mm2": float(row["tissue_area_mm2"]),
        "worker_peak_mib": max(workers_rss, default=float("nan")),
        "root_peak_mib": peak.get(proc.pid, (float("nan"), ""))[0],
    }


def _parquet_rows(out: Path) -> range:
    import pyarrow.parquet as pq

    files = list(out.glob("*/nuclei.parquet"))
    return range(sum(pq.ParquetFile(f).metadata.num_rows for f in files))


def segmenter_time(slide: Path, segmenter: str, n_tiles: int) -> dict[str, float]:
    """CPU seconds of predict + postprocess over the slide's tiles, one thread, in-process."""
    from napari_slidescope.batch import tasks
    from napari_slidescope.batch.params import BatchParams
    from napari_slidescope.options import NucleiOptions

    st = slide.stat()
    stamp = (st.st_size, st.st_mtime_ns)
    params = BatchParams(nuclei_options=NucleiOptions(segmenter=segmenter))
    info = tasks.slide_task(str(slide), stamp, params)
    run = tasks._prepare(str(slide), stamp, params, info.grid)
    tiles = list(info.tiles)
    pick = tiles if n_tiles <= 0 or n_tiles >= len(tiles) else tiles[:: len(tiles) // n_tiles]
    pick = pick[: n_tiles or None]
    seg, mpp, cpu, px = run.segmenter, run.plan.mpp, 0.0, 0
    for i in pick:
        rgb = run._read(run._tile(i))
        c0 = time.process_time()
        raw = seg.predict(rgb[None], mpp=mpp)
        seg.postprocess(raw[0], mpp=mpp)
        cpu += time.process_time() - c0
        px += rgb.shape[0] * rgb.shape[1]
    scale = len(tiles) / len(pick)
    return {"cpu": cpu * scale, "tiles": len(tiles), "measured": len(pick), "mpx": px * scale / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("--src", default="src", help="comma-separated source trees; first = ours")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--segmenter", default="builtin")
    ap.add_argument("--segmenter-tiles", type=int, default=8, help="0: every tile")
    args = ap.parse_args()
    srcs = args.src.split(",")
    print(f"load at start: {_load()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in srcs}
    for k in range(args.repeat):
        for s in srcs:
            r = run_batch(args.slide, s, args.workers, args.segmenter)
            runs[s].append(r)
            print(
                f"run {k + 1} {s}: "
                + ", ".join(f"{a} {b:.4g}" for a, b in r.items())
                + f" (load {_load()})",
                flush=True,
            )
    seg = segmenter_time(args.slide, args.segmenter, args.segmenter_tiles)
    print(
        f"segmenter {args.segmenter} alone (predict + postprocess, one thread): "
        f"{seg['cpu']:.1f} CPU-s for {seg['tiles']} tiles ({seg['mpx']:.0f} Mpx at the working "
        f"resolution; {seg['measured']} measured, scaled), {seg['mpx'] / seg['cpu']:.2f} Mpx/CPU-s"
    )
    print(f"load at end: {_load()}\n")
    print(
        "| source | runs | wall s | CPU s | nuclei | CPU-ms / nucleus | run CPU / segmenter CPU "
        "| wall x workers / segmenter CPU | worker peak MiB | client peak MiB "
        "| CPU-s / mm² tissue |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    med: dict[str, dict[str, float]] = {}
    for s in srcs:
        m = {key: statistics.median(r[key] for r in runs[s]) for key in runs[s][0]}
        med[s] = m
        print(
            f"| {s} | {len(runs[s])} | {m['wall']:.1f} | {m['cpu']:.1f} | {m['nuclei']:.0f} | "
            f"{1000 * m['cpu'] / max(m['nuclei'], 1):.2f} | {m['cpu'] / seg['cpu']:.2f} | "
            f"{m['wall'] * args.workers / seg['cpu']:.2f} | {m['worker_peak_mib']:.0f} | "
            f"{m['root_peak_mib']:.0f} | {m['cpu'] / m['tissue_mm2']:.2f} |"
        )
    base = med[srcs[-1]]
    for s in srcs[:-1]:
        print(
            f"\n{s} vs {srcs[-1]}: wall x{base['wall'] / med[s]['wall']:.2f} faster, CPU "
            f"x{base['cpu'] / med[s]['cpu']:.2f} less, worker peak "
            f"{med[s]['worker_peak_mib'] / base['worker_peak_mib']:.2f}x"
        )


if __name__ == "__main__":
    main()
