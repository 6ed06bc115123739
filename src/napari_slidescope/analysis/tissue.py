"""Tissue detection on an in-memory image at a coarse working resolution.

The functions here see one array (a slide thumbnail or a level read at about
8 µm/px) and return a boolean tissue mask. Every size is given in physical units
(µm, µm²) and converted with the image's ``mpp``, so the same defaults work at any
working resolution.

Two modes:

``"brightfield"`` (H&E, IHC)
    Tissue is darker and more saturated than the glass. The feature is
    ``max(saturation, relative darkness)``, smoothed, and thresholded by Otsu over
    plausible pixels; the threshold is clipped to :data:`BRIGHTFIELD_THRESHOLD_RANGE`
    so that an all-glass image stays empty and an all-tissue image stays full.
    Pen marks (saturated blue/green) and near-black debris are rejected.
``"fluorescence"``
    Tissue is brighter than a dark background. The feature is the maximum over
    channels, smoothed, thresholded by Otsu in the log domain, never below the
    background level plus a few noise widths.

Both modes then close and open with a disk of the smoothing radius, drop pieces
smaller than ``min_tissue_um2`` and fill holes smaller than ``max_hole_um2``.

Pale tissue open to the glass (fat: thin membranes around empty vacuoles at the edge of a
section) falls below the brightfield threshold and is no hole to fill: at 8 µm/px a 2 µm
membrane lifts its pixel's feature to about 0.05, under the threshold's low end. With
``envelope_um`` (off by default, so masks stay as they were) :func:`pale_tissue_envelope`
adds it: pixels darker than their surroundings by a thin line's contrast (membranes; a
black top-hat, which flat glass and the steps between scan tiles do not pass) are closed
by a disk about an adipocyte's radius, and the pieces that touch the tissue join it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np
from scipy import ndimage as ndi
from skimage import filters

from napari_slidescope.analysis._strips import map_parallel, row_strips
from napari_slidescope.analysis.checks import check_image
from napari_slidescope.analysis.geometry import gather, label_sizes
from napari_slidescope.analysis.resample import block_mean

__all__ = [
    "BRIGHTFIELD_THRESHOLD_RANGE",
    "DEFAULT_MAX_HOLE_UM2",
    "DEFAULT_MIN_TISSUE_UM2",
    "DEFAULT_SMOOTH_UM",
    "ENVELOPE_CONTRAST",
    "ENVELOPE_LINE_UM",
    "Mode",
    "artifact_mask",
    "block_mean",
    "brightfield_feature",
    "fill_small_holes",
    "fluorescence_feature",
    "infer_mode",
    "pale_tissue_envelope",
    "remove_small_pieces",
    "tissue_mask",
]

Mode = Literal["brightfield", "fluorescence"]

#: The automatic brightfield threshold is clipped into this range (feature units, 0..1):
#: glass with JPEG tint stays below the low end, stained tissue above the high end.
BRIGHTFIELD_THRESHOLD_RANGE: tuple[float, float] = (0.08, 0.30)
#: Gaussian smoothing sigma (µm) per mode; fluorescence needs more to bridge nuclei.
DEFAULT_SMOOTH_UM: dict[str, float] = {"brightfield": 8.0, "fluorescence": 20.0}
#: Pieces of tissue smaller than this (µm², a 50 µm square) are dropped as dust.
DEFAULT_MIN_TISSUE_UM2 = 2_500.0
#: Holes smaller than this (µm², gaps of a few cells) are filled; lumens and tears stay.
DEFAULT_MAX_HOLE_UM2 = 1_000.0

#: A membrane is at least this much darker (brightness 0..1) than the brightest pixel
#: within :data:`ENVELOPE_LINE_UM` of it (glass, flat, scores under 0.01 at 8 µm/px; fat
#: membranes 0.03-0.2; measured in benchmarks/regions_gate.py).
ENVELOPE_CONTRAST = 0.03
#: Width of the black top-hat's square, µm: lines thinner than it (membranes, 1-10 µm)
#: pass, steps between flat areas (scan-tile seams on the glass, tissue borders) do not.
ENVELOPE_LINE_UM = 40.0

_MODES = ("brightfield", "fluorescence")
_DARK_MEAN = 0.2  # an RGB image darker than this on average is fluorescence
_GLASS_MAX = 0.12  # a class of pixels whose mean feature is below this is glass
_FLUO_MIN_LOG_CONTRAST = math.log(1.5)  # tissue is at least 1.5x brighter than background


def _unit_scale(image: np.ndarray) -> float:
    """Value that maps the image's range to 1 (255 for uint8, the max for floats > 1)."""
    if image.dtype == np.uint8:
        return 255.0
    if np.issubdtype(image.dtype, np.integer):
        return float(max(int(image.max()), 1))
    mx = float(np.nanmax(image)) if image.size else 1.0
    return mx if mx > 1.0 else 1.0


def infer_mode(image: np.ndarray) -> Mode:
    """Guess the imaging mode of a working-resolution image.

    Parameters
    ----------
    image : (M, N) or (M, N, C) ndarray
        RGB(A) images are brightfield unless very dark on average; grayscale and
        multichannel (C != 3, 4) images are fluorescence.

    Returns
    -------
    {'brightfield', 'fluorescence'}
    """
    image = check_image(image)
    if image.ndim == 2 or image.shape[-1] not in (3, 4):
        return "fluorescence"
    mean = float(image[..., :3].mean()) / _unit_scale(image)
    return "fluorescence" if mean < _DARK_MEAN else "brightfield"


def _rgb_planes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """R, G, B as separate float32 planes in 0..1 (faster than reducing a last axis of 3)."""
    rgb = _check_rgb(rgb)
    return _planes(rgb, np.float32(1.0 / _unit_scale(rgb)))


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    rgb = check_image(rgb, name="rgb")
    if rgb.ndim != 3 or rgb.shape[-1] not in (3, 4):
        raise ValueError(f"rgb: expected an (M, N, 3) RGB image, got shape {rgb.shape}")
    return rgb


def _planes(rgb: np.ndarray, scale: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(rgb[..., i].astype(np.float32) * scale for i in range(3))  # type: ignore[return-value]


#: Pixels per strip of :func:`_brightfield` (its float32 temporaries stay small and are
#: reused: whole-image temporaries are fresh memory, slow to touch in a new process).
_STRIP_PIXELS = 1 << 16


def _gray(r: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Brightness (Rec. 601 luma) of R, G, B planes in 0..1."""
    gray: np.ndarray = np.float32(0.299) * r + np.float32(0.587) * g + np.float32(0.114) * b
    return gray


def _glass_level(sub: np.ndarray, scale: np.float32) -> np.float32:
    """Brightness of the glass: the 99th percentile of `sub`'s (never below 0.8)."""
    gray = np.empty(sub.shape[:2], np.float32)

    def strip(sl: slice) -> None:
        gray[sl] = _gray(*_planes(sub[sl], scale))

    map_parallel(strip, row_strips(sub.shape[0], sub.shape[1], _STRIP_PIXELS))
    return np.float32(max(float(np.percentile(gray, 99)), 0.8))


def _brightfield(rgb: np.ndarray, *, artifacts: bool) -> tuple[np.ndarray, np.ndarray | None]:
    rgb = _check_rgb(rgb)
    scale = np.float32(1.0 / _unit_scale(rgb))
    rows, cols = rgb.shape[:2]
    # the glass level from every other pixel's brightness (computed for those pixels only:
    # a whole-image brightness plane is 4 bytes a pixel); each value is computed pixel by
    # pixel, so strips, threads and subsampling change no bit
    white = _glass_level(rgb[::2, ::2], scale)
    feature = np.empty((rows, cols), np.float32)
    bad = np.empty((rows, cols), bool) if artifacts else None

    def strip(sl: slice) -> None:
        r, g, b = _planes(rgb[sl], scale)
        mx = np.maximum(np.maximum(r, g), b)
        mn = np.minimum(np.minimum(r, g), b)
        chroma = mx - mn
        sat = chroma / np.maximum(mx, np.float32(0.05))
        dark = np.clip(1.0 - _gray(r, g, b) / white, 0.0, 1.0)
        np.maximum(sat, dark, out=feature[sl])
        if bad is None:
            return
        safe = np.maximum(chroma, np.float32(1e-6))
        # hue in degrees where green or blue is the largest channel (red-dominant: not ink)
        hue = np.where(g >= b, 120.0 + 60.0 * (b - r) / safe, 240.0 + 60.0 * (r - g) / safe)
        ink = (mx > r) & (hue >= 75.0) & (hue <= 250.0) & (sat > 0.25) & (chroma > 0.08)
        # near-black and grey (not the deep purple of dense hematoxylin): marker, debris
        np.bitwise_or(ink, (mx < 0.25) & (sat < 0.35), out=bad[sl])

    map_parallel(strip, row_strips(rows, cols, _STRIP_PIXELS))
    return feature, bad


def brightfield_feature(rgb: np.ndarray) -> np.ndarray:
    """Tissue-ness of brightfield pixels: ``max(saturation, relative darkness)``.

    Parameters
    ----------
    rgb : (M, N, 3) ndarray
        RGB image (uint8, or float in 0..1).

    Returns
    -------
    (M, N) ndarray of float32
        In 0..1: about 0 on glass, 0.3-0.6 on stained tissue. Darkness is relative
        to the glass, estimated as the 99th percentile of brightness (never below 0.8).
    """
    return _brightfield(rgb, artifacts=False)[0]


def artifact_mask(rgb: np.ndarray) -> np.ndarray:
    """Pixels that are pen ink or debris rather than tissue (brightfield).

    Parameters
    ----------
    rgb
        As for :func:`brightfield_feature`.

    Returns
    -------
    (M, N) ndarray of bool
        True for saturated blue or green ink (hue 75°-250°, where neither H&E nor
        DAB lies), and for near-black, unsaturated pixels (brightest channel < 0.25,
        saturation < 0.35: black marker, dust, debris; dense hematoxylin is more
        saturated and stays).
    """
    bad = _brightfield(rgb, artifacts=True)[1]
    assert bad is not None
    return bad


def fluorescence_feature(image: np.ndarray) -> np.ndarray:
    """Brightness of fluorescence pixels: the maximum over channels, scaled to 0..1.

    Parameters
    ----------
    image : (M, N) or (M, N, C) ndarray
        Channels last.

    Returns
    -------
    (M, N) ndarray of float32
        The channel maximum divided by its 99.5th percentile, clipped to 0..1.
    """
    image = check_image(image)
    m = image if image.ndim == 2 else image.max(axis=-1)
    m = m.astype(np.float32)
    hi = float(np.percentile(m, 99.5))
    if hi <= 0:
        hi = float(m.max()) or 1.0
    return np.clip(m / np.float32(hi), 0.0, 1.0)


class _Values:
    """The `valid` values of an array, as row strips for passes on a few threads.

    No copy of the values is made (a whole-slide feature is 50-75 MiB): the passes mask
    each strip with `valid` (``where=``), and only the histogram picks a strip's valid
    values at a time. ``lo``, ``hi``, ``n`` and ``total`` are their minimum, maximum (in
    the values' type), count and float64 sum.
    """

    def __init__(self, values: np.ndarray, valid: np.ndarray | None = None) -> None:
        self.values = values.reshape(values.shape[0], -1) if values.ndim > 1 else values[None]
        self.valid = None if valid is None else valid.reshape(self.values.shape)
        self.strips = row_strips(*self.values.shape)
        ext = map_parallel(self._extent, self.strips)
        full = [e for e in ext if e[2]]
        self.n = sum(e[2] for e in full)
        # numpy scalars of the values' type (np.histogram's own range when given none)
        self.lo: Any = min((e[0] for e in full), default=None)
        self.hi: Any = max((e[1] for e in full), default=None)
        self.total = math.fsum(e[3] for e in full)

    def part(self, sl: slice) -> np.ndarray:
        """Return the valid values of the strip `sl` (a copy when some are not)."""
        v = self.values[sl]
        return v.ravel() if self.valid is None else v[self.valid[sl]]

    def _extent(self, sl: slice) -> tuple[Any, Any, int, float]:
        v = self.values[sl]
        if self.valid is None:
            if v.size == 0:
                return None, None, 0, 0.0
            return v.min(), v.max(), v.size, float(v.sum(dtype=np.float64))
        ok = self.valid[sl]
        n = int(np.count_nonzero(ok))
        if n == 0:
            return None, None, 0, 0.0
        lo = v.min(where=ok, initial=np.inf)
        hi = v.max(where=ok, initial=-np.inf)
        return lo, hi, n, float(v.sum(where=ok, dtype=np.float64))

    def below(self, sl: slice, t: float) -> tuple[int, float]:
        """Count and float64 sum of the strip's valid values <= `t`."""
        v = self.values[sl]
        low = v <= t
        if self.valid is not None:
            low &= self.valid[sl]
        return int(np.count_nonzero(low)), float(v.sum(where=low, dtype=np.float64))

    def spread(self) -> float:
        """Return ``max - min`` of the values, computed in their type (0 when fewer than two)."""
        if self.n < 2 or self.lo is None or self.hi is None:
            return 0.0
        return float(self.hi - self.lo)


def _two_classes(values: _Values) -> tuple[float, float, float]:
    """Otsu refined to the midpoint of the two class means (Ridler-Calvard).

    The midpoint puts the boundary of a blurred step edge where the step was, which
    Otsu alone does not when the classes differ in size. Returns the threshold and
    the means of the lower and upper classes.

    Every pass runs over row strips on a few threads: the histogram is skimage's own
    (256 bins over the values' range, counted strip by strip: the same counts), the
    class sums are float64.
    """
    rng = (values.lo, values.hi)
    hists = map_parallel(
        lambda sl: np.histogram(values.part(sl), bins=256, range=rng), values.strips
    )
    counts = np.sum([h[0] for h in hists], axis=0)
    edges = hists[0][1]
    t = float(filters.threshold_otsu(hist=(counts, (edges[:-1] + edges[1:]) / 2.0)))
    low_mean, high_mean = t, t
    total, n = values.total, values.n

    for _ in range(10):
        # class sums without copying either class
        sums = map_parallel(functools.partial(values.below, t=t), values.strips)
        n_low = sum(c for c, _ in sums)
        if n_low == 0 or n_low == n:
            break
        low_sum = math.fsum(s for _, s in sums)
        low_mean, high_mean = low_sum / n_low, (total - low_sum) / (n - n_low)
        new = 0.5 * (low_mean + high_mean)
        if abs(new - t) < 1e-4:
            return new, low_mean, high_mean
        t = new
    return t, low_mean, high_mean


def _brightfield_threshold(feature: np.ndarray, valid: np.ndarray) -> float:
    lo, hi = BRIGHTFIELD_THRESHOLD_RANGE
    values = _Values(feature, None if valid.all() else valid)
    if values.spread() < 1e-6:
        return lo
    t, low_mean, high_mean = _two_classes(values)
    if low_mean > _GLASS_MAX:  # both classes are tissue: no glass in view
        return lo
    if high_mean < _GLASS_MAX:  # both classes are glass: no tissue in view
        return max(t, hi)
    return float(np.clip(t, lo, hi))


def _fluorescence_threshold(feature: np.ndarray) -> float:
    eps = np.float32(1e-3)
    logf = np.log(feature + eps)
    values = _Values(logf)
    if values.spread() < 1e-6:
        return 1.0
    t, low_mean, high_mean = _two_classes(values)
    if high_mean - low_mean < _FLUO_MIN_LOG_CONTRAST:  # uniform: treat as background
        return 1.0
    # classes split in the log domain (dim tissue is far from the background there);
    # the threshold is the linear midpoint of their medians, where a blurred edge was
    low = float(np.median(feature[logf <= t]))
    high = float(np.median(feature[logf > t]))
    return 0.5 * (low + high)


def _gaussian_in_place(image: np.ndarray, sigma: float) -> None:
    """``ndi.gaussian_filter(image, sigma, mode="nearest")`` into `image`, on a few threads.

    scipy filters one axis after the other, line by line through a buffer, so each pass
    may write into its input: the pass down the columns runs on column bands, the pass
    along the rows on row strips, each band on a thread (the same bits as one call).
    """
    rows, cols = image.shape
    bands = row_strips(cols, rows)  # column bands of about as many pixels as a strip

    def down(sl: slice) -> None:
        band = image[:, sl]
        ndi.gaussian_filter1d(band, sigma, axis=0, mode="nearest", output=band)

    def along(sl: slice) -> None:
        strip = image[sl]
        ndi.gaussian_filter1d(strip, sigma, axis=1, mode="nearest", output=strip)

    map_parallel(down, bands)
    map_parallel(along, row_strips(rows, cols))


def _disk(radius: int) -> np.ndarray:
    """Pixels within `radius` of the centre: ``skimage.morphology.disk(radius)`` as bool.

    Built here: importing ``skimage.morphology`` costs a fresh process about 0.15 s.
    """
    r = np.arange(-radius, radius + 1)
    disk: np.ndarray = r[:, None] ** 2 + r[None, :] ** 2 <= radius**2
    return disk


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """``ndi.binary_dilation(mask, _disk(radius))``, as rows of horizontal runs.

    The disk is the union of its rows, each a run of half-width ``w(dy)``: the mask is
    dilated along rows once per half-width, then shifted along columns and OR-ed, about
    4 r passes over the mask where scipy tests every disk pixel at every mask pixel.
    Outside the image is background, as scipy's default ``border_value=0``.
    """
    mask = np.asarray(mask, bool)
    rows, cols = mask.shape
    widths = [math.isqrt(radius * radius - dy * dy) for dy in range(radius + 1)]
    runs = {0: mask}
    run = mask
    for w in range(1, max(widths) + 1):  # run of half-width w = run of w - 1 | shifts by w
        run = run.copy()
        if w < cols:
            run[:, w:] |= mask[:, :-w]
            run[:, :-w] |= mask[:, w:]
        runs[w] = run
    out = runs[widths[0]].copy()
    for dy in range(1, radius + 1):
        if dy >= rows:
            break
        band = runs[widths[dy]]
        out[dy:] |= band[:-dy]
        out[:-dy] |= band[dy:]
    return out


def _erode(mask: np.ndarray, radius: int) -> np.ndarray:
    """``ndi.binary_erosion(mask, _disk(radius), border_value=1)``: outside is tissue."""
    return ~_dilate(~np.asarray(mask, bool), radius)


def _px(value_um: float, mpp: float) -> float:
    return value_um / mpp


def remove_small_pieces(mask: np.ndarray, min_area: float) -> np.ndarray:
    """Drop 4-connected pieces of ``mask`` with fewer than ``min_area`` pixels.

    Parameters
    ----------
    mask : (M, N) ndarray of bool
        Binary mask.
    min_area : float
        Area in pixels.

    Returns
    -------
    (M, N) ndarray of bool
    """
    labels, n = ndi.label(mask)
    if n == 0:
        return mask.astype(bool, copy=True)
    sizes = label_sizes(labels, n)
    keep = sizes >= min_area
    keep[0] = False
    return gather(keep, labels)


def fill_small_holes(mask: np.ndarray, max_area: float) -> np.ndarray:
    """Fill holes of ``mask`` with fewer than ``max_area`` pixels.

    A hole is an 8-connected piece of background that does not touch the image
    border (the connectivity :func:`skimage.measure.find_contours` implies for the
    background, so the polygons of the mask have exactly these holes).

    Parameters
    ----------
    mask : (M, N) ndarray of bool
        Binary mask.
    max_area : float
        Area in pixels.

    Returns
    -------
    (M, N) ndarray of bool
    """
    mask = np.asarray(mask, bool)
    labels, n = ndi.label(~mask, structure=np.ones((3, 3), bool))
    if n == 0:
        return mask.copy()
    sizes = label_sizes(labels, n)
    fill = sizes < max_area
    fill[0] = False
    border = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    fill[border] = False
    filled = gather(fill, labels)
    filled |= mask
    return filled


def pale_tissue_envelope(
    rgb: np.ndarray,
    mask: np.ndarray,
    *,
    mpp: float,
    radius_um: float,
    contrast: float = ENVELOPE_CONTRAST,
    line_um: float = ENVELOPE_LINE_UM,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """Grow a tissue mask into the pale, membranous tissue that touches it (fat).

    Fat at the edge of a section is thin membranes around empty vacuoles, open to the
    glass: too pale for the tissue threshold and no hole to fill. Its membranes are thin
    lines darker than their surroundings, which glass is not, even where its brightness
    steps between scan tiles. They are found by a black top-hat (grey closing of the
    brightness with a square of `line_um`, minus the brightness) above `contrast`; with
    the mask, closed by a disk of `radius_um` (the vacuoles, up to twice that across, are
    filled; the envelope is eroded back to the outermost membranes); the pieces of that
    closing that overlap `mask` are added to it.

    Parameters
    ----------
    rgb : (M, N, 3) ndarray
        The brightfield image the mask was found on (uint8, or float in 0..1).
    mask : (M, N) ndarray of bool
        The tissue mask.
    mpp : float
        µm per pixel of both.
    radius_um : float
        Radius of the closing, µm: about an adipocyte's radius (30-75 µm).
    contrast : float
        Top-hat threshold, brightness units (0..1).
    line_um : float
        Side of the top-hat's square, µm.
    exclude : (M, N) ndarray of bool, optional
        Pixels never added (pen ink, debris: :func:`artifact_mask`).

    Returns
    -------
    (M, N) ndarray of bool
        `mask` with the envelope added (a superset of `mask`).

    Examples
    --------
    >>> rgb = np.full((64, 96, 3), 240, np.uint8)
    >>> rgb[:, :32] = (200, 110, 160)          # tissue
    >>> rgb[::8, 32:64] = rgb[:, 32:64:8] = (215, 170, 200)  # membranes of fat
    >>> mask = np.zeros((64, 96), bool); mask[:, :32] = True
    >>> out = pale_tissue_envelope(rgb, mask, mpp=8.0, radius_um=48)
    >>> bool(out[30, 50]), bool(out[30, 90])
    (True, False)
    """
    rgb = _check_rgb(rgb)
    mask = np.asarray(mask, bool)
    if mask.shape != rgb.shape[:2]:
        raise ValueError(f"mask: expected shape {rgb.shape[:2]}, got {mask.shape}")
    if radius_um < 0 or line_um < 0:
        raise ValueError(f"radius_um, line_um: expected sizes >= 0 µm, got {radius_um}, {line_um}")
    radius = int(round(_px(radius_um, mpp)))
    if radius < 1 or not mask.any():
        return mask.copy()
    r, g, b = _rgb_planes(rgb)
    gray = _gray(r, g, b)
    del r, g, b
    side = max(3, int(round(_px(line_um, mpp))) | 1)
    lines = ndi.grey_closing(gray, size=(side, side), mode="nearest") - gray > contrast
    del gray
    lines |= mask
    if exclude is not None:
        lines &= ~exclude
    # closing: outside the image is neither tissue nor glass (as tissue_mask's)
    closed = _erode(_dilate(lines, radius), radius)
    del lines
    if exclude is not None:
        closed &= ~exclude
    pieces, n = ndi.label(closed)
    keep = np.zeros(n + 1, bool)
    keep[pieces[mask]] = True
    keep[0] = False
    out = gather(keep, pieces)
    out |= mask
    return out


def tissue_mask(
    image: np.ndarray,
    *,
    mpp: float,
    mode: Mode = "brightfield",
    threshold: float | None = None,
    smooth_um: float | None = None,
    min_tissue_um2: float = DEFAULT_MIN_TISSUE_UM2,
    max_hole_um2: float = DEFAULT_MAX_HOLE_UM2,
    outer_only: bool = False,
    reject_artifacts: bool = True,
    envelope_um: float = 0.0,
) -> tuple[np.ndarray, float]:
    """Detect tissue in a low-resolution image.

    Parameters
    ----------
    image : (M, N) or (M, N, C) ndarray
        The image at working resolution; RGB for brightfield, channels last for
        fluorescence.
    mpp : float
        Pixel size of ``image`` in µm/px.
    mode : {'brightfield', 'fluorescence'}
        See the module docstring; :func:`infer_mode` guesses it.
    threshold : float, optional
        Manual threshold on the feature (0..1; see :func:`brightfield_feature`
        and :func:`fluorescence_feature`). Default: automatic.
    smooth_um : float, optional
        Gaussian sigma (µm) of the feature smoothing, also the radius of the
        morphological closing and opening. Default :data:`DEFAULT_SMOOTH_UM`.
    min_tissue_um2 : float
        Smaller tissue pieces are removed.
    max_hole_um2 : float
        Smaller holes are filled.
    outer_only : bool
        Fill every hole (keep outer contours only).
    reject_artifacts : bool
        Brightfield only: remove pen ink and near-black debris (:func:`artifact_mask`).
    envelope_um : float
        Brightfield only: radius (µm) of :func:`pale_tissue_envelope`, which adds the
        pale membranous tissue (fat) touching the mask before holes are filled; 0 (the
        default) leaves it out.

    Returns
    -------
    mask : (M, N) ndarray of bool
        True on tissue.
    threshold : float
        The feature threshold used.

    Raises
    ------
    ValueError
        For an unknown mode, a non-positive ``mpp``, negative sizes, or an image
        that is not 2-D or 3-D.

    Examples
    --------
    >>> rgb = np.full((64, 64, 3), 240, np.uint8)
    >>> rgb[16:48, 16:48] = (220, 120, 170)
    >>> mask, thr = tissue_mask(rgb, mpp=8.0, min_tissue_um2=0)
    >>> bool(mask[32, 32]), bool(mask[4, 4])
    (True, False)
    """
    image = check_image(image)
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    if not (isinstance(mpp, int | float) and math.isfinite(mpp) and mpp > 0):
        raise ValueError(f"mpp: expected a positive number of µm per pixel, got {mpp!r}")
    for name, v in (("min_tissue_um2", min_tissue_um2), ("max_hole_um2", max_hole_um2)):
        if v < 0:
            raise ValueError(f"{name}: expected a size >= 0 µm², got {v!r}")
    if not 0 <= envelope_um < np.inf:
        raise ValueError(f"envelope_um: expected a radius >= 0 µm, got {envelope_um!r}")
    if smooth_um is None:
        smooth_um = DEFAULT_SMOOTH_UM[mode]
    if smooth_um < 0:
        raise ValueError(f"smooth_um: expected a sigma >= 0 µm, got {smooth_um!r}")

    sigma = _px(smooth_um, mpp)
    if mode == "brightfield":
        feature, maybe_bad = _brightfield(image, artifacts=reject_artifacts)
        bad = maybe_bad if maybe_bad is not None else np.zeros(feature.shape, bool)
        del maybe_bad  # (the dilated copy below replaces it)
        if bad.any():
            bad = _dilate(bad, 1)  # scipy's default cross is the disk of radius 1
            # ink must not pull the smoothed feature of its neighbours up
            feature[bad] = np.float32(0.0)
    else:
        feature = fluorescence_feature(image)
        bad = np.zeros(feature.shape, bool)
    if sigma >= 0.3:
        _gaussian_in_place(feature, sigma)

    if threshold is None:
        if mode == "brightfield":
            threshold = _brightfield_threshold(feature, ~bad)
        else:
            threshold = _fluorescence_threshold(feature)
    mask = feature > threshold
    del feature  # the largest plane (4 bytes a pixel): not held through the morphology
    mask &= ~bad

    radius = int(round(sigma))
    if radius >= 1:
        # the image border is neither tissue nor glass: it must not erode or grow the mask
        # (the disk's dilation and erosion with border 1 are scipy's, as _dilate says)
        closed = _erode(_dilate(mask, radius), radius)
        mask = _dilate(_erode(closed, radius), radius)
        mask &= ~bad
    px_area = mpp * mpp
    if min_tissue_um2 > 0:
        mask = remove_small_pieces(mask, min_tissue_um2 / px_area)
    if envelope_um > 0 and mode == "brightfield":
        mask = pale_tissue_envelope(
            image, mask, mpp=mpp, radius_um=envelope_um, exclude=bad if bad.any() else None
        )
    if outer_only:
        mask = ndi.binary_fill_holes(mask)
    elif max_hole_um2 > 0:
        mask = fill_small_holes(mask, max_hole_um2 / px_area)
    return mask, float(threshold)
