"""Masks and labels as polygons in level-0 pixels, and tile gating.

Coordinates
-----------
A mask (or label image) pixel ``(r, c)`` covers the level-0 area
``[origin_y + r * downsample_y, origin_y + (r + 1) * downsample_y)`` (same for x).
Polygons are ``(N, 2)`` float arrays of level-0 ``(row, col)`` vertices, open (the
first vertex is not repeated, collinear vertices dropped), tracing pixel edges (cutting
corners diagonally): a polygon encloses exactly the centres of the pixels it was made
from. GeoJSON I/O for these polygons is in :mod:`napari_slidescope.analysis.geojson`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt
from scipy import ndimage as ndi
from skimage import draw, measure

from napari_slidescope.analysis._strips import map_parallel, row_strips, submit

__all__ = [
    "labels_to_polygons",
    "labels_to_rings",
    "mask_to_polygons",
    "polygons_to_mask",
    "tiles_with_tissue",
    "tissue_fraction",
]

Pair = tuple[float, float]


class MaskGrid(Protocol):
    """A mask with its grid (e.g. a ``TissueResult``): what the tile gating reads of it."""

    @property
    def mask(self) -> npt.ArrayLike: ...

    @property
    def downsample(self) -> float | Sequence[float]: ...

    @property
    def origin(self) -> float | Sequence[float]: ...


def _pair(value: float | Sequence[float], name: str) -> Pair:
    if isinstance(value, int | float | np.integer | np.floating):
        out = (float(value), float(value))
    else:
        seq = tuple(float(v) for v in value)
        if len(seq) != 2:
            raise ValueError(f"{name}: expected a number or a (y, x) pair, got {value!r}")
        out = (seq[0], seq[1])
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name}: expected finite numbers, got {value!r}")
    return out


#: Rows of a label image counted at once by :func:`label_sizes`.
_SIZE_ROWS = 256
#: Label images from this many pixels up (whole-slide masks, not nuclei tiles) are
#: counted and looked up on a few threads.
_PARALLEL_PIXELS = 1 << 22


def label_sizes(labels: np.ndarray, n: int, *, _threads: bool = True) -> np.ndarray:
    """Pixels of each label ``0..n`` of `labels`: ``np.bincount(labels.ravel())``, in bands.

    ``np.bincount`` first copies an int32 label image to int64 (8 bytes a pixel: 100 MiB
    for a 13 Mpx whole-slide mask); a band of rows at a time keeps that copy small.
    """
    flat = labels.reshape(labels.shape[0], -1) if labels.ndim else labels.reshape(1, 1)

    def count(r: int) -> np.ndarray:
        counted: np.ndarray = np.bincount(flat[r : r + _SIZE_ROWS].ravel(), minlength=n + 1)
        return counted[: n + 1]

    bands = range(0, flat.shape[0], _SIZE_ROWS)
    # a whole-slide mask's bands on a few threads (np.bincount releases the GIL)
    threads = _threads and flat.size >= _PARALLEL_PIXELS
    counts = map_parallel(count, bands) if threads else map(count, bands)
    sizes = np.zeros(n + 1, np.int64)
    for c in counts:
        sizes += c
    return sizes


def gather(table: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``table[labels]``: a whole-slide label image's rows on a few threads."""
    if labels.ndim != 2 or labels.size < _PARALLEL_PIXELS:
        return cast(np.ndarray, table[labels])
    out = np.empty(labels.shape, table.dtype)

    def rows(sl: slice) -> None:
        np.take(table, labels[sl], out=out[sl])

    map_parallel(rows, row_strips(*labels.shape))
    return out


def _signed_area(ring: np.ndarray) -> float:
    """Shoelace area of a ring of (row, col) vertices (positive = clockwise on screen)."""
    r, c = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(c[:-1], r[1:]) - np.dot(r[:-1], c[1:]) + c[-1] * r[0] - r[-1] * c[0])


def _to_level0(
    contour: np.ndarray, offset: tuple[int, int], downsample: Pair, origin: Pair
) -> np.ndarray:
    """Contour in padded-crop pixel-centre units -> open level-0 ring (row, col)."""
    if len(contour) > 1 and np.array_equal(contour[0], contour[-1]):
        contour = contour[:-1]
    # -1 undoes the padding; +0.5 turns pixel-centre units into pixel-edge units
    scale = np.array(downsample)
    shift = np.array(origin) + (np.array(offset) - 0.5) * scale
    placed: np.ndarray = contour * scale + shift
    return placed


def _drop_collinear(ring: np.ndarray) -> np.ndarray:
    """Remove vertices that lie on the straight line through their neighbours (lossless)."""
    if len(ring) < 4:
        return ring
    prev = np.roll(ring, 1, axis=0)
    nxt = np.roll(ring, -1, axis=0)
    a, b = ring - prev, nxt - ring
    cross = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    keep = np.abs(cross) > 1e-9 * (np.abs(a).sum(1) * np.abs(b).sum(1) + 1e-300)
    return ring[keep] if keep.sum() >= 3 else ring


def _rings_of_object(crop: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Exterior and hole contours of one 4-connected object in a 1-px padded crop."""
    contours = measure.find_contours(crop.astype(np.uint8), 0.5)
    areas = [_signed_area(c) for c in contours]
    k = int(np.argmax(np.abs(areas)))
    sign = math.copysign(1.0, areas[k])
    holes = [c for i, c in enumerate(contours) if i != k and math.copysign(1.0, areas[i]) != sign]
    return contours[k], holes


def mask_to_polygons(
    mask: np.ndarray,
    *,
    downsample: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = (0.0, 0.0),
    holes: bool = True,
    bounds: Sequence[float] | None = None,
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Outline each 4-connected piece of a mask, with its holes.

    Marching squares at level 0.5, as :func:`skimage.measure.find_contours` draws them
    (vertices at pixel-edge midpoints, corners cut diagonally, diagonal neighbours not
    joined), done on the boundary only and in whole-array steps: the rings are the cycles
    of the boundary segments, ordered by pointer doubling (:func:`_trace_rings`). Memory
    is a few bytes per mask pixel plus per boundary segment, and a whole-slide mask with
    ten thousand holes takes a fraction of a second (``find_contours`` took seconds and
    a float64 copy of the mask).

    Parameters
    ----------
    mask : (M, N) ndarray of bool
        Binary mask.
    downsample : float or (float, float)
        Level-0 pixels per mask pixel, ``(y, x)``.
    origin : float or (float, float)
        Level-0 ``(y, x)`` of the top-left corner of ``mask[0, 0]``.
    holes : bool
        Also return the interior rings.
    bounds : (float, float, float, float), optional
        Level-0 box ``(y0, x0, y1, x1)`` every vertex is clipped into (a region whose
        edges cut mask pixels).

    Returns
    -------
    exteriors : list of (N, 2) ndarray of float
        One outer ring per piece, level-0 ``(row, col)``, largest piece first (in pixels;
        ties in raster order of the pieces' first pixels).
    interiors : list of list of (K, 2) ndarray of float
        ``interiors[i]`` are the holes of ``exteriors[i]`` (empty lists when
        ``holes`` is False).
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask: expected a 2-D array, got shape {mask.shape}")
    ds, org = _pair(downsample, "downsample"), _pair(origin, "origin")
    mask = mask.astype(bool, copy=False)
    if holes:
        return _outlines_with_holes(mask, ds, org, bounds)
    labels, n = ndi.label(mask)
    if n == 0:
        return [], []
    outer, none = _filled_outlines(labels, ds, org)
    if bounds is not None:
        lo, hi = np.array(bounds[:2], float), np.array(bounds[2:], float)
        outer = [np.clip(e, lo, hi) for e in outer]
    return outer, none


def _outlines_with_holes(
    mask: np.ndarray, ds: Pair, org: Pair, bounds: Sequence[float] | None
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """:func:`mask_to_polygons` with holes: rings traced while the pieces are labelled.

    The labelling (scipy, which holds the GIL) runs on a pool thread while the tracing
    (numpy passes, which release it) runs on this one: the two overlap on two cores.
    """

    def pieces() -> tuple[np.ndarray, int, np.ndarray]:
        labels, n = ndi.label(mask)
        return labels, n, label_sizes(labels, n, _threads=False)

    if not mask.any():
        return [], []
    job = submit(pieces) if mask.size >= _PARALLEL_PIXELS else None
    padded = np.pad(mask, 1)
    pts, offsets, fg, area = _trace_rings(padded)
    del padded
    labels, n, sizes = pieces() if job is None else job.result()
    ring_label = labels[fg[:, 0] - 1, fg[:, 1] - 1]  # the piece each ring bounds
    del labels
    scale = np.array(ds)
    pts *= scale
    pts += np.array(org) - 0.5 * scale  # padded centre units -> level-0 pixel edges
    if bounds is not None:
        np.clip(pts, np.array(bounds[:2], float), np.array(bounds[2:], float), out=pts)
    rings = np.split(pts, offsets[1:-1])
    exterior = area > 0
    order = sorted(np.flatnonzero(exterior), key=lambda i: (-sizes[ring_label[i]], ring_label[i]))
    where = {int(ring_label[i]): k for k, i in enumerate(order)}
    exts = [rings[i] for i in order]
    hls: list[list[np.ndarray]] = [[] for _ in order]
    for i in np.flatnonzero(~exterior):
        hls[where[int(ring_label[i])]].append(rings[i])
    return exts, hls


def _filled_outlines(
    labels: np.ndarray, ds: Pair, org: Pair
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Outer rings of each piece with its holes filled (4-connected background), one by one.

    (A background pocket that reaches the outside only diagonally is filled here, so the
    ring may differ from the piece's exterior ring of :func:`mask_to_polygons`.)
    """
    sizes = label_sizes(labels, int(labels.max()))[1:]
    pieces: list[tuple[int, np.ndarray]] = []
    for lab, sl in enumerate(ndi.find_objects(labels), start=1):
        if sl is None:
            continue
        crop = ndi.binary_fill_holes(np.pad(labels[sl] == lab, 1))
        ext, _ = _rings_of_object(crop)
        off = (sl[0].start, sl[1].start)
        pieces.append((int(sizes[lab - 1]), _drop_collinear(_to_level0(ext, off, ds, org))))
    pieces.sort(key=lambda p: -p[0])
    return [p[1] for p in pieces], [[] for _ in pieces]


#: Marching-squares segments of each cell configuration (corner bits: top-left 1,
#: top-right 2, bottom-right 4, bottom-left 8), as pairs of cell edges (0 top, 1 right,
#: 2 bottom, 3 left) with the foreground corner they cut off; saddles (5, 10) cut each
#: foreground corner on its own (diagonal neighbours are not joined).
_CORNERS = ((0, 0), (0, 1), (1, 1), (1, 0))  # tl, tr, br, bl
_EDGE_CORNERS = ((0, 1), (1, 2), (3, 2), (0, 3))  # top, right, bottom, left
_EDGE_POINT = ((0.0, 0.5), (0.5, 1.0), (1.0, 0.5), (0.5, 0.0))


def _segment_table() -> dict[int, list[tuple[int, int, int]]]:
    """Oriented segments ``(from edge, to edge, foreground corner)`` of each configuration.

    Oriented so that the foreground corner lies on one fixed side (negative cross
    product), as find_contours runs: one way round the pieces, the other round holes.
    """
    table: dict[int, list[tuple[int, int, int]]] = {}
    for k in range(1, 15):
        on = [bool(k >> b & 1) for b in range(4)]
        crossed = [e for e, (a, b) in enumerate(_EDGE_CORNERS) if on[a] != on[b]]
        if k == 5:  # tl + br
            pairs = [(0, 3, 0), (2, 1, 2)]
        elif k == 10:  # tr + bl
            pairs = [(0, 1, 1), (2, 3, 3)]
        else:
            e0, e1 = crossed
            a, b = _EDGE_CORNERS[e0]
            pairs = [(e0, e1, a if on[a] else b)]
        segs = []
        for e0, e1, f in pairs:
            p, q, c = np.array(_EDGE_POINT[e0]), np.array(_EDGE_POINT[e1]), np.array(_CORNERS[f])
            d, g = q - p, c - p
            cross = d[0] * g[1] - d[1] * g[0]
            segs.append((e0, e1, f) if cross < 0 else (e1, e0, f))
        table[k] = segs
    return table


_SEGMENTS = _segment_table()


def _trace_rings(
    padded: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rings of a mask padded with one background pixel on every side.

    Returns
    -------
    points : (V, 2) ndarray of float
        The open rings one after the other, in padded pixel-centre ``(row, col)`` units,
        collinear vertices dropped.
    offsets : (R + 1,) ndarray of int
        Ring ``i`` is ``points[offsets[i]:offsets[i + 1]]``.
    fg : (R, 2) ndarray of int
        A foreground pixel (padded coordinates) next to each ring.
    area : (R,) ndarray of float
        Signed area of each ring: positive round a piece, negative round a hole.
    """
    h, w = padded.shape
    m = padded.view(np.uint8)
    config = m[:-1, :-1] | (m[:-1, 1:] << 1) | (m[1:, 1:] << 2) | (m[1:, :-1] << 3)
    # the boundary cells (neither all background nor all foreground), by configuration
    cells = np.flatnonzero((config.ravel() - np.uint8(1)) < np.uint8(14))
    kinds = config.ravel()[cells]
    del config
    by_kind = np.argsort(kinds, kind="stable")
    bounds = np.searchsorted(kinds[by_kind], np.arange(1, 16))
    starts, ends, points, fgs = [], [], [], []
    nh = h * w  # ids: horizontal edge (r, c) -> r * w + c; vertical edge -> nh + r * w + c
    for k, segs in _SEGMENTS.items():
        at = cells[by_kind[bounds[k - 1] : bounds[k]]]
        if at.size == 0:
            continue
        rr, cc = np.divmod(at, w - 1)
        ids = (
            rr * w + cc,  # top: horizontal edge (r, c)
            nh + rr * w + cc + 1,  # right: vertical edge (r, c + 1)
            (rr + 1) * w + cc,  # bottom: horizontal edge (r + 1, c)
            nh + rr * w + cc,  # left: vertical edge (r, c)
        )
        for e0, e1, f in segs:
            starts.append(ids[e0])
            ends.append(ids[e1])
            points.append(np.stack([rr + _EDGE_POINT[e0][0], cc + _EDGE_POINT[e0][1]], axis=1))
            fgs.append(np.stack([rr + _CORNERS[f][0], cc + _CORNERS[f][1]], axis=1))
    start = np.concatenate(starts)
    end = np.concatenate(ends)
    point = np.concatenate(points)
    fg_all = np.concatenate(fgs)
    del starts, ends, points, fgs, cells, kinds, by_kind
    # each edge point starts one segment and ends one: the next segment of each
    by_start = np.argsort(start, kind="stable")
    nxt = by_start[np.searchsorted(start, end, sorter=by_start)]
    del start, end, by_start
    n = len(nxt)
    # 4-byte indices where they suffice: the doubling rounds below are gathers, whose time
    # is the bytes they move
    index_type: type[np.signedinteger[Any]] = np.int32 if n < 2**31 else np.int64
    nxt = nxt.astype(index_type)
    # the ring of each segment (a cycle of `nxt`): its smallest segment index, by pointer
    # doubling (after k rounds, the minimum over the next 2^k segments); done when every
    # segment agrees with the next
    first = np.arange(n, dtype=index_type)
    jump = nxt
    while not np.array_equal(first, first[nxt]):
        np.minimum(first, first[jump], out=first)
        jump = jump[jump]
    first_seg, ring = np.unique(first, return_inverse=True)
    nrings = first_seg.size
    # steps from the ring's first segment: list ranking by pointer doubling along the
    # predecessors, each ring cut at its first segment (which points to itself)
    prev = np.empty(n, index_type)
    prev[nxt] = np.arange(n, dtype=index_type)
    prev[first_seg] = first_seg
    dist = np.ones(n, index_type)
    dist[first_seg] = 0
    while True:
        step = prev[prev]
        if np.array_equal(step, prev):
            break
        dist += dist[prev]
        prev = step
    order = np.lexsort((dist, ring))
    del prev, dist, jump, nxt
    counts = np.bincount(ring, minlength=nrings)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    pts = point[order]
    del point, order, ring
    following = pts[_next_in_ring(offsets)]
    terms = pts[:, 1] * following[:, 0] - pts[:, 0] * following[:, 1]
    area = 0.5 * np.add.reduceat(terms, offsets[:-1])  # positive round a piece
    del following, terms
    kept, kept_offsets = _drop_collinear_all(pts, offsets)
    return kept, kept_offsets, fg_all[first_seg], area


def _next_in_ring(offsets: np.ndarray) -> np.ndarray:
    """Index of the next vertex of each vertex of the rings ``[offsets[i], offsets[i+1])``."""
    counts = np.diff(offsets)
    ring_of = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(int(offsets[-1])) - offsets[:-1][ring_of]
    following: np.ndarray = offsets[:-1][ring_of] + (pos + 1) % counts[ring_of]
    return following


def _drop_collinear_all(pts: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_drop_collinear` on every open ring ``pts[offsets[i]:offsets[i+1]]`` at once.

    Returns the kept vertices and their ring offsets.
    """
    counts = np.diff(offsets)
    ring_of = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(len(pts)) - offsets[:-1][ring_of]
    c = counts[ring_of]
    base = offsets[:-1][ring_of]
    a = pts - pts[base + (pos - 1) % c]  # from the previous vertex
    b = pts[base + (pos + 1) % c] - pts  # to the next
    del pos, c, base
    cross = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    keep = np.abs(cross) > 1e-9 * (np.abs(a).sum(1) * np.abs(b).sum(1) + 1e-300)
    del a, b, cross
    kept = np.bincount(ring_of, weights=keep, minlength=len(counts))
    whole = (counts < 4) | (kept < 3)  # as _drop_collinear: such rings are kept whole
    keep |= whole[ring_of]
    out = pts[keep]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(ring_of[keep], minlength=len(counts)))])
    return out, bounds


def labels_to_polygons(
    labels: np.ndarray,
    *,
    downsample: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = (0.0, 0.0),
) -> tuple[list[np.ndarray], np.ndarray]:
    """Outer contour of every label of a label image (e.g. nuclei).

    All labels are traced at once (:func:`labels_to_rings`), so a tile of thousands of
    nuclei costs a few array passes, not a call per nucleus. A label split in several
    pieces gets the outline of its largest piece; holes are ignored.

    Parameters
    ----------
    labels : (M, N) ndarray of int
        0 is background.
    downsample : float or (float, float)
        Level-0 pixels per label pixel, ``(y, x)``.
    origin : float or (float, float)
        Level-0 ``(y, x)`` of the top-left corner of ``labels[0, 0]``.

    Returns
    -------
    polygons : list of (N, 2) ndarray of float
        Level-0 ``(row, col)`` rings, in increasing label order.
    ids : (K,) ndarray of int
        The label of each polygon.

    Examples
    --------
    >>> lab = np.zeros((6, 6), np.int32)
    >>> lab[1:3, 1:3] = 7
    >>> polys, ids = labels_to_polygons(lab, downsample=2, origin=(100, 0))
    >>> ids.tolist(), float(polys[0][:, 0].min()), float(polys[0][:, 0].max())
    ([7], 102.0, 106.0)
    """
    coords, offsets, ids = labels_to_rings(labels, downsample=downsample, origin=origin)
    return np.split(coords, offsets[1:-1]) if ids.size else [], ids


#: Unit steps (row, col) of the four directions: up, right, down, left.
_STEPS = np.array([(-1, 0), (0, 1), (1, 0), (0, -1)], np.intp)


def labels_to_rings(
    labels: np.ndarray,
    *,
    downsample: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outer contour of every label, all rings in one flat array (what the outputs store).

    The contour of a label is the one ``skimage.measure.find_contours`` traces at level
    0.5 in the label's zero-padded binary crop (objects 4-connected, background
    8-connected), with collinear vertices dropped: its vertices are midpoints of the
    edges between a pixel of the label and a 4-neighbour outside it, in the same order,
    though the ring may start at another of them. The rings of every label are traced
    in one pass: each such edge is a node whose successor follows from its 2 x 2
    neighbourhood, and the cycles of that successor map are ordered by pointer doubling.
    A label in several pieces (or with holes) keeps its ring of largest area.

    Parameters
    ----------
    labels : (M, N) ndarray of int
        0 is background; no negative labels.
    downsample, origin
        The label grid, as in :func:`labels_to_polygons`.

    Returns
    -------
    coords : (V, 2) ndarray of float
        Level-0 ``(row, col)`` vertices of all rings, ring after ring (open rings: the
        first vertex is not repeated); each ring starts at its vertex of lowest
        ``(row, col)`` pixel edge.
    offsets : (K + 1,) ndarray of int64
        Ring ``k`` is ``coords[offsets[k]:offsets[k + 1]]``.
    ids : (K,) ndarray of int64
        The label of each ring, increasing.

    Raises
    ------
    ValueError
        If ``labels`` is not a 2-D integer array, or has negative labels.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels: expected a 2-D integer array, got shape {labels.shape} {labels.dtype}"
        )
    ds, org = _pair(downsample, "downsample"), _pair(origin, "origin")
    if labels.size and labels.min() < 0:
        raise ValueError("labels: expected labels >= 0 (0 = background)")
    empty = (np.zeros((0, 2)), np.zeros(1, np.int64), np.zeros(0, np.int64))
    if not labels.size:
        return empty
    padded = np.pad(labels, 1)
    flat = padded.ravel()
    w = padded.shape[1]
    step = _STEPS[:, 0] * w + _STEPS[:, 1]  # flat offset of each direction
    # nodes: (in-pixel, direction to an outside 4-neighbour), keyed pixel * 4 + direction
    core = padded[1:-1, 1:-1]
    h, wc = core.shape
    keys = []
    labelled = core != 0
    edge = np.empty_like(labelled)
    for k, (dy, dx) in enumerate(_STEPS):
        np.not_equal(core, padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + wc], out=edge)
        edge &= labelled
        at = np.flatnonzero(edge)
        keys.append(((at // wc + 1) * w + at % wc + 1) * 4 + k)
    del labelled, edge
    key = np.sort(np.concatenate(keys))
    n = key.size
    if n == 0:
        return empty
    pix, d = key // 4, key % 4
    lab = flat[pix]
    # successor, walking with the label on the left (find_contours' way round)
    t = (d + 1) % 4  # travel direction
    p2 = pix + step[t]  # next pixel along the label's side
    q2 = pix + step[d] + step[t]  # next pixel along the outside
    in_p2, in_q2 = flat[p2] == lab, flat[q2] == lab
    nxt_key = np.where(~in_p2, pix * 4 + t, np.where(in_q2, q2 * 4 + (t + 2) % 4, p2 * 4 + d))
    nxt = np.searchsorted(key, nxt_key)
    del keys, key, t, p2, q2, in_p2, in_q2, nxt_key, padded, flat, core  # keep the peak low
    # cycles: each node's cycle is named by its lowest node (pointer doubling)
    first = np.arange(n)
    jump = nxt.copy()
    span = 1
    while span < n:
        np.minimum(first, first[jump], out=first)
        jump = jump[jump]
        span *= 2
        if span >= 64 and np.array_equal(first, first[nxt]):  # settled early
            break
    del jump
    # position along the cycle from its lowest node: list ranking on the broken cycle
    tail = nxt == first  # the node before each cycle's start
    succ = np.where(tail, np.arange(n), nxt)
    dist = (~tail).astype(np.int64)
    span = 1
    while span < n:
        moved = succ != succ[succ]
        if not moved.any():
            break
        dist = dist + dist[succ]
        succ = succ[succ]
        span *= 2
    del succ, tail
    # vertices: midpoints of the edges, in label pixel units
    r = (pix // w - 1) + 0.5 * _STEPS[d, 0]
    c = (pix % w - 1) + 0.5 * _STEPS[d, 1]
    # each label keeps its cycle of largest area (shoelace over the successor pairs)
    cycles, cycle_of = np.unique(first, return_inverse=True)
    cross = c * r[nxt] - r * c[nxt]
    area = np.abs(np.bincount(cycle_of, cross, minlength=cycles.size))
    cyc_lab = lab[cycles]
    best = np.lexsort((cycles, -area, cyc_lab))  # by label, largest first, then first found
    keep_cycle = np.zeros(cycles.size, bool)
    starts = np.ones(best.size, bool)
    starts[1:] = cyc_lab[best][1:] != cyc_lab[best][:-1]
    keep_cycle[best[starts]] = True
    sel = np.flatnonzero(keep_cycle[cycle_of])
    order = sel[np.lexsort((-dist[sel], lab[sel]))]  # by label, then along the cycle
    r, c, ring_lab = r[order], c[order], lab[order]
    ids, begin, sizes = np.unique(ring_lab, return_index=True, return_counts=True)
    # drop collinear vertices (as _drop_collinear, ring by ring), exactly: halves of a pixel
    ring_of = np.repeat(np.arange(ids.size), sizes)
    pos = np.arange(r.size) - begin[ring_of]
    prev = begin[ring_of] + (pos - 1) % sizes[ring_of]
    after = begin[ring_of] + (pos + 1) % sizes[ring_of]
    ay, ax = r - r[prev], c - c[prev]
    by, bx = r[after] - r, c[after] - c
    keep = (ay * bx - ax * by) != 0
    kept = np.bincount(ring_of, keep, minlength=ids.size)
    keep |= ((sizes < 4) | (kept < 3))[ring_of]
    r, c, ring_of = r[keep], c[keep], ring_of[keep]
    offsets = np.zeros(ids.size + 1, np.int64)
    np.cumsum(np.bincount(ring_of, minlength=ids.size), out=offsets[1:])
    coords = np.empty((r.size, 2))
    coords[:, 0] = org[0] + (r + 0.5) * ds[0]
    coords[:, 1] = org[1] + (c + 0.5) * ds[1]
    return coords, offsets, ids.astype(np.int64)


def polygons_to_mask(
    exteriors: Iterable[np.ndarray],
    interiors: Iterable[Iterable[np.ndarray]] | None = None,
    *,
    shape: tuple[int, int],
    downsample: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = (0.0, 0.0),
) -> np.ndarray:
    """Rasterise level-0 polygons onto a mask grid (pixel centres inside -> True).

    Parameters
    ----------
    exteriors : iterable of (N, 2) ndarray
        Level-0 ``(row, col)`` outer rings.
    interiors : iterable of iterable of (K, 2) ndarray, optional
        Holes of each exterior.
    shape : (int, int)
        Shape of the output mask.
    downsample, origin
        The mask grid, as in :func:`mask_to_polygons`.

    Returns
    -------
    (M, N) ndarray of bool
    """
    ds, org = _pair(downsample, "downsample"), _pair(origin, "origin")
    out = np.zeros(shape, bool)
    ext_list = list(exteriors)
    int_list = list(interiors) if interiors is not None else [[] for _ in ext_list]

    def grid(ring: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ring = np.asarray(ring, float)
        rr = (ring[:, 0] - org[0]) / ds[0] - 0.5
        cc = (ring[:, 1] - org[1]) / ds[1] - 0.5
        rows, cols = draw.polygon(rr, cc, shape=shape)
        return np.asarray(rows), np.asarray(cols)

    for ext, hls in zip(ext_list, int_list, strict=True):
        piece = np.zeros(shape, bool)
        piece[grid(ext)] = True
        for h in hls:
            piece[grid(h)] = False
        out |= piece
    return out


def _grid_of(
    mask: npt.ArrayLike | MaskGrid,
    downsample: float | Sequence[float] | None,
    origin: float | Sequence[float] | None,
) -> tuple[np.ndarray, Pair, Pair]:
    if hasattr(mask, "mask") and not isinstance(mask, np.ndarray):
        grid = cast(MaskGrid, mask)
        downsample = grid.downsample if downsample is None else downsample
        origin = grid.origin if origin is None else origin
        mask = grid.mask
    arr = np.asarray(mask, bool)
    if arr.ndim != 2:
        raise ValueError(f"mask: expected a 2-D mask, got shape {arr.shape}")
    return (
        arr,
        _pair(1.0 if downsample is None else downsample, "downsample"),
        _pair((0.0, 0.0) if origin is None else origin, "origin"),
    )


def tissue_fraction(
    mask: npt.ArrayLike | MaskGrid,
    boxes: npt.ArrayLike,
    *,
    downsample: float | Sequence[float] | None = None,
    origin: float | Sequence[float] | None = None,
) -> np.ndarray:
    """Fraction of each level-0 box covered by tissue mask pixels.

    A mask pixel counts for a box when it overlaps the box at all, so a box with
    any tissue never gets 0 (gating errs on the side of reading).

    Parameters
    ----------
    mask : (M, N) ndarray of bool, or an object with ``mask``, ``downsample`` and ``origin``
        The tissue mask (e.g. a ``TissueResult``).
    boxes : (K, 4) array_like
        Level-0 boxes ``(y0, x0, y1, x1)``, half-open, e.g. a tile grid at any level
        expressed in level-0 pixels.
    downsample, origin : optional
        The mask grid (see :func:`mask_to_polygons`); taken from ``mask`` when it is
        a result object. Default 1 and (0, 0).

    Returns
    -------
    (K,) ndarray of float
        In 0..1; 0 for boxes outside the mask.
    """
    arr, ds, org = _grid_of(mask, downsample, origin)
    b = np.asarray(boxes, float).reshape(-1, 4)
    if len(b) and np.any((b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1])):
        raise ValueError("boxes: expected (y0, x0, y1, x1) with y1 >= y0 and x1 >= x0")
    h, w = arr.shape
    sat = np.zeros((h + 1, w + 1), np.int64)
    sat[1:, 1:] = arr.cumsum(0, dtype=np.int64).cumsum(1)
    eps = 1e-9
    r0 = np.floor((b[:, 0] - org[0]) / ds[0] + eps)
    c0 = np.floor((b[:, 1] - org[1]) / ds[1] + eps)
    r1 = np.ceil((b[:, 2] - org[0]) / ds[0] - eps)
    c1 = np.ceil((b[:, 3] - org[1]) / ds[1] - eps)
    area = np.maximum(r1 - r0, 0) * np.maximum(c1 - c0, 0)
    r0c, r1c = np.clip(r0, 0, h).astype(np.int64), np.clip(r1, 0, h).astype(np.int64)
    c0c, c1c = np.clip(c0, 0, w).astype(np.int64), np.clip(c1, 0, w).astype(np.int64)
    r1c, c1c = np.maximum(r1c, r0c), np.maximum(c1c, c0c)
    count = sat[r1c, c1c] - sat[r0c, c1c] - sat[r1c, c0c] + sat[r0c, c0c]
    density: np.ndarray = np.divide(count, area, out=np.zeros(len(b)), where=area > 0)
    return density


def tiles_with_tissue(
    mask: npt.ArrayLike | MaskGrid,
    boxes: npt.ArrayLike,
    *,
    min_fraction: float = 0.0,
    downsample: float | Sequence[float] | None = None,
    origin: float | Sequence[float] | None = None,
) -> np.ndarray:
    """Which level-0 boxes (tiles of a grid at any level) contain tissue.

    Parameters
    ----------
    mask : (M, N) ndarray of bool, or an object with ``mask``, ``downsample`` and ``origin``
        The tissue mask (e.g. a ``TissueResult``).
    boxes : (K, 4) array_like
        Level-0 boxes ``(y0, x0, y1, x1)``.
    min_fraction : float
        A box is kept when it has tissue and its tissue fraction
        (:func:`tissue_fraction`) is at least this. 0 keeps every box with any tissue.
    downsample, origin : optional
        The mask grid, taken from ``mask`` when it is a result object.

    Returns
    -------
    (K,) ndarray of bool

    Examples
    --------
    >>> m = np.zeros((4, 4), bool)
    >>> m[0, 0] = True
    >>> tiles_with_tissue(m, [(0, 0, 32, 32), (32, 32, 64, 64)], downsample=16).tolist()
    [True, False]
    """
    if not 0.0 <= min_fraction <= 1.0:
        raise ValueError(f"min_fraction: expected a fraction in [0, 1], got {min_fraction!r}")
    frac = tissue_fraction(mask, boxes, downsample=downsample, origin=origin)
    return (frac > 0) & (frac >= min_fraction)
