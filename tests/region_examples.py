"""Strokes a user would draw on a synthetic region slide, with the class under each known.

``strokes(truth, per_class, seed)`` samples short horizontal strokes inside each class of a
:class:`~napari_slidescope.sample_regions.RegionTruth` (what
:func:`~napari_slidescope.write_region_slide` returns), as the examples that
:func:`~napari_slidescope.train_region_classifier` takes. The region classifier's tests
and the batch's regions tests train on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope import Stroke
from napari_slidescope.sample_regions import REGION_CLASSES, TRUTH_MPP


def strokes(truth: Any, per_class: int, seed: int = 1) -> dict[str, list[Stroke]]:
    """Return `per_class` short horizontal strokes (80 µm wide at 0.5 µm/px) per class.

    Each stroke is three level-0 ``(row, col)`` vertices 40 px apart, centred on a truth
    pixel at least four truth pixels inside its class (where there is one), 10 µm wide;
    `seed` picks the pixels.
    """
    from scipy import ndimage

    px = TRUTH_MPP / truth.mpp  # level-0 px per truth pixel
    rng = np.random.default_rng(seed)
    out = {}
    for k, name in enumerate(REGION_CLASSES, start=1):
        inner = ndimage.binary_erosion(truth.labels == k, iterations=4)
        ys, xs = np.nonzero(inner if inner.any() else truth.labels == k)
        pick = rng.choice(len(ys), per_class, replace=len(ys) < per_class)
        out[name] = [
            Stroke(
                np.array([[(ys[i] + 0.5) * px, (xs[i] + 0.5) * px + d] for d in (-40, 0, 40)]),
                10.0,
            )
            for i in pick
        ]
    return out
