"""Synthetic cell images with known phenotypes: a multiplex fluorescence image and an H-DAB one.

Test fixtures and benchmark inputs for
:func:`~napari_slidescope.pipeline.cell_classes.classify_cells`: every cell's markers and IHC score
are known. GUI-free; numpy, scipy and scikit-image only (tifffile to write the OME-TIFF).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope._io import atomic_write

__all__ = [
    "CellTruth",
    "MULTIPLEX_RULES",
    "make_hdab",
    "make_multiplex",
    "write_ki67_sample",
    "write_multiplex_sample",
]

#: Phenotype rules of :func:`make_multiplex`'s cells, in priority order.
MULTIPLEX_RULES = {"Tumour": "PanCK+", "Cytotoxic T": "CD3+ CD8+", "T helper": "CD3+ CD8-"}


@dataclass
class CellTruth:
    """A synthetic image and its truth.

    Attributes
    ----------
    image : (C, M, N) ndarray of uint16, or (M, N, 3) ndarray of uint8 (H-DAB)
        The pixels.
    channels : tuple of str
        Channel names (fluorescence).
    mpp : float
        µm per pixel.
    nuclei, cells : (M, N) ndarray of int32
        True nuclei and cells (id ``k`` is cell ``k``, row ``k - 1`` of the arrays below).
    positive : dict of str to (K,) ndarray of bool
        Per marker, whether each cell is positive (fluorescence).
    phenotype : (K,) ndarray of str
        Each cell's phenotype under :data:`MULTIPLEX_RULES` (fluorescence).
    dab : (K,) ndarray of float
        Each cell's DAB concentration (optical density) in its stained compartment (H-DAB).
    """

    image: np.ndarray
    channels: tuple[str, ...]
    mpp: float
    nuclei: np.ndarray
    cells: np.ndarray
    positive: dict[str, np.ndarray] = field(default_factory=dict)
    phenotype: np.ndarray = field(default_factory=lambda: np.zeros(0, "<U1"))
    dab: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the image as a tiled OME-TIFF with a 2x SubIFD level (channels named)."""
        import tifffile

        path = Path(path)
        rgb = self.image.ndim == 3 and self.image.shape[-1] == 3 and self.image.dtype == np.uint8
        meta: dict = {"PhysicalSizeX": self.mpp, "PhysicalSizeY": self.mpp}
        if rgb:
            meta["axes"] = "YXS"
            half = self.image[::2, ::2]
            extra: dict = {"photometric": "rgb"}
        else:
            meta.update(axes="CYX", Channel={"Name": list(self.channels)})
            half = self.image[:, ::2, ::2]
            extra = {}
        with atomic_write(path, "wb") as fh, tifffile.TiffWriter(fh, ome=True) as tif:
            tif.write(
                self.image, subifds=1, tile=(128, 128), compression="zlib", metadata=meta, **extra
            )
            tif.write(half, subfiletype=1, tile=(128, 128), compression="zlib", **extra)
        return path


def _nuclei(
    rng: np.random.Generator, shape: tuple[int, int], mpp: float, spacing_um: float
) -> np.ndarray:
    """Elliptical nuclei (semi-axes 2.5-4.5 µm) at least `spacing_um` apart, centre to centre."""
    lab = np.zeros(shape, np.int32)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    margin = 6 / mpp
    target = int(shape[0] * shape[1] * mpp * mpp / spacing_um**2)
    # the placed centres, checked all at once (a Python loop over them was quadratic)
    placed = np.empty((max(target, 0), 2))
    centres: list[tuple[float, float]] = []
    tries = 0
    while len(centres) < target and tries < 20 * target:
        tries += 1
        cy, cx = rng.uniform(margin, shape[0] - margin), rng.uniform(margin, shape[1] - margin)
        done = placed[: len(centres)]
        if (np.hypot(cy - done[:, 0], cx - done[:, 1]) * mpp < spacing_um).any():
            continue
        a, b = rng.uniform(2.5, 4.5) / mpp, rng.uniform(2.5, 4.0) / mpp
        t = rng.uniform(0, np.pi)
        y0, y1 = int(max(cy - a - 1, 0)), int(min(cy + a + 2, shape[0]))
        x0, x1 = int(max(cx - a - 1, 0)), int(min(cx + a + 2, shape[1]))
        dy, dx = yy[y0:y1, x0:x1] - cy, xx[y0:y1, x0:x1] - cx
        u, v = dy * np.cos(t) + dx * np.sin(t), -dy * np.sin(t) + dx * np.cos(t)
        inside = (u / a) ** 2 + (v / b) ** 2 <= 1
        window = lab[y0:y1, x0:x1]
        if (window[inside] > 0).any():
            continue
        placed[len(centres)] = cy, cx
        centres.append((cy, cx))
        window[inside] = len(centres)
    return lab


def make_multiplex(
    *,
    seed: int = 0,
    shape: tuple[int, int] = (600, 600),
    mpp: float = 0.5,
    cell_radius_um: float = 5.0,
    spill: float = 0.08,
) -> CellTruth:
    """Return a multiplex image: DAPI, CD3 and CD8 (membrane), PanCK (cytoplasm), Ki67 (nucleus).

    Cells are their nuclei grown by `cell_radius_um` (never into a neighbour). Phenotypes:
    about 40 % tumour (PanCK+), 12 % cytotoxic T (CD3+ CD8+), 18 % T helper (CD3+ CD8-),
    the rest other; Ki67 marks a quarter of the nuclei at random. A positive cell's level
    is log-normal (a factor of ~2 either way); the image adds autofluorescence, a
    `spill` fraction of each marker into the next channel (CD3 -> CD8 -> PanCK -> Ki67),
    optical blur, shot noise and read noise.
    """
    from skimage.segmentation import expand_labels, find_boundaries

    rng = np.random.default_rng(seed)
    nuclei = _nuclei(rng, shape, mpp, spacing_um=9.0)
    cells = expand_labels(nuclei, cell_radius_um / mpp).astype(np.int32)
    k = int(nuclei.max())
    u = rng.random(k)
    tumour = u < 0.40
    cd8_t = (u >= 0.40) & (u < 0.52)
    helper = (u >= 0.52) & (u < 0.70)
    positive = {
        "CD3": cd8_t | helper,
        "CD8": cd8_t,
        "PanCK": tumour,
        "Ki67": rng.random(k) < 0.25,
    }
    phenotype = np.full(k, "Other", dtype="<U11")
    phenotype[tumour], phenotype[cd8_t], phenotype[helper] = "Tumour", "Cytotoxic T", "T helper"

    membrane = find_boundaries(cells, mode="inner") & (cells > 0)
    membrane = ndi.binary_dilation(membrane) & (cells > 0)
    cytoplasm = (cells > 0) & (nuclei == 0)
    where = {"CD3": membrane, "CD8": membrane, "PanCK": cytoplasm, "Ki67": nuclei > 0}
    channels = ("DAPI", "CD3", "CD8", "PanCK", "Ki67")
    signal = np.zeros((len(channels), *shape), np.float64)
    dapi_level = np.r_[0, rng.lognormal(np.log(900), 0.25, k)]
    texture = 1 + 0.2 * ndi.gaussian_filter(rng.normal(size=shape), 1.5)
    signal[0] = dapi_level[nuclei] * texture
    for c, name in enumerate(channels[1:], 1):
        level = np.r_[0, np.where(positive[name], rng.lognormal(np.log(700), 0.5, k), 0)]
        signal[c] = np.where(where[name], level[cells], 0)
    for c in range(len(channels) - 1, 1, -1):  # spill-over into the next channel
        signal[c] += spill * signal[c - 1]
    image = np.empty(signal.shape, np.uint16)
    for c in range(len(channels)):
        blurred = ndi.gaussian_filter(signal[c], 1.0)
        auto = 40 + 25 * ndi.gaussian_filter(rng.random(shape), 10)
        counts = rng.poisson(np.maximum(blurred + auto, 0)).astype(np.float64)
        image[c] = np.clip(counts + rng.normal(0, 8, shape), 0, 65535).astype(np.uint16)
    return CellTruth(image, channels, mpp, nuclei, cells, positive, phenotype)


#: Stain vectors :func:`make_hdab` renders with (close to, not equal to, Ruifrok's).
_H = np.array([0.62, 0.72, 0.31])
_D = np.array([0.30, 0.56, 0.77])


def make_hdab(
    *,
    seed: int = 0,
    shape: tuple[int, int] = (600, 600),
    mpp: float = 0.5,
    membrane: bool = False,
) -> CellTruth:
    """Return a brightfield hematoxylin-DAB image with nuclei at known DAB levels.

    Each nucleus (or, with `membrane`, its cell's membrane ring, as HER2) carries a DAB
    concentration from four bands around QuPath's default thresholds: 40 % negative
    (0.02-0.16), 20 % each of 1+ (0.24-0.36), 2+ (0.44-0.56) and 3+ (0.64-0.90); nuclei
    carry hematoxylin 0.35-0.7 and the tissue a faint counterstain. Rendered by
    Beer-Lambert with vectors close to Ruifrok's, slightly blurred, with sensor noise.
    """
    from skimage.segmentation import expand_labels, find_boundaries

    rng = np.random.default_rng(seed)
    nuclei = _nuclei(rng, shape, mpp, spacing_um=10.0)
    cells = expand_labels(nuclei, 4.0 / mpp).astype(np.int32)
    k = int(nuclei.max())
    band = rng.choice(4, size=k, p=[0.4, 0.2, 0.2, 0.2])
    lo = np.array([0.02, 0.24, 0.44, 0.64])[band]
    hi = np.array([0.16, 0.36, 0.56, 0.90])[band]
    dab = rng.uniform(lo, hi)
    h_level = np.r_[0, rng.uniform(0.35, 0.7, k)]
    texture = 1 + 0.15 * ndi.gaussian_filter(rng.normal(size=shape), 1.2)
    conc_h = h_level[nuclei] * texture + 0.04 * (cells > 0)
    if membrane:
        ring = ndi.binary_dilation(find_boundaries(cells, mode="inner")) & (cells > 0)
        conc_d = np.where(ring, np.r_[0, dab][cells], 0.0)
    else:
        conc_d = np.r_[0, dab][nuclei] * texture
    h, d = _H / np.linalg.norm(_H), _D / np.linalg.norm(_D)
    od = conc_h[..., None] * h + conc_d[..., None] * d
    od = ndi.gaussian_filter(od, (0.7, 0.7, 0))
    rgb = 255.0 * 10.0 ** (-od) + rng.normal(0, 2.0, od.shape)
    image = np.clip(np.round(rgb), 0, 255).astype(np.uint8)
    return CellTruth(image, ("R", "G", "B"), mpp, nuclei, cells, dab=dab)


def write_ki67_sample(
    path: str | os.PathLike[str],
    *,
    shape: tuple[int, int] = (1024, 1024),
    mpp: float = 0.5,
    seed: int = 0,
) -> CellTruth:
    """Write a synthetic Ki-67 (hematoxylin-DAB) slide as an Aperio-SVS-like TIFF.

    The image of :func:`make_hdab`: nuclei whose DAB levels fall in QuPath's four bands
    (negative, 1+, 2+, 3+), for trying IHC scoring
    (``classify_cells(result, dab=True)``) on a slide of known truth. It takes a few
    seconds at the default size.

    Parameters
    ----------
    path : str or PathLike
        Output file, such as ``"ki67.svs"`` (written to a temporary name, then renamed).
    shape : (int, int)
        Level-0 (rows, cols).
    mpp : float
        Micrometres per pixel, recorded in the file.
    seed : int
        Random seed; the same seed gives the same slide.

    Returns
    -------
    CellTruth
        The pixels, true nuclei and cells, and each cell's DAB level.

    Examples
    --------
    >>> from napari_slidescope import write_ki67_sample, segment_nuclei
    >>> truth = write_ki67_sample("ki67.svs")  # doctest: +SKIP
    >>> result = segment_nuclei("ki67.svs")  # doctest: +SKIP
    """
    from napari_slidescope.sample_data import _pyramid, _write_svs

    truth = make_hdab(seed=seed, shape=shape, mpp=mpp)
    _write_svs(path, _pyramid(truth.image, 256), mpp=mpp, name="napari-slidescope Ki-67 sample")
    return truth


def write_multiplex_sample(
    path: str | os.PathLike[str],
    *,
    shape: tuple[int, int] = (1024, 1024),
    mpp: float = 0.5,
    seed: int = 0,
) -> CellTruth:
    """Write a synthetic multiplex fluorescence slide as an OME-TIFF with named channels.

    The image of :func:`make_multiplex`: channels ``DAPI``, ``CD3``, ``CD8`` (membrane),
    ``PanCK`` (cytoplasm) and ``Ki67`` (nucleus), uint16, tiled, with a 2x reduced level;
    cells of known phenotype under :data:`MULTIPLEX_RULES` (tumour, cytotoxic T, T helper,
    other). It takes a few seconds at the default size.

    Parameters
    ----------
    path : str or PathLike
        Output file, such as ``"multiplex.ome.tif"`` (written to a temporary name, then
        renamed).
    shape : (int, int)
        Level-0 (rows, cols).
    mpp : float
        Micrometres per pixel, recorded as the OME physical pixel size.
    seed : int
        Random seed; the same seed gives the same slide.

    Returns
    -------
    CellTruth
        The pixels, true nuclei and cells, each cell's marker positivity and phenotype.

    Examples
    --------
    >>> from napari_slidescope import write_multiplex_sample, segment_nuclei
    >>> truth = write_multiplex_sample("multiplex.ome.tif")  # doctest: +SKIP
    >>> result = segment_nuclei("multiplex.ome.tif", cell_expansion_um=5)  # doctest: +SKIP
    """
    truth = make_multiplex(seed=seed, shape=shape, mpp=mpp)
    truth.write(path)
    return truth
