"""Apply a tissue-region classifier to a whole slide: :func:`classify_regions`.

The slide is cut into tiles of the working grid (:mod:`~napari_slidescope.pipeline.region_grid`);
each tile is read with a halo of :func:`~napari_slidescope.analysis.region_features.halo_px`
working pixels (the widest feature's support), so its features, hence its predictions, are
exactly those of an untiled run: there are no seams at tile borders. Tiles without tissue
(:func:`regions_tissue`'s mask: tissue detection with large holes filled and the pale fat
open to the glass added) are never read, and only tissue pixels are classified. Tiles are
read and classified on worker threads, a bounded number in flight, so memory is that of a
few tiles plus the class map (one byte per working pixel).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis import geometry
from napari_slidescope.options import RegionsOptions, TissueOptions
from napari_slidescope.pipeline.cancel import check_cancel
from napari_slidescope.pipeline.progress import progress_caller
from napari_slidescope.pipeline.region_classifier import RegionClassifier
from napari_slidescope.pipeline.region_grid import WorkingGrid, read_working, working_grid
from napari_slidescope.pipeline.regions import as_slide, check_region

if TYPE_CHECKING:
    from napari_slidescope.pipeline.tissue import TissueResult

__all__ = [
    "DEFAULT_TILE_PX",
    "GATE_MARGIN_UM",
    "TISSUE_ENVELOPE_UM",
    "TISSUE_MAX_HOLE_UM2",
    "RegionMap",
    "classify_regions",
    "regions_tissue",
]

#: Tile side in working pixels (1 mm at 2 µm/px): large enough that the halo costs little.
DEFAULT_TILE_PX = 512
#: Holes of the tissue mask filled before gating, µm²: fat (empty vacuoles) and lumens inside
#: tissue are regions to classify, not glass (tissue detection alone fills up to 1000 µm²).
TISSUE_MAX_HOLE_UM2 = 250_000.0
#: Radius of the pale-tissue envelope of the gate, µm (``RegionsOptions().envelope_um``):
#: fat at a section's edge, thin membranes open to the glass, is too pale for tissue
#: detection and no hole to fill; closing its membranes by about an adipocyte's radius
#: (vacuoles up to 128 µm across) keeps it (benchmarks/regions_gate.py: 1 % of it kept
#: without the envelope, 99 % with it on the synthetic slide, 96 % of real fat textures;
#: under 1 % of the glass taken in).
TISSUE_ENVELOPE_UM = RegionsOptions().envelope_um
#: Margin around a region the gate is detected in, µm: fat in view at a section's edge
#: joins the tissue through its membranes, and the tissue it joins may lie out of view (a
#: viewport preview); 1 mm costs 125 gate pixels a side at 8 µm/px.
GATE_MARGIN_UM = 1000.0
#: Worker threads (reads, features and prediction).
_WORKERS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True, eq=False)
class RegionMap:
    """Tissue regions of a slide: a class map at the working resolution.

    Attributes
    ----------
    labels : (M, N) ndarray of uint8
        Class per working pixel: 0 no tissue / not classified, k the class
        ``classes[k - 1]``.
    classes : tuple of str
        Class names for 1..K.
    colors : dict of str to (int, int, int)
        RGB colour of each class.
    ignore : tuple of str
        Classes left out of :attr:`fractions`.
    downsample : (float, float)
        Level-0 pixels per working pixel ``(y, x)``.
    origin : (float, float)
        Level-0 ``(y, x)`` of the top-left corner of ``labels[0, 0]``.
    mpp : float
        µm per working pixel.
    region : (int, int, int, int)
        The level-0 box classified.
    parameters : dict
        The classifier's SHA-256 and options, the tile size, whether tissue gated and
        ``tissue_gate``: how (:func:`regions_tissue`'s ``max_hole_um2`` and
        ``envelope_um``; ``"given"`` for a mask passed in; False for none).
    """

    labels: np.ndarray = field(repr=False)
    classes: tuple[str, ...]
    colors: dict[str, tuple[int, int, int]]
    ignore: tuple[str, ...]
    downsample: tuple[float, float]
    origin: tuple[float, float]
    mpp: float
    region: Box
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def pixel_um2(self) -> float:
        """Area of one working pixel, µm²."""
        return float(self.mpp) ** 2

    @property
    def area_um2(self) -> dict[str, float]:
        """Area of each class, µm²."""
        counts = np.bincount(self.labels.ravel(), minlength=len(self.classes) + 1)
        return {c: float(counts[k + 1]) * self.pixel_um2 for k, c in enumerate(self.classes)}

    @property
    def fractions(self) -> dict[str, float]:
        """Share of each class in the classified area, classes in :attr:`ignore` left out."""
        return _fractions(self.area_um2, self.ignore)

    def areas_in(
        self, polygons: Sequence[np.ndarray], holes: Sequence[Sequence[np.ndarray]] | None = None
    ) -> dict[str, float]:
        """Area of each class (µm²) inside level-0 ``(row, col)`` polygons (an annotation).

        Pixels whose centres lie inside count (the polygons are rasterised on the grid).
        """
        inside = geometry.polygons_to_mask(
            polygons, holes, shape=self.labels.shape, downsample=self.downsample, origin=self.origin
        )
        counts = np.bincount(self.labels[inside], minlength=len(self.classes) + 1)
        return {c: float(counts[k + 1]) * self.pixel_um2 for k, c in enumerate(self.classes)}

    def class_at(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Class index (0..K) under level-0 points (0 outside the map)."""
        r = np.floor((np.asarray(rows, float) - self.origin[0]) / self.downsample[0]).astype(
            np.intp
        )
        c = np.floor((np.asarray(cols, float) - self.origin[1]) / self.downsample[1]).astype(
            np.intp
        )
        h, w = self.labels.shape
        ok = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        out = np.zeros(r.shape, np.uint8)
        out[ok] = self.labels[r[ok], c[ok]]
        return out

    def outlines(self) -> dict[str, tuple[list[np.ndarray], list[list[np.ndarray]]]]:
        """Outline of each class's pieces with their holes, level-0 ``(row, col)``.

        Traced on the whole class map, so a region crossing tile borders is one piece.
        """
        out = {}
        for k, name in enumerate(self.classes, start=1):
            out[name] = geometry.mask_to_polygons(
                self.labels == k, downsample=self.downsample, origin=self.origin
            )
        return out

    def to_geojson(self, path: str | os.PathLike[str]) -> Path:
        """Write the outlines as QuPath annotations (one per piece, classified, with area).

        GeoJSON ``(x, y)`` in level-0 pixels; each feature's ``measurements`` hold its
        ``area_um2``.
        """
        from napari_slidescope._io import atomic_write
        from napari_slidescope.analysis.geojson import polygon_feature, write_features

        def features() -> Any:
            for name, (exts, holes) in self.outlines().items():
                for ext, hls in zip(exts, holes, strict=True):
                    area = geometry._signed_area(ext) - sum(geometry._signed_area(h) for h in hls)
                    um2 = abs(area) * self.pixel_um2 / (self.downsample[0] * self.downsample[1])
                    yield polygon_feature(
                        ext,
                        hls,
                        name=name,
                        color=self.colors.get(name, (128, 128, 128)),
                        object_type="annotation",
                        measurements={"area_um2": round(um2, 3)},
                    )

        path = Path(path)
        with atomic_write(path, "w") as fh:
            write_features(fh, features())
        return path

    def pyramid(self, *, min_size: int = 256) -> list[np.ndarray]:
        """Return the class map and its 2x nearest-neighbour reductions, finest first.

        With :meth:`layer_scale` the levels make a multiscale labels layer.
        """
        levels = [self.labels]
        while min(levels[-1].shape) // 2 >= min_size:
            levels.append(levels[-1][::2, ::2])
        return levels

    def layer_scale(self, *, unit: str = "px") -> tuple[float, float]:
        """Scale of :attr:`labels` in level-0 pixels (``unit="px"``) or in µm (``"um"``)."""
        if unit == "um":
            return (self.mpp, self.mpp)
        return self.downsample

    def colormap(self) -> dict[int, tuple[float, float, float, float]]:
        """Label -> RGBA in 0..1 (0 transparent), for a labels layer."""
        out: dict[int, tuple[float, float, float, float]] = {0: (0.0, 0.0, 0.0, 0.0)}
        for k, name in enumerate(self.classes, start=1):
            r, g, b = self.colors.get(name, (128, 128, 128))
            out[k] = (r / 255, g / 255, b / 255, 1.0)
        return out


def _fractions(areas: dict[str, float], ignore: Sequence[str]) -> dict[str, float]:
    kept = {c: a for c, a in areas.items() if c not in ignore}
    total = sum(kept.values())
    return {c: (a / total if total > 0 else 0.0) for c, a in kept.items()}


def _tissue_mask(tissue: Any, grid: WorkingGrid, box: Box) -> np.ndarray:
    """Tissue under each working pixel centre of `box` (nearest mask pixel)."""
    y0, x0, y1, x1 = box
    dy, dx = grid.downsample
    mask = np.asarray(tissue.mask, bool)
    ty, tx = tissue.downsample
    oy, ox = tissue.origin
    r = np.floor(((np.arange(y0, y1) + 0.5) * dy - oy) / ty).astype(np.intp)
    c = np.floor(((np.arange(x0, x1) + 0.5) * dx - ox) / tx).astype(np.intp)
    rok = (r >= 0) & (r < mask.shape[0])
    cok = (c >= 0) & (c < mask.shape[1])
    out = np.zeros((y1 - y0, x1 - x0), bool)
    sub = mask[np.clip(r, 0, mask.shape[0] - 1)][:, np.clip(c, 0, mask.shape[1] - 1)]
    out[:] = sub & rok[:, None] & cok[None, :]
    return out


def regions_tissue(
    slide: Any,
    *,
    region: Sequence[int] | None = None,
    envelope_um: float = TISSUE_ENVELOPE_UM,
    options: TissueOptions | None = None,
    cancel: threading.Event | None = None,
    slide_mpp: float | None = None,
) -> TissueResult:
    """Find the tissue that gates region classification (what :func:`classify_regions` skips).

    :func:`~napari_slidescope.pipeline.tissue.detect_tissue` with `options` (default
    ``TissueOptions()``) but holes up to :data:`TISSUE_MAX_HOLE_UM2` filled (fat and
    lumens inside tissue are regions to classify) and the pale membranous tissue touching
    it added with an envelope of `envelope_um` (fat open to the glass at the edge of a
    section; see :func:`~napari_slidescope.analysis.tissue.pale_tissue_envelope`). Glass
    away from the tissue stays out. The batch's ``--regions`` and the Tissue regions dock
    gate with it.

    Parameters
    ----------
    slide : Slide, str, PathLike or (M, N, 3) ndarray of uint8
        The slide (an array needs `slide_mpp`).
    region : (int, int, int, int), optional
        Level-0 box; default the whole slide.
    envelope_um : float
        Radius of the envelope, µm (0: tissue detection's mask, holes filled).
    options : TissueOptions, optional
        Tissue detection's options (a batch's); smaller ``max_hole_um2`` are raised to
        :data:`TISSUE_MAX_HOLE_UM2`.
    cancel : threading.Event, optional
        Checked between the strips read.
    slide_mpp : float, optional
        Level-0 µm/px of an array, or of an uncalibrated slide.

    Returns
    -------
    TissueResult
        Its ``parameters`` record the gate (``max_hole_um2`` in the options,
        ``envelope_um``).
    """
    from napari_slidescope.pipeline.tissue import detect_tissue

    opts = options if options is not None else TissueOptions()
    src, owned = as_slide(slide, mpp=slide_mpp)
    try:
        return detect_tissue(
            src,
            region=region,
            options=opts,
            cancel=cancel,
            envelope_um=envelope_um,
            max_hole_um2=max(opts.max_hole_um2, TISSUE_MAX_HOLE_UM2),
        )
    finally:
        if owned:
            src.close()


def _gate_record(tissue: Any) -> dict[str, Any] | str | bool:
    """Record what gated a run: False, ``"given"`` or the gate's sizes and level-0 box."""
    if tissue is False:
        return False
    params = getattr(tissue, "parameters", None)
    if not params:
        return "given"  # a mask from elsewhere (the caller records what it was)
    return {
        "max_hole_um2": params["options"]["max_hole_um2"],
        "envelope_um": params.get("envelope_um", 0.0),
        "box": [int(v) for v in tissue.region],
    }


def _grown(box: Box, grid: WorkingGrid, shape0: tuple[int, int]) -> Box:
    """`box` grown by :data:`GATE_MARGIN_UM` on every side, clipped to the slide."""
    my = GATE_MARGIN_UM * grid.downsample[0] / grid.mpp  # level-0 px
    mx = GATE_MARGIN_UM * grid.downsample[1] / grid.mpp
    y0, x0, y1, x1 = box
    return (
        max(0, int(y0 - my)),
        max(0, int(x0 - mx)),
        min(int(shape0[0]), int(y1 + my)),
        min(int(shape0[1]), int(x1 + mx)),
    )


def classify_regions(
    slide: Any,
    classifier: RegionClassifier | str | os.PathLike[str],
    *,
    region: Sequence[int] | None = None,
    tissue: Any = None,
    tile_px: int = DEFAULT_TILE_PX,
    workers: int | None = None,
    progress: Callable[..., Any] | None = None,
    on_tile: Callable[[Box, np.ndarray], Any] | None = None,
    cancel: threading.Event | None = None,
    slide_mpp: float | None = None,
) -> RegionMap:
    """Classify the tissue of a slide (or of a level-0 box) into regions.

    Parameters
    ----------
    slide : Slide, str, PathLike or (M, N, 3) ndarray of uint8
        The slide (an array needs `slide_mpp`).
    classifier : RegionClassifier or path
        A trained classifier or its file (:func:`load_region_classifier`).
    region : (int, int, int, int), optional
        Level-0 box ``(y0, x0, y1, x1)``; default the whole slide.
    tissue : TissueResult, False or None
        The tissue mask gating the work: None detects it with :func:`regions_tissue`
        (holes up to :data:`TISSUE_MAX_HOLE_UM2` filled and fat open to the glass kept:
        both are tissue to classify) within `region` grown by :data:`GATE_MARGIN_UM`
        (the tissue that fat in view joins may be out of view); False classifies every
        pixel (a viewport preview of a known-tissue area). ``parameters["tissue_gate"]``
        records which.
    tile_px : int
        Tile side in working pixels.
    workers : int, optional
        Threads reading and classifying tiles (default 2).
    progress : callable, optional
        ``progress(Progress)`` after each tile.
    on_tile : callable, optional
        ``on_tile(box, labels)`` after each tile, with the tile's working-pixel box in the
        map and its classes (a viewer paints them as they come).
    cancel : threading.Event, optional
        Checked between tiles; once set the run raises
        :class:`~napari_slidescope.errors.Cancelled`.
    slide_mpp : float, optional
        Level-0 µm/px of an array, or of an uncalibrated slide.

    Returns
    -------
    RegionMap

    Raises
    ------
    ValueError
        The slide has no pixel size, or the region is empty or outside the slide.
    """
    if not isinstance(classifier, RegionClassifier):
        from napari_slidescope.pipeline.region_classifier import load_region_classifier

        classifier = load_region_classifier(classifier)
    if tile_px < 32:
        raise ValueError(f"tile_px: expected >= 32 working pixels, got {tile_px}")
    src, owned = as_slide(slide, mpp=slide_mpp)
    try:
        return _classify(
            src,
            classifier,
            region,
            tissue,
            int(tile_px),
            workers or _WORKERS,
            progress,
            on_tile,
            cancel,
        )
    finally:
        if owned:
            src.close()


def _classify(
    src: Any,
    clf: RegionClassifier,
    region: Sequence[int] | None,
    tissue: Any,
    tile_px: int,
    workers: int,
    progress: Callable[..., Any] | None,
    on_tile: Callable[[Box, np.ndarray], Any] | None,
    cancel: threading.Event | None,
) -> RegionMap:
    grid = working_grid(src, clf.mpp)
    box0 = check_region(None if region is None else tuple(region), src.shape0)  # type: ignore[arg-type]
    wy0, wx0, wy1, wx1 = grid.box_of(box0)
    if wy1 <= wy0 or wx1 <= wx0:
        raise ValueError(f"region {region!r} is smaller than one working pixel")
    gated = tissue is not False
    if tissue is None:
        tissue = regions_tissue(src, region=_grown(box0, grid, src.shape0), cancel=cancel)
    if abs(grid.mpp / clf.trained_mpp - 1) > 0.1:
        import warnings

        from napari_slidescope.errors import SlidescopeWarning

        warnings.warn(
            f"the slide's working grid is {grid.mpp:.3g} µm/px, the classifier was trained at "
            f"{clf.trained_mpp:.3g}: its features see other scales in pixels than it learnt",
            SlidescopeWarning,
            stacklevel=3,
        )
    halo = clf.halo_px(grid.mpp)
    clf.predict_proba(np.zeros((1, len(clf.features)), np.float32))  # trees built once, here
    labels = np.zeros((wy1 - wy0, wx1 - wx0), np.uint8)
    tiles = [
        (y, x, min(y + tile_px, wy1), min(x + tile_px, wx1))
        for y in range(wy0, wy1, tile_px)
        for x in range(wx0, wx1, tile_px)
    ]
    # a tile's mask is looked up again by its worker: memory stays that of the tiles in flight
    todo = [t for t in tiles if not gated or _tissue_mask(tissue, grid, t).any()]
    call = progress_caller(progress)
    total = len(todo)
    if call:
        call(0, total)

    def work(t: Box) -> np.ndarray:
        check_cancel(cancel, "regions")
        mask = _tissue_mask(tissue, grid, t) if gated else None
        rgb = read_working(src, grid, t, halo)
        return clf.predict_image(rgb, mpp=grid.mpp, crop=halo, mask=mask)

    done = 0
    with ThreadPoolExecutor(max(1, workers)) as pool:
        pending: list[tuple[Box, Future[np.ndarray]]] = []
        queue = iter(todo)
        try:
            for t in queue:
                pending.append((t, pool.submit(work, t)))
                if len(pending) >= 2 * workers:
                    done = _drain(pending, labels, (wy0, wx0), on_tile, call, done, total, cancel)
            while pending:
                done = _drain(pending, labels, (wy0, wx0), on_tile, call, done, total, cancel)
        except BaseException:
            for _, f in pending:
                f.cancel()
            raise
    return _region_map(labels, clf, clf.sha256, grid, box0, (wy0, wx0), tile_px, gated, tissue)


def _region_map(
    labels: np.ndarray,
    clf: RegionClassifier,
    sha256: str,
    grid: WorkingGrid,
    box0: Box,
    corner: tuple[int, int],
    tile_px: int,
    gated: bool,
    tissue: Any,
) -> RegionMap:
    """Wrap a classified box as a :class:`RegionMap` with what ran in its parameters.

    One place for :func:`classify_regions` and the dock's cached preview, so that both
    record the same parameters for the same computation.
    """
    dy, dx = grid.downsample
    params = {
        "classifier_sha256": sha256,
        "classifier": dict(clf.parameters),
        "tile_px": tile_px,
        "tissue_gated": gated,
        "tissue_gate": _gate_record(tissue),
        "level": grid.level,
        "factor": grid.factor,
    }
    return RegionMap(
        labels=labels,
        classes=clf.class_names,
        colors=dict(clf.colors),
        ignore=clf.ignore,
        downsample=(dy, dx),
        origin=(corner[0] * dy, corner[1] * dx),
        mpp=grid.mpp,
        region=box0,
        parameters=params,
    )


def _drain(
    pending: list[tuple[Box, Future[np.ndarray]]],
    labels: np.ndarray,
    origin: tuple[int, int],
    on_tile: Callable[[Box, np.ndarray], Any] | None,
    call: Callable[[int, int], None] | None,
    done: int,
    total: int,
    cancel: threading.Event | None,
) -> int:
    t, fut = pending.pop(0)
    out = fut.result()
    y0, x0, y1, x1 = t
    box = (y0 - origin[0], x0 - origin[1], y1 - origin[0], x1 - origin[1])
    labels[box[0] : box[2], box[1] : box[3]] = out
    if on_tile is not None:
        on_tile(box, out)
    done += 1
    if call:
        call(done, total)
    check_cancel(cancel, "regions")
    return done
