"""Ventana BIF: level-0 tiles that overlap their neighbours, stitched as OpenSlide does.

A Ventana scanner stores its camera frames side by side as the level-0 TIFF tiles, though
neighbouring frames overlap. Level 0's XMP ``EncodeInfo`` lists the tile joints
(``TileJointInfo``: the two tiles, the direction ``RIGHT`` or ``UP``, ``OverlapX`` /
``OverlapY`` in pixels and a ``Confidence``), tiles numbered from 1 at the bottom-left,
serpentine (every other row from the bottom runs right to left). OpenSlide's Ventana
reader places every tile at ``(col * advance_x, row * advance_y)`` with one advance per
axis for the whole slide: the tile size minus the confidence-weighted mean overlap. The
lower levels are stored the same way, each tile holding ``d x d`` downsampled frames
(``d`` the level's downsample), and each such sub-tile is placed at ``advance / d``.

:func:`stitch_plan` reads that geometry; :class:`StitchedChunks` shows a stored level
stitched. A stitched native chunk is one advance cell: the top-left ``advance`` pixels of
the frame painted there (a frame painted later, to the right or below, covers the rest,
as in OpenSlide), the last row and column showing their frames whole. Advances are
rounded to whole pixels at each level (OpenSlide draws fractional advances at sub-pixel
offsets, resampling); the stitched pixels are otherwise OpenSlide's.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_slidescope.slide import _tiff
from napari_slidescope.slide._xml import parse_xml
from napari_slidescope.slide.cache import tile_cache

#: Distinguishes the stored tiles of every stitched level in the shared decoded-tile cache.
_LEVELS = itertools.count()


@dataclass(frozen=True)
class StitchPlan:
    """Level-0 tile grid of a BIF slide and the advance between neighbouring frames.

    Attributes
    ----------
    rows, cols : int
        Frames down and across (one scanned area, at the origin).
    tile : (int, int)
        Frame (tile) height and width in level-0 pixels.
    advance : (float, float)
        Rows and columns from one frame's origin to the next's: tile minus mean overlap.
    """

    rows: int
    cols: int
    tile: tuple[int, int]
    advance: tuple[float, float]

    @property
    def overlap(self) -> tuple[float, float]:
        """Mean overlap (rows, columns) in level-0 pixels."""
        return self.tile[0] - self.advance[0], self.tile[1] - self.advance[1]


def _int(node: Any, name: str) -> int | None:
    try:
        return int(float(node.get(name, "")))
    except ValueError:
        return None


def _scanned(root: Any) -> list[Any]:
    return [i for i in root.iter("ImageInfo") if i.get("AOIScanned", "1") != "0"]


def mean_overlap(root: Any) -> tuple[float, float]:
    """Confidence-weighted mean overlap (rows, columns) of the joints in ``EncodeInfo``."""
    sums = {"UP": [0.0, 0.0], "RIGHT": [0.0, 0.0]}
    for info in _scanned(root):
        for joint in info.iter("TileJointInfo"):
            direction = joint.get("Direction", "")
            if direction not in sums or joint.get("FlagJoined", "1") == "0":
                continue
            try:
                weight = float(joint.get("Confidence", "0"))
                value = float(joint.get("OverlapY" if direction == "UP" else "OverlapX", "0"))
            except ValueError:
                continue
            sums[direction][0] += weight * value
            sums[direction][1] += weight
    oy = sums["UP"][0] / sums["UP"][1] if sums["UP"][1] else 0.0
    ox = sums["RIGHT"][0] / sums["RIGHT"][1] if sums["RIGHT"][1] else 0.0
    return oy, ox


def stitch_plan(
    root: Any, tile: tuple[int, int], stored: tuple[int, int] | None = None
) -> tuple[StitchPlan | None, str | None]:
    """Read the stitching geometry from level 0's parsed ``EncodeInfo`` XML.

    Parameters
    ----------
    root : Element
        The parsed XMP packet of the ``level=0`` page.
    tile : (int, int)
        The level-0 TIFF tile height and width.
    stored : (int, int), optional
        The level-0 image height and width: the grid's frames must all be stored in it.

    Returns
    -------
    plan : StitchPlan or None
        None when the tiles need no stitching (no overlap) or cannot be stitched.
    why : str or None
        Why a slide whose tiles overlap is not stitched (then `plan` is None).
    """
    infos = _scanned(root)
    oy, ox = mean_overlap(root)
    if not round(oy) and not round(ox):
        return None, None
    if len(infos) != 1:
        return None, f"{len(infos)} scanned areas (stitching handles one)"
    info = infos[0]
    rows, cols = _int(info, "NumRows"), _int(info, "NumCols")
    th, tw = _int(info, "Height"), _int(info, "Width")
    if not rows or not cols or rows < 1 or cols < 1:
        return None, "the tile grid (NumRows / NumCols) is missing"
    if stored is not None and (rows > -(-stored[0] // tile[0]) or cols > -(-stored[1] // tile[1])):
        return None, (
            f"the tile grid ({rows} x {cols} frames) is larger than level 0 "
            f"({stored[0]} x {stored[1]} px)"
        )
    if (th, tw) != tuple(tile):
        return None, f"the frames ({th} x {tw}) are not the TIFF tiles ({tile[0]} x {tile[1]})"
    pos = [_int(info, "Pos-X") or 0, _int(info, "Pos-Y") or 0]
    origin = next(iter(root.iter("AoiOrigin")), None)
    if origin is not None:
        for aoi in origin:
            pos = [pos[0] + (_int(aoi, "OriginX") or 0), pos[1] + (_int(aoi, "OriginY") or 0)]
    if any(pos):
        return None, "the scanned area does not start at the origin"
    if not (0 <= oy < tile[0] / 2 and 0 <= ox < tile[1] / 2):
        return None, f"implausible overlaps ({oy:g} x {ox:g} px)"
    return StitchPlan(rows, cols, (tile[0], tile[1]), (tile[0] - oy, tile[1] - ox)), None


class StitchedChunks:
    """A stored BIF level shown stitched (see the module text); its chunks are advance cells.

    Parameters
    ----------
    inner : NativeChunks
        The stored level (axes ``YXS`` or ``YX``), frames side by side.
    plan : StitchPlan
    downsample : int
        The level's downsample (1 for level 0): each stored tile holds ``d x d`` frames.
    owner : hashable, optional
        The slide's key in the decoded-tile cache (stored tiles of lower levels are kept
        there under it, decoded once for their ``d x d`` frames).
    """

    def __init__(
        self, inner: _tiff.NativeChunks, plan: StitchPlan, downsample: int, owner: Any = None
    ) -> None:
        self._inner, self._plan, self._d = inner, plan, int(downsample)
        self.fast = inner.fast
        self.dtype = inner.dtype
        self._sub = (plan.tile[0] // self._d, plan.tile[1] // self._d)  # a frame, stored
        self._adv = (
            max(1, round(plan.advance[0] / self._d)),
            max(1, round(plan.advance[1] / self._d)),
        )
        h = (plan.rows - 1) * self._adv[0] + self._sub[0]
        w = (plan.cols - 1) * self._adv[1] + self._sub[1]
        rest = tuple(inner.shape[2:])
        self.shape: tuple[int, ...] = (h, w, *rest)
        self.chunks: tuple[int, ...] = (min(self._adv[0], h), min(self._adv[1], w), *rest)
        self._n = (plan.rows, plan.cols)
        # the slide's owner first: closing the slide drops them from the shared cache
        self._key = (owner, "bif-stored", next(_LEVELS))

    def _box(self, idx: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
        """Stored-level box (y0, x0, rows, cols) of a stitched chunk, and its own rows, cols."""
        out = []
        for ax in (0, 1):
            i = int(idx[ax])
            frame = min(i, self._n[ax] - 1)
            offset = (i - frame) * self._adv[ax]
            size = min(self.chunks[ax], self.shape[ax] - i * self.chunks[ax])
            start = frame * self._sub[ax] + offset
            take = max(0, min(size, (frame + 1) * self._sub[ax] - start))
            out.append((start, take, size))
        (y0, hy, ry), (x0, hx, rx) = out
        return y0, x0, hy, hx, ry, rx

    def _stored(self, idx: tuple[int, ...]) -> list[tuple[int, ...]]:
        y0, x0, hy, hx, _, _ = self._box(idx)
        ny, nx = self._inner.chunks[0], self._inner.chunks[1]
        ys = range(y0 // ny, -(-(y0 + hy) // ny)) if hy else range(0)
        xs = range(x0 // nx, -(-(x0 + hx) // nx)) if hx else range(0)
        tail = (0,) * (len(self._inner.shape) - 2)
        return [(y, x, *tail) for y in ys for x in xs]

    def fetch(self, indices: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], bytes] | None:
        """Fetch the stored tiles under `indices` at once (a remote slide), else None."""
        need = list(dict.fromkeys(s for idx in indices for s in self._stored(idx)))
        cache = tile_cache()
        need = [s for s in need if cache.get((*self._key, s)) is None]
        return self._inner.fetch(need) if need else None

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        """Return each stitched chunk (or the error of a stored tile under it)."""
        need = list(dict.fromkeys(s for idx in indices for s in self._stored(idx)))
        # a stored tile holds d x d frames that reads may ask for in different batches:
        # decoded once, kept in the shared decoded-tile cache
        cache = tile_cache()
        tiles: dict[tuple[int, ...], np.ndarray | BaseException] = {}
        for s in need:
            hit = cache.get((*self._key, s))
            if hit is not None:
                tiles[s] = hit
        todo = [s for s in need if s not in tiles]
        if todo:
            for s, tile in zip(todo, self._inner.read(todo, raw), strict=True):
                tiles[s] = tile
                if not isinstance(tile, BaseException) and self._d > 1:
                    cache.put((*self._key, s), tile)
        ny, nx = self._inner.chunks[0], self._inner.chunks[1]
        out: list[np.ndarray | BaseException] = []
        for idx in indices:
            y0, x0, hy, hx, ry, rx = self._box(idx)
            chunk = np.zeros((ry, rx, *self.shape[2:]), dtype=self.dtype)
            failed: BaseException | None = None
            for s in self._stored(idx):
                tile = tiles[s]
                if isinstance(tile, BaseException):
                    failed = tile
                    break
                ty, tx = s[0] * ny, s[1] * nx
                a, b = max(y0, ty), min(y0 + hy, ty + tile.shape[0])
                c, e = max(x0, tx), min(x0 + hx, tx + tile.shape[1])
                if a < b and c < e:
                    chunk[a - y0 : b - y0, c - x0 : e - x0] = tile[a - ty : b - ty, c - tx : e - tx]
            out.append(failed if failed is not None else chunk)
        return out


def level0_plan(tif: Any, path: str) -> tuple[StitchPlan | None, str | None, tuple[float, float]]:
    """Return ``(plan, why not, mean overlap)`` from a BIF file's ``level=0`` page.

    `plan` is None when the tiles need no stitching or cannot be stitched (`why` says why
    for overlapping tiles); the overlap is (0, 0) when the joints give none.
    """
    for page in tif.pages[:8]:
        if not str(getattr(page, "description", "") or "").startswith("level=0"):
            continue
        xmp = _tiff.tag_value(page, "XMP")
        if not xmp or not getattr(page, "is_tiled", False):
            break
        root = parse_xml(xmp if isinstance(xmp, bytes) else str(xmp).encode(), path)
        if root is None:
            break
        plan, why = stitch_plan(
            root,
            (int(page.tilelength), int(page.tilewidth)),
            (int(page.imagelength), int(page.imagewidth)),
        )
        if plan is not None:
            return plan, None, plan.overlap
        if why is not None:
            return None, why, mean_overlap(root)
        break
    return None, None, (0.0, 0.0)
