"""InstanSeg's network on a CPU under different runtimes, against torch in the same run.

The network (``fcn``, the U-Net: about three quarters of InstanSeg's time) of the installed
``brightfield_nuclei`` model runs on its own bioimage.io test tile (256 x 256, scaled per
tile as the model card says) under:

* ``torch``: the TorchScript module as loaded (the baseline);
* ``frozen``: ``torch.jit.freeze`` + ``optimize_for_inference`` (conv/batch-norm folding);
* ``channels_last``: the frozen module on a channels-last input;
* ``onnxruntime``: the network exported to ONNX (opset 17) and run by ONNX Runtime's CPU
  provider (needs ``onnx`` to export and ``onnxruntime``; skipped, saying so, without them);
* ``ort_nospin`` (the segmenter's session: threads do not spin between runs),
  ``ort_1thread``, ``ort_basic`` (graph optimizations: basic only), ``ort_noarena`` (no
  memory arena): ONNX Runtime's session options;
* ``openvino_f32`` / ``openvino_bf16``: the same ONNX file compiled by OpenVINO for the CPU
  with its inference precision hint f32 / its default (bf16 where the CPU has it);
  skipped without ``openvino``;

interleaved, ``--repeat`` times each (``--variants`` picks which, the first is the
baseline), and prints the median wall and CPU time per variant, the ratio to the baseline
and the largest difference of its output from it. It also tries to export the whole model
(network and clustering) and prints why that fails when it does.

Usage::

    python benchmarks/instanseg_runtimes.py [--repeat 5] [--threads 2] [--tile 256]
    python benchmarks/instanseg_runtimes.py --tile 1024 --variants onnxruntime,ort_nospin,\
        ort_1thread,ort_basic,ort_noarena,openvino_f32,openvino_bf16
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
    ap.add_argument("--variants", default="torch,frozen,channels_last,onnxruntime")
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
            level = ort.GraphOptimizationLevel
            for name, threads, spin, opt, arena in (
                ("onnxruntime", args.threads, "1", level.ORT_ENABLE_ALL, True),
                ("ort_nospin", args.threads, "0", level.ORT_ENABLE_ALL, True),
                ("ort_1thread", 1, "0", level.ORT_ENABLE_ALL, True),
                ("ort_basic", args.threads, "0", level.ORT_ENABLE_BASIC, True),
                ("ort_noarena", args.threads, "0", level.ORT_ENABLE_ALL, False),
            ):
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.add_session_config_entry("session.intra_op.allow_spinning", spin)
                so.graph_optimization_level = opt
                so.enable_cpu_mem_arena = arena
                sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
                variants[name] = lambda s=sess: torch.from_numpy(s.run(None, {"x": xs})[0])
        except Exception as exc:  # noqa: BLE001 - reported, the other variants still run
            print(f"onnxruntime: skipped ({type(exc).__name__}: {str(exc)[:200]})")
        try:
            import openvino as ov

            core = ov.Core()
            for name, hint in (
                ("openvino_f32", {"INFERENCE_PRECISION_HINT": "f32"}),
                ("openvino_bf16", {}),
            ):
                compiled = core.compile_model(
                    str(path), "CPU", {"INFERENCE_NUM_THREADS": args.threads, **hint}
                )
                req = compiled.create_infer_request()
                variants[name] = lambda r=req: torch.from_numpy(r.infer({0: xs})[0].copy())
        except Exception as exc:  # noqa: BLE001 - reported, the other variants still run
            print(f"openvino: skipped ({type(exc).__name__}: {str(exc)[:200]})")
        wanted = args.variants.split(",")
        variants = {k: variants[k] for k in wanted if k in variants}
        try:
            if "torch" not in args.variants.split(","):
                raise RuntimeError("not tried (torch is not among --variants)")
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
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        first = wanted[0]
        with torch.inference_mode():
            ref = variants[first]()
            outs = {k: f() for k, f in variants.items()}  # warm-up
            for _ in range(args.repeat):
                for k, f in variants.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    f()
                    times[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
    base, base_cpu = statistics.median(times[first]), statistics.median(cpu[first])
    for k in variants:
        med, med_cpu = statistics.median(times[k]), statistics.median(cpu[k])
        diff = float((outs[k] - ref).abs().max())
        print(
            f"  {k:14s} median {med * 1000:7.0f} ms  {base / med:5.2f}x {first}  "
            f"CPU {med_cpu * 1000:7.0f} ms  {base_cpu / med_cpu:5.2f}x  "
            f"max |output - {first}| {diff:.1e}"
        )
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
