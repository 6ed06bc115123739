"""Label assembly of a nuclei run: one label image, or outlines when the image would be too big.

The tiles' owned nuclei are pasted into the region's label image
(:func:`~napari_slidescope.pipeline.tiling.paste_owned`), or, beyond
:data:`DENSE_LABELS_BYTES`, kept as level-0 outlines; an array source's labels are
resampled to the array's own pixels (:func:`_to_level0`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from napari_slidescope._warnings import SlidescopeWarning
from napari_slidescope.analysis.resample import resample_nearest
from napari_slidescope.pipeline.tiling import TilePlan

__all__ = ["DENSE_LABELS_BYTES"]


#: Largest label image ``segment_nuclei`` builds with ``labels="auto"`` (1 GiB of
#: int32: 16k x 16k px at the working resolution, a 4 x 4 mm region at 0.25 µm/px).
#: Beyond it the result keeps the table and one outline per nucleus, not the image.
DENSE_LABELS_BYTES = 2**30


def _dense_labels(labels: bool | str, plan: TilePlan, is_array: bool) -> bool:
    """Whether segment_nuclei builds the label image (see its ``labels`` parameter)."""
    if is_array or labels is True:
        return True
    if labels is False:
        return False
    nbytes = 4 * math.prod(plan.shape)
    if nbytes <= DENSE_LABELS_BYTES:
        return True
    warnings.warn(
        f"segment_nuclei: the labels of this region ({plan.shape[0]} x {plan.shape[1]} px at "
        f"{plan.mpp:g} µm/px) would take {nbytes / 2**30:.1f} GiB; the result keeps the "
        "table and each nucleus's outline (labels=None). Pass labels=True to build the "
        "image anyway, or use iter_segment_nuclei to stream the tiles.",
        SlidescopeWarning,
        stacklevel=3,
    )
    return False


def _to_level0(labels: np.ndarray, plan: TilePlan) -> np.ndarray:
    """Nearest-neighbour labels on the level-0 pixels of the plan's region."""
    y0, x0, y1, x1 = plan.region
    out = np.zeros((y1 - y0, x1 - x0), labels.dtype)
    sampled = resample_nearest(
        labels,
        src_origin=plan.origin,
        src_downsample=plan.downsample,
        dst_origin=(y0, x0),
        dst_downsample=(1.0, 1.0),
        dst_shape=out.shape,
    )
    if sampled is not None:
        (r0, c0, r1, c1), patch = sampled
        out[r0:r1, c0:c1] = patch
    return out
