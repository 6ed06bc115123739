"""How the batch engine scales: 2 worker processes over 1, overhead against the in-process
runner, worker and client memory on a slide 4x larger, throughput per CPU second, and the
bytes a task and its result carry.

    python benchmarks/batch_scaling.py --size 2048 --reps 3   # ~8 min on 2 busy cores
    python benchmarks/batch_scaling.py --size 1024 --reps 1   # a quick look

Synthetic H&E slides (``napari_slidescope.sample_data.write_sample_slide``, 0.25 µm/px) are
written into a temporary folder: S (``--size`` px square) and L (twice the side: 4x the
area). Per repetition, interleaved: ``segment_nuclei`` in this process (``workers=1``: one
post-processing thread, plus its read and model threads), then ``analyze_slides`` on a
``LocalCluster`` of 1 and of 2 worker processes (one thread each; the engine's own
``local_cluster``, so the workers keep glibc's malloc defaults), and the 1-worker cluster again
with 4 tiles per task (one staged run per task: reading, model and post-processing of its
tiles overlap).

Equal hardware: "one worker" means one core. The in-process run is pinned to CPU 0 (every
thread of this process, ``os.sched_setaffinity``), the 1-worker cluster's worker process to
CPU 0, the 2-worker cluster's to CPU 0 and CPU 1. The scheduler and client (this process)
stay unpinned while the clusters run; their CPU time is reported apart. Clusters are
started and their workers' imports warmed before timing.

Memory: a fresh 1-worker cluster per slide size; the worker's peak RSS (``VmHWM``), its RSS
sampled every 0.5 s (at a quarter, half, three quarters and the end of the run: a heap
that grows over the run shows here), and the client process's RSS (which holds the
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


def pin(cpus: set[int]) -> set[int]:
    """Pin every thread of this process to ``cpus`` (threads started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that has just ended
            pass
    return os.sched_getaffinity(0)


def cluster(n: int, warm: Path | None = None, cpus: list[int] | None = None):
    """A LocalCluster of n single-thread workers, warmed by a run on a tiny slide.

    With ``cpus``, worker i is pinned to CPU ``cpus[i]``.
    """
    from distributed import Client

    from napari_slidescope.batch.engine import local_cluster

    c = local_cluster(n)
    client = Client(c)
    client.wait_for_workers(n)
    client.run(_warm)
    if cpus is not None:
        for addr, cpu in zip(sorted(client.scheduler_info()["workers"]), cpus, strict=False):
            client.run(pin, {cpu}, workers=[addr])
    if warm is not None:  # every import the tasks need, on every worker
        from napari_slidescope import analyze_slides

        out = Path(tempfile.mkdtemp(prefix="warm-"))
        analyze_slides(warm, out, segmenter="builtin", tile_size_um=TILE_UM / 4, client=client)
    return c, client


def workers_cpu(client) -> float:
    return sum(client.run(_cpu).values())


def run_batch(client, slide: Path, out: Path, per_task: int = 1) -> dict:
    from napari_slidescope import analyze_slides

    cpu0, own0 = workers_cpu(client), _cpu()
    t0 = time.perf_counter()
    rows = analyze_slides(
        slide,
        out,
        segmenter="builtin",
        tile_size_um=TILE_UM,
        client=client,
        tiles_per_task=per_task,
    )
    wall = time.perf_counter() - t0
    assert rows[0]["status"] == "done", rows
    return {
        "wall": wall,
        "cpu": workers_cpu(client) - cpu0,
        "client_cpu": _cpu() - own0,
        "row": rows[0],
    }


def run_inprocess(slide: Path, cpu: int) -> dict:
    from napari_slidescope import segment_nuclei

    every = os.sched_getaffinity(0)
    pin({cpu})
    try:
        cpu0, t0 = _cpu(), time.perf_counter()
        res = segment_nuclei(
            slide,
            segmenter="builtin",
            tissue=True,
            tile_size_um=TILE_UM,
            labels=False,
            workers=1,
        )
        wall = time.perf_counter() - t0
        return {"wall": wall, "cpu": _cpu() - cpu0, "client_cpu": 0.0, "count": res.count}
    finally:
        pin(every)


class Sampler:
    """RSS of this process and the scheduler's task count every 0.1 s; workers' every 0.5 s."""

    def __init__(self, client) -> None:
        self.client, self.rss, self.tasks, self.worker_rss = client, [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.rss.append(_rss_mib())
            self.tasks.append(
                self.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            )
            if len(self.rss) % 5 == 1:
                self.worker_rss.append(max(self.client.run(_rss_mib).values()))
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
        w = s.worker_rss + [max(client.run(_rss_mib).values())]
        return {
            "worker_path": [w[min(len(w) - 1, round(q * (len(w) - 1)))] for q in (0.25, 0.5, 0.75)]
            + [w[-1]],
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

    params = BatchParams(segmenter="builtin", tile_size_um=TILE_UM)
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


RUNNERS = {
    "inproc": "segment_nuclei in process, workers=1, pinned to 1 CPU",
    "batch1": "analyze_slides, 1 worker process on 1 CPU",
    "batch1x4": "analyze_slides, 1 worker process on 1 CPU, 4 tiles per task",
    "batch2": "analyze_slides, 2 worker processes on 2 CPUs",
}


def report_timing(args, res, loads, load0, load1, t_start, unset_env) -> None:
    """Print the run's conditions, the timed runners' table and the speed-up and overhead."""
    row = res["batch1"][0]["row"]
    side = args.size * (2 if args.timed == "L" else 1)
    count = res["inproc"][0]["count"]
    assert all(r["row"]["nuclei"] == count for k in RUNNERS if k != "inproc" for r in res[k])
    tissue_mpx = row["tissue_area_mm2"] * 1e6 / MPP**2 / 1e6  # working px

    def med(k: str, f: str) -> float:
        return statistics.median(r[f] for r in res[k])

    def rng(k: str) -> str:
        w = [r["wall"] for r in res[k]]
        return f"{min(w):.1f}-{max(w):.1f}"

    print(
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, "
        f"{(time.time() - t_start) / 60:.1f} min; {psutil.cpu_count()} cores; load average "
        f"(1 min) {load0[0]:.1f} at start, after each repetition "
        + ", ".join(f"{x:.1f}" for x in loads[1:-1])
        + f", {load1[0]:.1f} at end. A load above 2 on 2 cores means other jobs shared "
        "the CPUs: the runners were interleaved (order rotated every repetition), so compare "
        "them within this run.  "
    )
    print(
        f"Timed slide {args.timed}: {side} x {side} px at {MPP} µm/px, "
        f"{row['tissue_area_mm2']:.3f} mm² "
        f"tissue ({tissue_mpx:.2f} Mpx at the working resolution), {count} nuclei, "
        f"tiles of {TILE_UM:g} µm; builtin segmenter. Workers warmed by a run on a 512 x 512 "
        "slide first. Equal hardware: the in-process run (all its threads) and the 1-worker "
        "cluster's worker are pinned to one CPU each (`os.sched_setaffinity`), the 2-worker "
        "cluster's workers to one CPU each; the scheduler and client are not pinned, their "
        "CPU time is the last column. Workers start without dask's "
        + ", ".join(f"`{k}`" for k in unset_env)
        + " (glibc's malloc defaults; `benchmarks/batch_malloc.py`).\n"
    )
    print(
        "| runner | wall s, median (range) | worker CPU s | tissue Mpx / s "
        "| tissue Mpx / CPU s | client + scheduler CPU s |"
    )
    print("|---|---|---|---|---|---|")
    for k, name in RUNNERS.items():
        w, c = med(k, "wall"), med(k, "cpu")
        print(
            f"| {name} | {w:.1f} ({rng(k)}) | {c:.1f} | {tissue_mpx / w:.3f} "
            f"| {tissue_mpx / c:.3f} | {med(k, 'client_cpu'):.1f} |"
        )
    print()
    print(
        f"- speed-up, 2 workers over 1: **{med('batch1', 'wall') / med('batch2', 'wall'):.2f}x** "
        "(target >= 1.7x)"
    )
    for k, what in (("batch1", "1 tile per task"), ("batch1x4", "4 tiles per task")):
        wall_over = med(k, "wall") / med("inproc", "wall") - 1
        cpu_over = med(k, "cpu") / med("inproc", "cpu") - 1
        print(
            f"- overhead, 1 worker ({what}) over in-process, both on one CPU: wall "
            f"**{wall_over:+.0%}**, worker CPU {cpu_over:+.0%} (target <= +10%)"
        )
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=2048, help="side of slide S, px (default 2048)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument(
        "--timed", choices=("S", "L"), default="L", help="slide the runners are timed on (L)"
    )
    ap.add_argument(
        "--xl",
        action="store_true",
        help="also measure memory on slide XL (4x the side of S: 16x the area)",
    )
    ap.add_argument(
        "--memory-only", action="store_true", help="skip the timed runs (memory and task sizes)"
    )
    args = ap.parse_args()
    import logging

    logging.getLogger("distributed").setLevel(logging.WARNING)

    from napari_slidescope.batch.engine import WORKER_UNSET_ENV
    from napari_slidescope.sample_data import write_sample_slide

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("batch_scaling: needs 2 CPUs to pin 2 workers to")
    tmp = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    small, large = tmp / "S.svs", tmp / "L.svs"
    write_sample_slide(small, shape=(args.size, args.size), mpp=MPP, seed=11, tile=256)
    write_sample_slide(large, shape=(2 * args.size, 2 * args.size), mpp=MPP, seed=11, tile=256)
    xl = tmp / "XL.svs"
    if args.xl:
        write_sample_slide(xl, shape=(4 * args.size, 4 * args.size), mpp=MPP, seed=11, tile=256)
    load0 = os.getloadavg()
    t_start = time.time()
    loads = [load0[0]]

    tiny = tmp / "tiny.svs"
    write_sample_slide(tiny, shape=(512, 512), mpp=MPP, seed=11, tile=256)
    timed = large if args.timed == "L" else small
    sizes = task_bytes(small)
    c1, cl1 = cluster(1, tiny, cpus[:1])
    c2, cl2 = cluster(2, tiny, cpus[:2])
    res: dict[str, list] = {k: [] for k in RUNNERS}
    run = {
        "inproc": lambda rep: run_inprocess(timed, cpus[0]),
        "batch1": lambda rep: run_batch(cl1, timed, tmp / f"o1-{rep}"),
        "batch1x4": lambda rep: run_batch(cl1, timed, tmp / f"o1x4-{rep}", per_task=4),
        "batch2": lambda rep: run_batch(cl2, timed, tmp / f"o2-{rep}"),
    }
    try:
        for rep in range(0 if args.memory_only else args.reps):
            order = list(RUNNERS)
            order = order[rep % len(order) :] + order[: rep % len(order)]  # rotate
            for k in order:
                res[k].append(run[k](rep))
            loads.append(os.getloadavg()[0])
            print(
                f"rep {rep} (load {loads[-1]:.1f}): "
                + ", ".join(f"{k} {v[-1]['wall']:.1f} s" for k, v in res.items()),
                file=sys.stderr,
                flush=True,
            )
    finally:
        for c in (cl1, cl2, c1, c2):
            c.close()
    print("memory runs", file=sys.stderr, flush=True)
    mem_s = memory(small, tmp / "m-s")
    mem_l = memory(large, tmp / "m-l")
    mem_xl = memory(xl, tmp / "m-xl") if args.xl else None
    load1 = os.getloadavg()
    loads.append(load1[0])

    print("## Batch engine scaling\n")
    print("Command: `python benchmarks/batch_scaling.py " + " ".join(sys.argv[1:]) + "`  ")
    if not args.memory_only:
        report_timing(args, res, loads, load0, load1, t_start, WORKER_UNSET_ENV)
    else:
        print(
            f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, "
            f"{(time.time() - t_start) / 60:.1f} min; load average (1 min) {load0[0]:.1f} at "
            f"start, {load1[0]:.1f} at end. Memory runs only (no timed runs).\n"
        )
    print(
        "| slide | area | worker RSS before MiB | worker RSS at 1/4, 1/2, 3/4, end of the run MiB "
        "| worker peak RSS MiB | client+scheduler RSS start / max / end MiB "
        "| scheduler tasks max |"
    )
    print("|---|---|---|---|---|---|---|")
    mems = [("S", mem_s, 1), ("L", mem_l, 4)] + ([("XL", mem_xl, 16)] if mem_xl else [])
    for name, m, area in mems:
        print(
            f"| {name} | {area}x | {m['worker_base']:.0f} | "
            + ", ".join(f"{x:.0f}" for x in m["worker_path"])
            + f" | {m['worker_peak']:.0f} | "
            f"{m['client_start']:.0f} / {m['client_max']:.0f} / {m['client_end']:.0f} | "
            f"{m['sched_tasks_max']} |"
        )
    print(
        f"\n- worker peak RSS, L over S: **{mem_l['worker_peak'] / mem_s['worker_peak']:.2f}x** "
        f"(L: {mem_l['tiles']['nuclei']} nuclei; target <= 1.10x)"
    )
    if mem_xl:
        print(
            f"- worker peak RSS, XL (16x the area) over S: "
            f"**{mem_xl['worker_peak'] / mem_s['worker_peak']:.2f}x** "
            f"(XL: {mem_xl['tiles']['nuclei']} nuclei)"
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
