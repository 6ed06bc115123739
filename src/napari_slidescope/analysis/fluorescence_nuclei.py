"""Built-in CPU nuclei segmentation for fluorescence (a nuclear channel: DAPI, Hoechst...).

Two stages, like the H&E method (:mod:`.brightfield_nuclei`):

``predict`` (pixel maps, per tile batch)
    The channel's background (a grey opening larger than any nucleus, ``background_radius_um``)
    is subtracted and the rest smoothed at ``sigma_um``; a scale-normalised
    Laplacian-of-Gaussian response at the nucleus radii ``seed_radii_um`` marks their centres.
``postprocess`` (objects, per tile)
    Foreground is the signal above the slide-level threshold (Otsu over the reference given
    to :meth:`FluorescenceSegmenter.prepare`); seeds are blob maxima at least
    ``min_seed_distance_um`` apart inside it; a watershed of the inverted signal from the
    seeds splits touching nuclei; objects outside ``min_area_um2``-``max_area_um2`` go.

Every parameter is physical (µm, µm²), so the method behaves the same at any resolution.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi
from skimage import feature, filters, segmentation

from napari_slidescope.analysis._builtin_method import BuiltinMethod
from napari_slidescope.analysis.checks import check_nuclei_params
from napari_slidescope.errors import SlidescopeWarning

__all__ = ["FluorescenceParams", "FluorescenceSegmenter", "segment_fluorescence_array"]

_SIGNAL, _BLOB = 0, 1
_MIN_PIXELS = 200


@dataclass(frozen=True)
class FluorescenceParams:
    """Parameters of the built-in fluorescence nuclei method, all in physical units.

    Attributes
    ----------
    target_mpp : float
        Working resolution in µm/px (0.5: a 6 µm nucleus is 12 px across).
    background_radius_um : float
        Radius of the grey opening that estimates the background (larger than a nucleus).
    sigma_um : float
        Gaussian smoothing of the signal (chromatin texture, noise).
    seed_radii_um : tuple of float
        Nucleus radii searched for seeds.
    min_seed_distance_um : float
        Minimum distance between two seeds.
    min_area_um2, max_area_um2 : float
        Objects outside this area range are removed.
    threshold : float or None
        Foreground threshold on the background-subtracted signal (the channel's units);
        None: Otsu over the reference of :meth:`FluorescenceSegmenter.prepare`.
    """

    target_mpp: float = 0.5
    background_radius_um: float = 12.0
    sigma_um: float = 0.7
    seed_radii_um: tuple[float, ...] = (2.5, 4.0)
    min_seed_distance_um: float = 3.0
    min_area_um2: float = 10.0
    max_area_um2: float = 400.0
    threshold: float | None = None

    def __post_init__(self) -> None:
        check_nuclei_params(self)


def _signal(channel: np.ndarray, p: FluorescenceParams, mpp: float) -> np.ndarray:
    """Background-subtracted, smoothed signal of one (H, W) channel."""
    x = channel.astype(np.float32)
    size = max(3, 2 * int(round(p.background_radius_um / mpp)) + 1)
    # grey opening on a 2x-binned image: background is smooth, nuclei are not
    small = x[: x.shape[0] // 2 * 2, : x.shape[1] // 2 * 2]
    if min(small.shape) >= 4 and size >= 9:
        binned = small.reshape(small.shape[0] // 2, 2, small.shape[1] // 2, 2).min(axis=(1, 3))
        bg_small = ndi.grey_opening(binned, size=(size // 2 | 1, size // 2 | 1))
        bg_small = ndi.uniform_filter(bg_small, size // 2 | 1)
        bg = np.repeat(np.repeat(bg_small, 2, axis=0), 2, axis=1)
        bg = np.pad(bg, ((0, x.shape[0] - bg.shape[0]), (0, x.shape[1] - bg.shape[1])), mode="edge")
    else:
        bg = ndi.grey_opening(x, size=(size, size))
    foreground = np.maximum(x - bg, 0.0)
    smooth: np.ndarray = ndi.gaussian_filter(foreground, p.sigma_um / mpp, truncate=3.0)
    return smooth


def _blob(signal: np.ndarray, radii_um: tuple[float, ...], mpp: float) -> np.ndarray:
    out = np.zeros_like(signal)
    for r in radii_um:
        s = r / math.sqrt(2.0) / mpp
        np.maximum(out, -(s * s) * ndi.gaussian_laplace(signal, s, truncate=3.0), out=out)
    return out


class FluorescenceSegmenter(BuiltinMethod[FluorescenceParams]):
    """Classical fluorescence nuclei segmenter in two stages (see the module docstring).

    Parameters
    ----------
    params : FluorescenceParams, optional
        Parameters; the defaults suit DAPI / Hoechst nuclei at 0.25-1 µm/px.
    """

    name = "builtin-fluorescence"
    input = "fluorescence"

    def __init__(self, params: FluorescenceParams | None = None) -> None:
        super().__init__(params if params is not None else FluorescenceParams())

    @property
    def min_overlap_um(self) -> float:
        """Tile overlap (µm): a nucleus plus the background window on each side."""
        p = self.params
        return 2.0 * max(2.0 * math.sqrt(p.max_area_um2 / math.pi), p.background_radius_um)

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Fix the foreground threshold (Otsu of the background-subtracted signal).

        Parameters
        ----------
        reference : (M, N) or (M, N, 1) ndarray
            The nuclear channel of the region at the working resolution.
        mpp : float
            Its pixel size in µm/px.
        """
        if self.params.threshold is not None:
            return
        ref = np.asarray(reference)
        ref = ref[..., 0] if ref.ndim == 3 else ref
        self.threshold = _otsu(_signal(ref, self.params, float(mpp)))

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Model stage: (B, H, W, 1) nuclear channel -> (B, H, W, 2) signal and blob maps."""
        tiles = np.asarray(tiles)
        if tiles.ndim != 4 or tiles.shape[-1] != 1:
            raise ValueError(f"tiles must have shape (B, H, W, 1); got {tiles.shape}")
        out = np.empty((*tiles.shape[:3], 2), np.float32)
        for b, tile in enumerate(tiles):
            sig = _signal(tile[..., 0], self.params, mpp)
            out[b, ..., _SIGNAL] = sig
            out[b, ..., _BLOB] = _blob(sig, self.params.seed_radii_um, mpp)
        return out

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """CPU stage: (H, W, 2) maps -> (H, W) int32 labels, 0 = background."""
        raw = np.asarray(raw, np.float32)
        if raw.ndim != 3 or raw.shape[-1] != 2:
            raise ValueError(f"raw must have shape (H, W, 2); got {raw.shape}")
        t = self.threshold
        if t is None:
            warnings.warn(
                "FluorescenceSegmenter.prepare() was not called; thresholding this tile alone",
                SlidescopeWarning,
                stacklevel=2,
            )
            t = _otsu(raw[..., _SIGNAL])
        if t is None:
            return np.zeros(raw.shape[:2], np.int32)
        return _objects(raw, t, self.params, mpp)


def _otsu(signal: np.ndarray) -> float | None:
    values = signal[signal > 0]
    if values.size < _MIN_PIXELS or np.ptp(values) <= 0:
        return None
    step = max(1, values.size // 250_000)
    return float(filters.threshold_otsu(values[::step]))


def _objects(raw: np.ndarray, t: float, p: FluorescenceParams, mpp: float) -> np.ndarray:
    sig, blob = raw[..., _SIGNAL], raw[..., _BLOB]
    fg = ndi.binary_fill_holes(ndi.binary_opening(sig > t, iterations=1))
    if not fg.any():
        return np.zeros(sig.shape, np.int32)
    dist = max(1, int(round(p.min_seed_distance_um / mpp)))
    peaks = feature.peak_local_max(blob, min_distance=dist, labels=fg.astype(np.int32))
    markers = np.zeros(sig.shape, np.int32)
    markers[tuple(peaks.T)] = np.arange(1, len(peaks) + 1)
    comps, n = ndi.label(fg)
    seeded = np.zeros(n + 1, bool)
    seeded[comps[markers > 0]] = True
    lone = ~seeded[comps] & fg  # components without a seed are one nucleus each
    markers[lone] = comps[lone] + len(peaks)
    labels = segmentation.watershed(-sig, markers, mask=fg)
    area = np.bincount(labels.ravel()) * (mpp * mpp)
    bad = (area < p.min_area_um2) | (area > p.max_area_um2)
    bad[0] = False
    labels[bad[labels]] = 0
    relabelled: np.ndarray = segmentation.relabel_sequential(labels)[0]
    return relabelled.astype(np.int32, copy=False)


def segment_fluorescence_array(
    channel: np.ndarray, *, mpp: float, params: FluorescenceParams | None = None
) -> np.ndarray:
    """Segment the nuclei of one fluorescence channel held in memory, at its own pixels.

    Parameters
    ----------
    channel : (M, N) ndarray
        The nuclear channel (any dtype).
    mpp : float
        Its pixel size in µm/px.
    params : FluorescenceParams, optional
        Parameters (``target_mpp`` is not used: the image is segmented as it is).

    Returns
    -------
    (M, N) ndarray of int32
        Instance labels, 0 = background.
    """
    image = np.asarray(channel)
    if image.ndim != 2:
        raise ValueError(f"channel must be a 2-D image; got shape {image.shape}")
    seg = FluorescenceSegmenter(params)
    seg.prepare(image, mpp=mpp)
    return seg.postprocess(seg.predict(image[None, ..., None], mpp=mpp)[0], mpp=mpp)
