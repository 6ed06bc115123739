"""InstanSeg on a CUDA GPU: throughput, GPU wait with CPU post-processing, batch --gpu vs CPU.

Needs torch with CUDA, a CUDA device and InstanSeg's ``brightfield_nuclei`` model installed
(``$SLIDESCOPE_MODELS``); without them it says what is missing and exits with status 2
(it measures nothing on a CPU: ``nuclei_throughput.py`` does that). In one short run
(a few minutes) it prints, with the load average and the device's name:

1. the network's throughput (megapixels per second at 0.5 µm/px, the whole TorchScript
   forward: network and clustering) by tile size and batch size;
2. the pipeline on a generated 40x slide (``segment_nuclei``, tiles read and
   post-processed on CPU threads while the model runs): wall time, GPU busy time, and the
   time the GPU waited for input after its first batch (the target is none);
3. ``slidescope batch --gpu`` against ``slidescope batch`` on CPU workers on the same
   slide: wall time of each and whether the nuclei tables are equal (count, centroids
   within 0.5 px, areas within 1%).

Targets: HoVer-NeXt's published ~5 Mpx/s on one GPU at 0.25 µm/px (1.25 Mpx/s at 0.5 µm/px
covers the same tissue area per second), and no GPU idle time beyond the first batch.

Usage::

    python benchmarks/gpu.py [--size 8192] [--tiles 256,512,1024] [--batches 1,4,16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _refuse(why: str) -> None:
    print(f"benchmarks/gpu.py: {why}; nothing measured", file=sys.stderr)
    raise SystemExit(2)


def _check() -> object:
    """Return a CUDA torch.device, or exit with status 2 saying what is missing."""
    try:
        import torch
    except ImportError:
        _refuse("torch is not installed (pip install -e '.[instanseg]' with a CUDA build)")
    if not torch.cuda.is_available():
        _refuse(
            f"no CUDA device (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'no'}); run it on a machine with an NVIDIA GPU"
        )
    from napari_slidescope.segmenters import missing_reason

    reason = missing_reason("instanseg")
    if reason is not None:
        _refuse(f"InstanSeg is not available: {reason}")
    return torch.device("cuda")


def network_throughput(device: object, tiles: list[int], batches: list[int], reps: int) -> None:
    import torch

    from napari_slidescope.segmenters import get_segmenter

    seg = get_segmenter("instanseg", device=str(device))
    rng = np.random.default_rng(0)
    print(f"1. network + clustering on {torch.cuda.get_device_name(device)} (Mpx/s at 0.5 µm/px)")
    for tile in tiles:
        row = []
        for batch in batches:
            x = rng.integers(0, 255, (batch, tile, tile, 3), dtype=np.uint8)
            x[..., :, : tile // 2] //= 3  # some dark "nuclei" texture, so clustering works
            try:
                seg.predict(x, mpp=0.5)  # warm-up (cuDNN autotuning, allocations)
                torch.cuda.synchronize()
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    seg.predict(x, mpp=0.5)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            except torch.cuda.OutOfMemoryError:
                row.append(f"batch {batch}: out of memory")
                torch.cuda.empty_cache()
                continue
            med = statistics.median(times)
            row.append(f"batch {batch}: {batch * tile * tile / 1e6 / med:.2f}")
        print(f"  tile {tile}: " + "; ".join(row) + f"  (load {_load()})")


def pipeline_wait(path: Path, device: object, batch_size: int) -> None:
    from napari_slidescope import segment_nuclei
    from napari_slidescope.segmenters import get_segmenter

    seg = get_segmenter("instanseg", device=str(device))
    events: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def monitor(stage: str, phase: str, index: int) -> None:
        with lock:
            events.append((time.perf_counter(), stage, phase))

    t0 = time.perf_counter()
    res = segment_nuclei(path, segmenter=seg, batch_size=batch_size, monitor=monitor)
    wall = time.perf_counter() - t0
    model = sorted((t, p) for t, s, p in events if s == "model")
    busy, waits = 0.0, 0.0
    start: float | None = None
    first_end: float | None = None
    last_end = 0.0
    for t, p in model:
        if p == "start":
            if first_end is not None and start is None:
                waits += t - last_end
            start = t
        elif start is not None:
            busy += t - start
            last_end = t
            first_end = first_end or t
            start = None
    mpx = res.labels.size / 1e6 if res.labels is not None else float("nan")
    print(
        f"2. pipeline, batch {batch_size}: {res.count} nuclei, {mpx:.1f} Mpx in {wall:.1f} s "
        f"({mpx / wall:.2f} Mpx/s); model stage busy {busy:.1f} s ({100 * busy / wall:.0f}% of "
        f"wall), GPU waited {waits:.2f} s after its first batch (load {_load()})"
    )


def batch_gpu_vs_cpu(path: Path, out: Path) -> None:
    import pyarrow.parquet as pq

    runs = {}
    for name, extra in (("cpu", []), ("gpu", ["--gpu"])):
        dest = out / name
        run_cli = (
            "import sys; from napari_slidescope.batch.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        cmd = [sys.executable, "-c", run_cli, "batch", str(path)]
        cmd += ["-o", str(dest), "--segmenter", "instanseg", "--no-progress", *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(
                f"3. slidescope batch ({name}) failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
            )
            return
        table = pq.read_table(next(dest.glob("*/nuclei.parquet"))).to_pandas()
        runs[name] = (wall, table)
    (tc, cpu), (tg, gpu) = runs["cpu"], runs["gpu"]
    key = ["centroid_row", "centroid_col"]
    cpu, gpu = (
        cpu.sort_values(key).reset_index(drop=True),
        gpu.sort_values(key).reset_index(drop=True),
    )
    same = len(cpu) == len(gpu) and bool(
        np.allclose(cpu[key].to_numpy(), gpu[key].to_numpy(), atol=0.5)
        and np.allclose(cpu["area_um2"], gpu["area_um2"], rtol=0.01)
    )
    print(
        f"3. slidescope batch: CPU workers {tc:.1f} s, --gpu {tg:.1f} s ({tc / tg:.2f}x); "
        f"{len(cpu)} vs {len(gpu)} nuclei, tables equal: {same} (load {_load()})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192, help="side of the generated 40x slide")
    ap.add_argument("--tiles", default="256,512,1024")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "slidescope-gpu")
    args = ap.parse_args()
    device = _check()
    from napari_slidescope.sample_data import write_sample_slide

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sample_{args.size}.svs"
    if not path.exists():
        write_sample_slide(path, shape=(args.size, args.size), mpp=0.25, seed=0)
    print(f"{os.cpu_count()} CPUs, load {_load()}; slide {path}")
    tiles = [int(v) for v in args.tiles.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    network_throughput(device, tiles, batches, args.reps)
    for b in (1, max(batches)):
        pipeline_wait(path, device, b)
    batch_gpu_vs_cpu(path, args.out)


if __name__ == "__main__":
    main()
