"""InstanSeg without torch: speed, cold start and labels against torch and the previous ORT path.

Three variants of the brightfield model, each in processes of its own, interleaved over
``--repeat`` rounds:

* ``torch``: this code, ``runtime="torch"`` (the model as published);
* ``ort-export``: the code to compare against (``--baseline``, a ``src`` folder of an
  earlier checkout), ``runtime="onnxruntime"``: the network exported by ``torch.onnx``;
* ``ort-torchfree``: this code, ``runtime="onnxruntime"`` in a process where importing
  torch raises: the network built from the weights, the clustering in numpy.

Each timed process segments a region (``--region``) of ``CMU-1-Small-Region.svs``
(``$SLIDESCOPE_TESTDATA``) twice through ``segment_nuclei`` (workers=2): the first run
gives the cold start (process start to first labels, imports and model loading included),
the second the warm throughput (Mpx/s at the working resolution). Then one process per
variant segments the whole slide, the 13 MoNuSeg images (``nuclei_gt/monuseg_train``)
and the model card's test tile; labels are compared with torch's (equal, or F1 / AJI
against them) and scored against the ground truth.

Usage::

    python benchmarks/instanseg_torchfree.py --baseline ../main/src [--repeat 5]
        [--region y0,x0,y1,x1] [--skip speed|labels]
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

spawn, runtime, slide, out, mode, monuseg, mpp, region = sys.argv[1:9]
box = tuple(int(v) for v in region.split(","))
seg = InstanSegSegmenter(runtime=runtime)
res = {"torch_loaded": None}
if mode == "speed":
    first = segment_nuclei(slide, segmenter=seg, workers=2, region=box, tissue=False)
    res["cold_s"] = time.time() - float(spawn)
    t0 = time.perf_counter()
    warm = segment_nuclei(slide, segmenter=seg, workers=2, region=box, tissue=False)
    res["warm_s"] = time.perf_counter() - t0
    h, w = warm.labels.shape
    res.update(mpx=h * w / 1e6, count=int(warm.count), runtime=warm.parameters["runtime"])
    assert np.array_equal(first.labels, warm.labels)
else:
    import tifffile
    whole = segment_nuclei(slide, segmenter=seg, workers=2)
    arrays = {"cmu1": whole.labels}
    res.update(count=int(whole.count), runtime=whole.parameters["runtime"])
    x = np.load(model_folder("brightfield_nuclei") / "test-input.npy")
    arrays["card"] = seg.predict(np.moveaxis(x, 1, -1), mpp=0.5)[0, ..., 0]
    for image in sorted(Path(monuseg).glob("*-DX1.tif")):
        rgb = tifffile.imread(image)[..., :3]
        arrays[image.stem] = segment_nuclei(
            rgb, mpp=float(mpp), segmenter=seg, tissue=False, workers=1).labels
    np.savez_compressed(out, **arrays)
res["torch_loaded"] = any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print(json.dumps(res))
"""


def _run(
    src: Path,
    runtime: str,
    block: bool,
    slide: Path,
    out: Path,
    mode: str,
    monuseg: Path,
    region: str,
) -> dict:
    code = (_NO_TORCH if block else "") + _CHILD
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [
        str(time.time()),
        runtime,
        str(slide),
        str(out),
        mode,
        str(monuseg),
        str(MONUSEG_MPP),
        region,
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
    ap.add_argument(
        "--region", default="900,700,1924,1724", help="y0,x0,y1,x1 of the timed runs (level 0)"
    )
    ap.add_argument("--skip", default="", help="comma list of 'speed', 'labels' not to run")
    args = ap.parse_args(argv)
    slide = args.data / "CMU-1-Small-Region.svs"
    monuseg = args.data / "nuclei_gt" / "monuseg_train"
    variants = {
        "torch": (OURS, "torch", False),
        "ort-export": (args.baseline.resolve(), "onnxruntime", False),
        "ort-torchfree": (OURS, "onnxruntime", True),
    }
    skip = set(args.skip.split(","))
    rows: dict[str, list[dict]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeat if "speed" not in skip else 0):
            for name, (src, runtime, block) in variants.items():
                r = _run(src, runtime, block, slide, Path(tmp), "speed", monuseg, args.region)
                rows[name].append(r)
                print(
                    f"round {rep} {name}: cold {r['cold_s']:.1f} s, warm {r['warm_s']:.1f} s",
                    flush=True,
                )
        if rows["torch"]:
            base_cold = statistics.median(r["cold_s"] for r in rows["torch"])
            base_warm = statistics.median(r["warm_s"] for r in rows["torch"])
            print(
                f"\nCMU-1-Small-Region region {args.region}, segment_nuclei, workers=2, "
                f"median of {args.repeat} processes each:"
            )
            for name, rs in rows.items():
                cold = statistics.median(r["cold_s"] for r in rs)
                warm = statistics.median(r["warm_s"] for r in rs)
                mpx = rs[0]["mpx"]
                print(
                    f"{name:14s} {mpx / warm:.2f} Mpx/s ({warm:.1f} s, {base_warm / warm:.2f}x "
                    f"torch); cold start to first labels {cold:.1f} s ({base_cold / cold:.2f}x); "
                    f"{rs[0]['count']} nuclei; runtime {rs[0]['runtime']!r}; "
                    f"torch imported: {rs[0]['torch_loaded']}"
                )
            _load()
        if "labels" in skip:
            return 0
        labels = {}
        for name, (src, runtime, block) in variants.items():
            out = Path(tmp) / f"{name}.npz"
            r = _run(src, runtime, block, slide, out, "labels", monuseg, args.region)
            labels[name] = dict(np.load(out))
            print(
                f"{name}: {r['count']} nuclei on the slide; torch imported: {r['torch_loaded']}",
                flush=True,
            )
    import tifffile

    from napari_slidescope.analysis.metrics import instance_scores

    print("\nlabels against torch's (card tile, whole CMU-1-Small-Region, 13 MoNuSeg images):")
    for name in ("ort-export", "ort-torchfree"):
        same = [k for k in labels["torch"] if np.array_equal(labels[name][k], labels["torch"][k])]
        differ = [k for k in labels["torch"] if k not in same]
        text = f"{name}: {len(same)} of {len(labels['torch'])} equal"
        for k in differ:
            s = instance_scores(labels["torch"][k], labels[name][k])
            text += f"; {k}: F1 {s['f1']:.4f} AJI {s['aji']:.4f}"
        print(text)
    print("\nagainst the MoNuSeg ground truth (13 images, all held out for InstanSeg), means:")
    truth = {
        p.stem: tifffile.imread(monuseg / f"{p.stem}_instances.tif")
        for p in monuseg.glob("*-DX1.tif")
    }
    for name in variants:
        scores = [instance_scores(truth[k], labels[name][k]) for k in sorted(truth)]
        f1 = float(np.mean([s["f1"] for s in scores]))
        aji = float(np.mean([s["aji"] for s in scores]))
        print(f"{name:14s} F1 {f1:.4f}  AJI {aji:.4f}")
    _load()
    return 0


def _load() -> None:
    if hasattr(os, "getloadavg"):
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"load average (1, 5, 15 min): {load} on {os.cpu_count()} CPUs", flush=True)


if __name__ == "__main__":
    sys.exit(main())
