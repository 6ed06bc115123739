"""One glass slide per source image: is the built-in method's loss on the 13-source slide its path?

``nuclei_slides.py`` lays all 13 MoNuSeg images (13 hospitals, 13 stainings) on one glass
slide, and the built-in method then prepares its stain vectors and threshold once for all
13. A user's slide has one source. This lays each image alone on glass (40x, the same gap and
writer), runs ``segment_nuclei(path, segmenter=METHOD)`` on it as a user would, and scores it
against the same method on the bare crop: if the slide path itself (tissue mask, glass,
one preparation per slide, tiles) cost accuracy, the one-source slides would show it.

Usage::

    python benchmarks/nuclei_slides_per_source.py [--method builtin] [--data DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import tifffile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from napari_slidescope import segment_nuclei  # noqa: E402
from napari_slidescope.analysis.metrics import instance_scores  # noqa: E402
from napari_slidescope.glass_slides import lay_on_glass, score_areas, write_svs  # noqa: E402
from nuclei_accuracy import MONUSEG_MPP  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("SLIDESCOPE_TESTDATA", "../shared/testdata"))
    ap.add_argument("--data", type=Path, default=default / "nuclei_gt" / "monuseg_train")
    ap.add_argument("--method", default="builtin")
    ap.add_argument("--gap", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "slidescope-glass1")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ids = sorted(p.name.removesuffix("_instances.tif") for p in args.data.glob("*_instances.tif"))
    slide_rows, crop_rows = [], []
    for ident in ids:
        image = tifffile.imread(args.data / f"{ident}.tif")[..., :3]
        truth = tifffile.imread(args.data / f"{ident}_instances.tif")
        rgb, truth_on_glass, lay = lay_on_glass([image], [truth], mpp=MONUSEG_MPP, gap=args.gap)
        path = write_svs(args.out / f"{ident}.svs", rgb, mpp=lay.mpp)
        y0, x0, y1, x1 = lay.boxes[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = segment_nuclei(path, segmenter=args.method)
            crop = segment_nuclei(rgb[y0:y1, x0:x1], mpp=lay.mpp, segmenter=args.method).labels
        s = score_areas(res, truth_on_glass, lay)[0]
        c = instance_scores(truth_on_glass[y0:y1, x0:x1], crop)
        slide_rows.append(s)
        crop_rows.append(c)
        print(
            f"{ident}: one-source slide F1 {s['f1']:.3f} AJI {s['aji']:.3f} | "
            f"crop F1 {c['f1']:.3f} AJI {c['aji']:.3f}",
            flush=True,
        )
    for name, rows in (("one-source slides", slide_rows), ("crops", crop_rows)):
        f1, aji = (float(np.mean([r[k] for r in rows])) for k in ("f1", "aji"))
        print(f"MEAN {args.method} {name}: F1 {f1:.3f} AJI {aji:.3f}")
    gaps = [abs(s["f1"] - c["f1"]) for s, c in zip(slide_rows, crop_rows, strict=True)]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"largest |F1 slide - crop| {max(gaps):.3f}; load {load}")


if __name__ == "__main__":
    main()
