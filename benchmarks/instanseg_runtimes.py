"""InstanSeg's network on a CPU under different runtimes, against torch in the same run.

The network (``fcn``, the U-Net: about three quarters of InstanSeg's time) of the installed
``brightfield_nuclei`` model runs on its own bioimage.io test tile (256 x 256, scaled per
tile as the model card says) under:

* ``torch``: the TorchScript module as loaded (the baseline);
* ``frozen``: ``torch.jit.freeze`` + ``optimize_for_inference`` (conv/batch-norm folding);
* ``channels_last``: the frozen module on a channels-last input;
* ``onnxruntime``: the network exported to ONNX (opset 17) and run by ONNX Runtime's CPU
  provider (needs ``onnx`` to export and ``onnxruntime``; skipped, saying so, without them);

interleaved, ``--repeat`` times each, and prints the median per variant, the ratio to
torch and the largest difference of its output from torch's. It also tries to export the
whole model (network and clustering) and prints why that fails when it does.

Usage::

    python benchmarks/instanseg_runtimes.py [--repeat 5] [--threads 2] [--tile 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tile", type=int, default=256, help="tile side (the test tile is tiled)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    from napari_slidescope.segmenters.instanseg import model_folder

    torch.set_num_threads(args.threads)
    folder = model_folder("brightfield_nuclei")
    net = torch.jit.load(str(folder / "instanseg.pt")).eval()
    x = np.load(folder / "test-input.npy").astype(np.float32)
    reps = -(-args.tile // x.shape[-1])
    x = np.tile(x, (1, 1, reps, reps))[..., : args.tile, : args.tile]
    lo, hi = np.percentile(x, [0.1, 99.9], axis=(2, 3), keepdims=True)
    xs = np.ascontiguousarray((x - lo) / (hi - lo + 1e-6), dtype=np.float32)
    t = torch.from_numpy(xs)
    fcn = net.fcn
    frozen = torch.jit.optimize_for_inference(torch.jit.freeze(fcn))
    variants: dict[str, Callable[[], torch.Tensor]] = {
        "torch": lambda: fcn(t.clone()),
        "frozen": lambda: frozen(t.clone()),
        "channels_last": lambda: frozen(t.clone().contiguous(memory_format=torch.channels_last)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import onnxruntime as ort

            path = Path(tmp) / "fcn.onnx"
            torch.onnx.export(
                fcn,
                (t.clone(),),
                str(path),
                input_names=["x"],
                output_names=["y"],
                dynamic_axes={"x": {0: "b", 2: "h", 3: "w"}, "y": {0: "b", 2: "h", 3: "w"}},
                opset_version=17,
                dynamo=False,
            )
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            variants["onnxruntime"] = lambda: torch.from_numpy(sess.run(None, {"x": xs})[0])
        except Exception as exc:  # noqa: BLE001 - reported, the other variants still run
            print(f"onnxruntime: skipped ({type(exc).__name__}: {str(exc)[:200]})")
        try:
            torch.onnx.export(
                net, (t.clone(),), str(Path(tmp) / "all.onnx"), opset_version=17, dynamo=False
            )
            print("whole model (network + clustering): exported to ONNX")
        except Exception as exc:  # noqa: BLE001 - the reason is the result
            print(f"whole model: not exportable: {type(exc).__name__}: {str(exc)[:300]}")
        print(
            f"network on a {args.tile} x {args.tile} tile, {args.threads} threads, "
            f"torch {torch.__version__}, load {_load()}",
            flush=True,
        )
        times: dict[str, list[float]] = {k: [] for k in variants}
        with torch.inference_mode():
            ref = variants["torch"]()
            outs = {k: f() for k, f in variants.items()}  # warm-up
            for _ in range(args.repeat):
                for k, f in variants.items():
                    t0 = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["torch"])
    for k in variants:
        med = statistics.median(times[k])
        diff = float((outs[k] - ref).abs().max())
        print(
            f"  {k:14s} median {med * 1000:7.0f} ms  {base / med:5.2f}x torch  "
            f"max |output - torch| {diff:.1e}"
        )
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
