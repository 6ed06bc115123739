"""Repeated region classification of views of one slide, from tile caches (the live preview).

A live preview classifies the region in view again after every pan, zoom and stroke. Most
of that work was done before: :class:`RegionPreview` keeps, per tile of a fixed grid of
the working resolution (``tile_px`` working pixels a side, aligned to the slide's working
grid), the tile's features and its predicted classes.

- Features depend on the pixels within the halo only
  (:func:`~napari_slidescope.analysis.region_features.halo_px`), so a tile's features
  computed from any larger box read with that halo are bit-identical to an untiled run's:
  missing tiles are computed together (a few rectangles of them, each read once with one
  halo), and cut into tiles. The cache is bounded in bytes (least recently used tiles
  go first) and emptied when what the features depend on changes
  (:class:`~napari_slidescope.pipeline.region_classifier.FeatureSpec`: resolution,
  channels, scales, kinds, stain vectors).
- Predictions are per pixel (:func:`~napari_slidescope.pipeline.forest_file.row_votes`
  sums each row's trees alone), so a tile remembers the classes of the pixels it predicted
  (0 = not yet) for the classifier of one SHA-256; another classifier empties them. A pan
  predicts only the pixels it has not seen; a new stroke (a new classifier) predicts the
  view again from cached features, tiles nearest the view's centre first, each handed to
  ``on_tile`` as it is done.
- Training (:meth:`RegionPreview.train`) takes the examples' features from the same
  cache, with stain vectors estimated once from the slide (``stains="slide"``), so a new
  stroke changes no feature.

The class map equals :func:`~napari_slidescope.pipeline.region_map.classify_regions`'s of
the same box, tissue gate and classifier, bit for bit (the tests check it).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.pipeline.cancel import check_cancel
from napari_slidescope.pipeline.progress import progress_caller
from napari_slidescope.pipeline.region_classifier import (
    FeatureSpec,
    RegionClassifier,
    slide_stains,
    train_region_classifier,
)
from napari_slidescope.pipeline.region_grid import WorkingGrid, read_working, working_grid
from napari_slidescope.pipeline.region_map import (
    RegionMap,
    _grown,
    _region_map,
    _tissue_mask,
    regions_tissue,
)
from napari_slidescope.pipeline.regions import as_slide, check_region

__all__ = ["DEFAULT_CACHE_BYTES", "PREVIEW_TILE_PX", "RegionPreview", "carry_over"]

#: Side of a cached tile, working pixels: small, so a view's tiles cover little beyond it.
PREVIEW_TILE_PX = 128
#: Bytes of features kept (about three 1024 x 1024 views of the default 60 features).
DEFAULT_CACHE_BYTES = 768 * 2**20
#: Most tiles whose classes are kept (16 KiB each at 128 px).
_MAX_LABEL_TILES = 8192
#: Most tiles computed together (one read and one halo for the rectangle): about a third
#: of a full screen, so that the first third shows while the rest is computed.
_RECT_TILES = 36


class RegionPreview:
    """Tile caches of features and classes for classifying views of one slide again and again.

    Parameters
    ----------
    slide : Slide, str, PathLike or (M, N, 3) ndarray of uint8
        The slide (kept open until :meth:`close`; an array needs `slide_mpp`).
    tile_px : int
        Side of a cached tile, working pixels.
    max_bytes : int
        Most bytes of cached features; the least recently used tiles are dropped beyond it,
        after each group of tiles a classification predicts (a view larger than the bound,
        the whole slide say, holds the bound and the tiles in work, not all its features).
    threads : int
        Threads predicting tiles.
    slide_mpp : float, optional
        Level-0 µm/px of an array, or of an uncalibrated slide.

    Attributes
    ----------
    computed_tiles : int
        Tiles whose features were computed so far (a cache miss each).
    predicted_pixels : int
        Pixels predicted so far.
    """

    def __init__(
        self,
        slide: Any,
        *,
        tile_px: int = PREVIEW_TILE_PX,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        threads: int = 2,
        slide_mpp: float | None = None,
    ) -> None:
        if tile_px < 16:
            raise ValueError(f"tile_px: expected >= 16 working pixels, got {tile_px}")
        self._src, self._owned = as_slide(slide, mpp=slide_mpp)
        self.tile_px = int(tile_px)
        self.max_bytes = int(max_bytes)
        self.threads = max(1, int(threads))
        self.computed_tiles = 0
        self.predicted_pixels = 0
        self._features: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._bytes = 0  # of the arrays in _features, kept as they come and go
        self._feature_key: tuple[Any, ...] | None = None
        self._labels: dict[tuple[int, int], np.ndarray] = {}
        self._label_key: str | None = None
        self._sha: tuple[int, str] | None = None
        self._lock = threading.RLock()

    # -- state --------------------------------------------------------------------------
    @property
    def slide(self) -> Any:
        """The open slide."""
        return self._src

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached features.

        A count kept with the cache, so that another thread may read it while a worker
        fills the cache (iterating the cache then could fail: it changes size).
        """
        return self._bytes

    @property
    def cached_tiles(self) -> int:
        """Tiles whose features are cached."""
        return len(self._features)

    def clear(self) -> None:
        """Drop every cached feature and class."""
        with self._lock:
            self._features.clear()
            self._bytes = 0
            self._labels.clear()
            self._feature_key = self._label_key = None

    def close(self) -> None:
        """Drop the caches and close the slide (when this object opened it)."""
        self.clear()
        if self._owned:
            self._src.close()

    def stains(self) -> Any:
        """Return the slide's stain vectors (:func:`slide_stains`, estimated once)."""
        return slide_stains(self._src)

    # -- features -------------------------------------------------------------------------
    def _use_spec(self, spec: FeatureSpec) -> None:
        key = spec.key
        if key != self._feature_key:
            self._features.clear()
            self._bytes = 0
            self._labels.clear()
            self._feature_key, self._label_key = key, None

    def _tiles_of(self, box: Box) -> list[tuple[int, int]]:
        t = self.tile_px
        y0, x0, y1, x1 = box
        return [
            (ty, tx)
            for ty in range(y0 // t, (y1 - 1) // t + 1)
            for tx in range(x0 // t, (x1 - 1) // t + 1)
        ]

    def _tile_box(self, tile: tuple[int, int], grid: WorkingGrid) -> Box:
        t = self.tile_px
        h, w = grid.shape
        y, x = tile[0] * t, tile[1] * t
        return (y, x, min(y + t, h), min(x + t, w))

    def _ensure(
        self,
        grid: WorkingGrid,
        tiles: Sequence[tuple[int, int]],
        spec: FeatureSpec,
        cancel: threading.Event | None,
    ) -> dict[tuple[int, int], np.ndarray]:
        """Features of `tiles` (cached or computed now); the caller holds them until done."""
        self._use_spec(spec)
        held: dict[tuple[int, int], np.ndarray] = {}
        missing = []
        for tile in tiles:
            feats = self._features.get(tile)
            if feats is None:
                missing.append(tile)
            else:
                self._features.move_to_end(tile)
                held[tile] = feats
        for rows, cols in _rectangles(missing):
            check_cancel(cancel, "region preview")
            self._compute(grid, rows, cols, spec, held)
        return held

    def _compute(
        self,
        grid: WorkingGrid,
        rows: range,
        cols: range,
        spec: FeatureSpec,
        held: dict[tuple[int, int], np.ndarray],
    ) -> None:
        """Compute the tiles of a rectangle of tiles from one read with one halo."""
        t = self.tile_px
        h, w = grid.shape
        box = (rows[0] * t, cols[0] * t, min(rows[-1] * t + t, h), min(cols[-1] * t + t, w))
        halo = spec.halo
        feats = spec.compute(read_working(self._src, grid, box, halo), crop=halo, planar=True)
        for ty in rows:
            for tx in cols:
                by0, bx0, by1, bx1 = self._tile_box((ty, tx), grid)
                part = feats[:, by0 - box[0] : by1 - box[0], bx0 - box[1] : bx1 - box[1]]
                tile_feats = np.ascontiguousarray(part)
                old = self._features.get((ty, tx))
                self._bytes += tile_feats.nbytes - (0 if old is None else old.nbytes)
                self._features[(ty, tx)] = held[(ty, tx)] = tile_feats
                self.computed_tiles += 1

    def _trim(self) -> None:
        while self._features and self._bytes > self.max_bytes:
            _, feats = self._features.popitem(last=False)
            self._bytes -= feats.nbytes
        while len(self._labels) > _MAX_LABEL_TILES:  # classes are small: kept longer
            self._labels.pop(next(iter(self._labels)))

    def features(self, grid: WorkingGrid, box: Box, spec: FeatureSpec) -> np.ndarray:
        """Features ``(y1 - y0, x1 - x0, F)`` of a working-pixel box, from the cache (a view).

        Only the tiles the box touches are computed; what a training example reads.
        """
        with self._lock:
            y0, x0, y1, x1 = box
            held = self._ensure(grid, self._tiles_of(box), spec, None)
            self._trim()
            nf = next(iter(held.values())).shape[0]
            out = np.empty((nf, y1 - y0, x1 - x0), np.float32)
            for tile, feats in held.items():
                ty0, tx0, ty1, tx1 = self._tile_box(tile, grid)
                a0, b0, a1, b1 = max(y0, ty0), max(x0, tx0), min(y1, ty1), min(x1, tx1)
                out[:, a0 - y0 : a1 - y0, b0 - x0 : b1 - x0] = feats[
                    :, a0 - ty0 : a1 - ty0, b0 - tx0 : b1 - tx0
                ]
            return np.moveaxis(out, 0, -1)

    # -- training -------------------------------------------------------------------------
    def train(self, examples: Any, **options: Any) -> RegionClassifier:
        """Train a classifier as :func:`train_region_classifier` does, features from the cache.

        The stain vectors are the slide's (``stains="slide"``, :meth:`stains`) unless
        `options` give others, so the features of the view stay valid from one stroke to
        the next; the classifier is the one ``train_region_classifier`` gives with the same
        options.
        """
        options.setdefault("stains", "slide")
        options.setdefault("n_jobs", self.threads)
        if "slide_mpp" in options:
            options.pop("slide_mpp")
        with self._lock:
            return train_region_classifier(
                self._src, examples, _feature_source=self.features, **options
            )

    # -- classes ---------------------------------------------------------------------------
    def _digest(self, clf: RegionClassifier) -> str:
        if self._sha is None or self._sha[0] != id(clf):
            self._sha = (id(clf), clf.sha256)
        return self._sha[1]

    def classify(
        self,
        classifier: RegionClassifier,
        region: Sequence[int] | None = None,
        *,
        tissue: Any = None,
        on_tile: Callable[[Box, np.ndarray], Any] | None = None,
        cancel: threading.Event | None = None,
        on_start: Callable[[RegionMap], Any] | None = None,
        progress: Callable[..., Any] | None = None,
    ) -> RegionMap:
        """Classify a level-0 box as :func:`classify_regions` does, reusing cached tiles.

        Parameters
        ----------
        classifier : RegionClassifier
        region : (int, int, int, int), optional
            Level-0 box ``(y0, x0, y1, x1)``; default the whole slide.
        tissue : TissueResult, False or None
            As :func:`classify_regions`: None detects the tissue within `region`, False
            classifies every pixel.
        on_tile : callable, optional
            ``on_tile(box, labels)`` for each tile, nearest the centre first: the
            tile's box in the returned map and its classes there.
        cancel : threading.Event, optional
            Checked between tiles; once set, raises
            :class:`~napari_slidescope.errors.Cancelled` (what was computed stays cached).
        on_start : callable, optional
            ``on_start(regions)`` once the cached tiles are in, before those that need
            work, with the map they fill in place (a viewer shows it then repaints as
            tiles come; a view all in the cache is complete by then).
        progress : callable, optional
            ``progress(Progress)`` first with none done, then after each tile (cached or
            predicted): tiles of the view pasted into the map, of those with tissue.

        Returns
        -------
        RegionMap
            Equal to ``classify_regions(slide, classifier, region=region, tissue=tissue)``.
        """
        src = self._src
        grid = working_grid(src, classifier.mpp)
        box0 = check_region(None if region is None else tuple(region), src.shape0)  # type: ignore[arg-type]
        wy0, wx0, wy1, wx1 = grid.box_of(box0)
        if wy1 <= wy0 or wx1 <= wx0:
            raise ValueError(f"region {region!r} is smaller than one working pixel")
        gated = tissue is not False
        if tissue is None:
            tissue = _gate(src, box0, grid, cancel)
        wbox = (wy0, wx0, wy1, wx1)
        want = _tissue_mask(tissue, grid, wbox) if gated else None
        labels = np.zeros((wy1 - wy0, wx1 - wx0), np.uint8)
        spec = classifier.feature_spec(grid.mpp)
        classifier.predict_proba(np.zeros((1, len(classifier.features)), np.float32))
        regions = _region_map(
            labels,
            classifier,
            self._digest(classifier),
            grid,
            box0,
            (wy0, wx0),
            self.tile_px,
            gated,
            tissue,
        )

        cy, cx = (wy0 + wy1) / 2, (wx0 + wx1) / 2
        t = self.tile_px

        def dist(tile: tuple[int, int]) -> float:
            return math.hypot((tile[0] + 0.5) * t - cy, (tile[1] + 0.5) * t - cx)

        with self._lock:
            tiles = sorted(self._tiles_of(wbox), key=dist)
            if want is not None:
                tiles = [tl for tl in tiles if self._part(tl, grid, wbox, want).any()]
            self._use_spec(spec)
            sha = self._digest(classifier)
            if sha != self._label_key:
                self._labels.clear()
                self._label_key = sha
            # cached classes first (instant); then the tiles to predict whose features are
            # cached, centre first; then rectangles of tiles to compute, nearest first
            todo = [tl for tl in tiles if self._needs(tl, grid, wbox, want)]
            pending = set(todo)
            call = progress_caller(progress)
            done, total = 0, len(tiles)
            if call:
                call(done, total)
            for tile in tiles:
                if tile not in pending:
                    self._paste(tile, grid, wbox, want, labels, on_tile)
                    done += 1
                    if call:
                        call(done, total)
            if on_start is not None:
                on_start(regions)
            rank = {tl: k for k, tl in enumerate(tiles)}
            cached = [tl for tl in todo if tl in self._features]
            rects = _rectangles([tl for tl in todo if tl not in self._features])
            rects.sort(
                key=lambda rc: min(rank.get((y, x), len(rank)) for y in rc[0] for x in rc[1])
            )
            steps = [
                cached[a : a + 4 * self.threads] for a in range(0, len(cached), 4 * self.threads)
            ]
            for rows, cols in rects:
                steps.append(
                    sorted(
                        [(y, x) for y in rows for x in cols if (y, x) in rank], key=rank.__getitem__
                    )
                )
            with ThreadPoolExecutor(self.threads) as pool:
                for group in steps:
                    check_cancel(cancel, "region preview")
                    held = self._ensure(grid, group, spec, cancel)

                    def one(tl: tuple[int, int], held: Any = held) -> tuple[np.ndarray, int]:
                        return self._predict(tl, grid, wbox, want, classifier, held)

                    for tile, (out, n) in zip(group, pool.map(one, group), strict=True):
                        self._labels[tile] = out
                        self.predicted_pixels += n
                        self._paste(tile, grid, wbox, want, labels, on_tile)
                        done += 1
                        if call:
                            call(done, total)
                    del held
                    self._trim()
        return regions

    def _clip(self, tile: tuple[int, int], grid: WorkingGrid, wbox: Box) -> tuple[Box, Box]:
        """Return the tile's part in the view: (box in the tile, box in the view's map)."""
        ty0, tx0, ty1, tx1 = self._tile_box(tile, grid)
        y0, x0 = max(ty0, wbox[0]), max(tx0, wbox[1])
        y1, x1 = min(ty1, wbox[2]), min(tx1, wbox[3])
        return (y0 - ty0, x0 - tx0, y1 - ty0, x1 - tx0), (
            y0 - wbox[0],
            x0 - wbox[1],
            y1 - wbox[0],
            x1 - wbox[1],
        )

    def _part(
        self, tile: tuple[int, int], grid: WorkingGrid, wbox: Box, want: np.ndarray
    ) -> np.ndarray:
        _, (a, b, c, d) = self._clip(tile, grid, wbox)
        return want[a:c, b:d]

    def _needs(
        self, tile: tuple[int, int], grid: WorkingGrid, wbox: Box, want: np.ndarray | None
    ) -> bool:
        lab = self._labels.get(tile)
        if lab is None:
            return True
        (a, b, c, d), _ = self._clip(tile, grid, wbox)
        unknown = lab[a:c, b:d] == 0
        if want is not None:
            unknown &= self._part(tile, grid, wbox, want)
        return bool(unknown.any())

    def _predict(
        self,
        tile: tuple[int, int],
        grid: WorkingGrid,
        wbox: Box,
        want: np.ndarray | None,
        clf: RegionClassifier,
        held: Mapping[tuple[int, int], np.ndarray],
    ) -> tuple[np.ndarray, int]:
        """Return the tile's classes, the view's pixels not known yet predicted; and how many."""
        feats = held[tile]  # planes (F, rows, cols)
        lab = self._labels.get(tile)
        lab = np.zeros(feats.shape[1:], np.uint8) if lab is None else lab.copy()
        (a, b, c, d), _ = self._clip(tile, grid, wbox)
        need = np.zeros(lab.shape, bool)
        need[a:c, b:d] = True if want is None else self._part(tile, grid, wbox, want)
        need &= lab == 0
        n = int(need.sum())
        if n:
            rows = feats.reshape(len(feats), -1).T  # pixels x features, F-ordered: no copy
            x = rows if n == need.size else rows[need.ravel()]
            lab[need] = np.argmax(clf.predict_proba(x), axis=1) + 1
        return lab, n

    def _paste(
        self,
        tile: tuple[int, int],
        grid: WorkingGrid,
        wbox: Box,
        want: np.ndarray | None,
        labels: np.ndarray,
        on_tile: Callable[[Box, np.ndarray], Any] | None,
    ) -> None:
        (a, b, c, d), (p, q, r, s) = self._clip(tile, grid, wbox)
        part = self._labels[tile][a:c, b:d]
        if want is not None:
            part = np.where(want[p:r, q:s], part, 0).astype(np.uint8)
        labels[p:r, q:s] = part
        if on_tile is not None:
            on_tile((p, q, r, s), labels[p:r, q:s].copy())


def carry_over(
    regions: RegionMap, previous: RegionMap | None, done: Sequence[Box] = ()
) -> RegionMap:
    """Return a copy of `regions` to show while it fills: the previous classes until replaced.

    A viewer that showed `regions` as it fills would blank the view at every stroke (a new
    classifier predicts every tile again) and refill it from the centre. The copy holds
    `previous`'s classes (by class name) where the two maps overlap on the same working
    grid, and `regions`' own classes in the tiles `done`; the viewer then pastes each new
    tile into it. Where `previous` has nothing (a new part of the view, another grid, a
    different tissue gate) the copy holds 0, as `regions` does.

    Parameters
    ----------
    regions : RegionMap
        The map being filled (:meth:`RegionPreview.classify`'s ``on_start``).
    previous : RegionMap or None
        What was shown before, of the same slide.
    done : sequence of (int, int, int, int)
        Boxes of `regions`' map (working pixels) already filled.

    Returns
    -------
    RegionMap
        `regions` with its own ``labels`` array (the caller owns it).
    """
    shown = np.zeros_like(regions.labels)
    if previous is not None and _same_grid(regions, previous):
        dy, dx = regions.downsample
        oy = round((previous.origin[0] - regions.origin[0]) / dy)
        ox = round((previous.origin[1] - regions.origin[1]) / dx)
        lut = np.zeros(256, np.uint8)
        for k, name in enumerate(previous.classes, start=1):
            if name in regions.classes:
                lut[k] = regions.classes.index(name) + 1
        ph, pw = previous.labels.shape
        h, w = shown.shape
        y0, x0, y1, x1 = max(oy, 0), max(ox, 0), min(oy + ph, h), min(ox + pw, w)
        if y1 > y0 and x1 > x0:
            shown[y0:y1, x0:x1] = lut[previous.labels[y0 - oy : y1 - oy, x0 - ox : x1 - ox]]
    for y0, x0, y1, x1 in done:
        shown[y0:y1, x0:x1] = regions.labels[y0:y1, x0:x1]
    return dataclasses.replace(regions, labels=shown)


def _same_grid(a: RegionMap, b: RegionMap) -> bool:
    """Whether two maps share a working grid and tissue gate (their pixels line up)."""
    if a.downsample != b.downsample or a.mpp != b.mpp:
        return False
    if a.parameters.get("tissue_gated") != b.parameters.get("tissue_gated"):
        return False
    steps = [(a.origin[i] - b.origin[i]) / a.downsample[i] for i in (0, 1)]
    return all(abs(s - round(s)) < 1e-6 for s in steps)


def _gate(src: Any, box0: Box, grid: WorkingGrid, cancel: threading.Event | None) -> Any:
    """Return the tissue mask :func:`classify_regions` gates `box0` with (the same call).

    The preview must skip what the run on the slide skips, so both call
    :func:`regions_tissue` on the box grown by the same margin.
    """
    return regions_tissue(src, region=_grown(box0, grid, src.shape0), cancel=cancel)


def _rectangles(tiles: Sequence[tuple[int, int]]) -> list[tuple[range, range]]:
    """Cover a set of tiles by few rectangles (row runs merged down, a few tiles at most)."""
    runs: dict[int, list[range]] = {}
    for ty in sorted({tl[0] for tl in tiles}):
        xs = sorted(tl[1] for tl in tiles if tl[0] == ty)
        start = prev = xs[0]
        for x in [*xs[1:], None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            runs.setdefault(ty, []).append(range(start, prev + 1))
            if x is not None:
                start = prev = x
    out: list[tuple[range, range]] = []
    open_: dict[tuple[int, int], tuple[int, int]] = {}  # (x0, x1) -> (first row, last row)
    for ty in sorted(runs):
        seen = set()
        for cols in runs[ty]:
            key = (cols.start, cols.stop)
            seen.add(key)
            first, last = open_.get(key, (ty, ty - 1))
            if last == ty - 1 and (ty - first + 1) * len(cols) <= _RECT_TILES:
                open_[key] = (first, ty)
            else:
                if key in open_:
                    out.append((range(first, last + 1), range(*key)))
                open_[key] = (ty, ty)
        for key in [k for k in open_ if k not in seen]:
            first, last = open_.pop(key)
            out.append((range(first, last + 1), range(*key)))
    out += [(range(f, la + 1), range(*k)) for k, (f, la) in open_.items()]
    return out
