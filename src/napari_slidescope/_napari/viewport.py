"""What is on screen: the level-0 box of a slide layer that the canvas shows.

The visible region is computed from the camera (centre, zoom) and the canvas size,
mapped through the image layer's scale and translate to level-0 pixels, and clipped
to the slide. ``layer.corner_pixels`` is deliberately not used: it is relative to the
displayed pyramid level and, since napari 0.9, widened to chunk boundaries and only
updated when the view leaves the loaded box, so it can be many times the screen.

Pixel convention (napari's): level-0 pixel ``i`` is centred on data coordinate ``i``
and covers ``[i - 0.5, i + 0.5)``; data coordinate ``d`` is world
``translate + scale * d``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from napari_slidescope._types import Box

__all__ = ["box_to_world", "camera_of", "image_shape0", "visible_box", "visible_region"]


def visible_box(
    center: Sequence[float],
    zoom: float,
    canvas_size: Sequence[int],
    *,
    scale: Sequence[float],
    translate: Sequence[float],
    shape0: Sequence[int],
) -> Box | None:
    """Level-0 box ``(y0, x0, y1, x1)`` of the pixels a canvas shows, clipped to the slide.

    Parameters
    ----------
    center : (float, float)
        Camera centre ``(y, x)`` in world units.
    zoom : float
        Screen pixels per world unit.
    canvas_size : (int, int)
        Canvas ``(height, width)`` in screen pixels.
    scale, translate : (float, float)
        The image layer's ``(y, x)`` scale and translate (world units).
    shape0 : (int, int)
        ``(rows, cols)`` of level 0.

    Returns
    -------
    box : tuple of int or None
        Every level-0 pixel that is at least partly on screen (half-open box), or None
        when the canvas shows none of the slide.

    Raises
    ------
    ValueError
        If `zoom` or a `scale` is not positive, or the canvas has no size.

    Examples
    --------
    A 200 x 100 screen-pixel canvas at zoom 2 shows 100 x 50 µm, i.e. 200 x 100 pixels
    of a 0.5 µm/px slide (pixel centres at ``translate + scale * i``):

    >>> visible_box((50.0, 100.0), 2.0, (100, 200), scale=(0.5, 0.5),
    ...             translate=(0.25, 0.25), shape0=(1000, 1000))
    (50, 100, 150, 300)
    """
    if not (zoom > 0 and math.isfinite(zoom)):
        raise ValueError(f"zoom: expected screen px per world unit > 0, got {zoom!r}")
    if min(canvas_size) <= 0:
        raise ValueError(f"canvas_size: expected a (height, width) > 0, got {tuple(canvas_size)!r}")
    if min(abs(float(s)) for s in scale) <= 0:
        raise ValueError(f"scale: expected non-zero (y, x) per pixel, got {tuple(scale)!r}")
    lows, highs = [], []
    for c, n, s, t, size in zip(center, canvas_size, scale, translate, shape0, strict=True):
        half = float(n) / (2.0 * zoom)
        a, b = (float(c) - half - float(t)) / float(s), (float(c) + half - float(t)) / float(s)
        lo, hi = min(a, b) + 0.5, max(a, b) + 0.5  # pixel edges: pixel i spans [i, i + 1)
        i0 = max(0, math.floor(lo + 1e-9))
        i1 = min(int(size), math.ceil(hi - 1e-9))
        if i1 <= i0:
            return None
        lows.append(i0)
        highs.append(i1)
    return (lows[0], lows[1], highs[0], highs[1])


def box_to_world(
    box: Sequence[float], *, scale: Sequence[float], translate: Sequence[float]
) -> tuple[float, float, float, float]:
    """World extent ``(y0, x0, y1, x1)`` covered by a level-0 pixel box (pixel edges)."""
    y0, x0, y1, x1 = (float(v) for v in box)
    sy, sx = (float(v) for v in scale)
    ty, tx = (float(v) for v in translate)
    return (ty + sy * (y0 - 0.5), tx + sx * (x0 - 0.5), ty + sy * (y1 - 0.5), tx + sx * (x1 - 0.5))


def image_shape0(layer: Any) -> tuple[int, int]:
    """``(rows, cols)`` of level 0 of a 2D (RGB) image layer, without reading pixels."""
    data = layer.data[0] if getattr(layer, "multiscale", False) else layer.data
    shape = tuple(int(v) for v in data.shape)
    if getattr(layer, "rgb", False):
        shape = shape[:-1]
    return (shape[-2], shape[-1])


def _canvas_size(viewer: Any) -> tuple[int, int]:
    canvas = getattr(viewer, "canvas", None)
    size = getattr(canvas, "size", None)
    if size is None:  # napari < 0.6
        size = getattr(viewer, "_canvas_size", None)
    if size is None:
        raise RuntimeError("viewer: cannot find the canvas size (is the viewer shown?)")
    return (int(size[0]), int(size[1]))


def camera_of(viewer: Any) -> Any:
    """Return the viewer's camera (``viewer.scene.camera`` from napari 0.9, else ``.camera``)."""
    scene = getattr(viewer, "scene", None)
    return scene.camera if scene is not None and hasattr(scene, "camera") else viewer.camera


def visible_region(viewer: Any, layer: Any) -> Box:
    """Level-0 box of `layer` that `viewer`'s canvas shows now.

    Parameters
    ----------
    viewer : napari.Viewer
        The viewer (2D display).
    layer : napari.layers.Image
        A 2D (RGB) image layer, e.g. a slide opened by this plugin.

    Returns
    -------
    box : (int, int, int, int)
        ``(y0, x0, y1, x1)`` level-0 pixels, half-open, clipped to the slide.

    Raises
    ------
    ValueError
        If none of the slide is on screen.

    Warns
    -----
    UserWarning
        When the layer is rotated, sheared or has an affine transform (ignored) or the
        viewer shows 3D (the 2D camera centre and zoom are used).
    """
    if getattr(viewer.dims, "ndisplay", 2) != 2:
        warnings.warn("visible_region: the viewer is in 3D; using the 2D view", stacklevel=2)
    if not _is_axis_aligned(layer):
        warnings.warn(
            f"visible_region: layer {layer.name!r} is rotated, sheared or has an affine "
            "transform; only its scale and translate are used",
            stacklevel=2,
        )
    camera = camera_of(viewer)
    shape0 = image_shape0(layer)
    box = visible_box(
        tuple(camera.center)[-2:],
        float(camera.zoom),
        _canvas_size(viewer),
        scale=tuple(layer.scale)[-2:],
        translate=tuple(layer.translate)[-2:],
        shape0=shape0,
    )
    if box is None:
        raise ValueError(
            f"layer {layer.name!r}: none of the slide ({shape0[0]} x {shape0[1]} px) is on "
            "screen; pan or zoom to it, or analyse the whole slide"
        )
    return box


def _is_axis_aligned(layer: Any) -> bool:
    rotate = np.asarray(getattr(layer, "rotate", np.eye(2)), float)
    shear = np.asarray(getattr(layer, "shear", np.zeros(1)), float)
    affine = getattr(layer, "affine", None)
    aff = np.asarray(getattr(affine, "affine_matrix", np.eye(3)), float)
    return (
        np.allclose(rotate, np.eye(rotate.shape[0]))
        and np.allclose(shear, 0)
        and np.allclose(aff, np.eye(aff.shape[0]))
    )


def clicked_label(layer: Any, event: Any) -> int | None:
    """Return the label id under a mouse click on a (multiscale) Labels layer, or None."""
    value = layer.get_value(
        event.position,
        view_direction=event.view_direction,
        dims_displayed=event.dims_displayed,
        world=True,
    )
    if isinstance(value, tuple):  # multiscale: (level, value)
        value = value[1]
    return int(value) if value is not None and int(value) > 0 else None
