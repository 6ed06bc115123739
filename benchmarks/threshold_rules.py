"""Which ``auto`` positivity threshold: Otsu or triangle, on linear or log1p means (issue 20).

On synthetic multiplex images (``sample_cells.make_multiplex``, seeds the tests never use;
markers positive in 12 % (CD8) to 40 % (PanCK) of cells), cells are segmented once per
image and each rule's threshold is applied to the per-cell means (cell compartment; Ki67
on the nucleus). Prints the positivity F1 of every marker per rule, against the truth.

Run: ``python benchmarks/threshold_rules.py`` (about 1 minute).
"""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
from skimage.filters import threshold_otsu, threshold_triangle

from napari_slidescope import SlidescopeWarning, segment_nuclei
from napari_slidescope.sample_cells import make_multiplex

RULES = {
    "otsu log1p (ours)": lambda v: np.expm1(threshold_otsu(np.log1p(v), nbins=256)),
    "otsu linear": lambda v: threshold_otsu(v, nbins=256),
    "triangle log1p": lambda v: np.expm1(threshold_triangle(np.log1p(v), nbins=256)),
    "triangle linear": lambda v: threshold_triangle(v, nbins=256),
}
COLUMNS = {"CD3": "CD3_cell_mean", "CD8": "CD8_cell_mean", "PanCK": "PanCK_cell_mean",
           "Ki67": "Ki67_nucleus_mean"}  # fmt: skip


def _f1(pred: np.ndarray, want: np.ndarray) -> float:
    tp = np.count_nonzero(pred & want)
    return 2 * tp / max(2 * tp + np.count_nonzero(pred ^ want), 1)


def main() -> None:
    warnings.simplefilter("ignore", SlidescopeWarning)
    print("| seed | rule | " + " | ".join(f"{m} F1" for m in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for seed in (111, 112):
        t = make_multiplex(seed=seed, shape=(800, 800))
        with tempfile.TemporaryDirectory() as tmp:
            path = t.write(os.path.join(tmp, "mx.ome.tif"))
            res = segment_nuclei(
                path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=5
            )
        rows = np.round(res.columns["centroid_row"]).astype(int)
        cols = np.round(res.columns["centroid_col"]).astype(int)
        tid = t.nuclei[rows, cols]
        ok = tid > 0
        for name, rule in RULES.items():
            f1 = []
            for marker, col in COLUMNS.items():
                v = np.asarray(res.columns[col], float)
                pred = v > rule(v)
                f1.append(_f1(pred[ok], t.positive[marker][tid[ok] - 1]))
            print(f"| {seed} | {name} | " + " | ".join(f"{x:.3f}" for x in f1) + " |")


if __name__ == "__main__":
    main()
