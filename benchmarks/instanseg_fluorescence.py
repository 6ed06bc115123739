"""InstanSeg's fluorescence model without torch: labels and clustering time against torch's.

Inputs: the model card's test tensor, and ``--crops`` 512 px crops of each shared
fluorescence slide in ``$SLIDESCOPE_TESTDATA`` (the two NDPI scans, DAPI and TRITC, at level
1, 0.46 µm/px, as two channels; the 3-channel QPTIFF at 0.50 µm/px), the crops with the most
nuclear signal on a grid. Each input is scaled per tile as the card says. For each:

* **clustering**: the network's output computed once (ONNX Runtime on the built graph), then
  the model's own TorchScript clustering (``forward_with_given_network``) and the numpy one
  (:mod:`napari_slidescope.segmenters._instanseg_clustering`) run on it, interleaved,
  ``--repeat`` times: whether nuclei and cells are identical, and the median wall and CPU
  time of each (after a first call that is not counted);
* **end to end**: ``runtime="onnxruntime"`` (no torch in its path) against
  ``runtime="torch"`` (the model as published): whether the labels are identical, and
  where not, the F1 of objects matched at IoU > 0.5 between the two label images.

Usage::

    python benchmarks/instanseg_fluorescence.py [--crops 3] [--repeat 5]
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


def match_f1(a: np.ndarray, b: np.ndarray) -> float:
    """F1 of objects matched one to one at IoU > 0.5 (at most one such partner each)."""
    a, b = a.astype(np.int64).ravel(), b.astype(np.int64).ravel()
    na, nb = int(a.max()) + 1, int(b.max()) + 1
    both = (a > 0) & (b > 0)
    pairs, inter = np.unique(a[both] * nb + b[both], return_counts=True)
    ia, ib = pairs // nb, pairs % nb
    area_a, area_b = np.bincount(a, minlength=na), np.bincount(b, minlength=nb)
    iou = inter / (area_a[ia] + area_b[ib] - inter)
    tp = int((iou > 0.5).sum())
    n_a, n_b = int((area_a[1:] > 0).sum()), int((area_b[1:] > 0).sum())
    return 1.0 if n_a + n_b == 0 else 2 * tp / (n_a + n_b)


def _crops(image: np.ndarray, nuclear: int, n: int, size: int = 512) -> list[np.ndarray]:
    """The `n` crops (H, W, C) of a (C, H, W) image with the most signal in `nuclear`."""
    _, h, w = image.shape
    grid = [
        (r, c) for r in range(0, h - size + 1, size // 2) for c in range(0, w - size + 1, size // 2)
    ]
    score = [float(image[nuclear, r : r + size, c : c + size].mean()) for r, c in grid]
    best = sorted(range(len(grid)), key=lambda k: -score[k])
    chosen: list[tuple[int, int]] = []
    for k in best:
        r, c = grid[k]
        if all(abs(r - r2) >= size or abs(c - c2) >= size for r2, c2 in chosen):
            chosen.append((r, c))
        if len(chosen) == n:
            break
    return [np.moveaxis(image[:, r : r + size, c : c + size], 0, -1) for r, c in chosen]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("SLIDESCOPE_TESTDATA", "")))
    ap.add_argument("--crops", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import tifffile
    import torch

    from napari_slidescope.segmenters._instanseg_torch import forward_with_given_network
    from napari_slidescope.segmenters.instanseg import (
        InstanSegSegmenter,
        model_folder,
        network_input,
    )

    fl = "fluorescence_nuclei_and_cells"
    ort = InstanSegSegmenter(model=fl, runtime="onnxruntime")
    ref = InstanSegSegmenter(model=fl, runtime="torch")
    cluster = ort._cluster
    if cluster is None:
        raise SystemExit("the numpy clustering does not run for this model here")
    script = forward_with_given_network(model_folder(fl) / "instanseg.pt", "cpu")

    inputs: list[tuple[str, np.ndarray]] = []
    card = np.load(model_folder(fl) / "test-input.npy")
    inputs.append(("card test tensor", np.moveaxis(card, 1, -1)[0]))
    dapi = tifffile.imread(args.data / "test3-DAPI-2-387.ndpi", series=0, level=1)[..., 2]
    tritc = tifffile.imread(args.data / "test3-TRITC-2-560.ndpi", series=0, level=1)[..., 0]
    for k, crop in enumerate(_crops(np.stack([tritc, dapi]), 1, args.crops)):
        inputs.append((f"NDPI TRITC+DAPI crop {k}", crop))
    qp = tifffile.imread(args.data / "small_vectra.qptiff", series=0)  # DAPI, FITC, Cy3
    for k, crop in enumerate(_crops(qp, 0, args.crops)):
        inputs.append((f"QPTIFF DAPI+FITC+Cy3 crop {k}", crop))

    print(f"{len(inputs)} inputs, {torch.get_num_threads()} torch threads, load {_load()}")
    times: dict[str, list[float]] = {
        "torch wall": [],
        "torch cpu": [],
        "numpy wall": [],
        "numpy cpu": [],
    }
    for name, tile in inputs:
        x = ort._scale(tile[None])
        net_out = ort._ort.run(None, {"x": network_input(x)})[0]
        h, w = x.shape[-2:]

        def run_torch(x: np.ndarray = x, net_out: np.ndarray = net_out) -> np.ndarray:
            with torch.inference_mode():
                out = script(torch.tensor(x), args={"x_full": torch.from_numpy(net_out)})
            return np.asarray(out.numpy())

        def run_numpy(net_out: np.ndarray = net_out, h: int = h, w: int = w) -> np.ndarray:
            return np.asarray(cluster(net_out, h, w))

        got = {"torch": run_torch(), "numpy": run_numpy()}  # first calls, not timed
        for _ in range(args.repeat):
            for kind, fn in (("torch", run_torch), ("numpy", run_numpy)):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[f"{kind} wall"].append(time.perf_counter() - t0)
                times[f"{kind} cpu"].append(time.process_time() - c0)
        same = [np.array_equal(got["torch"][0, k], got["numpy"][0, k]) for k in range(2)]
        end_ort = ort.raw_forward(x)
        end_torch = ref.raw_forward(x)
        equal = [np.array_equal(end_ort[0, k], end_torch[0, k]) for k in range(2)]
        f1 = [match_f1(end_ort[0, k], end_torch[0, k]) for k in range(2)]
        px = [int((got["torch"][0, k] != got["numpy"][0, k]).sum()) for k in range(2)]
        px_end = [int((end_ort[0, k] != end_torch[0, k]).sum()) for k in range(2)]
        counts = [len(np.unique(end_torch[0, k])) - 1 for k in range(2)]
        print(
            f"{name}: {h}x{w}, torch {counts[0]} nuclei / {counts[1]} cells | clustering on the "
            f"same network output: nuclei {'identical' if same[0] else f'{px[0]} px differ'}, "
            f"cells {'identical' if same[1] else f'{px[1]} px differ'} | end to end ORT vs "
            f"torch: nuclei {'identical' if equal[0] else f'{px_end[0]} px differ, F1 {f1[0]:.5f}'}"
            f", cells {'identical' if equal[1] else f'{px_end[1]} px differ, F1 {f1[1]:.5f}'}"
        )
    for kind in ("wall", "cpu"):
        t, n = statistics.median(times[f"torch {kind}"]), statistics.median(times[f"numpy {kind}"])
        print(
            f"clustering {kind} s, median of {len(times[f'torch {kind}'])}: torch {t:.3f}, "
            f"numpy {n:.3f} ({t / n:.2f}x)"
        )
    print(f"load {_load()}")


if __name__ == "__main__":
    main()
