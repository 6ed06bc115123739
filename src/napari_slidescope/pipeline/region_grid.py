"""The working-resolution pixel grid of tissue-region classification, and reads on it.

A working pixel is ``factor x factor`` pixels of one pyramid level (the coarsest level not
coarser than the target µm/px, averaged by the whole factor that comes nearest the
target), so its pixel size is exact and the grid is the same for every tile: a tile is a
box of working pixels, read as that many level pixels and block-averaged. Beyond the slide
the image is mirrored (``numpy.pad`` ``symmetric``), the same for a tile and for an untiled
read, which keeps tiled and untiled features identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis.resample import block_mean
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser, nearest_factor

__all__ = ["WorkingGrid", "read_working", "working_grid"]


@dataclass(frozen=True)
class WorkingGrid:
    """Where the working pixels lie on a slide.

    Attributes
    ----------
    level : int
        Pyramid level read.
    factor : int
        Level pixels per working pixel (each axis).
    downsample : (float, float)
        Level-0 pixels per working pixel ``(y, x)``.
    mpp : float
        µm per working pixel (the mean of the two axes).
    shape : (int, int)
        The whole slide in working pixels.
    level_shape : (int, int)
        The level's size in its own pixels.
    """

    level: int
    factor: int
    downsample: tuple[float, float]
    mpp: float
    shape: tuple[int, int]
    level_shape: tuple[int, int]

    def box_of(self, region: Box) -> Box:
        """Working-pixel box covering the level-0 box `region`, clipped to the grid."""
        y0, x0, y1, x1 = region
        dy, dx = self.downsample
        h, w = self.shape
        return (
            max(0, math.floor(y0 / dy)),
            max(0, math.floor(x0 / dx)),
            min(h, math.ceil(y1 / dy)),
            min(w, math.ceil(x1 / dx)),
        )


def slide_name(slide: Any) -> str:
    """Return the slide's path (or "slide") for messages."""
    return str(getattr(slide, "path", None) or getattr(slide, "name", None) or "slide")


def working_grid(slide: Any, target_mpp: float) -> WorkingGrid:
    """Return the working grid nearest `target_mpp` on `slide`.

    Raises
    ------
    ValueError
        If the slide has no pixel size (the scales in µm would mean nothing), or the
        target is not positive.
    """
    if not target_mpp > 0:
        raise ValueError(f"mpp: expected a positive working pixel size in µm, got {target_mpp!r}")
    if slide.mpp is None:
        raise ValueError(
            f"{slide_name(slide)}: the slide has no pixel size (µm/px), which region "
            "classification needs (its scales are in µm); pass mpp=<level-0 µm/px>"
        )
    my, mx = (float(v) for v in slide.mpp)
    target = (target_mpp / my, target_mpp / mx)
    level = coarsest_level_not_coarser(slide.downsamples, target)
    ly, lx = slide.downsamples[level]
    factor = nearest_factor(ly, target[0])
    lh, lw = slide.level_shapes[level] if hasattr(slide, "level_shapes") else _shape(slide, level)
    dy, dx = ly * factor, lx * factor
    return WorkingGrid(
        level=level,
        factor=factor,
        downsample=(dy, dx),
        mpp=float((my * dy + mx * dx) / 2),
        shape=(math.ceil(lh / factor), math.ceil(lw / factor)),
        level_shape=(int(lh), int(lw)),
    )


def _shape(slide: Any, level: int) -> tuple[int, int]:
    arr = slide.levels[level]
    return int(arr.shape[0]), int(arr.shape[1])


def read_working(slide: Any, grid: WorkingGrid, box: Box, halo: int = 0) -> np.ndarray:
    """Read the working-pixel box `box` grown by `halo` on every side, as RGB uint8.

    The part beyond the slide mirrors the slide's edge (``symmetric``), so a tile at the
    edge and an untiled read see the same pixels.

    Returns
    -------
    (y1 - y0 + 2 halo, x1 - x0 + 2 halo, 3) ndarray of uint8
    """
    y0, x0, y1, x1 = (int(v) for v in box)
    gy0, gx0, gy1, gx1 = y0 - halo, x0 - halo, y1 + halo, x1 + halo
    h, w = grid.shape
    cy0, cx0, cy1, cx1 = max(gy0, 0), max(gx0, 0), min(gy1, h), min(gx1, w)
    f = grid.factor
    lh, lw = grid.level_shape
    lbox = (cy0 * f, cx0 * f, min(cy1 * f, lh), min(cx1 * f, lw))
    pixels = np.asarray(slide.read_level(grid.level, lbox))
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[..., None], 3, axis=2)
    if pixels.shape[2] > 3:
        pixels = pixels[..., :3]
    if pixels.dtype != np.uint8:
        raise ValueError(
            f"{slide_name(slide)}: region classification needs 8-bit RGB, got {pixels.dtype}"
        )
    img = block_mean(pixels, f) if f > 1 else pixels
    pad = ((cy0 - gy0, gy1 - cy1), (cx0 - gx0, gx1 - cx1), (0, 0))
    if any(p for pair in pad for p in pair):
        img = _mirror(img, pad)
    return np.ascontiguousarray(img)


def _mirror(img: np.ndarray, pad: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``np.pad(symmetric)`` that also works when the pad exceeds the image (repeats)."""
    while True:
        step = tuple((min(a, n), min(b, n)) for (a, b), n in zip(pad, img.shape, strict=True))
        img = np.pad(img, step, mode="symmetric")
        pad = tuple((a - sa, b - sb) for (a, b), (sa, sb) in zip(pad, step, strict=True))
        if not any(p for pair in pad for p in pair):
            return img
