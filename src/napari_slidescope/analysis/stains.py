"""Stain vectors for brightfield H&E: optical density and Macenko estimation.

Light through a stained section follows Beer-Lambert: the optical density (OD) of each RGB
channel, ``-log10(I / I0)``, is a linear mix of the stain concentrations, ``OD = C @ M`` where
the rows of ``M`` are the unit OD vectors of hematoxylin, eosin and a residual. Estimating ``M``
once for a slide (or a region), from a sample of its pixels, and unmixing every tile with the
same ``M`` treats all tiles alike.

References
----------
Macenko et al., "A method for normalizing histology slides for quantitative analysis",
ISBI 2009. Ruifrok & Johnston, "Quantification of histochemical staining by color
deconvolution", Anal. Quant. Cytol. Histol. 23 (2001).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from napari_slidescope.analysis.checks import check_rgb
from napari_slidescope.errors import SlidescopeWarning

__all__ = [
    "RUIFROK_HDAB",
    "RUIFROK_HE",
    "STAINS",
    "StainMatrix",
    "estimate_stains",
    "for_stain",
    "rgb_to_od",
    "stain_kind",
]

#: Brightfield stain combinations: hematoxylin & eosin, hematoxylin & DAB (IHC).
STAINS = ("H&E", "H-DAB")

#: Incident light intensity of an 8-bit brightfield scan (white glass).
_I0 = 255.0
#: OD of every 8-bit value, clipped at 1 to keep the logarithm finite (max OD = log10(255)).
#: (log10 of 255/255 is -0.0 in IEEE arithmetic; written as log10(I0 / I), white is +0.0.)
_OD_LUT = np.log10(_I0 / np.maximum(np.arange(256, dtype=np.float64), 1.0)).astype(np.float32)


def _unit(v: np.ndarray | list[float]) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    unit: np.ndarray = v / np.linalg.norm(v)
    return unit


def _residual(h: np.ndarray, e: np.ndarray) -> np.ndarray:
    r = np.cross(h, e)
    return _unit(r if r.sum() >= 0 else -r)


def _check_rgb(rgb: np.ndarray, name: str) -> np.ndarray:
    check_rgb(rgb, name, ndim=None)
    return np.asarray(rgb)


def rgb_to_od(rgb: np.ndarray) -> np.ndarray:
    """Convert 8-bit RGB to optical density, ``-log10(max(I, 1) / 255)``.

    Parameters
    ----------
    rgb : (..., 3) ndarray of uint8
        RGB pixels; 255 is white glass.

    Returns
    -------
    (..., 3) ndarray of float32
        Optical density per channel, in [0, log10(255)].

    Raises
    ------
    ValueError
        If the array is not uint8 or its last axis is not 3.

    Examples
    --------
    >>> rgb_to_od(np.array([[255, 25, 1]], np.uint8)).round(2)
    array([[0.  , 1.01, 2.41]], dtype=float32)
    """
    od: np.ndarray = _OD_LUT[_check_rgb(rgb, "rgb")]
    return od


@dataclass(frozen=True)
class StainMatrix:
    """Unit optical-density vectors (R, G, B) of hematoxylin, eosin and a residual.

    Attributes
    ----------
    hematoxylin, eosin, residual : (3,) ndarray of float64
        Unit OD vectors.
    estimated : bool
        True when estimated from an image, False for the reference (Ruifrok) vectors.
    second : {"eosin", "dab"}
        What the second vector (``eosin``) is: eosin on H&E, DAB on an IHC (H-DAB)
        slide; measurement columns are named after it (``eosin_od_mean``,
        ``dab_od_mean``).
    """

    hematoxylin: np.ndarray
    eosin: np.ndarray
    residual: np.ndarray
    estimated: bool = False
    second: str = "eosin"

    @property
    def matrix(self) -> np.ndarray:
        """(3, 3) array whose rows are the H, E and residual OD vectors."""
        return np.stack([self.hematoxylin, self.eosin, self.residual])

    def separate(self, rgb: np.ndarray) -> np.ndarray:
        """Unmix RGB into stain concentrations (colour deconvolution).

        Parameters
        ----------
        rgb : (..., 3) ndarray of uint8
            RGB pixels.

        Returns
        -------
        (..., 3) ndarray of float32
            OD concentrations of hematoxylin, eosin and residual (channels last).
        """
        od = rgb_to_od(rgb)
        inv = np.linalg.inv(self.matrix).astype(np.float32)
        return od @ inv


RUIFROK_HE = StainMatrix(
    hematoxylin=_unit([0.65, 0.70, 0.29]),
    eosin=_unit([0.07, 0.99, 0.11]),
    residual=_residual(_unit([0.65, 0.70, 0.29]), _unit([0.07, 0.99, 0.11])),
    estimated=False,
)
"""Standard H&E vectors of Ruifrok & Johnston (2001), the fallback of :func:`estimate_stains`."""

_DAB = _unit([0.27, 0.57, 0.78])
#: :func:`stain_kind`: a second stain whose blue OD is above its green OD less this is DAB.
_DAB_MARGIN = 0.07
RUIFROK_HDAB = StainMatrix(
    hematoxylin=RUIFROK_HE.hematoxylin,
    eosin=_DAB,
    residual=_residual(RUIFROK_HE.hematoxylin, _DAB),
    estimated=False,
    second="dab",
)
"""Standard hematoxylin-DAB vectors of Ruifrok & Johnston (2001) (second vector: DAB)."""


def stain_kind(stains: StainMatrix) -> str:
    """Return whether stain vectors show H&E or H-DAB (is the second stain pink or brown?).

    Eosin absorbs green more than blue; DAB, brown, absorbs blue most. The second vector
    is DAB when its blue OD exceeds its green OD less :data:`_DAB_MARGIN` (0.07). Measured
    (blue - green of the unit vector): 13 real H&E crops of MoNuSeg -0.14 to -0.55,
    CMU-1 -0.55, scikit-image's IHC image +0.32, a synthetic Ki-67 image where DAB always
    lies on hematoxylin 0.0. (The angle to the two references did not separate them:
    Macenko's eosin of real H&E lies nearer DAB than Ruifrok's eosin.)

    Examples
    --------
    >>> stain_kind(RUIFROK_HE), stain_kind(RUIFROK_HDAB)
    ('H&E', 'H-DAB')
    """
    v = _unit(stains.eosin)
    return "H-DAB" if float(v[2] - v[1]) > -_DAB_MARGIN else "H&E"


def for_stain(stains: StainMatrix, stain: str) -> StainMatrix:
    """Stain vectors for a brightfield stain: ``"auto"`` (what `stains` show), H&E or H-DAB.

    Estimated H&E vectors are kept. On H-DAB the estimated hematoxylin is kept and DAB
    is Ruifrok's reference vector: DAB nearly always lies on hematoxylin (nuclear
    markers) so the estimate's extreme angle is a mix of the two (on a synthetic Ki-67
    image it read DAB 1.34x too high), and QuPath's default DAB thresholds (0.2 / 0.4 /
    0.6) are set on its default, Ruifrok's, vector. Vectors that show the other stain
    give way to the reference vectors of the asked one.

    Raises
    ------
    ValueError
        For an unknown stain name.
    """
    if stain not in ("auto", *STAINS):
        raise ValueError(f"stain: expected 'auto', 'H&E' or 'H-DAB', got {stain!r}")
    seen = stain_kind(stains)
    if stain == "auto":
        stain = seen
    if seen != stain:
        return RUIFROK_HDAB if stain == "H-DAB" else RUIFROK_HE
    if stain == "H-DAB":
        h = _unit(stains.hematoxylin)
        return StainMatrix(h, _DAB, _residual(h, _DAB), estimated=stains.estimated, second="dab")
    return replace(stains, second="eosin")


def _fallback(reason: str) -> StainMatrix:
    warnings.warn(
        f"stain estimation fell back to the standard Ruifrok H&E vectors: {reason}",
        SlidescopeWarning,
        stacklevel=3,
    )
    return RUIFROK_HE


def estimate_stains(
    rgb: np.ndarray,
    *,
    od_threshold: float = 0.15,
    percentile: float = 1.0,
    min_pixels: int = 500,
    max_pixels: int = 200_000,
    min_angle_deg: float = 5.0,
    seed: int = 0,
) -> StainMatrix:
    """Estimate H&E stain vectors with the method of Macenko et al. (2009).

    Tissue pixels (OD above ``od_threshold`` in every channel, as in the reference
    implementation; this excludes glass, and also pale eosin-only stroma whose red OD is
    low, which measured better on real H&E than a test on the total OD) are
    projected on the plane of the two main principal directions of their OD; the robust
    extremes (``percentile`` and ``100 - percentile``) of the angle in that plane are the two
    stain vectors. Hematoxylin is the one with the larger red OD (it absorbs red light and
    looks blue-purple); eosin absorbs green and looks pink.

    Parameters
    ----------
    rgb : (M, N, 3) or (P, 3) ndarray of uint8
        Pixels of the slide or region, at any resolution (a few hundred thousand suffice).
    od_threshold : float, optional
        Minimum OD of every channel for a pixel to count as tissue. 0.15 (70 % transmission)
        excludes glass and faint scanner noise.
    percentile : float, optional
        Robust extreme of the angular distribution, in percent.
    min_pixels : int, optional
        Fewer tissue pixels than this gives the fallback.
    max_pixels : int, optional
        Tissue pixels beyond this are sub-sampled (deterministically, ``seed``) for speed.
    min_angle_deg : float, optional
        The two estimated vectors must be at least this far apart, otherwise the image does
        not show two stains and the fallback is used.
    seed : int, optional
        Seed of the sub-sampling.

    Returns
    -------
    StainMatrix
        Estimated vectors (``estimated=True``), or :data:`RUIFROK_HE` with a warning when
        there are too few tissue pixels or the estimate is degenerate.

    Raises
    ------
    ValueError
        If ``rgb`` is not uint8 with three channels last.

    Examples
    --------
    >>> stains = estimate_stains(thumbnail)  # doctest: +SKIP
    >>> hed = stains.separate(tile)  # doctest: +SKIP
    """
    od = rgb_to_od(rgb).reshape(-1, 3)
    od = od[np.all(od > od_threshold, axis=1)]
    if od.shape[0] < min_pixels:
        return _fallback(
            f"only {od.shape[0]} tissue pixels (OD > {od_threshold}), need {min_pixels}"
        )
    if od.shape[0] > max_pixels:
        rng = np.random.default_rng(seed)
        od = od[rng.choice(od.shape[0], max_pixels, replace=False)]
    od = od.astype(np.float64)
    # principal plane of the OD cloud (covariance), as in the reference implementation
    _, eigvecs = np.linalg.eigh(np.cov(od, rowvar=False))
    plane = eigvecs[:, 1:3]  # two largest eigenvalues
    plane = plane * np.where(plane.sum(axis=0) < 0, -1.0, 1.0)  # point into positive OD
    proj = od @ plane
    phi = np.arctan2(proj[:, 1], proj[:, 0])
    lo, hi = np.percentile(phi, [percentile, 100.0 - percentile])
    v1 = _unit(plane @ [np.cos(lo), np.sin(lo)])
    v2 = _unit(plane @ [np.cos(hi), np.sin(hi)])
    angle = np.degrees(np.arccos(np.clip(v1 @ v2, -1.0, 1.0)))
    if not np.isfinite(angle) or angle < min_angle_deg:
        return _fallback(f"the two stain directions are only {angle:.1f} degrees apart")
    if min(v1.min(), v2.min()) < -0.05:
        return _fallback("an estimated stain vector has negative optical density")
    v1, v2 = np.clip(v1, 0.0, None), np.clip(v2, 0.0, None)
    h, e = (v1, v2) if v1[0] > v2[0] else (v2, v1)
    h, e = _unit(h), _unit(e)
    return StainMatrix(hematoxylin=h, eosin=e, residual=_residual(h, e), estimated=True)
