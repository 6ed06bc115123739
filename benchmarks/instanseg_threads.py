"""InstanSeg on ONNX Runtime: intra-op threads and spinning, whole pipeline on a real region.

Runs ``segment_nuclei(slide, region=..., segmenter=...)`` with the network's ONNX Runtime
session rebuilt under each setting (2 threads spinning, 1 thread, 2 threads not spinning),
interleaved, and prints median wall and CPU time and whether the labels equal the first
setting's. Default: a 1024 x 1024 px region of CMU-1-Small-Region from
``$SLIDESCOPE_TESTDATA``.

Usage::

    python benchmarks/instanseg_threads.py [--runtime onnxruntime] [--repeat 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from napari_slidescope import segment_nuclei
from napari_slidescope.segmenters.instanseg import InstanSegSegmenter

SETTINGS = ((2, "1"), (1, "1"), (2, "0"))  # (intra-op threads, allow spinning)


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = Path(os.environ.get("SLIDESCOPE_TESTDATA", "../shared/testdata"))
    ap.add_argument("--slide", type=Path, default=data / "CMU-1-Small-Region.svs")
    ap.add_argument("--region", default="900,700,1924,1724")
    ap.add_argument("--runtime", default="onnxruntime")
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    region = tuple(int(v) for v in args.region.split(","))
    segs = {}
    for threads, spin in SETTINGS:
        seg = InstanSegSegmenter(runtime=args.runtime)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        model = seg._ort._model_bytes  # the same exported (and quantized) network
        seg._ort = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        segs[f"{threads} thread(s), spinning {'on' if spin == '1' else 'off'}"] = seg
    wall: dict[str, list[float]] = {k: [] for k in segs}
    cpu: dict[str, list[float]] = {k: [] for k in segs}
    labels: dict[str, np.ndarray] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(args.repeat):
            for k, seg in segs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                res = segment_nuclei(args.slide, region=region, segmenter=seg, workers=2)
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
                assert res.labels is not None
                labels[k] = res.labels
    first = next(iter(segs))
    for k in segs:
        print(
            f"{args.runtime}, {k}: median wall {statistics.median(wall[k]):.2f} s, "
            f"CPU {statistics.median(cpu[k]):.2f} s; labels equal to the first: "
            f"{np.array_equal(labels[k], labels[first])}"
        )
    print("load " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
