"""Per-pixel texture features for tissue-region classification (QuPath's pixel-classifier set).

Each channel (red, green, blue, and the hematoxylin and eosin concentrations of colour
deconvolution) is smoothed by a Gaussian at a few scales given in µm; at each scale the
features are the smoothed value, the Laplacian of Gaussian, the gradient magnitude, the two
eigenvalues of the structure tensor and the two of the Hessian. Scales are in µm, so the
same features describe the same tissue on a 20x and a 40x scan once both are read at the
same working resolution. Derivatives are scale-normalised (multiplied by sigma to their
order) so features of different scales have comparable ranges.

Everything is vectorised (one separable Gaussian per channel and scale, derivatives by
central differences of the smoothed image, structure tensor by three more Gaussians),
float32. A pixel's features depend only on the pixels within :func:`halo_px` of it: a tile
read with that much margin gives exactly the features of an untiled image, so a tiled
classification has no seams.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage

from napari_slidescope.analysis.stains import RUIFROK_HE, StainMatrix

__all__ = [
    "CHANNELS",
    "DEFAULT_CHANNELS",
    "DEFAULT_KINDS",
    "DEFAULT_SCALES_UM",
    "FEATURES_VERSION",
    "FEATURE_KINDS",
    "feature_names",
    "halo_px",
    "region_features",
]

#: Bumped whenever a feature's definition changes (a saved classifier records it).
FEATURES_VERSION = 1
#: The channels features can be computed on.
CHANNELS: tuple[str, ...] = ("red", "green", "blue", "hematoxylin", "eosin")
#: Default channels: RGB and the two estimated stains.
DEFAULT_CHANNELS: tuple[str, ...] = CHANNELS
#: Default Gaussian scales, µm (sigma): from a nucleus's radius to a gland's.
DEFAULT_SCALES_UM: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
#: Features per channel and scale, in order.
FEATURE_KINDS: tuple[str, ...] = (
    "gaussian",
    "log",
    "gradient",
    "structure_max",
    "structure_min",
    "hessian_max",
    "hessian_min",
)
#: Default kinds: on the synthetic regions benchmark (``benchmarks/regions_accuracy.py``)
#: these three gave the pixel accuracy of all seven (0.975 both, 5 strokes per class) at
#: 2.7 times the throughput; the structure tensor alone is over half the features' cost.
DEFAULT_KINDS: tuple[str, ...] = ("gaussian", "log", "gradient")
_TRUNCATE = 4.0


def feature_names(
    channels: Sequence[str], scales_um: Sequence[float], kinds: Sequence[str] = FEATURE_KINDS
) -> tuple[str, ...]:
    """Names of the features, in the order :func:`region_features` returns them.

    Examples
    --------
    >>> feature_names(["hematoxylin"], [2.0])[:3]
    ('hematoxylin_gaussian_2um', 'hematoxylin_log_2um', 'hematoxylin_gradient_2um')
    """
    return tuple(f"{c}_{k}_{s:g}um" for c in channels for s in scales_um for k in kinds)


def _sigmas(scales_um: Sequence[float], mpp: float) -> list[float]:
    if mpp <= 0:
        raise ValueError(f"mpp: expected a positive pixel size in µm, got {mpp}")
    if not scales_um or any(s <= 0 for s in scales_um):
        raise ValueError(f"scales_um: expected positive scales in µm, got {list(scales_um)}")
    return [float(s) / float(mpp) for s in scales_um]


def _radius(sigma: float) -> int:
    return int(_TRUNCATE * sigma + 0.5)


def halo_px(scales_um: Sequence[float], mpp: float) -> int:
    """Margin in pixels beyond which no pixel changes a feature (the tiles' overlap).

    The structure tensor is the widest: a Gaussian of the gradients of a Gaussian (two
    radii plus the difference stencils).

    Examples
    --------
    >>> halo_px([1, 2, 4, 8], 2.0)
    36
    """
    return 2 * _radius(max(_sigmas(scales_um, mpp))) + 4


def _channels(rgb: np.ndarray, channels: Sequence[str], stains: StainMatrix) -> list[np.ndarray]:
    unknown = [c for c in channels if c not in CHANNELS]
    if unknown:
        raise ValueError(f"channels: unknown {unknown}; expected some of {list(CHANNELS)}")
    out = []
    conc = None
    for c in channels:
        if c in ("red", "green", "blue"):
            out.append(rgb[..., ("red", "green", "blue").index(c)].astype(np.float32) / 255)
        else:
            if conc is None:
                conc = stains.separate(rgb)
            out.append(np.ascontiguousarray(conc[..., 0 if c == "hematoxylin" else 1]))
    return out


def _eig(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (larger, smaller) of the symmetric 2 x 2 matrices ``[[a, c], [c, b]]``."""
    half = (a + b) / 2
    root = np.sqrt(((a - b) / 2) ** 2 + c**2)
    return half + root, half - root


def region_features(
    rgb: np.ndarray,
    *,
    mpp: float,
    channels: Sequence[str] = DEFAULT_CHANNELS,
    scales_um: Sequence[float] = DEFAULT_SCALES_UM,
    stains: StainMatrix = RUIFROK_HE,
    kinds: Sequence[str] = FEATURE_KINDS,
    crop: int = 0,
    planar: bool = False,
) -> np.ndarray:
    """Compute the per-pixel features of an RGB image.

    Parameters
    ----------
    rgb : (M, N, 3) ndarray of uint8
        The image at the working resolution.
    mpp : float
        Its pixel size, µm/px (turns the scales into pixels).
    channels : sequence of str
        Some of :data:`CHANNELS`.
    scales_um : sequence of float
        Gaussian sigmas in µm.
    stains : StainMatrix
        Stain vectors of the colour deconvolution (hematoxylin and eosin channels).
    kinds : sequence of str
        Some of :data:`FEATURE_KINDS`, computed in that order (fewer kinds: faster).
    crop : int
        Pixels to drop on every side of the output (the halo a tile was read with).
    planar : bool
        Return the features as planes ``(F, M - 2 crop, N - 2 crop)`` (the same values;
        cheaper to write, and a prediction can read the pixels as the rows of an
        F-ordered matrix without a copy).

    Returns
    -------
    (M - 2 crop, N - 2 crop, F) ndarray of float32
        Features in :func:`feature_names` order (``(F, M - 2 crop, N - 2 crop)`` when
        `planar`).

    Raises
    ------
    ValueError
        If the image is not RGB uint8, a channel is unknown or a scale not positive.

    Examples
    --------
    >>> rgb = np.full((40, 40, 3), 200, np.uint8)
    >>> region_features(rgb, mpp=2.0, scales_um=[2.0], crop=5).shape
    (30, 30, 35)
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"rgb: expected an (M, N, 3) uint8 image, got {rgb.dtype} {rgb.shape}")
    sigmas = _sigmas(scales_um, mpp)
    bad = [k for k in kinds if k not in FEATURE_KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds: expected some of {list(FEATURE_KINDS)}, got {list(kinds)}")
    want = [k for k in FEATURE_KINDS if k in kinds]
    structure = "structure_max" in want or "structure_min" in want
    second = any(k in want for k in ("log", "hessian_max", "hessian_min"))
    first = structure or "gradient" in want
    h, w = rgb.shape[0] - 2 * crop, rgb.shape[1] - 2 * crop
    if h <= 0 or w <= 0:
        raise ValueError(f"crop: {crop} px leaves nothing of a {rgb.shape[:2]} image")
    core = (slice(crop, crop + h), slice(crop, crop + w))
    planes = _channels(rgb, channels, stains)
    nf = len(planes) * len(sigmas) * len(want)
    out = np.empty((nf, h, w) if planar else (h, w, nf), np.float32)
    diff = np.array([-0.5, 0.0, 0.5], np.float32)  # correlate1d: (f[i+1] - f[i-1]) / 2
    k = 0
    for plane in planes:
        for s in sigmas:
            g = ndimage.gaussian_filter(plane, s, truncate=_TRUNCATE, mode="nearest")
            s1, s2 = np.float32(s), np.float32(s * s)
            feats: dict[str, np.ndarray] = {"gaussian": g[core]}
            if first:
                gy = ndimage.correlate1d(g, diff, axis=0, mode="nearest")
                gx = ndimage.correlate1d(g, diff, axis=1, mode="nearest")
                feats["gradient"] = s1 * np.hypot(gy[core], gx[core])
            if second:
                lap = np.array([1, -2, 1], np.float32)
                gyy = ndimage.correlate1d(g, lap, axis=0, mode="nearest")[core]
                gxx = ndimage.correlate1d(g, lap, axis=1, mode="nearest")[core]
                feats["log"] = s2 * (gyy + gxx)
                if "hessian_max" in want or "hessian_min" in want:
                    gxy = ndimage.correlate1d(
                        gx if first else ndimage.correlate1d(g, diff, axis=1, mode="nearest"),
                        diff,
                        axis=0,
                        mode="nearest",
                    )[core]
                    h_max, h_min = _eig(gyy, gxx, gxy)
                    feats["hessian_max"], feats["hessian_min"] = s2 * h_max, s2 * h_min
            if structure:
                jyy = ndimage.gaussian_filter(gy * gy, s, truncate=_TRUNCATE, mode="nearest")
                jxx = ndimage.gaussian_filter(gx * gx, s, truncate=_TRUNCATE, mode="nearest")
                jxy = ndimage.gaussian_filter(gy * gx, s, truncate=_TRUNCATE, mode="nearest")
                st_max, st_min = _eig(jyy[core], jxx[core], jxy[core])
                feats["structure_max"], feats["structure_min"] = s2 * st_max, s2 * st_min
            for name in want:
                if planar:
                    out[k] = feats[name]
                else:
                    out[..., k] = feats[name]
                k += 1
    return out
