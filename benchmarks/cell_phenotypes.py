"""Cell phenotypes against known truth, and the cost of the cell step (issue 20).

1. Multiplex: synthetic OME-TIFFs (DAPI; CD3, CD8 on the membrane; PanCK in the cytoplasm;
   Ki67 in the nucleus; spill-over, blur, shot and read noise; ``sample_cells.make_multiplex``)
   on seeds the tests never use. Built-in fluorescence segmentation with cells grown 5 µm,
   ``classify_cells`` with ``auto`` thresholds and the rules ``MULTIPLEX_RULES``. A detected
   cell is matched to the true cell under its centroid; per-marker positivity F1 (on the cell
   compartment, Ki67 on the nucleus) and phenotype accuracy over matched cells.
2. IHC: synthetic hematoxylin-DAB images (``make_hdab``: nuclear DAB at known levels), the
   built-in brightfield segmenter with ``stain="auto"``, ``dab=True`` (QuPath's 0.2 / 0.4 /
   0.6): positive % and H-score against the truth's, score accuracy over matched nuclei.
3. Cost: ``segment_nuclei`` with and without ``cell_expansion_um=5`` on the same images
   (interleaved, median of 3): the ratio.

Run: ``python benchmarks/cell_phenotypes.py`` (about 2 minutes on 2 shared cores).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

from napari_slidescope import SlidescopeWarning, classify_cells, segment_nuclei
from napari_slidescope.analysis.phenotypes import dab_scores, ihc_summary
from napari_slidescope.pipeline.cell_classes import class_summary
from napari_slidescope.sample_cells import MULTIPLEX_RULES, make_hdab, make_multiplex

SHAPE = (800, 800)
EXPAND_UM = 5.0


def _matched(res, truth_labels):
    rows = np.clip(np.round(res.columns["centroid_row"]).astype(int), 0, truth_labels.shape[0] - 1)
    cols = np.clip(np.round(res.columns["centroid_col"]).astype(int), 0, truth_labels.shape[1] - 1)
    tid = truth_labels[rows, cols]
    return tid > 0, tid - 1


def _f1(pred: np.ndarray, want: np.ndarray) -> float:
    tp = np.count_nonzero(pred & want)
    fp = np.count_nonzero(pred & ~want)
    fn = np.count_nonzero(~pred & want)
    return 2 * tp / max(2 * tp + fp + fn, 1)


def multiplex(seeds: list[int]) -> None:
    print("\n## Multiplex (auto thresholds: Otsu on log1p of the per-cell means)\n")
    print(
        "| seed | cells (truth) | matched | CD3 F1 | CD8 F1 | PanCK F1 | Ki67 F1 "
        "| phenotype accuracy |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        t = make_multiplex(seed=seed, shape=SHAPE)
        with tempfile.TemporaryDirectory() as tmp:
            path = t.write(os.path.join(tmp, f"multiplex-{seed}.ome.tif"))
            res = segment_nuclei(
                path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=EXPAND_UM
            )
        markers = {"CD3": "auto", "CD8": "auto", "PanCK": "auto",
                   "Ki67": {"threshold": "auto", "compartment": "nucleus"}}  # fmt: skip
        out = classify_cells(res, markers=markers, phenotypes=MULTIPLEX_RULES, compartment="cell")
        ok, idx = _matched(out, t.nuclei)
        f1 = {m: _f1(out.columns[f"{m}_positive"][ok], t.positive[m][idx[ok]]) for m in markers}
        acc = float(np.mean(out.columns["class"][ok] == t.phenotype[idx[ok]]))
        print(
            f"| {seed} | {res.count} ({t.nuclei.max()}) | {ok.sum()} | "
            + " | ".join(f"{f1[m]:.3f}" for m in markers)
            + f" | {acc:.3f} |"
        )


def ihc(seeds: list[int]) -> None:
    print("\n## IHC, nuclear DAB (QuPath thresholds 0.2 / 0.4 / 0.6 on the nucleus)\n")
    print(
        "| seed | stain found | nuclei (truth) | positive % (truth) | H-score (truth) "
        "| score accuracy |"
    )
    print("|---|---|---|---|---|---|")
    for seed in seeds:
        t = make_hdab(seed=seed, shape=SHAPE)
        res = segment_nuclei(t.image, mpp=t.mpp, segmenter="builtin", tissue=False)
        stain = "H-DAB" if "dab_od_mean" in res.columns else "H&E"
        out = classify_cells(res, dab=True)
        got, want = class_summary(out), ihc_summary(dab_scores(t.dab))
        ok, idx = _matched(out, t.nuclei)
        acc = float(np.mean(out.columns["dab_score"][ok] == dab_scores(t.dab)[idx[ok]]))
        print(
            f"| {seed} | {stain} | {res.count} ({t.nuclei.max()}) | "
            f"{got['positive_percent']:.1f} ({want['positive_percent']:.1f}) | "
            f"{got['h_score']:.1f} ({want['h_score']:.1f}) | {acc:.3f} |"
        )


def cost(repeats: int = 3) -> None:
    print(f"\n## Cost of the cell step (cell_expansion_um={EXPAND_UM} vs nuclei alone)\n")
    print("| image | nuclei s (median) | cells s (median) | ratio |")
    print("|---|---|---|---|")
    cases = {
        "multiplex 800x800 (DAPI)": (
            make_multiplex(seed=300, shape=SHAPE).image[0], "builtin-fluorescence"
        ),
        "H-DAB 800x800": (make_hdab(seed=301, shape=SHAPE).image, "builtin"),
    }  # fmt: skip
    for name, (image, seg) in cases.items():
        times: dict[str, list[float]] = {"nuclei": [], "cells": []}
        for _ in range(repeats):
            for kind in ("nuclei", "cells"):  # interleaved
                kw = {"cell_expansion_um": EXPAND_UM} if kind == "cells" else {}
                t0 = time.perf_counter()
                segment_nuclei(image, mpp=0.5, segmenter=seg, tissue=False, workers=1, **kw)
                times[kind].append(time.perf_counter() - t0)
        a, b = statistics.median(times["nuclei"]), statistics.median(times["cells"])
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f} |")


def whole_slide_cost(path: str, repeats: int = 3, tile_um: float = 256.0) -> None:
    """The cell step's cost on a whole slide: tissue detection, every tile, seams, stitching."""
    print(f"\n## Cost of the cell step on a whole slide ({os.path.basename(path)})\n")
    print(
        f"`segment_nuclei(path)` as a user runs it (tissue mask, {tile_um:g} µm tiles, "
        f"2 workers), with and without cell_expansion_um={EXPAND_UM}, interleaved\n"
    )
    print("| run | nuclei | seconds (median) | ratio |")
    print("|---|---|---|---|")
    times: dict[str, list[float]] = {"nuclei": [], "cells": []}
    counts: dict[str, int] = {}
    for _ in range(repeats):
        for kind in ("nuclei", "cells"):  # interleaved
            kw = {"cell_expansion_um": EXPAND_UM} if kind == "cells" else {}
            t0 = time.perf_counter()
            res = segment_nuclei(
                path, segmenter="builtin", tile_size_um=tile_um, workers=2, labels=False, **kw
            )
            times[kind].append(time.perf_counter() - t0)
            counts[kind] = res.count
    base = statistics.median(times["nuclei"])
    for kind in ("nuclei", "cells"):
        t = statistics.median(times[kind])
        print(f"| {kind} | {counts[kind]} | {t:.2f} | {t / base:.2f} |")


def main() -> None:
    warnings.simplefilter("ignore", SlidescopeWarning)
    if len(sys.argv) > 2 and sys.argv[1] == "--whole-slide":
        print(f"load average at start: {os.getloadavg()[0]:.1f}")
        whole_slide_cost(sys.argv[2])
        print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
        return
    t0 = time.time()
    print(f"# cell_phenotypes.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load average at start: {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")
    multiplex([101, 102])
    ihc([201, 202])
    cost()
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
