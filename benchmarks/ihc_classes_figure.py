"""The README screenshot of cell classes on a real IHC image: scikit-image's immunohistochemistry().

``skimage.data.immunohistochemistry()`` is a 512 x 512 RGB crop of a hematoxylin-DAB
stained section (membranous and cytoplasmic brown). It has no calibration: it is read
as 0.5 µm/px. Nuclei are segmented with the built-in method (``stain="auto"`` finds the
slide H-DAB and segments on hematoxylin + DAB), grown 3 µm into cells, and scored on the
mean DAB OD of the **cell** (a membrane marker) with QuPath's 0.2 / 0.4 / 0.6. napari shows
the image, the nuclei in their class colours, the cell outlines, and the "Cell classes"
legend. There is no ground truth: the figure is for the eye.

Usage (needs a display: ``xvfb-run -a``)::

    python benchmarks/ihc_classes_figure.py [--out docs/images/ihc_classes.png]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from skimage import data

from napari_slidescope import SlidescopeWarning, classify_cells, segment_nuclei

MPP = 0.5


def main(argv: list[str] | None = None) -> int:
    """Write the screenshot; return the exit status."""
    import napari
    from skimage import io

    from napari_slidescope._napari.layers import aligned_transform
    from napari_slidescope._qt.cell_classes_dock import _legend, add_cells, show_classes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--out", type=Path, default=root / "docs" / "images" / "ihc_classes.png")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", SlidescopeWarning)
    rgb = data.immunohistochemistry()
    res = segment_nuclei(rgb, mpp=MPP, segmenter="builtin", tissue=False, cell_expansion_um=3)
    res = classify_cells(res, dab={"thresholds": (0.2, 0.4, 0.6), "compartment": "cell"})
    viewer = napari.Viewer(show=True)
    image = viewer.add_image(rgb, name="immunohistochemistry", scale=(MPP, MPP), rgb=True)
    scale, translate = aligned_transform(image, res.origin, res.downsample)
    nuclei = viewer.add_labels(res.labels, name="nuclei", scale=scale, translate=translate)
    nuclei.features = {"index": res.columns["id"]}
    show_classes(nuclei, res)
    nuclei.opacity = 0.8
    add_cells(viewer, res, image)
    _legend(viewer, res, None)
    viewer.window._qt_window.resize(1400, 900)
    viewer.reset_view()
    napari.qt.get_qapp().processEvents()
    shot = viewer.screenshot(canvas_only=False, flash=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    io.imsave(args.out, shot, check_contrast=False)
    counts = {c: int((res.columns["class"] == c).sum()) for c in res.classes}
    print(f"{res.count} cells, stain columns {[c for c in res.columns if c.startswith('dab')][:3]}")
    print(f"classes {counts}; wrote {args.out}")
    viewer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
