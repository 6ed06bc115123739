"""``slidescope batch --tiles --embed``: its cost against the per-slide function, and resume.

Usage::

    python benchmarks/batch_tiles.py SLIDE [--runs 5] [--tile-um 112] [--mpp 0.5]

Interleaved, per run, each into a fresh output folder:

A. ``embed_slide(SLIDE, ...)`` (``napari_slidescope.tiles.cohort``) in this process: the
   baseline, tiling and embedding one slide with no cluster;
B. ``analyze_slides(SLIDE, tasks=("tissue",), tiles_options=...)`` on a one-worker
   ``LocalCluster`` started once: the tissue task, then the tiles task on the worker;
C. B's output resumed with another model file: the tiles task alone (tissue kept).

The model is a tiny ONNX model built here (global average pooling + a linear layer), so
what is measured is reading, resampling and the batch machinery, not a network. Prints
medians of wall seconds and tiles per second, and the ratios B/A and C/B.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def tiny_model(path: Path, seed: int) -> Path:
    """Write a (N, 3, H, W) -> (N, 8) ONNX model to `path`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["mm"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "H"])],
        [helper.make_tensor_value_info("mm", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(rng.normal(size=(3, 8)).astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tile-um", type=float, default=112.0)
    ap.add_argument("--mpp", type=float, default=0.5)
    args = ap.parse_args()

    from distributed import Client

    from napari_slidescope import analyze_slides
    from napari_slidescope.batch.engine import local_cluster
    from napari_slidescope.options import TilesOptions
    from napari_slidescope.tiles.cohort import embed_slide

    work = Path(tempfile.mkdtemp(prefix="batch-tiles-"))
    models = [tiny_model(work / f"m{i}.onnx", i) for i in (1, 2)]
    opts = [TilesOptions(tile_um=args.tile_um, mpp=args.mpp, model=str(m)) for m in models]
    times: dict[str, list[float]] = {"A": [], "B": [], "C": []}
    tiles: dict[str, list[int]] = {"A": [], "B": [], "C": []}
    waits: dict[str, list[float]] = {"B": [], "C": []}
    cluster = local_cluster(1)
    client = Client(cluster)
    try:
        for run in range(args.runs):
            a_out, b_out = work / f"a{run}", work / f"b{run}"
            t0 = time.perf_counter()
            m = embed_slide(args.slide, a_out, model=models[0], tile_um=args.tile_um, mpp=args.mpp)
            times["A"].append(time.perf_counter() - t0)
            tiles["A"].append(int(m["tiles"]))
            for key, options, resume in (("B", opts[0], False), ("C", opts[1], True)):
                t0 = time.perf_counter()
                rows = analyze_slides(
                    args.slide, b_out, tasks=("tissue",), tiles_options=options,
                    client=client, resume=resume,
                )  # fmt: skip
                times[key].append(time.perf_counter() - t0)
                assert rows[0]["status"] == "done", rows[0]
                manifest = json.loads((b_out / args.slide.name / "manifest.json").read_text())
                tiles[key].append(int(manifest["tile_table"]["tiles"]))
                waits[key].append(float(manifest["tile_table"]["model_wait_s"]))
            shutil.rmtree(a_out)
            shutil.rmtree(b_out)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    finally:
        client.close()
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"slide {args.slide.name}, {args.runs} runs, load {os.getloadavg()[0]:.1f}")
    names = {
        "A": "embed_slide (no cluster)",
        "B": "batch --tiles --embed",
        "C": "batch resume, new model",
    }
    for k in "ABC":
        n = tiles[k][0]
        wait = f", model wait {statistics.median(waits[k]):.3f} s" if k in waits else ""
        print(f"  {k} {names[k]}: {med[k]:.2f} s, {n} tiles, {n / med[k]:.1f} tiles/s{wait}")
    print(f"  B/A {med['B'] / med['A']:.2f}x, C/B {med['C'] / med['B']:.2f}x")


if __name__ == "__main__":
    main()
