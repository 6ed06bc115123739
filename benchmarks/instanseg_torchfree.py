"""InstanSeg without torch: speed, cold start and labels against torch and the previous ORT path.

Three variants of the brightfield model, each in processes of its own, interleaved over
``--repeat`` rounds:

* ``torch``: this code, ``runtime="torch"`` (the model as published);
* ``ort-export``: the code to compare against (``--baseline``, a ``src`` folder of an
  earlier checkout), ``runtime="onnxruntime"``: the network exported by ``torch.onnx``;
* ``ort-torchfree``: this code, ``runtime="onnxruntime"`` in a process where importing
  torch raises: the network built from the weights, the clustering in numpy.

Each process segments ``CMU-1-Small-Region.svs`` (``$SLIDESCOPE_TESTDATA``) twice through
``segment_nuclei`` (workers=2): the first run gives the cold start (process start to first
labels, imports and model loading included), the second the warm throughput (Mpx/s at the
working resolution). The first round also segments the 13 MoNuSeg images
(``nuclei_gt/monuseg_train``) and the model card's test tile; labels are compared with
torch's (equal, or F1 / AJI against them) and scored against the ground truth.

Usage::

    python benchmarks/instanseg_torchfree.py --baseline ../main/src [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
OURS = HERE.parents[1] / "src"
MONUSEG_MPP = 0.2457

_NO_TORCH = """
import sys, importlib.util
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch blocked")
sys.meta_path.insert(0, _NoTorch())
_real = importlib.util.find_spec
importlib.util.find_spec = lambda n, *a: None if n.split(".")[0] == "torch" else _real(n, *a)
"""

_CHILD = """
import json, sys, time
import numpy as np
from pathlib import Path
from napari_slidescope import segment_nuclei
from napari_slidescope.segmenters.instanseg import InstanSegSegmenter, model_folder

spawn, runtime, slide, out, full = sys.argv[1:6]
MONUSEG_MPP = float(sys.argv[7])
seg = InstanSegSegmenter(runtime=runtime)
first = segment_nuclei(slide, segmenter=seg, workers=2)
cold = time.time() - float(spawn)
t0 = time.perf_counter()
warm = segment_nuclei(slide, segmenter=seg, workers=2)
wall = time.perf_counter() - t0
h, w = warm.labels.shape
res = {"cold_s": cold, "warm_s": wall, "mpx": h * w / 1e6, "count": int(warm.count),
       "runtime": warm.parameters["runtime"],
       "torch_loaded": any(m == "torch" or m.startswith("torch.") for m in sys.modules)}
if full == "1":
    import tifffile
    arrays = {"cmu1": warm.labels}
    x = np.load(model_folder("brightfield_nuclei") / "test-input.npy")
    arrays["card"] = seg.predict(np.moveaxis(x, 1, -1), mpp=0.5)[0, ..., 0]
    for image in sorted(Path(sys.argv[6]).glob("*-DX1.tif")):
        rgb = tifffile.imread(image)[..., :3]
        arrays[image.stem] = segment_nuclei(
            rgb, mpp=MONUSEG_MPP, segmenter=seg, tissue=False, workers=1).labels
    np.savez_compressed(out, **arrays)
print(json.dumps(res))
"""


def _run(src: Path, runtime: str, block: bool, slide: Path, out: Path, monuseg: Path | None):
    code = (_NO_TORCH if block else "") + _CHILD
    env = {**os.environ, "PYTHONPATH": str(src)}
    full = "1" if monuseg is not None else "0"
    args = [
        str(time.time()),
        runtime,
        str(slide),
        str(out),
        full,
        str(monuseg or ""),
        str(MONUSEG_MPP),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{runtime} ({src}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    data = Path(os.environ.get("SLIDESCOPE_TESTDATA", HERE.parents[2] / "shared" / "testdata"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="src folder to compare against")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", type=Path, default=data, help="folder of the test data")
    args = ap.parse_args(argv)
    slide = args.data / "CMU-1-Small-Region.svs"
    monuseg = args.data / "nuclei_gt" / "monuseg_train"
    variants = {
        "torch": (OURS, "torch", False),
        "ort-export": (args.baseline.resolve(), "onnxruntime", False),
        "ort-torchfree": (OURS, "onnxruntime", True),
    }
    rows: dict[str, list[dict]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeat):
            for name, (src, runtime, block) in variants.items():
                out = Path(tmp) / f"{name}.npz"
                rows[name].append(
                    _run(src, runtime, block, slide, out, monuseg if rep == 0 else None)
                )
                r = rows[name][-1]
                print(f"round {rep} {name}: cold {r['cold_s']:.1f} s, warm {r['warm_s']:.1f} s")
        labels = {k: dict(np.load(Path(tmp) / f"{k}.npz")) for k in variants}
    import tifffile

    from napari_slidescope.analysis.metrics import instance_scores

    base_cold = statistics.median(r["cold_s"] for r in rows["torch"])
    base_warm = statistics.median(r["warm_s"] for r in rows["torch"])
    print(f"\nCMU-1-Small-Region, whole pipeline, workers=2, median of {args.repeat}:")
    for name, rs in rows.items():
        cold = statistics.median(r["cold_s"] for r in rs)
        warm = statistics.median(r["warm_s"] for r in rs)
        mpx = rs[0]["mpx"]
        print(
            f"{name:14s} {mpx / warm:.2f} Mpx/s ({warm:.1f} s, {base_warm / warm:.2f}x torch); "
            f"cold start {cold:.1f} s ({base_cold / cold:.2f}x); {rs[0]['count']} nuclei; "
            f"runtime {rs[0]['runtime']!r}; torch imported: {rs[0]['torch_loaded']}"
        )
    print("\nlabels against torch's (same images):")
    for name in ("ort-export", "ort-torchfree"):
        same = [k for k in labels["torch"] if np.array_equal(labels[name][k], labels["torch"][k])]
        differ = [k for k in labels["torch"] if k not in same]
        text = f"{name}: {len(same)} of {len(labels['torch'])} equal"
        for k in differ:
            s = instance_scores(labels["torch"][k], labels[name][k])
            text += f"; {k}: F1 {s['f1']:.4f} AJI {s['aji']:.4f}"
        print(text)
    print(
        "\nagainst the MoNuSeg ground truth (13 images, all held out for InstanSeg): mean F1 / AJI"
    )
    truth = {
        p.stem: tifffile.imread(monuseg / f"{p.stem}_instances.tif")
        for p in monuseg.glob("*-DX1.tif")
    }
    for name in variants:
        scores = [instance_scores(truth[k], labels[name][k]) for k in sorted(truth)]
        f1 = float(np.mean([s["f1"] for s in scores]))
        aji = float(np.mean([s["aji"] for s in scores]))
        print(f"{name:14s} F1 {f1:.4f}  AJI {aji:.4f}")
    if hasattr(os, "getloadavg"):
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"load average (1, 5, 15 min) at the end: {load} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
