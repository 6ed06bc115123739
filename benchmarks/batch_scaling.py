"""How the batch engine scales: 2 worker processes over 1, overhead against the in-process
runner, worker and client memory on a slide 4x larger, throughput per CPU second, and the
bytes a task and its result carry.

    python benchmarks/batch_scaling.py                # ~6 min on 2 busy cores
    python benchmarks/batch_scaling.py --size 1024 --reps 1   # a quick look

Synthetic H&E slides (``napari_slidescope.sample_data.write_sample_slide``, 0.25 µm/px) are
written into a temporary folder: S (``--size`` px square) and L (twice the side: 4x the
area). Per repetition, interleaved: ``segment_nuclei`` in this process (``workers=1``: one
post-processing thread, plus its read and model threads), then ``analyze_slides`` on a
``LocalCluster`` of 1 and of 2 worker processes (one thread each). Clusters are started and
their workers' imports warmed before timing. Memory: a fresh 1-worker cluster per slide size;
the worker's peak RSS (``VmHWM``) and the client process's RSS (which holds the
LocalCluster's scheduler too) sampled every 0.1 s. CPU seconds are the worker processes'
(or this process's) user + system time over the run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

TILE_UM = 128.0
MPP = 0.25  # the builtin segmenter's working resolution


def _warm() -> int:
    import napari_slidescope.analysis.brightfield_nuclei  # noqa: F401
    import napari_slidescope.batch.tasks  # noqa: F401
    import napari_slidescope.pipeline.nuclei  # noqa: F401
    import napari_slidescope.pipeline.tissue  # noqa: F401

    return os.getpid()


def _cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _peak_rss_mib() -> float:
    """Peak RSS of this process since its exec (VmHWM; ru_maxrss would include the parent's)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def cluster(n: int, warm: Path | None = None):
    """A LocalCluster of n single-thread workers, warmed by a run on a tiny slide."""
    from distributed import Client, LocalCluster

    c = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(c)
    client.run(_warm)
    if warm is not None:  # every import the tasks need, on every worker
        from napari_slidescope import analyze_slides

        out = Path(tempfile.mkdtemp(prefix="warm-"))
        analyze_slides(warm, out, tile_size_um=TILE_UM / 4, client=client)
    return c, client


def workers_cpu(client) -> float:
    return sum(client.run(_cpu).values())


def run_batch(client, slide: Path, out: Path) -> dict:
    from napari_slidescope import analyze_slides

    cpu0 = workers_cpu(client)
    t0 = time.perf_counter()
    rows = analyze_slides(slide, out, tile_size_um=TILE_UM, client=client)
    wall = time.perf_counter() - t0
    assert rows[0]["status"] == "done", rows
    return {"wall": wall, "cpu": workers_cpu(client) - cpu0, "row": rows[0]}


def run_inprocess(slide: Path) -> dict:
    from napari_slidescope import segment_nuclei

    cpu0, t0 = _cpu(), time.perf_counter()
    res = segment_nuclei(slide, tissue=True, tile_size_um=TILE_UM, labels=False, workers=1)
    return {"wall": time.perf_counter() - t0, "cpu": _cpu() - cpu0, "count": res.count}


class Sampler:
    """RSS of this process and the scheduler's task count, every 0.1 s."""

    def __init__(self, client) -> None:
        self.client, self.rss, self.tasks = client, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.rss.append(_rss_mib())
            self.tasks.append(
                self.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            )
            self.stop.wait(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def memory(slide: Path, out: Path) -> dict:
    c, client = cluster(1)
    try:
        base = statistics.median(client.run(_rss_mib).values())
        rss0 = _rss_mib()
        with Sampler(client) as s:
            r = run_batch(client, slide, out)
        peak = max(client.run(_peak_rss_mib).values())
        return {
            "worker_base": base,
            "worker_peak": peak,
            "client_start": rss0,
            "client_max": max(s.rss),
            "client_end": s.rss[-1],
            "sched_tasks_max": max(s.tasks),
            "tiles": r["row"],
            "wall": r["wall"],
        }
    finally:
        client.close()
        c.close()


def task_bytes(slide: Path) -> dict:
    """Pickled sizes of what the client sends and receives, from tasks run in this process."""
    from napari_slidescope.batch.params import BatchParams, stamp_slide
    from napari_slidescope.batch.tasks import nuclei_task, slide_task, summary_of

    params = BatchParams(tile_size_um=TILE_UM)
    stamp = stamp_slide(slide).key
    info = slide_task(str(slide), stamp, params)
    sizes = []
    counts = []
    for i in info.tiles:
        out = nuclei_task(str(slide), stamp, params, info, [i])
        sizes.append(len(pickle.dumps(out, protocol=5)))
        counts.append(len(out[0].table["id"]))
    args = (str(slide), stamp, params, "<future>", [info.tiles[0]])
    return {
        "task_args": len(pickle.dumps(args, protocol=5)),
        "slide_info_full": len(pickle.dumps(info, protocol=5)),
        "slide_info_client": len(pickle.dumps(summary_of(info), protocol=5)),
        "result_median": statistics.median(sizes),
        "result_max": max(sizes),
        "nuclei_per_tile_median": statistics.median(counts),
        "bytes_per_nucleus": sum(sizes) / max(1, sum(counts)),
        "tiles": len(info.tiles),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=2048, help="side of slide S, px (default 2048)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions (default 2)")
    ap.add_argument(
        "--timed", choices=("S", "L"), default="L", help="slide the runners are timed on (L)"
    )
    args = ap.parse_args()
    import logging

    logging.getLogger("distributed").setLevel(logging.WARNING)

    from napari_slidescope.sample_data import write_sample_slide

    tmp = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    small, large = tmp / "S.svs", tmp / "L.svs"
    write_sample_slide(small, shape=(args.size, args.size), mpp=MPP, seed=11, tile=256)
    write_sample_slide(large, shape=(2 * args.size, 2 * args.size), mpp=MPP, seed=11, tile=256)
    load0 = os.getloadavg()
    t_start = time.time()

    tiny = tmp / "tiny.svs"
    write_sample_slide(tiny, shape=(512, 512), mpp=MPP, seed=11, tile=256)
    timed = large if args.timed == "L" else small
    sizes = task_bytes(small)
    c1, cl1 = cluster(1, tiny)
    c2, cl2 = cluster(2, tiny)
    res: dict[str, list] = {"inproc": [], "batch1": [], "batch2": []}
    try:
        for rep in range(args.reps):
            res["inproc"].append(run_inprocess(timed))
            res["batch1"].append(run_batch(cl1, timed, tmp / f"o1-{rep}"))
            res["batch2"].append(run_batch(cl2, timed, tmp / f"o2-{rep}"))
            print(
                f"rep {rep}: " + ", ".join(f"{k} {v[-1]['wall']:.1f} s" for k, v in res.items()),
                file=sys.stderr,
                flush=True,
            )
    finally:
        for c in (cl1, cl2, c1, c2):
            c.close()
    print("memory runs", file=sys.stderr, flush=True)
    mem_s = memory(small, tmp / "m-s")
    mem_l = memory(large, tmp / "m-l")
    load1 = os.getloadavg()

    row = res["batch1"][0]["row"]
    side = args.size * (2 if args.timed == "L" else 1)
    count = res["inproc"][0]["count"]
    assert all(r["row"]["nuclei"] == count for k in ("batch1", "batch2") for r in res[k])
    tissue_mpx = row["tissue_area_mm2"] * 1e6 / MPP**2 / 1e6  # working px

    def med(k: str, f: str) -> float:
        return statistics.median(r[f] for r in res[k])

    def rng(k: str) -> str:
        w = [r["wall"] for r in res[k]]
        return f"{min(w):.1f}-{max(w):.1f}"

    print("## Batch engine scaling\n")
    print("Command: `python benchmarks/batch_scaling.py " + " ".join(sys.argv[1:]) + "`  ")
    print(
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, "
        f"{(time.time() - t_start) / 60:.1f} min; {psutil.cpu_count()} cores; load average "
        f"{load0[0]:.1f} at start, {load1[0]:.1f} at end (shared machine).  "
    )
    print(
        f"Timed slide {args.timed}: {side} x {side} px at {MPP} µm/px, "
        f"{row['tissue_area_mm2']:.3f} mm² "
        f"tissue ({tissue_mpx:.2f} Mpx at the working resolution), {count} nuclei, "
        f"tiles of {TILE_UM:g} µm; builtin segmenter. Workers warmed by a run on a 512 x 512 "
        "slide first.\n"
    )
    print("| runner | wall s, median (range) | CPU s | tissue Mpx / s | tissue Mpx / CPU s |")
    print("|---|---|---|---|---|")
    for k, name in (
        ("inproc", "segment_nuclei in process, workers=1"),
        ("batch1", "analyze_slides, 1 worker process"),
        ("batch2", "analyze_slides, 2 worker processes"),
    ):
        w, c = med(k, "wall"), med(k, "cpu")
        print(
            f"| {name} | {w:.1f} ({rng(k)}) | {c:.1f} | {tissue_mpx / w:.3f} "
            f"| {tissue_mpx / c:.3f} |"
        )
    print()
    print(f"- speed-up, 2 workers over 1: **{med('batch1', 'wall') / med('batch2', 'wall'):.2f}x**")
    wall_over = med("batch1", "wall") / med("inproc", "wall") - 1
    cpu_over = med("batch1", "cpu") / med("inproc", "cpu") - 1
    print(f"- overhead, 1 worker over in-process: wall **{wall_over:+.0%}**, CPU {cpu_over:+.0%}")
    print()
    print(
        "| slide | area | worker RSS before MiB | worker peak RSS MiB "
        "| client+scheduler RSS start / max / end MiB | scheduler tasks max |"
    )
    print("|---|---|---|---|---|---|")
    for name, m, area in (("S", mem_s, 1), ("L", mem_l, 4)):
        print(
            f"| {name} | {area}x | {m['worker_base']:.0f} | {m['worker_peak']:.0f} | "
            f"{m['client_start']:.0f} / {m['client_max']:.0f} / {m['client_end']:.0f} | "
            f"{m['sched_tasks_max']} |"
        )
    print(
        f"\n- worker peak RSS, L over S: **{mem_l['worker_peak'] / mem_s['worker_peak']:.2f}x** "
        f"(L: {mem_l['tiles']['nuclei']} nuclei)"
    )
    print()
    print("What a task carries (pickled, protocol 5):\n")
    kib = {k: v / 1024 for k, v in sizes.items()}
    print(
        "- nuclei task arguments (path, stamp, parameters, tile indices; the slide task's "
        f"future travels as a key): {sizes['task_args']} B"
    )
    print(
        f"- nuclei task result per tile: median {kib['result_median']:.1f} KiB, "
        f"max {kib['result_max']:.1f} KiB ({sizes['nuclei_per_tile_median']:.0f} nuclei per "
        f"tile median, {sizes['bytes_per_nucleus']:.0f} B per nucleus)"
    )
    print(
        f"- slide task result: {kib['slide_info_full']:.1f} KiB on the workers (tissue mask "
        f"included), {kib['slide_info_client']:.1f} KiB to the client"
    )


if __name__ == "__main__":
    main()
