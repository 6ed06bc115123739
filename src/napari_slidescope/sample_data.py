"""A deterministic synthetic H&E slide: the bundled sample and the test fixture generator.

The slide is rendered with the Beer-Lambert law from hematoxylin and eosin
concentration maps (pink stroma, purple nuclei, white glass, lumen holes), so colour
deconvolution behaves as on real H&E. It is written as an Aperio-SVS-like pyramidal
TIFF (256 x 256 JPEG tiles, 4x reduced levels, a thumbnail page, ``MPP`` and ``AppMag``
in the description) and comes with its ground truth: the tissue mask and every
nucleus' centre and radii.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope._io import atomic_write

#: Level-0 downsample of the ground-truth tissue mask.
TRUTH_DOWNSAMPLE = 16

# Stain optical-density vectors (Ruifrok & Johnston), normalised.
_H = np.array([0.650, 0.704, 0.286])
_E = np.array([0.072, 0.990, 0.105])
_H = (_H / np.linalg.norm(_H)).astype(np.float32)
_E = (_E / np.linalg.norm(_E)).astype(np.float32)

SAMPLE_VERSION = 1


@dataclass(frozen=True)
class SampleTruth:
    """Ground truth of a synthetic slide.

    Attributes
    ----------
    tissue_mask : (M, N) ndarray of bool
        Tissue at ``TRUTH_DOWNSAMPLE`` x downsample; ``tissue_mask[0, 0]`` is level-0 (0, 0).
    downsample : int
        Level-0 pixels per mask pixel.
    nuclei : (K, 4) ndarray of float
        One row per nucleus: centre row, centre col (level-0 px), semi-axes (px).
    mpp : float
        Level-0 micrometres per pixel.
    shape : (int, int)
        Level-0 (rows, cols).
    """

    tissue_mask: np.ndarray
    downsample: int
    nuclei: np.ndarray
    mpp: float
    shape: tuple[int, int]


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    field = ndi.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma, mode="wrap")
    return (field - field.mean()) / (field.std() + 1e-6)


def make_truth(
    shape: tuple[int, int], *, mpp: float = 0.25, seed: int = 0, nuclei_per_mm2: float = 2500.0
) -> SampleTruth:
    """Draw the tissue layout and nuclei of a synthetic slide (no pixels rendered)."""
    rng = np.random.default_rng(seed)
    h, w = shape
    th, tw = -(-h // TRUTH_DOWNSAMPLE), -(-w // TRUTH_DOWNSAMPLE)
    blob = _smooth_noise(rng, (th, tw), sigma=max(th, tw) / 10)
    # Keep a glass margin so tissue pieces are separate objects on glass.
    yy, xx = np.mgrid[0:th, 0:tw]
    edge = np.minimum(np.minimum(yy, xx), np.minimum(th - 1 - yy, tw - 1 - xx))
    edge = edge / max(min(th, tw) * 0.12, 1)
    tissue = (blob + 0.9 * (1 - np.clip(edge, 0, 1)) * -1.5) > 0.1
    lumen_scale = 80.0 / (mpp * TRUTH_DOWNSAMPLE)  # holes ~ 80 µm across
    holes = _smooth_noise(rng, (th, tw), sigma=max(lumen_scale / 3, 1.0)) > 1.6
    tissue &= ~holes
    tissue = ndi.binary_opening(tissue, iterations=2)
    area_mm2 = tissue.sum() * (TRUTH_DOWNSAMPLE * mpp / 1000) ** 2
    n = rng.poisson(nuclei_per_mm2 * area_mm2)
    cy = rng.uniform(0, h, n)
    cx = rng.uniform(0, w, n)
    inside = tissue[(cy // TRUTH_DOWNSAMPLE).astype(int), (cx // TRUTH_DOWNSAMPLE).astype(int)]
    cy, cx = cy[inside], cx[inside]
    k = cy.size
    radius_um = rng.uniform(2.5, 4.5, k)
    aspect = rng.uniform(1.0, 1.6, k)
    ry = radius_um / mpp * np.sqrt(aspect)
    rx = radius_um / mpp / np.sqrt(aspect)
    nuclei = np.stack([cy, cx, ry, rx], axis=1)
    return SampleTruth(tissue, TRUTH_DOWNSAMPLE, nuclei, mpp, (h, w))


def render_region(truth: SampleTruth, y0: int, y1: int, *, seed: int = 0) -> np.ndarray:
    """Render level-0 rows ``y0:y1`` (all columns) of the synthetic slide as RGB uint8."""
    h, w = truth.shape
    rng = np.random.default_rng((seed, y0))
    rows = y1 - y0
    bank = rng.standard_normal((2, 512, 512)).astype(np.float32)
    reps = (-(-rows // 512), -(-w // 512))
    grain = np.tile(bank[0], reps)[:rows, :w]
    grain2 = np.tile(bank[1], reps)[:rows, :w]
    ds = truth.downsample
    # Tissue at level 0: the truth mask, nearest-neighbour upsampled (so truth is exact).
    rows_idx = np.arange(y0, y1) // ds
    tissue = np.repeat(truth.tissue_mask[rows_idx], ds, axis=1)[:, :w]
    eosin = np.where(tissue, 0.35, 0.0).astype(np.float32)
    eosin *= 1 + 0.25 * grain
    hema = np.where(tissue, 0.04, 0.0).astype(np.float32)
    sel = (truth.nuclei[:, 0] + truth.nuclei[:, 2] >= y0) & (
        truth.nuclei[:, 0] - truth.nuclei[:, 2] < y1
    )
    for cy, cx, ry, rx in truth.nuclei[sel]:
        by0, by1 = int(max(cy - ry - 1, y0)), int(min(cy + ry + 2, y1))
        bx0, bx1 = int(max(cx - rx - 1, 0)), int(min(cx + rx + 2, w))
        yy, xx = np.mgrid[by0:by1, bx0:bx1]
        d = ((yy + 0.5 - cy) / ry) ** 2 + ((xx + 0.5 - cx) / rx) ** 2
        inside = np.clip((1.15 - d) * 4, 0, 1).astype(np.float32)
        patch = hema[by0 - y0 : by1 - y0, bx0:bx1]
        np.maximum(patch, inside * 0.9, out=patch)
    hema *= 1 + 0.1 * grain2
    od = hema[..., None] * _H + eosin[..., None] * _E
    od += np.float32(0.03)
    np.clip(od, 0, None, out=od)
    np.negative(od, out=od)
    np.exp(od, out=od)
    od *= np.float32(255.0)
    od += np.float32(2.0) * grain2[..., None]
    return np.clip(od, 0, 255).astype(np.uint8)


def write_sample_slide(
    path: str | os.PathLike[str],
    *,
    shape: tuple[int, int] = (8192, 8192),
    mpp: float = 0.25,
    seed: int = 0,
    tile: int = 256,
    quality: int = 90,
) -> SampleTruth:
    """Write a synthetic H&E slide as an Aperio-SVS-like pyramidal TIFF.

    Parameters
    ----------
    path : str or PathLike
        Output file (written to a temporary name, then renamed, so a crash never leaves
        a half-written slide behind).
    shape : (int, int)
        Level-0 (rows, cols).
    mpp : float
        Level-0 micrometres per pixel.
    seed : int
        Random seed; the same seed gives the same slide.
    tile : int
        Tile size in pixels.
    quality : int
        JPEG quality.

    Returns
    -------
    SampleTruth
        Tissue mask and nuclei of the slide.
    """
    path = Path(path)
    truth = make_truth(shape, mpp=mpp, seed=seed)
    h, w = shape
    level0 = np.empty((h, w, 3), np.uint8)
    band = 1024
    for y in range(0, h, band):
        level0[y : y + band] = render_region(truth, y, min(y + band, h), seed=seed)
    levels = _pyramid(level0, tile)
    _write_svs(path, levels, mpp=mpp, tile=tile, quality=quality, name="napari-slidescope sample")
    return truth


def _pyramid(level0: np.ndarray, tile: int) -> list[np.ndarray]:
    """Level 0 and its 4x block means, down to the last level at least one tile across."""
    levels = [level0]
    while min(levels[-1].shape[:2]) // 4 >= tile:
        prev = levels[-1]
        ph, pw = prev.shape[0] // 4 * 4, prev.shape[1] // 4 * 4
        blocks = prev[:ph, :pw].reshape(ph // 4, 4, pw // 4, 4, 3)
        levels.append((blocks.sum((1, 3), dtype=np.uint16) // 16).astype(np.uint8))
    return levels


def _write_svs(
    path: str | os.PathLike[str],
    levels: list[np.ndarray],
    *,
    mpp: float,
    tile: int = 256,
    quality: int = 90,
    name: str = "napari-slidescope sample",
) -> None:
    """Write RGB levels as an Aperio-SVS-like TIFF (level 0, a thumbnail, the other levels)."""
    import tifffile

    h, w = levels[0].shape[:2]
    thumb = levels[-1][::2, ::2]
    desc = (
        "Aperio Image Library v12.0.15 \r\n"
        f"{w}x{h} [0,0 {w}x{h}] ({tile}x{tile}) JPEG/RGB Q={quality}"
        f"|AppMag = {round(10 / mpp)}|MPP = {mpp:.4f}|Filename = {name}"
    )
    opts: dict[str, Any] = {
        "photometric": "rgb",
        "compression": "jpeg",
        "compressionargs": {"level": quality},
        "metadata": None,
    }
    with (
        atomic_write(path, "wb") as fh,
        tifffile.TiffWriter(fh, bigtiff=h * w * 3 > 2**31) as tif,
    ):
        tif.write(levels[0], tile=(tile, tile), description=desc, **opts)
        tif.write(thumb, description=desc.replace("JPEG/RGB", "thumbnail JPEG/RGB"), **opts)
        for lv in levels[1:]:
            tif.write(lv, tile=(tile, tile), description=desc, **opts)


def cache_dir() -> Path:
    """Folder for generated slides: ``$SLIDESCOPE_CACHE`` or ``~/.cache/napari-slidescope``."""
    root = os.environ.get("SLIDESCOPE_CACHE") or Path.home() / ".cache" / "napari-slidescope"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sample_slide_path() -> Path:
    """Return the bundled sample slide, writing it to the cache folder on first use."""
    path = cache_dir() / f"slidescope-sample-v{SAMPLE_VERSION}.svs"
    if not path.exists():
        write_sample_slide(path)
    return path
