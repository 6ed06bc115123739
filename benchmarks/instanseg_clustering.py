"""InstanSeg's clustering: the model's TorchScript against the numpy one, same inputs, same run.

For each of the 13 MoNuSeg images (``$SLIDESCOPE_TESTDATA/nuclei_gt/monuseg_train``, run as
``segment_nuclei(img, mpp=0.2457)`` runs them: resampled to the model's 0.5 µm/px) the
network's output is computed once (ONNX Runtime); then the model's TorchScript clustering
(its flood fill and hole filling in scipy, as ``runtime="onnxruntime"`` ran it before the
eager clustering) and the numpy one (:mod:`napari_slidescope.segmenters._instanseg_clustering`,
named "eager" below) run
on it, interleaved, ``--repeat`` times. Prints, per image, whether the labels are
identical, and the CPU time of each: the first call of the process (TorchScript compiles
its graph then) and the median of the others, with the load average.

Usage::

    python benchmarks/instanseg_clustering.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", "")) / "nuclei_gt" / "monuseg_train"
    ap.add_argument("--data", type=Path, default=default)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import tifffile
    import torch

    from napari_slidescope import segment_nuclei
    from napari_slidescope.segmenters import get_segmenter
    from napari_slidescope.segmenters._instanseg_torch import forward_with_given_network
    from napari_slidescope.segmenters.instanseg import model_folder

    seg = get_segmenter("instanseg", runtime="onnxruntime")
    eager, session = seg._cluster, seg._ort
    model = forward_with_given_network(model_folder("brightfield_nuclei") / "instanseg.pt", "cpu")
    if eager is None:
        raise SystemExit("the eager clustering does not run here (not a CPU, or another model)")
    recorded: list[tuple[np.ndarray, np.ndarray]] = []

    class _Recorder:  # keeps each tile's scaled input and network output
        def run(self, names: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            out = session.run(names, feed)
            recorded.append((feed["x"], out[0]))
            return out

    seg._ort = _Recorder()
    files = sorted(p for p in args.data.glob("*.tif") if not p.stem.endswith("_instances"))
    inputs = []
    for path in files:
        recorded.clear()
        img = tifffile.imread(path)[..., :3]
        shape = segment_nuclei(img, mpp=0.2457, segmenter=seg, workers=1).labels.shape
        inputs.append((path.stem, recorded[0], shape))
    print(f"{len(files)} images, {torch.get_num_threads()} torch threads, load {_load()}")
    cpu: dict[str, list[float]] = {"torchscript": [], "eager": []}
    first: dict[str, float] = {}
    same = 0
    with torch.inference_mode():
        for name, (x, net_out), _shape in inputs:
            h, w = x.shape[-2:]  # the padded tile: both clusterings label the same pixels
            runs: dict[str, list[float]] = {"torchscript": [], "eager": []}
            out = {}
            for _ in range(args.repeat + (0 if first else 1)):
                for kind in runs:
                    t0 = time.process_time()
                    if kind == "eager":
                        y = eager(net_out, h, w)
                    else:
                        y = model(
                            torch.from_numpy(x.copy()), args={"x_full": torch.from_numpy(net_out)}
                        ).numpy()
                    runs[kind].append(time.process_time() - t0)
                    out[kind] = np.asarray(y)
            if not first:  # the process's first calls
                first = {k: v.pop(0) for k, v in runs.items()}
            for k, v in runs.items():
                cpu[k].append(statistics.median(v))
            eq = np.array_equal(out["eager"], out["torchscript"])
            same += eq
            print(
                f"  {name}: labels identical {eq}, {int(out['eager'].max())} max label, CPU "
                f"TorchScript {cpu['torchscript'][-1]:.3f} s, eager {cpu['eager'][-1]:.3f} s"
            )
    ts, ea = sum(cpu["torchscript"]), sum(cpu["eager"])
    print(f"identical labels on {same}/{len(inputs)} images")
    print(
        f"first call of the process: TorchScript {first['torchscript']:.2f} CPU-s, "
        f"eager {first['eager']:.2f} CPU-s"
    )
    print(
        f"after it, sum over the images of the median CPU: TorchScript {ts:.2f} s, "
        f"eager {ea:.2f} s ({ts / ea:.2f}x); load {_load()}"
    )


if __name__ == "__main__":
    main()
