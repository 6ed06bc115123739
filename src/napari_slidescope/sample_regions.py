"""A synthetic H&E slide with known tissue regions (tumour, stroma, necrosis, fat, lymphocytes).

The content is defined in µm, not pixels: the same seed drawn at 0.25 and at 0.5 µm/px
shows the same tissue, so a region classifier can be checked at 20x and 40x. Regions are a
noisy Voronoi partition of a tissue blob, one class per cell, on a truth grid of
:data:`TRUTH_MPP` µm; the textures are stain concentrations (hematoxylin, eosin) turned into
RGB by Beer-Lambert with the Ruifrok vectors:

- Tumor: nests of large (9 µm), crowded nuclei on pale eosin;
- Stroma: eosin fibres along a slowly turning direction, sparse spindle nuclei;
- Necrosis: pale, washed-out eosin with small dark debris;
- Fat: white vacuoles (about 60 µm) with thin eosin membranes;
- Lymphocytes: dense small (6 µm) round, dark nuclei.

Every random value is a hash of integer µm-grid coordinates, so any tile can be drawn on
its own and tiles agree. It shows the machinery (tiling, seams, resolution, accuracy on
textures that differ); it says nothing of accuracy on real slides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "REGION_CLASSES",
    "REGION_COLORS",
    "RegionTruth",
    "make_region_truth",
    "render_regions",
    "write_region_slide",
]

#: Classes 1..5 of the truth map (0 is glass).
REGION_CLASSES: tuple[str, ...] = ("Tumor", "Stroma", "Necrosis", "Fat", "Lymphocytes")
#: Their colours in a class map.
REGION_COLORS: dict[str, tuple[int, int, int]] = {
    "Tumor": (200, 0, 0),
    "Stroma": (150, 200, 150),
    "Necrosis": (80, 80, 80),
    "Fat": (240, 228, 66),
    "Lymphocytes": (0, 114, 178),
}
#: µm per pixel of the truth map.
TRUTH_MPP = 8.0
_H = np.array([0.65, 0.70, 0.29]) / np.linalg.norm([0.65, 0.70, 0.29])
_E = np.array([0.07, 0.99, 0.11]) / np.linalg.norm([0.07, 0.99, 0.11])


@dataclass(frozen=True)
class RegionTruth:
    """The known regions of a synthetic slide.

    Attributes
    ----------
    labels : (M, N) ndarray of uint8
        Class per :data:`TRUTH_MPP` µm pixel: 0 glass, k the class ``REGION_CLASSES[k-1]``.
    mpp : float
        Level-0 µm/px of the slide drawn.
    shape : (int, int)
        Level-0 size in pixels.
    seed : int
    """

    labels: np.ndarray
    mpp: float
    shape: tuple[int, int]
    seed: int

    def classes_at(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Class (0..5) at level-0 pixel positions (floats: the pixel centre is ``+0.5``)."""
        ty = np.clip(
            (np.asarray(rows) * self.mpp / TRUTH_MPP).astype(np.intp), 0, self.labels.shape[0] - 1
        )
        tx = np.clip(
            (np.asarray(cols) * self.mpp / TRUTH_MPP).astype(np.intp), 0, self.labels.shape[1] - 1
        )
        return np.asarray(self.labels[ty, tx])

    def example_lines(
        self, per_class: int = 5, *, seed: int = 0, length_um: float = 40.0
    ) -> dict[str, list[np.ndarray]]:
        """Short horizontal lines, level-0 ``(row, col)`` ``(2, 2)`` arrays, inside each class.

        What a user's strokes would be: each centred on a truth pixel at least 32 µm inside
        its region (where there is one), drawn with `seed`.
        """
        from scipy import ndimage

        rng = np.random.default_rng(seed)
        px = TRUTH_MPP / self.mpp
        half = length_um / 2 / self.mpp
        out = {}
        for k, name in enumerate(REGION_CLASSES, start=1):
            inner = ndimage.binary_erosion(self.labels == k, iterations=4)
            ys, xs = np.nonzero(inner if inner.any() else self.labels == k)
            if not len(ys):
                continue
            pick = rng.choice(len(ys), per_class, replace=len(ys) < per_class)
            out[name] = [
                np.array([[(ys[i] + 0.5) * px, (xs[i] + 0.5) * px - half],
                          [(ys[i] + 0.5) * px, (xs[i] + 0.5) * px + half]])
                for i in pick
            ]  # fmt: skip
        return out

    def grid(
        self, downsample: float, shape: tuple[int, int], origin: tuple[float, float] = (0, 0)
    ) -> np.ndarray:
        """Truth on a grid of ``downsample`` level-0 px per pixel (each pixel's centre)."""
        r = origin[0] + (np.arange(shape[0]) + 0.5) * downsample
        c = origin[1] + (np.arange(shape[1]) + 0.5) * downsample
        return self.classes_at(r[:, None], c[None, :])


def _hash(*keys: Any) -> np.ndarray:
    """Uniform [0, 1) from integer keys (splitmix64), elementwise."""
    h = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = np.zeros(np.broadcast_shapes(*(np.shape(k) for k in keys)), np.uint64)
        for k in keys:
            x = (x ^ np.asarray(k).astype(np.int64).astype(np.uint64)) * np.uint64(
                0xBF58476D1CE4E5B9
            ) + h
            x ^= x >> np.uint64(31)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(29)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _smooth(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    from scipy import ndimage

    f = ndimage.gaussian_filter(rng.standard_normal(shape), sigma, mode="wrap")
    return (f - f.mean()) / (f.std() + 1e-9)


def make_region_truth(
    shape: tuple[int, int], *, mpp: float = 0.5, seed: int = 0, region_um: float = 400.0
) -> RegionTruth:
    """Lay out tissue and its regions for a slide of `shape` level-0 pixels at `mpp`.

    Parameters
    ----------
    shape : (int, int)
        Level-0 size.
    mpp : float
        Level-0 µm/px.
    seed : int
        The same seed gives the same layout.
    region_um : float
        Typical region size in µm (the Voronoi cells' spacing).

    Examples
    --------
    >>> t = make_region_truth((2000, 2000), mpp=0.5)
    >>> sorted(set(np.unique(t.labels).tolist()) - {0})
    [1, 2, 3, 4, 5]
    """
    rng = np.random.default_rng(seed)
    th = max(2, int(np.ceil(shape[0] * mpp / TRUTH_MPP)))
    tw = max(2, int(np.ceil(shape[1] * mpp / TRUTH_MPP)))
    # tissue: a blob covering most of the slide, with glass around it
    yy, xx = np.mgrid[0:th, 0:tw]
    ry, rx = (yy - th / 2) / (th / 2), (xx - tw / 2) / (tw / 2)
    blob = 1.0 - (ry**2 + rx**2) + 0.25 * _smooth(rng, (th, tw), max(th, tw) / 12)
    tissue = blob > 0.1
    # regions: noisy Voronoi, classes dealt round-robin so each appears
    n = max(len(REGION_CLASSES), int(th * tw * TRUTH_MPP**2 / region_um**2))
    seeds = rng.random((n, 2)) * (th, tw)
    cls = (np.arange(n) + rng.integers(len(REGION_CLASSES))) % len(REGION_CLASSES) + 1
    rng.shuffle(cls)
    cell = region_um / TRUTH_MPP
    ny = yy + 0.2 * cell * _smooth(rng, (th, tw), cell / 4)
    nx = xx + 0.2 * cell * _smooth(rng, (th, tw), cell / 4)
    best = np.full((th, tw), np.inf)
    labels = np.zeros((th, tw), np.uint8)
    for (sy, sx), c in zip(seeds, cls, strict=True):
        d = (ny - sy) ** 2 + (nx - sx) ** 2
        closer = d < best
        best[closer] = d[closer]
        labels[closer] = c
    labels[~tissue] = 0
    return RegionTruth(labels, float(mpp), (int(shape[0]), int(shape[1])), int(seed))


def _cells(
    y: np.ndarray,
    x: np.ndarray,
    spacing: float,
    seed: int,
    stretch: tuple[float, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Worley noise: distances (µm) to the nearest and second jittered point, and a hash."""
    gy, gx = np.floor(y / spacing), np.floor(x / spacing)
    d1 = np.full(y.shape, np.inf)
    d2 = np.full(y.shape, np.inf)
    v1 = np.zeros(y.shape)
    for oy in (-1, 0, 1):
        for ox in (-1, 0, 1):
            cy, cx = gy + oy, gx + ox
            py = (cy + 0.15 + 0.7 * _hash(cy, cx, seed)) * spacing
            px = (cx + 0.15 + 0.7 * _hash(cy, cx, seed + 1)) * spacing
            dy, dx = y - py, x - px
            if stretch is not None:
                k, theta = stretch
                c, s = np.cos(theta), np.sin(theta)
                along, across = dy * s + dx * c, -dy * c + dx * s
                dy, dx = along / k, across
            d = np.hypot(dy, dx)
            v = _hash(cy, cx, seed + 2)
            nearer = d < d1
            d2 = np.where(nearer, d1, np.minimum(d2, d))
            v1 = np.where(nearer, v, v1)
            d1 = np.where(nearer, d, d1)
    return d1, d2, v1


def render_regions(truth: RegionTruth, box: tuple[int, int, int, int]) -> np.ndarray:
    """Draw the level-0 box ``(y0, x0, y1, x1)`` of the slide as RGB.

    Returns
    -------
    (y1 - y0, x1 - x0, 3) ndarray of uint8
    """
    y0, x0, y1, x1 = box
    m = truth.mpp
    rows = np.arange(y0, y1, dtype=float)[:, None] + 0.5
    cols = np.arange(x0, x1, dtype=float)[None, :] + 0.5
    y = np.broadcast_to(rows * m, (y1 - y0, x1 - x0))
    x = np.broadcast_to(cols * m, (y1 - y0, x1 - x0))
    cls = truth.classes_at(rows, cols)
    cls = np.broadcast_to(cls, y.shape)
    h = np.zeros(y.shape)
    e = np.zeros(y.shape)
    s = truth.seed * 1000
    for k in np.unique(cls).tolist():
        sel = cls == k
        yy, xx = y[sel], x[sel]
        if k == 1:  # tumour: large crowded nuclei on pale pink
            d, _, v = _cells(yy, xx, 11.0, s + 10)
            nuc = (d < 4.0 + 1.0 * v) & (v < 0.92)
            h[sel] = np.where(nuc, 0.75 + 0.3 * v, 0.08)
            e[sel] = np.where(nuc, 0.15, 0.35)
        elif k == 2:  # stroma: fibres and spindle nuclei
            theta = 0.8 + 0.6 * np.sin(yy / 230.0) + 0.4 * np.cos(xx / 310.0)
            phase = (xx * np.cos(theta) - yy * np.sin(theta)) * (2 * np.pi / 7.0)
            fibre = np.sin(phase + 2.0 * _hash(np.floor(yy / 40), np.floor(xx / 40), s + 3)) > 0.2
            d, _, v = _cells(yy, xx, 38.0, s + 20, stretch=(4.0, theta))
            nuc = (d < 2.0) & (v < 0.6)
            h[sel] = np.where(nuc, 0.7, 0.03)
            e[sel] = np.where(nuc, 0.2, np.where(fibre, 0.8, 0.35))
        elif k == 3:  # necrosis: washed out, debris
            d, _, v = _cells(yy, xx, 6.0, s + 30)
            deb = (d < 0.8 + 0.8 * v) & (v < 0.55)
            h[sel] = np.where(deb, 0.55 * v + 0.3, 0.12)
            e[sel] = np.where(
                deb, 0.2, 0.22 + 0.08 * _hash(np.floor(yy / 15), np.floor(xx / 15), s + 4)
            )
        elif k == 4:  # fat: empty vacuoles, thin membranes
            d1, d2, _ = _cells(yy, xx, 60.0, s + 40)
            wall = (d2 - d1) < 1.5
            h[sel] = 0.0
            e[sel] = np.where(wall, 0.55, 0.01)
        elif k == 5:  # lymphocytes: dense small dark round nuclei
            d, _, v = _cells(yy, xx, 7.0, s + 50)
            nuc = (d < 2.6 + 0.5 * v) & (v < 0.95)
            h[sel] = np.where(nuc, 1.1, 0.1)
            e[sel] = np.where(nuc, 0.1, 0.2)
    noise = _hash(np.floor(y / m), np.floor(x / m), s + 99) - 0.5
    od = h[..., None] * _H + e[..., None] * _E + 0.04 * noise[..., None] + 0.02
    rgb = 255.0 * np.power(10.0, -np.clip(od, 0, None))
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)


def write_region_slide(
    path: str | os.PathLike[str],
    *,
    shape: tuple[int, int] = (4096, 4096),
    mpp: float = 0.5,
    seed: int = 0,
    region_um: float = 400.0,
    quality: int = 90,
) -> RegionTruth:
    """Write a synthetic region slide as an Aperio-SVS-like pyramid; return its truth.

    The whole level 0 is held in memory: for small slides (tests, examples). Benchmarks
    stream bigger ones (``benchmarks/regions_data.py``).

    Examples
    --------
    >>> truth = write_region_slide(tmp / "regions.svs", shape=(2048, 2048))  # doctest: +SKIP
    """
    from napari_slidescope.sample_data import _pyramid, _write_svs

    truth = make_region_truth(shape, mpp=mpp, seed=seed, region_um=region_um)
    h, w = shape
    level0 = np.empty((h, w, 3), np.uint8)
    for y in range(0, h, 512):
        level0[y : y + 512] = render_regions(truth, (y, 0, min(y + 512, h), w))
    _write_svs(
        Path(path), _pyramid(level0, 256), mpp=mpp, quality=quality, name="slidescope regions"
    )
    return truth
