"""Tissue regions from a few strokes: train, save and load a pixel classifier.

The workflow of QuPath's pixel classifier: draw a few strokes or polygons of each class
(tumour, stroma, necrosis...), train a random forest (scikit-learn, the ``classify`` extra)
on the per-pixel features (:mod:`~napari_slidescope.analysis.region_features`) of the
pixels under them, at a working resolution in µm/px. Only the pixels under and around the
examples are read. :func:`~napari_slidescope.pipeline.region_map.classify_regions` applies
it to a whole slide.

The saved file is the cell classifier's (:mod:`~napari_slidescope.pipeline.forest_file`):
a ``.npz`` of plain arrays opened with ``allow_pickle=False`` (it cannot run code) and a
JSON document with a checksum.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from skimage import draw

from napari_slidescope.analysis.region_features import (
    CHANNELS,
    DEFAULT_CHANNELS,
    DEFAULT_KINDS,
    DEFAULT_SCALES_UM,
    FEATURE_KINDS,
    FEATURES_VERSION,
    feature_names,
    halo_px,
    region_features,
)
from napari_slidescope.analysis.stains import RUIFROK_HE, StainMatrix, estimate_stains
from napari_slidescope.errors import ClassifierFileError, SlidescopeWarning
from napari_slidescope.pipeline import forest_file
from napari_slidescope.pipeline.region_grid import (
    WorkingGrid,
    read_working,
    working_grid,
)
from napari_slidescope.pipeline.regions import as_slide

__all__ = [
    "DEFAULT_REGION_MPP",
    "FeatureSpec",
    "IGNORE",
    "RegionClassifier",
    "Stroke",
    "load_region_classifier",
    "slide_stains",
    "train_region_classifier",
]

#: ``format`` of a saved region classifier.
FORMAT = "napari-slidescope region classifier"
#: Bumped when the file layout changes.
FORMAT_VERSION = 1
#: Default working resolution, µm/px (QuPath's default on a 40x slide is about 2).
DEFAULT_REGION_MPP = 2.0
#: The class whose area is left out of percentages (glass, folds, pen...).
IGNORE = "Ignore"
#: Default width of a stroke (an open polyline example), µm.
DEFAULT_STROKE_UM = 20.0
#: Largest example box read at once, working pixels (a larger polygon is sampled inside it).
_MAX_EXAMPLE_PX = 2048
#: Default colours (tumour red, stroma pink, necrosis grey, fat yellow, lymphocytes blue...).
PALETTE: tuple[tuple[int, int, int], ...] = (
    (200, 0, 0),
    (150, 200, 150),
    (80, 80, 80),
    (240, 228, 66),
    (0, 114, 178),
    (213, 94, 0),
    (204, 121, 167),
    (86, 180, 233),
)


@dataclass(frozen=True)
class FeatureSpec:
    """What a pixel's features depend on besides its neighbourhood's pixels.

    Two equal specs give bit-identical features of the same working pixels (a feature
    cache is keyed by it).

    Attributes
    ----------
    mpp : float
        µm per working pixel (the grid's exact value).
    channels, scales_um, kinds : tuple
        As :func:`~napari_slidescope.analysis.region_features.region_features` takes them.
    stains : StainMatrix
        The vectors of the hematoxylin and eosin channels.
    """

    mpp: float
    channels: tuple[str, ...]
    scales_um: tuple[float, ...]
    kinds: tuple[str, ...]
    stains: StainMatrix

    @property
    def key(self) -> tuple[Any, ...]:
        """Hashable identity (the stain vectors by value)."""
        m = np.asarray(self.stains.matrix, np.float64)
        return (
            FEATURES_VERSION,
            float(self.mpp),
            self.channels,
            self.scales_um,
            self.kinds,
            m.tobytes(),
        )

    @property
    def halo(self) -> int:
        """Margin a box needs for exact features (:func:`halo_px`)."""
        return halo_px(self.scales_um, self.mpp)

    def compute(self, rgb: np.ndarray, *, crop: int = 0, planar: bool = False) -> np.ndarray:
        """Features ``(M - 2 crop, N - 2 crop, F)`` of a working-resolution RGB image.

        ``(F, M - 2 crop, N - 2 crop)`` when `planar` (:func:`region_features`).
        """
        return region_features(
            rgb,
            mpp=self.mpp,
            channels=self.channels,
            scales_um=self.scales_um,
            stains=self.stains,
            kinds=self.kinds,
            crop=crop,
            planar=planar,
        )


class FeatureSource(Protocol):
    """Features ``(y1 - y0, x1 - x0, F)`` of a working-pixel box (a cache of them)."""

    def __call__(
        self, grid: WorkingGrid, box: tuple[int, int, int, int], spec: FeatureSpec
    ) -> np.ndarray: ...


#: Largest side (pixels) of the level :func:`slide_stains` reads.
_STAIN_LEVEL_PX = 4096


#: Estimates of :func:`slide_stains`, per open slide (a live preview retrains often).
_SLIDE_STAINS: weakref.WeakKeyDictionary[Any, StainMatrix] = weakref.WeakKeyDictionary()


def slide_stains(slide: Any) -> StainMatrix:
    """H&E vectors (Macenko) of a slide's pixels at low resolution; Ruifrok's as fallback.

    The finest pyramid level at most 4096 pixels a side (else the coarsest) is read whole;
    glass drops out by its low optical density. The estimate depends on the slide only,
    not on the examples drawn on it; it is kept while the slide object lives.
    """
    try:
        return _SLIDE_STAINS[slide]
    except (KeyError, TypeError):
        pass
    out = _estimate_slide_stains(slide)
    try:
        _SLIDE_STAINS[slide] = out
    except TypeError:  # a slide that takes no weak reference: estimated each time
        pass
    return out


def _estimate_slide_stains(slide: Any) -> StainMatrix:
    shapes = [tuple(int(v) for v in s) for s in slide.level_shapes]
    small = [k for k, (h, w) in enumerate(shapes) if max(h, w) <= _STAIN_LEVEL_PX]
    level = small[0] if small else len(shapes) - 1
    h, w = shapes[level]
    pixels = np.asarray(slide.read_level(level, (0, 0, h, w)))
    if pixels.ndim != 3 or pixels.shape[2] < 3 or pixels.dtype != np.uint8:
        return RUIFROK_HE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return estimate_stains(pixels[..., :3])
        except ValueError:
            return RUIFROK_HE


@dataclass(frozen=True)
class Stroke:
    """An open polyline example: the pixels within ``width_um / 2`` of it.

    Attributes
    ----------
    vertices : (N, 2) ndarray of float
        Level-0 ``(row, col)`` vertices, N >= 2.
    width_um : float
        Brush width in µm.
    """

    vertices: np.ndarray
    width_um: float = DEFAULT_STROKE_UM


@dataclass(eq=False)
class RegionClassifier:
    """A trained tissue-region classifier: a random forest on per-pixel features.

    Attributes
    ----------
    class_names : tuple of str
        Classes 1..K of a class map (0 is no tissue / unclassified).
    colors : dict of str to (int, int, int)
        RGB colour (0-255) of each class.
    ignore : tuple of str
        Classes left out of area fractions.
    mpp : float
        Working resolution asked for, µm/px.
    trained_mpp : float
        The working pixel size it was trained at (the grid's exact value).
    channels : tuple of str
    scales_um : tuple of float
    kinds : tuple of str
        Feature channels, Gaussian scales in µm and feature kinds.
    stains : StainMatrix
        Colour-deconvolution vectors of the hematoxylin and eosin channels.
    examples : dict of str to int
        Training pixels per class (after sampling).
    parameters : dict
        The training options (what :attr:`sha256` also covers).
    software_version : str
    """

    class_names: tuple[str, ...]
    colors: dict[str, tuple[int, int, int]]
    ignore: tuple[str, ...]
    mpp: float
    trained_mpp: float
    channels: tuple[str, ...]
    scales_um: tuple[float, ...]
    kinds: tuple[str, ...]
    stains: StainMatrix
    examples: dict[str, int]
    parameters: dict[str, Any]
    software_version: str
    _arrays: dict[str, np.ndarray] = field(repr=False)
    _trees: list[Any] | None = field(default=None, repr=False)

    @property
    def features(self) -> tuple[str, ...]:
        """Feature names, in the forest's input order."""
        return feature_names(self.channels, self.scales_um, self.kinds)

    def halo_px(self, mpp: float) -> int:
        """Margin a tile needs at `mpp` µm/px for its features to be exact."""
        return halo_px(self.scales_um, mpp)

    def feature_spec(self, mpp: float) -> FeatureSpec:
        """Return what its features are at `mpp` µm/px (a feature cache's key)."""
        return FeatureSpec(float(mpp), self.channels, self.scales_um, self.kinds, self.stains)

    def features_of(self, rgb: np.ndarray, *, mpp: float, crop: int = 0) -> np.ndarray:
        """Features ``(M, N, F)`` of a working-resolution RGB image (:func:`region_features`)."""
        return region_features(
            rgb,
            mpp=mpp,
            channels=self.channels,
            scales_um=self.scales_um,
            stains=self.stains,
            kinds=self.kinds,
            crop=crop,
        )

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(K, n_classes)`` of a feature matrix in :attr:`features` order."""
        x = np.asarray(x, np.float32)  # any layout: the trees read strided rows
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"features: expected (K, {len(self.features)}), got {x.shape}")
        if not len(x):
            return np.zeros((0, len(self.class_names)))
        return forest_file.row_votes(self._forest(), x, len(self.class_names))

    def predict_image(
        self, rgb: np.ndarray, *, mpp: float, crop: int = 0, mask: np.ndarray | None = None
    ) -> np.ndarray:
        """Class map of a working-resolution RGB image.

        Parameters
        ----------
        rgb : (M, N, 3) ndarray of uint8
            The image, read with `crop` pixels of margin on every side.
        mpp : float
            Its µm/px.
        crop : int
            Margin to drop (at least :meth:`halo_px` for exact features at the core's edge).
        mask : (M - 2 crop, N - 2 crop) ndarray of bool, optional
            Pixels to classify (the others get 0).

        Returns
        -------
        (M - 2 crop, N - 2 crop) ndarray of uint8
            1..K the class (:attr:`class_names`), 0 outside `mask`.
        """
        feats = self.features_of(rgb, mpp=mpp, crop=crop)
        out = np.zeros(feats.shape[:2], np.uint8)
        if mask is None:
            x = feats.reshape(-1, feats.shape[2])
            out.ravel()[:] = np.argmax(self.predict_proba(x), axis=1) + 1
        elif mask.any():
            out[mask] = np.argmax(self.predict_proba(feats[mask]), axis=1) + 1
        return out

    # -- identity and files ------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "features_version": FEATURES_VERSION,
            "software_version": self.software_version,
            "class_names": list(self.class_names),
            "colors": {k: list(map(int, v)) for k, v in self.colors.items()},
            "ignore": list(self.ignore),
            "mpp": float(self.mpp),
            "trained_mpp": float(self.trained_mpp),
            "channels": list(self.channels),
            "scales_um": [float(s) for s in self.scales_um],
            "kinds": list(self.kinds),
            "stains": [[float(v) for v in row] for row in self.stains.matrix],
            "examples": {k: int(v) for k, v in self.examples.items()},
            "parameters": dict(self.parameters),
        }

    @property
    def sha256(self) -> str:
        """SHA-256 of the classifier's content (trees, features, classes, options)."""
        return forest_file.digest(self._meta(), self._arrays)

    def digest(self) -> str:
        """Return :attr:`sha256` (a changed classifier gives another parameter hash)."""
        return self.sha256

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the classifier to `path` (``.npz``), atomically; return the path."""
        return forest_file.write_npz(path, self._meta(), self._arrays)

    def _forest(self) -> list[Any]:
        if self._trees is None:
            self._trees = forest_file.rebuild_trees(
                self._arrays,
                len(self.features),
                len(self.class_names),
                what="Applying a region classifier",
            )
        return self._trees


# -- examples --------------------------------------------------------------------------
def _as_examples(
    examples: Any,
) -> tuple[dict[str, list[Any]], dict[str, tuple[int, int, int]]]:
    """Class -> list of polygons / strokes; colours from a QuPath file."""
    colours: dict[str, tuple[int, int, int]] = {}
    if isinstance(examples, str | os.PathLike):
        return _from_geojson(Path(examples))
    if not isinstance(examples, Mapping):
        raise TypeError(
            "examples: expected a mapping of class name -> list of (N, 2) level-0 "
            f"(row, col) polygons, or a QuPath GeoJSON path; got {type(examples).__name__}"
        )
    out: dict[str, list[Any]] = {}
    for name, items in examples.items():
        if isinstance(items, np.ndarray | Stroke):
            items = [items]
        shapes: list[Any] = []
        for k, item in enumerate(items):
            if isinstance(item, Stroke):
                v = np.asarray(item.vertices, float)
                if v.ndim != 2 or v.shape[1] != 2 or len(v) < 2:
                    raise ValueError(
                        f"examples[{name!r}][{k}]: a stroke needs (N >= 2, 2) vertices"
                    )
                shapes.append(Stroke(v, float(item.width_um)))
                continue
            v = np.asarray(item, float)
            if v.ndim != 2 or v.shape[1] != 2 or len(v) < 2:
                raise ValueError(
                    f"examples[{name!r}][{k}]: expected an (N, 2) array of level-0 (row, col) "
                    f"vertices, got shape {v.shape}"
                )
            shapes.append(Stroke(v) if len(v) == 2 else v)
        out[str(name)] = shapes
    return out, colours


def _from_geojson(path: Path) -> tuple[dict[str, list[Any]], dict[str, tuple[int, int, int]]]:
    """Classified annotations of a QuPath GeoJSON: polygons and (LineString) strokes."""
    import json

    from napari_slidescope.analysis.qupath import _open

    try:
        with _open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it as GeoJSON ({exc})") from exc
    feats = doc.get("features", []) if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and doc.get("type") == "Feature":
        feats = [doc]
    out: dict[str, list[Any]] = {}
    colours: dict[str, tuple[int, int, int]] = {}
    for f in feats if isinstance(feats, list) else []:
        props = f.get("properties") or {}
        cls = props.get("classification") or {}
        name = cls.get("name") if isinstance(cls, dict) else None
        if not name:
            continue
        if isinstance(cls.get("color"), list) and len(cls["color"]) == 3:
            colours[name] = (int(cls["color"][0]), int(cls["color"][1]), int(cls["color"][2]))
        for kind, coords in _geometries(f.get("geometry")):
            if kind == "LineString" and len(coords) >= 2:
                out.setdefault(name, []).append(Stroke(np.asarray(coords, float)[:, ::-1]))
            elif kind == "Polygon" and coords and len(coords[0]) >= 3:
                ext = np.asarray(coords[0], float)[:, ::-1]
                out.setdefault(name, []).append(ext)
    if not out:
        raise ValueError(f"{path}: no classified annotations (examples need a classification)")
    return out, colours


def _geometries(geom: Any) -> list[tuple[str, Any]]:
    if not isinstance(geom, dict):
        return []
    kind, coords = geom.get("type"), geom.get("coordinates")
    if kind == "GeometryCollection":
        return [g for sub in geom.get("geometries") or [] for g in _geometries(sub)]
    if kind in ("MultiPolygon", "MultiLineString"):
        return [(str(kind)[5:], c) for c in coords or []]
    return [(str(kind), coords)]


def _example_box(shape: Any, grid: WorkingGrid) -> tuple[int, int, int, int]:
    v = shape.vertices if isinstance(shape, Stroke) else shape
    dy, dx = grid.downsample
    r = (shape.width_um / 2 if isinstance(shape, Stroke) else 0.0) / grid.mpp + 1
    h, w = grid.shape
    y0 = max(0, math.floor(v[:, 0].min() / dy - r))
    x0 = max(0, math.floor(v[:, 1].min() / dx - r))
    y1 = min(h, math.ceil(v[:, 0].max() / dy + r) + 1)
    x1 = min(w, math.ceil(v[:, 1].max() / dx + r) + 1)
    return y0, x0, y1, x1


def _example_mask(shape: Any, grid: WorkingGrid, box: tuple[int, int, int, int]) -> np.ndarray:
    """Working pixels of `box` whose centres lie under the example."""
    y0, x0, y1, x1 = box
    dy, dx = grid.downsample
    size = (y1 - y0, x1 - x0)
    mask = np.zeros(size, bool)
    if isinstance(shape, Stroke):
        v = shape.vertices
        rr = v[:, 0] / dy - 0.5 - y0
        cc = v[:, 1] / dx - 0.5 - x0
        radius = shape.width_um / 2 / grid.mpp
        for a in range(len(v) - 1):
            lr, lc = draw.line(
                int(round(rr[a])), int(round(cc[a])), int(round(rr[a + 1])), int(round(cc[a + 1]))
            )
            keep = (lr >= 0) & (lr < size[0]) & (lc >= 0) & (lc < size[1])
            mask[lr[keep], lc[keep]] = True
        if radius > 0.5:
            from scipy import ndimage

            mask = ndimage.distance_transform_edt(~mask) <= radius
        return mask
    rr = shape[:, 0] / dy - 0.5 - y0
    cc = shape[:, 1] / dx - 0.5 - x0
    r, c = draw.polygon(rr, cc, shape=size)
    mask[r, c] = True
    return mask


def _colours(
    names: Sequence[str], colors: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, int, int]]:
    out = {}
    for k, name in enumerate(names):
        default = (200, 200, 200) if name == IGNORE else PALETTE[k % len(PALETTE)]
        rgb = (colors or {}).get(name, default)
        vals = tuple(int(v) for v in rgb)
        if len(vals) != 3 or not all(0 <= v <= 255 for v in vals):
            raise ValueError(f"colors: {name!r} needs (r, g, b) in 0-255, got {rgb!r}")
        out[name] = (vals[0], vals[1], vals[2])
    return out


def train_region_classifier(
    slide: Any,
    examples: Mapping[str, Sequence[Any]] | str | os.PathLike[str],
    *,
    mpp: float = DEFAULT_REGION_MPP,
    scales_um: Sequence[float] = DEFAULT_SCALES_UM,
    channels: Sequence[str] = DEFAULT_CHANNELS,
    kinds: Sequence[str] = DEFAULT_KINDS,
    classes: Sequence[str] | None = None,
    colors: Mapping[str, Sequence[int]] | None = None,
    ignore: Sequence[str] = (IGNORE,),
    stroke_width_um: float | None = None,
    max_pixels_per_class: int = 20_000,
    n_estimators: int = 32,
    min_samples_leaf: int = 5,
    random_state: int = 0,
    stains: StainMatrix | str = "examples",
    n_jobs: int = 1,
    slide_mpp: float | None = None,
    _feature_source: FeatureSource | None = None,
) -> RegionClassifier:
    """Train a tissue-region (pixel) classifier from strokes or polygons on a slide.

    Parameters
    ----------
    slide : Slide, str, PathLike or (M, N, 3) ndarray of uint8
        The slide the examples are drawn on (an array needs `slide_mpp`).
    examples : mapping of str to list of (N, 2) ndarray or Stroke, or a path
        Class name -> examples: polygons of level-0 ``(row, col)`` vertices (N >= 3), two-
        vertex lines and :class:`Stroke` polylines (the pixels within half their width);
        or a QuPath GeoJSON of classified annotations (polygons; LineStrings are strokes).
    mpp : float
        Working resolution, µm/px (the nearest exact grid of the slide is used and
        recorded as :attr:`RegionClassifier.trained_mpp`).
    scales_um : sequence of float
        Feature scales (Gaussian sigmas), µm.
    channels : sequence of str
        Feature channels (:data:`~napari_slidescope.analysis.region_features.CHANNELS`).
    kinds : sequence of str
        Feature kinds
        (:data:`~napari_slidescope.analysis.region_features.FEATURE_KINDS`: Gaussian,
        Laplacian of Gaussian, gradient magnitude, structure-tensor and Hessian
        eigenvalues). Default
        :data:`~napari_slidescope.analysis.region_features.DEFAULT_KINDS` (Gaussian, LoG,
        gradient: measured as accurate as all seven on the synthetic regions, at 2.7 times
        the speed); ``FEATURE_KINDS`` gives all seven.
    classes : sequence of str, optional
        Class order (default: that of `examples`); each needs examples.
    colors : mapping of str to (r, g, b), optional
        Class colours 0-255 (default: QuPath's in a GeoJSON, else a palette).
    ignore : sequence of str
        Classes left out of area fractions (default ``"Ignore"``).
    stroke_width_um : float, optional
        Width of every stroke (overrides each :class:`Stroke`'s own).
    max_pixels_per_class : int
        Training pixels drawn per class at most (uniformly, with `random_state`); the
        forest weighs classes as balanced whatever their counts.
    n_estimators, min_samples_leaf : int
        The random forest's size and smallest leaf.
    random_state : int
        Seed: the same examples give the same classifier.
    stains : StainMatrix, "examples" or "slide"
        The H&E vectors of the hematoxylin and eosin channels: estimated from the
        examples' pixels (default), once from the whole slide's low-resolution pixels
        (:func:`slide_stains`: the same whatever the strokes, so the live preview keeps its
        features when a stroke is added), or given. Recorded in the classifier either way.
    n_jobs : int
        Threads that grow the trees (the forest is the same for any number).
    slide_mpp : float, optional
        Level-0 µm/px of an array, or of a slide without calibration.

    Returns
    -------
    RegionClassifier

    Raises
    ------
    ValueError
        No pixel size, fewer than two classes, a class without pixels under its
        examples, malformed examples or options.
    ImportError
        Without scikit-learn (the ``classify`` extra).

    Examples
    --------
    >>> clf = train_region_classifier(  # doctest: +SKIP
    ...     "slide.svs", {"Tumor": [poly1, poly2], "Stroma": [Stroke(line, 30)]}
    ... )
    >>> clf.save("regions.npz")  # doctest: +SKIP
    """
    version = str(sys.modules["napari_slidescope"].__version__)
    shapes, file_colours = _as_examples(examples)
    names = tuple(classes) if classes is not None else tuple(shapes)
    if len(set(names)) < 2:
        raise ValueError(f"examples: need at least two classes, got {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"classes: names repeat in {list(names)}")
    missing = [c for c in names if not shapes.get(c)]
    extra = [c for c in shapes if c not in names]
    if missing or extra:
        raise ValueError(
            f"examples: no example of {missing}" if missing else f"examples: {extra} not in classes"
        )
    bad = [c for c in channels if c not in CHANNELS]
    if bad or not channels:
        raise ValueError(f"channels: expected some of {list(CHANNELS)}, got {list(channels)}")
    if stroke_width_um is not None:
        if not stroke_width_um > 0:
            raise ValueError(f"stroke_width_um: expected > 0 µm, got {stroke_width_um}")
        shapes = {
            c: [Stroke(s.vertices, stroke_width_um) if isinstance(s, Stroke) else s for s in v]
            for c, v in shapes.items()
        }
    if max_pixels_per_class < 10:
        raise ValueError(f"max_pixels_per_class: expected >= 10, got {max_pixels_per_class}")
    sk = forest_file.sklearn_or_error("train_region_classifier")
    if isinstance(stains, str) and stains not in ("examples", "slide"):
        raise ValueError(f"stains: expected 'examples', 'slide' or a StainMatrix, got {stains!r}")
    chans = tuple(str(c) for c in channels)
    scales = tuple(float(s) for s in scales_um)
    kind_t = tuple(k for k in FEATURE_KINDS if k in kinds)
    if not kind_t or any(k not in FEATURE_KINDS for k in kinds):
        raise ValueError(f"kinds: expected some of {list(FEATURE_KINDS)}, got {list(kinds)}")
    src, owned = as_slide(slide, mpp=slide_mpp)
    try:
        grid = working_grid(src, mpp)
        halo = halo_px(scales_um, grid.mpp)
        picked: list[tuple[int, tuple[int, int, int, int], np.ndarray]] = []
        for k, name in enumerate(names):
            for shape in shapes[name]:
                box = _example_box(shape, grid)
                if box[2] <= box[0] or box[3] <= box[1]:
                    continue
                box = _clamp_box(box)
                mask = _example_mask(shape, grid, box)
                if mask.any():
                    picked.append((k, box, mask))
        counts = {c: 0 for c in names}
        for k, _, mask in picked:
            counts[names[k]] += int(mask.sum())
        empty = [c for c, n in counts.items() if n == 0]
        if empty:
            raise ValueError(
                f"examples: no working pixel of {empty} on the slide at {grid.mpp:.3g} µm/px "
                "(examples outside the slide, or thinner than a pixel?)"
            )
        crops: list[np.ndarray] = []
        if isinstance(stains, StainMatrix):
            matrix = stains
        elif stains == "slide":
            matrix = slide_stains(src)
        else:  # the examples' own pixels: read them first
            crops = [read_working(src, grid, box, halo) for _, box, _ in picked]
            matrix = _stains(
                [(k, rgb, m) for (k, _, m), rgb in zip(picked, crops, strict=True)], halo
            )
        spec = FeatureSpec(grid.mpp, chans, scales, kind_t, matrix)
        rng = np.random.default_rng(random_state)
        xs: list[list[np.ndarray]] = [[] for _ in names]
        for j, (k, box, mask) in enumerate(picked):
            if crops:
                feats = spec.compute(crops[j], crop=halo)
            elif _feature_source is not None:
                feats = _feature_source(grid, box, spec)
            else:
                feats = spec.compute(read_working(src, grid, box, halo), crop=halo)
            xs[k].append(feats[mask])
    finally:
        if owned:
            src.close()
    x_parts, y_parts, used = [], [], {}
    for k, name in enumerate(names):
        xk = np.concatenate(xs[k])
        if len(xk) > max_pixels_per_class:
            xk = xk[np.sort(rng.choice(len(xk), max_pixels_per_class, replace=False))]
        x_parts.append(xk)
        y_parts.append(np.full(len(xk), k, np.intp))
        used[name] = len(xk)
    x, y = np.concatenate(x_parts), np.concatenate(y_parts)
    forest = sk.ensemble.RandomForestClassifier(
        n_estimators=n_estimators,
        min_samples_leaf=min_samples_leaf,
        class_weight="balanced",
        random_state=random_state,
        n_jobs=max(1, int(n_jobs)),
    )
    forest.fit(x, y)
    few = {c: n for c, n in counts.items() if n < 50}
    if few:
        warnings.warn(
            f"few example pixels: {few} at {grid.mpp:.3g} µm/px (draw longer or wider strokes)",
            SlidescopeWarning,
            stacklevel=2,
        )
    params = {
        "mpp": float(mpp),
        "scales_um": [float(s) for s in scales_um],
        "channels": list(channels),
        "kinds": list(kind_t),
        "max_pixels_per_class": int(max_pixels_per_class),
        "n_estimators": int(n_estimators),
        "min_samples_leaf": int(min_samples_leaf),
        "random_state": int(random_state),
        "stroke_width_um": stroke_width_um,
    }
    if not (isinstance(stains, str) and stains == "examples"):  # the default keeps its old digest
        params["stains"] = stains if isinstance(stains, str) else "given"
    return RegionClassifier(
        class_names=names,
        colors=_colours(names, {**file_colours, **(colors or {})}),
        ignore=tuple(c for c in ignore if c in names),
        mpp=float(mpp),
        trained_mpp=grid.mpp,
        channels=chans,
        scales_um=scales,
        kinds=kind_t,
        stains=matrix,
        examples=used,
        parameters=params,
        software_version=version,
        _arrays=forest_file.forest_arrays(forest),
        _trees=[est.tree_ for est in forest.estimators_],
    )


def _clamp_box(box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Shrink an example box larger than :data:`_MAX_EXAMPLE_PX` about its centre."""
    y0, x0, y1, x1 = box
    if y1 - y0 > _MAX_EXAMPLE_PX:
        c = (y0 + y1) // 2
        y0, y1 = c - _MAX_EXAMPLE_PX // 2, c + _MAX_EXAMPLE_PX // 2
    if x1 - x0 > _MAX_EXAMPLE_PX:
        c = (x0 + x1) // 2
        x0, x1 = c - _MAX_EXAMPLE_PX // 2, c + _MAX_EXAMPLE_PX // 2
    return y0, x0, y1, x1


def _stains(crops: list[tuple[int, np.ndarray, np.ndarray]], halo: int) -> StainMatrix:
    """H&E vectors estimated (Macenko) from the examples' pixels; Ruifrok's as fallback."""
    pix = [rgb[halo : rgb.shape[0] - halo, halo : rgb.shape[1] - halo][m] for _, rgb, m in crops]
    if not pix:
        return RUIFROK_HE
    allpix = np.concatenate(pix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return estimate_stains(allpix)
        except ValueError:
            return RUIFROK_HE


def load_region_classifier(path: str | os.PathLike[str]) -> RegionClassifier:
    """Read a classifier written by :meth:`RegionClassifier.save`.

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ClassifierFileError
        Not a region classifier, damaged (checksum), or another file format or feature
        version (the message names the file).
    """
    path = Path(path)
    meta, arrays = forest_file.read_npz(path, FORMAT, what="region classifier")
    if meta.get("format_version") != FORMAT_VERSION or meta.get("features_version") != (
        FEATURES_VERSION
    ):
        raise ClassifierFileError(
            f"{path}: region classifier file format {meta.get('format_version')}, features "
            f"{meta.get('features_version')} (napari-slidescope {meta.get('software_version')}); "
            f"this version reads {FORMAT_VERSION}, features {FEATURES_VERSION}: retrain it"
        )
    forest_file.check_digest(path, meta, arrays, what="region classifier")
    try:
        m = np.asarray(meta["stains"], float)
        stains = StainMatrix(m[0], m[1], m[2], estimated=True)
        clf = RegionClassifier(
            class_names=tuple(str(c) for c in meta["class_names"]),
            colors={k: (int(v[0]), int(v[1]), int(v[2])) for k, v in meta["colors"].items()},
            ignore=tuple(meta["ignore"]),
            mpp=float(meta["mpp"]),
            trained_mpp=float(meta["trained_mpp"]),
            channels=tuple(meta["channels"]),
            scales_um=tuple(float(s) for s in meta["scales_um"]),
            kinds=tuple(str(k) for k in meta["kinds"]),
            stains=stains,
            examples={k: int(v) for k, v in meta["examples"].items()},
            parameters=dict(meta["parameters"]),
            software_version=str(meta["software_version"]),
            _arrays=arrays,
        )
        if (
            m.shape != (3, 3)
            or any(c not in CHANNELS for c in clf.channels)
            or any(k not in FEATURE_KINDS for k in clf.kinds)
        ):
            raise ValueError("stains or channels malformed")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ClassifierFileError(f"{path}: incomplete region classifier file ({exc})") from exc
    return clf
