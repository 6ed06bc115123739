"""Annotated crops laid out on glass as a whole slide, to score a slide like its crops.

Accuracy measured on crops says little about what a user gets from ``segment_nuclei(path)``
on a whole slide: tissue detection, the per-slide preparation (stain vectors, intensity
scaling), tile seams and the slide's magnification all come in between. This module builds
the check: annotated images are laid out on a glass background with a gap between them
(:func:`lay_on_glass`), written as a tiled pyramidal Aperio-SVS-like file
(:func:`write_svs`), optionally downsampled (a 40x set becomes a 20x slide, ground truth
resampled alongside, :func:`downsample`), and each image's area of the slide's result is
scored against its own ground truth (:func:`score_areas`).
``benchmarks/nuclei_slides.py`` runs it on MoNuSeg images; the tests on a synthetic image.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope._types import Box

__all__ = ["GlassLayout", "downsample", "lay_on_glass", "score_areas", "write_svs"]

#: RGB of the empty glass (a scanner's white-balanced background, slightly off white).
GLASS_RGB = (236, 236, 234)


@dataclass(frozen=True)
class GlassLayout:
    """Where each image lies on a glass canvas.

    Attributes
    ----------
    shape : (int, int)
        Level-0 ``(rows, cols)`` of the canvas.
    boxes : tuple of Box
        Level-0 box ``(y0, x0, y1, x1)`` of each image, in the order given.
    mpp : float
        Level-0 µm per pixel.
    """

    shape: tuple[int, int]
    boxes: tuple[Box, ...]
    mpp: float


def lay_on_glass(
    images: Sequence[np.ndarray],
    truths: Sequence[np.ndarray],
    *,
    mpp: float,
    gap: int = 300,
    columns: int | None = None,
    align: int = 16,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, GlassLayout]:
    """Lay RGB images and their instance labels out on glass, in a grid.

    Parameters
    ----------
    images : sequence of (M, N, 3) ndarray of uint8
        The annotated images (any sizes).
    truths : sequence of (M, N) ndarray of int
        Their instance labels (0 = background), same shapes as `images`.
    mpp : float
        µm per pixel of the images.
    gap : int
        Pixels of glass between images and around them.
    columns : int, optional
        Images per row; default ``ceil(sqrt(len(images)))``.
    align : int
        Every image starts on a multiple of this many pixels (so a downsample by a
        divisor of it keeps each image on whole pixels).
    seed : int
        Seed of the glass's faint noise (a scanner's glass is never one value).

    Returns
    -------
    rgb : (H, W, 3) ndarray of uint8
        The slide.
    truth : (H, W) ndarray of int32
        Slide-wide instance labels: image ``k``'s nuclei get ids after image ``k-1``'s.
    layout : GlassLayout

    Raises
    ------
    ValueError
        If there are no images, the counts or shapes differ, or an image is not RGB uint8.
    """
    if not images or len(images) != len(truths):
        raise ValueError(
            f"images, truths: expected the same non-zero count, got {len(images)} and {len(truths)}"
        )
    for k, (im, tr) in enumerate(zip(images, truths, strict=True)):
        if im.ndim != 3 or im.shape[2] != 3 or im.dtype != np.uint8:
            raise ValueError(f"images[{k}]: expected (M, N, 3) uint8, got {im.shape} {im.dtype}")
        if tr.shape != im.shape[:2]:
            raise ValueError(f"truths[{k}]: shape {tr.shape} differs from its image {im.shape}")
    if gap < 0 or align < 1:
        raise ValueError(f"gap >= 0 and align >= 1 expected, got gap={gap}, align={align}")
    cols = columns or math.ceil(math.sqrt(len(images)))

    def up(v: int) -> int:
        return -(-v // align) * align

    rows = [images[i : i + cols] for i in range(0, len(images), cols)]
    col_w = [up(max(im.shape[1] for im in images[c::cols])) for c in range(cols)]
    row_h = [up(max(im.shape[0] for im in r)) for r in rows]
    step = up(gap)
    height = step + sum(h + step for h in row_h)
    width = step + sum(w + step for w in col_w)
    rng = np.random.default_rng(seed)
    rgb = np.empty((height, width, 3), np.uint8)
    rgb[:] = GLASS_RGB
    noise = rng.integers(-2, 3, size=(height, width, 1), dtype=np.int16)
    rgb[:] = np.clip(rgb.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    truth = np.zeros((height, width), np.int32)
    boxes = []
    offset = 0
    for k, (im, tr) in enumerate(zip(images, truths, strict=True)):
        r, c = divmod(k, cols)
        y0 = step + sum(h + step for h in row_h[:r])
        x0 = step + sum(w + step for w in col_w[:c])
        y1, x1 = y0 + im.shape[0], x0 + im.shape[1]
        rgb[y0:y1, x0:x1] = im
        ids = np.asarray(tr).astype(np.int64)
        _, inverse = np.unique(ids, return_inverse=True)
        dense = inverse.reshape(ids.shape).astype(np.int32)  # 0 stays 0 when present
        if not (ids == 0).any():
            dense += 1
        truth[y0:y1, x0:x1] = np.where(dense > 0, dense + offset, 0)
        offset += int(np.max(dense))
        boxes.append((y0, x0, y1, x1))
    return rgb, truth, GlassLayout((height, width), tuple(boxes), float(mpp))


def downsample(
    rgb: np.ndarray, truth: np.ndarray, layout: GlassLayout, factor: int = 2
) -> tuple[np.ndarray, np.ndarray, GlassLayout]:
    """Make a lower magnification of a glass slide: pixels block-averaged, labels sampled.

    Output pixel ``(i, j)`` is the mean of the ``factor x factor`` block it covers; its
    label is the one under the block's centre (nearest neighbour, never mixed).

    Returns
    -------
    rgb, truth, layout
        As :func:`lay_on_glass` returns them, at ``layout.mpp * factor`` µm/px.
    """
    from napari_slidescope.analysis.resample import block_mean

    if factor < 1 or int(factor) != factor:
        raise ValueError(f"factor: expected an integer >= 1, got {factor!r}")
    f = int(factor)
    small = block_mean(rgb, f)
    h, w = small.shape[:2]
    c = f // 2
    lab = np.zeros((h, w), truth.dtype)
    sampled = truth[c::f, c::f]
    lab[: sampled.shape[0], : sampled.shape[1]] = sampled
    boxes = tuple((y0 // f, x0 // f, -(-y1 // f), -(-x1 // f)) for y0, x0, y1, x1 in layout.boxes)
    return small, lab, GlassLayout((h, w), boxes, layout.mpp * f)


def write_svs(
    path: str | os.PathLike[str],
    rgb: np.ndarray,
    *,
    mpp: float,
    tile: int = 256,
    quality: int = 90,
    compression: str = "jpeg",
) -> Path:
    """Write an RGB image as a tiled pyramidal Aperio-SVS-like TIFF (JPEG tiles).

    Level 0 and 4x-reduced levels down to one tile, a thumbnail page, ``MPP`` and
    ``AppMag`` in the description; written to a temporary name and renamed.
    ``compression="zlib"`` writes lossless tiles (the slide's pixels are then exactly the
    image's, so a comparison with crops measures the slide path alone, not the codec).

    Returns
    -------
    Path
        `path`.
    """
    import tifffile

    from napari_slidescope.analysis.resample import block_mean

    path = Path(path)
    h, w = rgb.shape[:2]
    levels = [np.ascontiguousarray(rgb)]
    while min(levels[-1].shape[:2]) // 4 >= tile:
        levels.append(block_mean(levels[-1], 4))
    thumb = levels[-1][::2, ::2]
    desc = (
        "Aperio Image Library v12.0.15 \r\n"
        f"{w}x{h} [0,0 {w}x{h}] ({tile}x{tile}) {compression.upper()}/RGB Q={quality}"
        f"|AppMag = {round(10 / mpp)}|MPP = {mpp:.4f}|Filename = napari-slidescope glass slide"
    )
    opts: dict[str, Any] = {"photometric": "rgb", "compression": compression, "metadata": None}
    if compression == "jpeg":
        opts["compressionargs"] = {"level": quality}
    with (
        atomic_write(path, "wb") as fh,
        tifffile.TiffWriter(fh, bigtiff=h * w * 3 > 2**31) as tif,
    ):
        tif.write(levels[0], tile=(tile, tile), description=desc, **opts)
        tif.write(thumb, description=desc.replace("/RGB", "/RGB thumbnail"), **opts)
        for lv in levels[1:]:
            tif.write(lv, tile=(tile, tile), description=desc, **opts)
    return path


def score_areas(result: Any, truth: np.ndarray, layout: GlassLayout) -> list[dict[str, float]]:
    """Score a slide's nuclei result on each image's area against its ground truth.

    Parameters
    ----------
    result : NucleiResult
        ``segment_nuclei(path)`` of the whole glass slide, with ``labels`` (its working
        grid: ``origin``, ``downsample``).
    truth : (H, W) ndarray of int
        The slide-wide ground truth (level 0).
    layout : GlassLayout
        The slide's layout.

    Returns
    -------
    list of dict
        One :func:`~napari_slidescope.analysis.metrics.instance_scores` dict per image,
        scored on the level-0 grid (the result's labels sampled at level-0 pixel centres).

    Raises
    ------
    ValueError
        If the result has no label image.
    """
    from napari_slidescope.analysis.metrics import instance_scores
    from napari_slidescope.analysis.resample import resample_nearest

    if getattr(result, "labels", None) is None:
        raise ValueError("result: has no label image (segment_nuclei(..., labels=True))")
    scores = []
    for y0, x0, y1, x1 in layout.boxes:
        shape = (y1 - y0, x1 - x0)
        pred = np.zeros(shape, np.int32)
        got = resample_nearest(
            np.asarray(result.labels),
            src_origin=result.origin,
            src_downsample=result.downsample,
            dst_origin=(y0, x0),
            dst_downsample=(1.0, 1.0),
            dst_shape=shape,
        )
        if got is not None:
            (by0, bx0, by1, bx1), values = got
            pred[by0:by1, bx0:bx1] = values
        scores.append(instance_scores(np.asarray(truth[y0:y1, x0:x1]), pred))
    return scores
