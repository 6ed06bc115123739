"""Synthetic H&E with three nucleus populations of known class, for cell-classifier checks.

Rendered by the Beer-Lambert law like :mod:`napari_slidescope.sample_data`, at any pixel
size, from nuclei placed in µm:

- ``Lymphocyte``: small (5.6-8.6 µm across), round, dark and even hematoxylin (OD ~1.0);
- ``Tumor``: large (9-17 µm), slightly oval, pale vesicular chromatin (OD ~0.6) with a
  darker rim and one or two dark nucleoli (~1.5 µm), in nests;
- ``Spindle``: elongated (14-24 x 3.5-5 µm), medium OD (~0.75), in the stroma between nests;
  a third of them cut across the section, short and roundish (5-10 x 3.5-5 µm).

Sizes and ODs overlap between classes (OD varies by ±20 % per nucleus, lymphocytes reach
8.6 µm and tumour nuclei go down to 9 µm across).

Lymphocytes sit mostly in the stroma, some inside the nests. A 20x version of an image is its
40x rendering averaged over 2 x 2 pixels in intensity, as a scanner's optics would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

__all__ = ["CLASS_NAMES", "CellsTruth", "downsample_rgb", "make_cells_image", "write_cells_slide"]

CLASS_NAMES: tuple[str, ...] = ("Lymphocyte", "Tumor", "Spindle")

_H = np.array([0.650, 0.704, 0.286])
_E = np.array([0.072, 0.990, 0.105])
_H = (_H / np.linalg.norm(_H)).astype(np.float32)
_E = (_E / np.linalg.norm(_E)).astype(np.float32)


@dataclass(frozen=True)
class CellsTruth:
    """Nuclei of a synthetic image.

    Attributes
    ----------
    centers_um : (K, 2) ndarray of float
        Centres ``(y, x)`` in µm from the image's top-left corner.
    classes : (K,) ndarray of int
        Index into :data:`CLASS_NAMES`.
    labels : (M, N) ndarray of int32
        Nucleus ``k + 1`` where nucleus ``k`` covers a pixel (0 elsewhere), at ``mpp``.
    mpp : float
        µm per pixel of ``labels``.
    """

    centers_um: np.ndarray
    classes: np.ndarray
    labels: np.ndarray
    mpp: float

    def class_at(self, y_um: np.ndarray, x_um: np.ndarray) -> np.ndarray:
        """Class index at points in µm (-1 where no nucleus is)."""
        r = np.clip((np.asarray(y_um) / self.mpp).astype(int), 0, self.labels.shape[0] - 1)
        c = np.clip((np.asarray(x_um) / self.mpp).astype(int), 0, self.labels.shape[1] - 1)
        k = self.labels[r, c]
        return np.where(k > 0, self.classes[np.maximum(k - 1, 0)], -1)


def _place(rng: np.random.Generator, size_um: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres, classes and half-lengths of non-overlapping nuclei in a square of `size_um`."""
    yy, xx = np.mgrid[0:64, 0:64]
    field = ndi.gaussian_filter(rng.standard_normal((64, 64)), 6, mode="wrap")
    field = (field - field.mean()) / field.std()
    nest = field > 0.3  # tumour nests on ~38 % of the area
    cand = rng.uniform(0, size_um, (int(size_um**2 / 60), 2))
    cell = (cand / size_um * 64).astype(int).clip(0, 63)
    in_nest = nest[cell[:, 0], cell[:, 1]]
    u = rng.uniform(size=len(cand))
    cls = np.where(in_nest, np.where(u < 0.85, 1, 0), np.where(u < 0.5, 2, 0))
    half = np.array([4.5, 8.5, 12.0])[cls]  # longest half-length (µm), for spacing
    keep: list[int] = []
    pts = np.zeros((0, 2))
    reach = np.zeros(0)
    for k in range(len(cand)):
        if pts.size:
            d = np.hypot(*(pts - cand[k]).T)
            if np.any(d < 0.8 * (reach + half[k])):
                continue
        keep.append(k)
        pts = np.vstack([pts, cand[k]])
        reach = np.append(reach, half[k])
    idx = np.array(keep, int)
    return cand[idx], cls[idx], half[idx]


def make_cells_image(
    size_um: float = 256.0, *, mpp: float = 0.25, seed: int = 0
) -> tuple[np.ndarray, CellsTruth]:
    """Render a square synthetic H&E image with lymphocytes, tumour and spindle nuclei.

    Parameters
    ----------
    size_um : float
        Side of the square in µm.
    mpp : float
        µm per pixel.
    seed : int
        Random seed (the same seed gives the same nuclei at any ``mpp``).

    Returns
    -------
    rgb : (M, M, 3) ndarray of uint8
    truth : CellsTruth
    """
    rng = np.random.default_rng(seed)
    centers, classes, _ = _place(rng, size_um)
    n = len(centers)
    # per nucleus: semi-axes (µm), angle, and the chromatin pattern's parameters
    a = np.empty(n)
    b = np.empty(n)
    a[classes == 0] = rng.uniform(2.8, 4.3, (classes == 0).sum())
    b[classes == 0] = a[classes == 0] * rng.uniform(0.85, 1.0, (classes == 0).sum())
    a[classes == 1] = rng.uniform(4.5, 8.5, (classes == 1).sum())
    b[classes == 1] = a[classes == 1] * rng.uniform(0.7, 0.95, (classes == 1).sum())
    spindle = np.flatnonzero(classes == 2)
    # a spindle cut across (a third of them) looks short and roundish in the section
    a[spindle] = np.where(
        rng.uniform(size=spindle.size) < 1 / 3,
        rng.uniform(2.5, 5.0, spindle.size),
        rng.uniform(7.0, 12.0, spindle.size),
    )
    b[spindle] = rng.uniform(1.75, 2.5, spindle.size)
    theta = rng.uniform(0, np.pi, n)
    od = np.array([1.0, 0.6, 0.75])[classes] * rng.uniform(0.8, 1.2, n)
    nucleoli = [
        rng.uniform(-0.45, 0.45, (rng.integers(1, 3), 2)) if c == 1 else np.zeros((0, 2))
        for c in classes
    ]
    side = round(size_um / mpp)
    hema = np.full((side, side), 0.04, np.float32)
    labels = np.zeros((side, side), np.int32)
    for k in range(n):
        cy, cx = centers[k] / mpp
        r = a[k] / mpp + 2
        y0, y1 = int(max(cy - r, 0)), int(min(cy + r + 1, side))
        x0, x1 = int(max(cx - r, 0)), int(min(cx + r + 1, side))
        if y1 <= y0 or x1 <= x0:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1]
        dy, dx = (yy + 0.5) * mpp - centers[k, 0], (xx + 0.5) * mpp - centers[k, 1]
        c, s = np.cos(theta[k]), np.sin(theta[k])
        u, v = (dx * c + dy * s) / a[k], (-dx * s + dy * c) / b[k]
        d = np.sqrt(u * u + v * v)
        inside = np.clip((1.0 - d) * a[k] / 0.5, 0, 1)  # ~0.5 µm soft edge
        conc = np.full(d.shape, od[k])
        if classes[k] == 1:  # vesicular: chromatin on the rim, nucleoli inside
            conc = conc + 0.25 * np.clip((d - 0.7) / 0.3, 0, 1)
            for ny, nx in nucleoli[k]:
                dn = np.hypot((u - nx) * a[k], (v - ny) * b[k])
                conc = np.maximum(conc, 1.2 * np.clip((1.6 - dn) / 0.5, 0, 1))
        patch = hema[y0:y1, x0:x1]
        np.maximum(patch, (inside * conc).astype(np.float32), out=patch)
        labels[y0:y1, x0:x1][d < 1] = k + 1
    grain = rng.standard_normal((side, side)).astype(np.float32)
    eosin = 0.3 * (1 + 0.2 * ndi.gaussian_filter(grain, 2.0 / mpp) * 4)
    hema *= 1 + 0.06 * ndi.gaussian_filter(grain, 0.5 / mpp) * 2
    odimg = hema[..., None] * _H + np.clip(eosin, 0, None)[..., None] * _E + np.float32(0.03)
    rgb = 255.0 * 10.0 ** -np.clip(odimg, 0, None) + 1.5 * rng.standard_normal((side, side, 1))
    truth = CellsTruth(centers, classes, labels, mpp)
    return np.clip(rgb, 0, 255).astype(np.uint8), truth


def downsample_rgb(rgb: np.ndarray, factor: int = 2) -> np.ndarray:
    """Average RGB intensities over ``factor x factor`` pixels (a lower magnification scan)."""
    h, w = rgb.shape[0] // factor * factor, rgb.shape[1] // factor * factor
    blocks = rgb[:h, :w].reshape(h // factor, factor, w // factor, factor, 3).astype(np.float32)
    return np.round(blocks.mean(axis=(1, 3))).astype(np.uint8)


def write_cells_slide(
    path: str | os.PathLike[str], size_um: float = 256.0, *, mpp: float = 0.5, seed: int = 0
) -> CellsTruth:
    """Write :func:`make_cells_image` as a small Aperio-SVS-like tiled TIFF; return its truth."""
    import tifffile

    from napari_slidescope._io import atomic_write

    rgb, truth = make_cells_image(size_um, mpp=mpp, seed=seed)
    h, w = rgb.shape[:2]
    desc = (
        f"Aperio Image Library v12.0.15 \r\n{w}x{h} [0,0 {w}x{h}] (128x128) JPEG/RGB Q=90"
        f"|AppMag = {round(10 / mpp)}|MPP = {mpp:.4f}|Filename = cell types"
    )
    with atomic_write(path, "wb") as fh, tifffile.TiffWriter(fh) as tif:
        tif.write(rgb, tile=(128, 128), photometric="rgb", description=desc, metadata=None)
        tif.write(rgb[::4, ::4], photometric="rgb", description=desc, metadata=None)
    return truth
