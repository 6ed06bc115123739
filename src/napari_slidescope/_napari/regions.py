"""napari glue of tissue regions: strokes from a Shapes layer, the class map as a Labels layer.

A Shapes layer aligned with the slide holds the examples: each shape's class is its
``class`` feature; paths and lines are strokes (:class:`~napari_slidescope.Stroke`, resolution
free, as QuPath's line annotations), polygons, rectangles and ellipses are areas. A
:class:`~napari_slidescope.RegionMap` is shown as a multiscale Labels layer drawn exactly over
the slide (the class colours, 0 transparent).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope._napari.layers import _units, aligned_transform
from napari_slidescope._napari.shapes import from_layer_coords
from napari_slidescope.pipeline.region_classifier import DEFAULT_STROKE_UM, Stroke
from napari_slidescope.pipeline.region_map import RegionMap
from napari_slidescope.pipeline.task_table import task

__all__ = ["examples_from_shapes", "show_regions"]


def _ellipse(corners: np.ndarray, n: int = 48) -> np.ndarray:
    lo, hi = corners.min(axis=0), corners.max(axis=0)
    c, r = (lo + hi) / 2, (hi - lo) / 2
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.column_stack([c[0] + r[0] * np.sin(t), c[1] + r[1] * np.cos(t)])


def examples_from_shapes(
    layer: Any, *, stroke_width_um: float = DEFAULT_STROKE_UM, feature: str = "class"
) -> dict[str, list[Any]]:
    """Return training examples (class -> polygons and strokes) drawn on a Shapes layer.

    Parameters
    ----------
    layer : napari.layers.Shapes
        Aligned with the slide (data coordinates are level-0 pixels); each shape's class
        in its `feature` feature (shapes without one are left out).
    stroke_width_um : float
        Width of the strokes (paths and lines), µm.

    Returns
    -------
    dict of str to list of (N, 2) ndarray or Stroke
        What :func:`~napari_slidescope.train_region_classifier` takes as ``examples``.
    """
    feats = layer.features
    if feature not in feats or not len(layer.data):
        return {}
    out: dict[str, list[Any]] = {}
    for verts, kind, cls in zip(layer.data, layer.shape_type, feats[feature], strict=True):
        if cls is None or (isinstance(cls, float) and np.isnan(cls)) or str(cls) == "":
            continue
        v = from_layer_coords(np.asarray(verts))
        if kind in ("path", "line"):
            item: Any = Stroke(v, float(stroke_width_um))
        elif kind == "ellipse":
            item = _ellipse(v)
        else:
            item = v
        out.setdefault(str(cls), []).append(item)
    return out


def show_regions(viewer: Any, image: Any, regions: RegionMap, *, name: str | None = None) -> Any:
    """Show (or update) a class map as a multiscale Labels layer over `image`.

    Returns
    -------
    napari.layers.Labels
        Named ``"<image> regions"`` unless `name` is given; a layer of that name is
        reused.
    """
    from napari.utils.colormaps import DirectLabelColormap

    name = name or task("regions").layer_name(image.name)
    scale, translate = aligned_transform(image, regions.origin, regions.downsample)
    mapping: dict[Any, Any] = {None: np.zeros(4)}
    mapping.update({k: np.asarray(v, float) for k, v in regions.colormap().items()})
    cmap = DirectLabelColormap(color_dict=mapping)
    levels = regions.pyramid()
    data: Any = levels if len(levels) > 1 else levels[0]
    if name in viewer.layers:
        layer = viewer.layers[name]
        if bool(layer.multiscale) == (len(levels) > 1):
            layer.data = data
            layer.scale, layer.translate = scale, translate
            layer.colormap = cmap
            return layer
        viewer.layers.remove(layer)
    return viewer.add_labels(
        data,
        name=name,
        scale=scale,
        translate=translate,
        opacity=0.5,
        colormap=cmap,
        multiscale=len(levels) > 1,
        **_units(image),
    )
