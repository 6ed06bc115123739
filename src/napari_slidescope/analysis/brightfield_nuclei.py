"""Built-in CPU nuclei segmentation for H&E (classical, no trained model).

The method runs in two stages, so that a tiled pipeline can overlap them (the "model" stage
batched, the post-processing in a pool of CPU workers):

``predict`` (pixel maps, per tile batch)
    Colour deconvolution with slide-level stain vectors (:mod:`.stains`); the hematoxylin OD
    smoothed at ``sigma_um``; a multi-scale, scale-normalised Laplacian-of-Gaussian "blob"
    response of the hematoxylin (nucleus centres); the eosin OD (for measurements); and a
    foreground ramp around the slide-level hematoxylin threshold.
``postprocess`` (objects, per tile)
    Seeds are the blob maxima at least ``min_seed_distance_um`` apart. Every seed owns the
    pixels within ``background_radius_um`` that a watershed of the hematoxylin gives it, and
    inside that neighbourhood its own Otsu threshold separates nucleus from local background
    (adaptive per nucleus, limited to ``threshold_range`` times the global threshold, so pale
    vesicular and dark lymphocyte nuclei in one field are both outlined at their own edge).
    Neighbourhoods without contrast are dropped; objects are opened, their holes filled,
    filtered to ``min_area_um2``-``max_area_um2`` and dilated by ``outline_dilation_um``
    (annotators draw outlines on the boundary, so the outline pixels belong to the nucleus).

Every parameter is physical (µm, µm², optical density), so the method behaves the same at any
scan resolution; the work is done at ``target_mpp``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi
from skimage import filters, measure, morphology, segmentation, transform

from napari_slidescope.analysis._builtin_method import BuiltinMethod
from napari_slidescope.analysis.checks import check_nuclei_params, check_rgb
from napari_slidescope.analysis.stains import (
    StainMatrix,
    estimate_stains,
    for_stain,
    rgb_to_od,
    stain_kind,
)
from napari_slidescope.errors import SlidescopeWarning

__all__ = ["RAW_CHANNELS", "BuiltinSegmenter", "NucleiParams", "segment_nuclei_array"]

#: Names of the channels of the raw maps returned by :meth:`BuiltinSegmenter.predict`.
RAW_CHANNELS = ("hematoxylin", "eosin", "blob", "foreground")
_H, _E, _BLOB, _FG = range(4)
_HIST_BINS = 64
_HIST_MAX_OD = 2.0
_MIN_TISSUE_PIXELS = 200
_SQRT_PI_2 = math.sqrt(math.pi) / 2
_CROSS = ndi.generate_binary_structure(2, 1)


@dataclass(frozen=True)
class NucleiParams:
    """Parameters of the built-in nuclei segmentation, all in physical units.

    The defaults are meant for any H&E slide, without tuning.

    Attributes
    ----------
    target_mpp : float
        Working resolution in µm/px. 0.25 (40x) keeps nucleus outlines exact: at 0.5 µm/px a
        one-pixel boundary error is already ~15 % of the area of a 6 µm lymphocyte nucleus,
        which costs matches at IoU 0.5; the method still runs at > 1.5 Mpx/s per core.
    background_radius_um : float
        Radius of the neighbourhood around each seed in which the nucleus is thresholded
        against its own local background (a nucleus is at most ~10 µm across, so 8 µm from
        its centre reaches the surrounding cytoplasm or stroma).
    sigma_um : float
        Gaussian smoothing of the hematoxylin before thresholding. 1 µm is the scale of the
        chromatin texture (nucleoli, chromatin clumps) that must not break a nucleus apart,
        and well below a nucleus radius (2.5-5 µm).
    min_area_um2, max_area_um2 : float
        Objects outside this area range are removed (10 µm² ≈ a 3.6 µm disc, below any
        nucleus but above debris; 400 µm² ≈ a 22 µm disc, above any single nucleus).
    threshold : float or None
        Global hematoxylin OD threshold; None estimates it by Otsu's method over the tissue
        of the reference image given to :meth:`BuiltinSegmenter.prepare` (else per tile).
    threshold_range : tuple of float
        Each nucleus's own threshold is kept within these multiples of the global one.
    seed_radii_um : tuple of float
        Radii of the blobs searched for seeds (a LoG of sigma ``r / sqrt(2)`` peaks on a disc
        of radius ``r``): 2.8 µm (lymphocytes) and 4.2 µm (epithelial/tumour nuclei).
    min_seed_distance_um : float
        Minimum distance between two seeds (about half the smallest nucleus diameter).
    seed_threshold : float
        Minimum blob response (OD) of a seed.
    min_contrast : float
        Minimum OD difference between a nucleus and its local background.
    glass_od : float
        Hematoxylin OD below which a pixel is glass or empty space, never a nucleus.
    opening_radius_um : float
        Morphological opening that removes thin bridges and spurs.
    outline_dilation_um : float
        Final dilation of every object (annotated outlines lie on the nucleus boundary).
    """

    target_mpp: float = 0.25
    background_radius_um: float = 8.0
    sigma_um: float = 1.0
    min_area_um2: float = 10.0
    max_area_um2: float = 400.0
    threshold: float | None = None
    threshold_range: tuple[float, float] = (0.7, 1.2)
    seed_radii_um: tuple[float, ...] = (2.8, 4.2)
    min_seed_distance_um: float = 2.5
    seed_threshold: float = 0.05
    min_contrast: float = 0.08
    glass_od: float = 0.1
    opening_radius_um: float = 0.5
    outline_dilation_um: float = 0.25

    def __post_init__(self) -> None:
        check_nuclei_params(self)
        lo, hi = self.threshold_range
        if not 0 < lo <= hi:
            raise ValueError(f"NucleiParams.threshold_range must be 0 < lo <= hi; got {lo, hi}")
        if self.threshold is not None and not self.threshold > 0:
            raise ValueError(f"NucleiParams.threshold must be > 0 or None; got {self.threshold!r}")

    @property
    def max_diameter_um(self) -> float:
        """Diameter of a disc of ``max_area_um2``."""
        return 2.0 * math.sqrt(self.max_area_um2 / math.pi)


def _check_mpp(mpp: float) -> float:
    if not (isinstance(mpp, int | float) and mpp > 0 and math.isfinite(mpp)):
        raise ValueError(f"mpp must be a positive pixel size in µm/px; got {mpp!r}")
    return float(mpp)


def _otsu_tissue(h: np.ndarray, glass_od: float) -> float | None:
    tissue = h[h > glass_od]
    if tissue.size < _MIN_TISSUE_PIXELS or np.ptp(tissue) <= 0:
        return None
    step = max(1, tissue.size // 250_000)
    return float(filters.threshold_otsu(tissue[::step]))


class BuiltinSegmenter(BuiltinMethod[NucleiParams]):
    """Classical H&E nuclei segmenter in two stages (see the module docstring).

    Parameters
    ----------
    params : NucleiParams, optional
        Parameters; the defaults suit H&E in general.
    stains : StainMatrix, optional
        Stain vectors to use for every slide. When None, every call of :meth:`prepare`
        estimates them afresh from its reference, so one segmenter can be reused over
        slides (or regions) of different staining.

    Examples
    --------
    >>> seg = BuiltinSegmenter()
    >>> seg.prepare(thumbnail)  # doctest: +SKIP
    >>> raw = seg.predict(tiles, mpp=0.25)  # doctest: +SKIP
    >>> labels = [seg.postprocess(r, mpp=0.25) for r in raw]  # doctest: +SKIP
    """

    name = "builtin"
    input = "brightfield"
    raw_channels = RAW_CHANNELS

    def __init__(self, params: NucleiParams | None = None, *, stains: StainMatrix | None = None):
        super().__init__(params if params is not None else NucleiParams())
        self.stains = stains
        self._fixed_stains = stains is not None

    @property
    def min_overlap_um(self) -> float:
        """Tile overlap (µm) that makes objects near tile edges independent of the cut."""
        p = self.params
        context = p.background_radius_um + 4.0 * max(p.sigma_um, *p.seed_radii_um)
        return 2.0 * max(p.max_diameter_um, context)

    def prepare(self, reference_rgb: np.ndarray, *, mpp: float | None = None) -> None:
        """Estimate slide-level stain vectors and hematoxylin threshold from a reference.

        Call it once per slide or region, before its tiles: both are re-estimated on every
        call, except stains given to the constructor and a ``params.threshold``, which are
        kept.

        Parameters
        ----------
        reference_rgb : (M, N, 3) ndarray of uint8
            Pixels of the slide or region as the tiles will be (``segment_nuclei`` passes
            crops of up to 8 of its tiles at the working resolution, stacked).
        mpp : float, optional
            Pixel size of the reference. When it is finer than ``sigma_um``, the hematoxylin
            is smoothed like the tiles before its threshold is estimated (from an
            unsmoothed, sub-sampled thumbnail the threshold of a real 20x slide came out
            twice too high); a coarser reference must be averaged (a pyramid level), not
            sub-sampled.
        """
        ref = np.asarray(reference_rgb)
        check_rgb(ref, "reference_rgb", ndim=3)
        if not self._fixed_stains:
            self.stains = estimate_stains(ref)
            # IHC: DAB lies on hematoxylin in positive nuclei, so Macenko's second vector
            # is a mix of the two and unmixing with it takes hematoxylin away from them;
            # the reference DAB vector gives their hematoxylin back (see `for_stain`)
            if stain_kind(self.stains) == "H-DAB":
                self.stains = for_stain(self.stains, "H-DAB")
        assert self.stains is not None  # set just above, or fixed at construction
        if self.params.threshold is None:
            h = self.stains.separate(ref)[..., 0]
            if mpp is not None and self.params.sigma_um / _check_mpp(mpp) > 0.5:
                h = ndi.gaussian_filter(h, self.params.sigma_um / mpp, truncate=3.0)
            self.threshold = _otsu_tissue(h, self.params.glass_od)

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Model stage: pixel maps of a batch of tiles.

        Parameters
        ----------
        tiles : (B, H, W, 3) ndarray of uint8
            RGB tiles, ideally at ``target_mpp``.
        mpp : float
            Pixel size of the tiles in µm/px.

        Returns
        -------
        (B, H, W, 4) ndarray of float32
            Channels :data:`RAW_CHANNELS`: hematoxylin OD (smoothed), eosin OD (smoothed),
            blob response (OD), foreground ramp in [0, 1] (0 below the lowest allowed
            threshold, 1 above the highest).

        Raises
        ------
        ValueError
            If the tiles are not a uint8 RGB batch or ``mpp`` is not positive.
        """
        tiles = np.asarray(tiles)
        check_rgb(tiles, "tiles", ndim=4)
        mpp = _check_mpp(mpp)
        if self.stains is None:
            warnings.warn(
                "BuiltinSegmenter.prepare() was not called; estimating stains from this batch",
                SlidescopeWarning,
                stacklevel=2,
            )
            self.prepare(tiles.reshape(-1, tiles.shape[-2], 3))
        assert self.stains is not None
        p = self.params
        out = np.empty((*tiles.shape[:3], len(RAW_CHANNELS)), dtype=np.float32)
        inv = np.linalg.inv(self.stains.matrix).astype(np.float32)[:, :2]
        sigma = p.sigma_um / mpp
        for b, tile in enumerate(tiles):
            he = rgb_to_od(tile) @ inv
            h = np.ascontiguousarray(he[..., 0])
            out[b, ..., _H] = ndi.gaussian_filter(h, sigma, truncate=3.0)
            out[b, ..., _E] = ndi.gaussian_filter(he[..., 1], sigma, truncate=3.0)
            out[b, ..., _BLOB] = _blob_response(h, p.seed_radii_um, mpp)
            t = (
                self.threshold
                if self.threshold is not None
                else _otsu_tissue(out[b, ..., _H], p.glass_od)
            )
            if t is None:  # no tissue in this tile
                out[b, ..., _FG] = 0.0
                continue
            lo, hi = (f * t for f in p.threshold_range)
            ramp = (out[b, ..., _H] - lo) / max(hi - lo, 1e-6)
            out[b, ..., _FG] = np.clip(ramp, 0.0, 1.0)
            # a pixel just above `lo` must not read as 0: keep it strictly positive
            out[b, ..., _FG][(out[b, ..., _H] > lo) & (ramp <= 0)] = 1e-6
        return out

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Post-processing stage: instance labels from the raw maps of one tile.

        Parameters
        ----------
        raw : (H, W, 4) ndarray of float32
            One tile of :meth:`predict`'s output.
        mpp : float
            Pixel size in µm/px.

        Returns
        -------
        (H, W) ndarray of int32
            0 = background, 1..n = nuclei (consecutive).

        Raises
        ------
        ValueError
            If ``raw`` does not have the channels of :data:`RAW_CHANNELS`.
        """
        raw = np.asarray(raw)
        if raw.ndim != 3 or raw.shape[-1] != len(RAW_CHANNELS):
            raise ValueError(
                f"raw must have shape (H, W, {len(RAW_CHANNELS)}) with channels {RAW_CHANNELS}; "
                f"got {raw.shape}"
            )
        return _postprocess(raw.astype(np.float32, copy=False), self.params, _check_mpp(mpp))


def _blob_response(h: np.ndarray, radii_um: tuple[float, ...], mpp: float) -> np.ndarray:
    """Max over scales of the scale-normalised negative LoG (bright blobs of hematoxylin)."""
    # LoG sigmas are >= 2 µm: compute them on a 2x-binned image when the binned sigma is
    # still >= 3.75 px (true from 0.26 µm/px down, so 0.25 and 0.2457 µm/px take one path)
    binned = min(radii_um) / math.sqrt(2) / mpp >= 7.5 and min(h.shape) >= 8
    src, step = (h, 1)
    if binned:
        ny, nx = (h.shape[0] // 2) * 2, (h.shape[1] // 2) * 2
        src = h[:ny, :nx].reshape(ny // 2, 2, nx // 2, 2).mean(axis=(1, 3))
        step = 2
    resp: np.ndarray | None = None
    for r in radii_um:
        s = r / math.sqrt(2) / (mpp * step)
        cur = -(s**2) * ndi.gaussian_laplace(src, s, truncate=3.0)
        resp = cur if resp is None else np.maximum(resp, cur)
    assert resp is not None
    if step == 1:
        return resp
    full = np.repeat(np.repeat(resp, 2, axis=0), 2, axis=1)
    return np.pad(
        full, ((0, h.shape[0] - full.shape[0]), (0, h.shape[1] - full.shape[1])), mode="edge"
    )


def _per_label_otsu(cells: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Otsu threshold and between-class contrast of ``values`` inside every label 0..n."""
    nb, vmax = _HIST_BINS, _HIST_MAX_OD
    bins = np.clip((values * (nb / vmax)).astype(np.int64), 0, nb - 1)
    counts = np.bincount((cells.astype(np.int64) * nb + bins).ravel(), minlength=(n + 1) * nb)
    hist = counts.reshape(n + 1, nb).astype(np.float64)
    centers = (np.arange(nb) + 0.5) * (vmax / nb)
    w0 = np.cumsum(hist, axis=1)
    m0 = np.cumsum(hist * centers, axis=1)
    w1 = w0[:, -1:] - w0
    with np.errstate(divide="ignore", invalid="ignore"):
        mu0 = m0 / w0
        mu1 = (m0[:, -1:] - m0) / w1
        between = np.nan_to_num(w0 * w1 * (mu0 - mu1) ** 2, nan=-1.0)
    k = between.argmax(axis=1)
    rows = np.arange(n + 1)
    contrast = np.nan_to_num(mu1[rows, k] - mu0[rows, k])
    return ((k + 1) * (vmax / nb)).astype(np.float32), contrast


def _disk(radius_px: float) -> np.ndarray:
    disk: np.ndarray = morphology.disk(max(1, int(round(radius_px))))
    return disk


def _postprocess(raw: np.ndarray, p: NucleiParams, mpp: float) -> np.ndarray:
    hs, blob, fg = raw[..., _H], raw[..., _BLOB], raw[..., _FG]
    shape = hs.shape
    candidate = fg > 0
    if not candidate.any():
        return np.zeros(shape, dtype=np.int32)
    # seeds: blob maxima on candidate nucleus pixels
    md = max(1, int(round(p.min_seed_distance_um / mpp)))
    peaks = (
        (blob == ndi.maximum_filter(blob, size=2 * md + 1)) & (blob > p.seed_threshold) & candidate
    )
    markers = measure.label(peaks, connectivity=2)  # plateaus give one seed
    n = int(markers.max())
    if n == 0:
        return np.zeros(shape, dtype=np.int32)
    # neighbourhood of every seed, split between seeds along hematoxylin valleys
    reach = int(round(p.background_radius_um * _SQRT_PI_2 / mpp))  # square of the disc area
    near = ndi.maximum_filter(peaks.view(np.uint8), size=2 * reach + 1) > 0
    cells = segmentation.watershed(-hs, markers, mask=near & (hs > p.glass_od))
    thr, contrast = _per_label_otsu(cells, hs, n)
    keep = contrast >= p.min_contrast
    keep[0] = False
    # pixel > own threshold, where the own threshold is clamped to threshold_range:
    # clamp(t, lo, hi) < v  <=>  v > lo and (v > t or v > hi)
    inside = candidate & ((hs > thr[cells]) | (fg >= 1.0)) & keep[cells]
    if p.opening_radius_um / mpp >= 1.0:
        inside = ndi.binary_opening(inside, _disk(p.opening_radius_um / mpp))
    labels = np.where(inside, cells, 0)
    # fill holes (pale vesicular centres) up to a quarter of the largest nucleus
    max_hole = int(p.max_area_um2 / 4.0 / mpp**2)
    filled = morphology.remove_small_holes(labels > 0, max_size=max_hole)
    holes = filled & (labels == 0)
    if holes.any():  # each hole takes the label of an object on its rim
        hole_id, n_holes = ndi.label(holes)
        rim = ndi.grey_dilation(hole_id, size=3) * (labels > 0)
        owner = np.zeros(n_holes + 1, dtype=labels.dtype)
        np.maximum.at(owner, rim[rim > 0], labels[rim > 0])
        labels = np.where(holes, owner[hole_id], labels)
    # area filter in µm²
    area = np.bincount(labels.ravel(), minlength=n + 1) * (mpp * mpp)
    bad = (area < p.min_area_um2) | (area > p.max_area_um2)
    bad[0] = True
    labels[bad[labels]] = 0
    dil = p.outline_dilation_um / mpp
    for _ in range(int(round(dil))):  # grow into background only, one pixel per step
        grown = ndi.grey_dilation(labels, footprint=_CROSS)
        labels = np.where(labels == 0, grown, labels)
    relabelled: np.ndarray = segmentation.relabel_sequential(labels)[0]
    return relabelled.astype(np.int32, copy=False)


def segment_nuclei_array(
    rgb: np.ndarray,
    *,
    mpp: float,
    params: NucleiParams | None = None,
    stains: StainMatrix | None = None,
) -> np.ndarray:
    """Segment the nuclei of one H&E image held in memory.

    The image is resampled to ``params.target_mpp`` when its pixel size differs by more than
    5 %, segmented there, and the labels are brought back to the input's shape (nearest
    neighbour).

    Parameters
    ----------
    rgb : (M, N, 3) ndarray of uint8
        H&E image.
    mpp : float
        Pixel size of ``rgb`` in µm/px.
    params : NucleiParams, optional
        Segmentation parameters.
    stains : StainMatrix, optional
        Stain vectors; estimated from ``rgb`` itself when None.

    Returns
    -------
    (M, N) ndarray of int32
        Instance labels, 0 = background, 1..n = nuclei.

    Raises
    ------
    ValueError
        If ``rgb`` is not a uint8 RGB image (grayscale and RGBA are refused) or ``mpp`` is
        not positive.

    Examples
    --------
    >>> labels = segment_nuclei_array(rgb, mpp=0.25)  # doctest: +SKIP
    """
    rgb = np.asarray(rgb)
    check_rgb(rgb, "rgb", ndim=3)
    mpp = _check_mpp(mpp)
    seg = BuiltinSegmenter(params, stains=stains)
    work_mpp = seg.target_mpp
    image = rgb
    if abs(mpp / work_mpp - 1.0) > 0.05:
        scale = mpp / work_mpp
        image = transform.rescale(
            rgb, scale, order=1, channel_axis=-1, anti_aliasing=scale < 1, preserve_range=True
        )
        image = np.clip(np.round(image), 0, 255).astype(np.uint8)
    else:
        work_mpp = mpp
    seg.prepare(image, mpp=work_mpp)
    labels = seg.postprocess(seg.predict(image[np.newaxis], mpp=work_mpp)[0], mpp=work_mpp)
    if labels.shape != rgb.shape[:2]:
        rows = np.minimum(
            (np.arange(rgb.shape[0]) + 0.5) * labels.shape[0] / rgb.shape[0], labels.shape[0] - 1
        )
        cols = np.minimum(
            (np.arange(rgb.shape[1]) + 0.5) * labels.shape[1] / rgb.shape[1], labels.shape[1] - 1
        )
        labels = labels[np.ix_(rows.astype(np.intp), cols.astype(np.intp))]
        labels, _, _ = segmentation.relabel_sequential(labels)
        labels = labels.astype(np.int32, copy=False)
    return labels
