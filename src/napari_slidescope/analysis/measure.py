"""Per-nucleus measurements in physical units from a label image.

Array in, columns out: a ``dict`` of 1-D numpy arrays, one row per nucleus, so the
core needs no pandas. Coordinates follow the project's conventions: centroids in
level-0 pixel index coordinates ``(row, col)`` and in µm from the slide's top-left
corner (``(row + 0.5) * mpp``, the convention QuPath uses for its centroids).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from napari_slidescope._io import atomic_write
from napari_slidescope._units import as_pair

__all__ = ["COLUMNS", "concat_tables", "empty_table", "measure_nuclei", "write_csv"]

#: Column names and units of :func:`measure_nuclei`.
COLUMNS: dict[str, str] = {
    "id": "label value",
    "centroid_row": "level-0 px",
    "centroid_col": "level-0 px",
    "centroid_y_um": "µm",
    "centroid_x_um": "µm",
    "area_um2": "µm²",
    "perimeter_um": "µm",
    "eccentricity": "1",
    "solidity": "1",
    "hematoxylin_od_mean": "optical density",
    "eosin_od_mean": "optical density",
    "hematoxylin_od_std": "optical density",
    "hematoxylin_od_skew": "1",
}

_DTYPES = {"id": np.int32}


_OD_COLUMNS = (
    "hematoxylin_od_mean",
    "eosin_od_mean",
    "hematoxylin_od_std",
    "hematoxylin_od_skew",
)


def _columns(channel_columns: tuple[str, ...]) -> list[str]:
    if not channel_columns:
        return list(COLUMNS)
    return [c for c in COLUMNS if c not in _OD_COLUMNS] + list(channel_columns)


def empty_table(channel_columns: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Return a table with all :data:`COLUMNS` (or the fluorescence columns) and no rows.

    Parameters
    ----------
    channel_columns : tuple of str
        Per-channel intensity columns; when given they replace the stain OD columns.
    """
    return {name: np.zeros(0, _DTYPES.get(name, np.float64)) for name in _columns(channel_columns)}


def measure_nuclei(
    labels: np.ndarray,
    *,
    mpp: float | tuple[float, float],
    od: np.ndarray | None = None,
    origin: tuple[float, float] = (0, 0),
    downsample: float | tuple[float, float] = 1.0,
    channels: np.ndarray | None = None,
    channel_columns: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Measure each labelled nucleus.

    Parameters
    ----------
    labels : (M, N) ndarray of int
        Nuclei labels (0 = background) at a working resolution.
    mpp : float or (float, float)
        µm per pixel of ``labels``, ``(y, x)`` or one value.
    od : (M, N, C) ndarray of float, optional
        Optical density images with hematoxylin in channel 0 and eosin in
        channel 1 (e.g. ``StainMatrix.separate(rgb)``). Without it the OD columns
        are NaN. Negative values are clipped to 0 before the means: a stain's amount
        cannot be negative, and colour deconvolution gives slightly negative amounts
        of a stain a pixel does not hold (noise, and colours the two stain vectors do
        not span); averaging them in would pull the means below the stain present, to
        negative means on nuclei with no eosin at all.
    origin : (float, float)
        Level-0 ``(row, col)`` of the top-left corner of ``labels[0, 0]``.
    downsample : float or (float, float)
        Level-0 pixels per pixel of ``labels``.
    channels : (M, N, C) ndarray, optional
        Fluorescence channels; their mean under each nucleus go to `channel_columns`.
    channel_columns : tuple of str
        One column name per channel (``"DAPI_mean"``...). When given, the stain OD
        columns are left out unless `od` is given too.

    Returns
    -------
    table : dict of str to (K,) ndarray
        The :data:`COLUMNS` (or the fluorescence columns), one row per label, sorted by id.

    Raises
    ------
    ValueError
        If ``labels`` is not 2-D integer or ``od`` does not match it.

    Examples
    --------
    >>> lab = np.zeros((20, 20), np.int32); lab[5:10, 5:10] = 1
    >>> measure_nuclei(lab, mpp=0.5)["area_um2"]
    array([6.25])
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.dtype.kind not in "iu":
        raise ValueError(f"labels: expected a 2-D integer array, got {labels.dtype} {labels.shape}")
    my, mx = as_pair(mpp, "mpp")
    dy, dx = as_pair(downsample, "downsample")
    if od is not None:
        od = np.asarray(od, dtype=np.float32)
        if od.ndim != 3 or od.shape[:2] != labels.shape or od.shape[2] < 2:
            raise ValueError(
                f"od: expected (M, N, >=2) float matching labels {labels.shape}, got {od.shape}"
            )
        od = np.maximum(od, np.float32(0))  # no negative amounts of a stain (see above)
    if channels is not None:
        channels = np.asarray(channels)
        if channels.shape[:2] != labels.shape or channels.ndim != 3:
            raise ValueError(
                f"channels: expected (M, N, C) matching labels {labels.shape}, got {channels.shape}"
            )
        if channels.shape[2] != len(channel_columns):
            raise ValueError(
                f"channel_columns: {len(channel_columns)} names for {channels.shape[2]} channels"
            )
    slices = ndi.find_objects(labels) if labels.size else []  # ids <= 0 are ignored
    ids = np.array([i for i, sl in enumerate(slices, 1) if sl is not None], np.int64)
    if ids.size == 0:
        table = empty_table(channel_columns)
        if od is not None and channel_columns:
            table.update({c: np.zeros(0) for c in _OD_COLUMNS})
        return table
    n = len(slices)
    ys, xs = np.nonzero(labels > 0)
    lab = labels[ys, xs].astype(np.intp)
    count = np.bincount(lab, minlength=n + 1).astype(np.float64)
    # centroids: integer coordinate sums (exact in float64) over the pixel count
    cy = np.bincount(lab, ys, minlength=n + 1) / np.maximum(count, 1)
    cx = np.bincount(lab, xs, minlength=n + 1) / np.maximum(count, 1)
    ecc = _eccentricity(lab, ys - cy[lab], xs - cx[lab], count)
    perim, b_idx, b_lab = _perimeter(labels, ys, xs, lab, n)
    w = labels.shape[1] + 2
    convex = _convex_pixels(b_idx // w - 1, b_idx % w - 1, b_lab, n)
    od_mean = np.full((n + 1, 2), np.nan)
    if od is not None:  # float64 sums of the float32 densities, per label
        for k in range(2):
            od_mean[:, k] = np.bincount(lab, od[ys, xs, k], minlength=n + 1) / np.maximum(count, 1)
    h_std = h_skew = np.full(n + 1, np.nan)
    if od is not None:
        h_std, h_skew = _spread(lab, od[ys, xs, 0], count)
    means = {}
    if channels is not None:
        for k, name in enumerate(channel_columns):
            sums = np.bincount(lab, channels[ys, xs, k].astype(np.float64), minlength=n + 1)
            means[name] = sums[ids] / count[ids]
    cy, cx, count = cy[ids], cx[ids], count[ids]
    table = {
        "id": ids.astype(np.int32),
        "centroid_row": origin[0] + (cy + 0.5) * dy - 0.5,
        "centroid_col": origin[1] + (cx + 0.5) * dx - 0.5,
        "centroid_y_um": origin[0] * my / dy + (cy + 0.5) * my,
        "centroid_x_um": origin[1] * mx / dx + (cx + 0.5) * mx,
        "area_um2": count * my * mx,
        "perimeter_um": perim[ids] * float(np.sqrt(my * mx)),
        "eccentricity": ecc[ids],
        "solidity": count / convex[ids],
        "hematoxylin_od_mean": od_mean[ids, 0],
        "eosin_od_mean": od_mean[ids, 1],
        "hematoxylin_od_std": h_std[ids],
        "hematoxylin_od_skew": h_skew[ids],
    }
    if channel_columns and od is None:
        for name in _OD_COLUMNS:
            del table[name]
    return table | means


def _spread(
    lab: np.ndarray, values: np.ndarray, count: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the standard deviation and skewness of `values` per label (index = id).

    The chromatin texture of a nucleus in the hematoxylin channel: a lymphocyte is dark and
    even (small spread), a vesicular tumour nucleus pale with dark rim and nucleoli (large
    spread, positive skew). Both are per-pixel moments, so they keep their meaning at any
    pixel size.
    """
    n = count.size
    v = values.astype(np.float64)
    c = np.maximum(count, 1)
    mean = np.bincount(lab, v, minlength=n) / c
    d = v - mean[lab]
    d2 = d * d
    m2 = np.bincount(lab, d2, minlength=n) / c
    m3 = np.bincount(lab, d2 * d, minlength=n) / c
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = np.where(m2 > 1e-12, m3 / np.maximum(m2, 1e-12) ** 1.5, 0.0)
    return np.sqrt(m2), skew


def _eccentricity(lab: np.ndarray, dy: np.ndarray, dx: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Eccentricity of the ellipse with each label's second central moments (per label id)."""
    n = count.size
    mu0 = np.maximum(count, 1)
    a = np.bincount(lab, dx * dx, minlength=n) / mu0
    c = np.bincount(lab, dy * dy, minlength=n) / mu0
    b = -np.bincount(lab, dy * dx, minlength=n) / mu0
    root = np.sqrt(((a - c) / 2) ** 2 + b**2)
    l1 = np.maximum((a + c) / 2 + root, 0)
    l2 = np.maximum((a + c) / 2 - root, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ecc = np.sqrt(np.maximum(1 - l2 / l1, 0))
    return np.where(l1 == 0, 0.0, ecc)


#: Perimeter weight of a border pixel by its code (see :func:`_perimeter`), as in
#: ``skimage.measure.perimeter(image, neighborhood=4)``.
_PERIMETER_WEIGHTS = np.zeros(50)
_PERIMETER_WEIGHTS[[5, 7, 15, 17, 25, 27]] = 1
_PERIMETER_WEIGHTS[[21, 33]] = np.sqrt(2)
_PERIMETER_WEIGHTS[[13, 23]] = (1 + np.sqrt(2)) / 2


def _perimeter(
    labels: np.ndarray, ys: np.ndarray, xs: np.ndarray, lab: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Perimeter of every label (index = id), as ``skimage.measure.perimeter`` per object.

    Also returns the border pixels (flat indices into ``labels`` padded by 1) and
    their labels, the only pixels the convex hulls need.

    A border pixel is a pixel of the object with a 4-neighbour outside it; its code
    is 1 + 2 x (4-neighbours on the border) + 10 x (diagonal neighbours on the
    border), counting only border pixels of the same object; codes weigh by
    :data:`_PERIMETER_WEIGHTS` (skimage's convolution and histogram, for all objects
    at once).
    """
    w = labels.shape[1] + 2
    padded = np.pad(labels, 1)
    flat = padded.ravel()
    idx = (ys + 1) * w + (xs + 1)
    inner = np.ones(idx.size, bool)
    for off in (-w, w, -1, 1):
        inner &= flat[idx + off] == lab
    border = np.zeros(flat.size, bool)
    b_idx = idx[~inner]
    b_lab = lab[~inner]
    border[b_idx] = True
    code = np.ones(b_idx.size, np.intp)
    sides = [(off, 2) for off in (-w, w, -1, 1)]
    corners = [(off, 10) for off in (-w - 1, -w + 1, w - 1, w + 1)]
    for off, weight in sides + corners:
        code += weight * (border[b_idx + off] & (flat[b_idx + off] == b_lab))
    hist = np.bincount(b_lab * 50 + code, minlength=(n + 1) * 50).reshape(n + 1, 50)
    perimeter: np.ndarray = (hist * _PERIMETER_WEIGHTS).sum(axis=1)  # no BLAS: no threads
    return perimeter, b_idx, b_lab


#: Labels x points of the padded arrays of one :func:`_chain_rows` call (memory bound).
_HULL_CELLS = 2**18


def _convex_pixels(by: np.ndarray, bx: np.ndarray, blab: np.ndarray, n: int) -> np.ndarray:
    """Pixels of each label's convex hull (index = id), as ``convex_hull_image`` counts them.

    skimage's hull is that of the midpoints of the pixels' edges, and a pixel counts
    when its centre is inside it or on it. All hulls are built at once from the border
    pixels (``by``, ``bx``, label ``blab``), in doubled coordinates where every point
    is an integer (so exactly): each label's leftmost and rightmost midpoint at every
    half row, the left chain as their lower convex envelope and the right chain as the
    upper one (Andrew's monotone chain, all labels in lockstep), then the whole columns
    between the chains summed row by row.
    """
    out = np.zeros(n + 1)
    if blab.size == 0:
        return out
    height = int(by.max()) + 2
    # leftmost and rightmost border pixel of each (label, row)
    key = blab.astype(np.int64) * height + by
    order = np.lexsort((bx, key))
    key, bx_s = key[order], bx[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    last = np.r_[first[1:], key.size] - 1
    row_lab, row = key[first] // height, key[first] % height
    left, right = bx_s[first].astype(np.int64), bx_s[last].astype(np.int64)
    # midpoints at half rows 2r - 1, 2r, 2r + 1 (doubled): the extremes of each
    yy = np.concatenate([2 * row - 1, 2 * row, 2 * row + 1])
    xl = np.concatenate([2 * left, 2 * left - 1, 2 * left])
    xr = np.concatenate([2 * right, 2 * right + 1, 2 * right])
    labs = np.tile(row_lab, 3)
    key = labs * (2 * height + 2) + yy + 1
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    yy, labs = yy[order][starts], labs[order][starts]
    xl = np.minimum.reduceat(xl[order], starts)
    xr = np.maximum.reduceat(xr[order], starts)
    ids, begin, sizes = np.unique(labs, return_index=True, return_counts=True)
    # labels by size, in groups whose padded (labels x points) arrays stay small
    total = np.zeros(ids.size, np.int64)
    by_size = np.argsort(sizes, kind="stable")
    start = 0
    while start < by_size.size:
        stop = start + 1
        while stop < by_size.size and (stop + 1 - start) * sizes[by_size[stop]] <= _HULL_CELLS:
            stop += 1
        group = by_size[start:stop]
        g_begin, g_sizes = begin[group], sizes[group]
        left = _chain_rows(yy, xl, g_begin, g_sizes, lower=True)  # sum of ceil(left) per row
        total[group] = _chain_rows(yy, xr, g_begin, g_sizes, lower=False) - left
        start = stop
    y0, y1 = yy[begin], yy[begin + sizes - 1]
    n_rows = ((y1 - y1 % 2) - (y0 + y0 % 2)) // 2 + 1  # integer rows between the ends
    out[ids] = total + n_rows
    return out


def _chain_rows(
    yy: np.ndarray, xx: np.ndarray, begin: np.ndarray, sizes: np.ndarray, *, lower: bool
) -> np.ndarray:
    """Per object: the sum over its integer rows of ceil (lower) or floor (upper) of its chain.

    ``yy``, ``xx``: doubled coordinates of each object's points, sorted by ``yy`` and
    grouped (``begin``, ``sizes``). The chain is the lower (``lower``) or upper convex
    envelope of ``xx`` as a function of ``yy``; rows are the even ``yy`` it spans.
    """
    k_obj, m = sizes.size, int(sizes.max())
    col = np.arange(m)
    valid = col[None, :] < sizes[:, None]
    at = np.minimum(begin[:, None] + col[None, :], yy.size - 1)
    py, px = yy[at], xx[at]
    sy = np.zeros((k_obj, m), np.int64)
    sx = np.zeros((k_obj, m), np.int64)
    size = np.zeros(k_obj, np.intp)
    sign = 1 if lower else -1
    for j in range(m):
        act = np.flatnonzero(valid[:, j])
        y, x = py[act, j], px[act, j]
        while True:
            can = size[act] >= 2
            if not can.any():
                break
            a_, y_, x_ = act[can], y[can], x[can]
            s_ = size[a_]
            oy, ox = sy[a_, s_ - 2], sx[a_, s_ - 2]
            ay, ax = sy[a_, s_ - 1], sx[a_, s_ - 1]
            cross = (ay - oy) * (x_ - ox) - (ax - ox) * (y_ - oy)
            pop = a_[sign * cross <= 0]
            if pop.size == 0:
                break
            size[pop] -= 1
        s_ = size[act]
        sy[act, s_], sx[act, s_] = y, x
        size[act] += 1
    # the chain's edges, each with the even rows in [y0, y1) (the last vertex: its own)
    e_obj, e_j = np.nonzero(col[None, :] < (size - 1)[:, None])
    y0, x0 = sy[e_obj, e_j], sx[e_obj, e_j]
    y1, x1 = sy[e_obj, e_j + 1], sx[e_obj, e_j + 1]
    r0 = y0 + (y0 % 2)  # first even row at or after y0
    n_r = np.maximum((y1 - 1 - r0) // 2 + 1, 0)  # even rows in [y0, y1)
    e = np.repeat(np.arange(e_obj.size), n_r)
    rows = np.repeat(r0, n_r) + 2 * (np.arange(e.size) - np.repeat(np.cumsum(n_r) - n_r, n_r))
    dy = (y1 - y0)[e]
    num = x0[e] * dy + (x1 - x0)[e] * (rows - y0[e])  # x at the row = num / (2 * dy) px
    den = 2 * dy
    value = -((-num) // den) if lower else num // den  # exact ceil / floor
    sums = np.bincount(e_obj[e], value, minlength=k_obj)
    end_y, end_x = sy[np.arange(k_obj), size - 1], sx[np.arange(k_obj), size - 1]
    end = np.where(end_y % 2 == 0, -((-end_x) // 2) if lower else end_x // 2, 0)
    result: np.ndarray = sums + end
    return result


def concat_tables(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate tables column-wise (empty tables and missing inputs allowed).

    Parameters
    ----------
    tables : list of dict of str to ndarray
        Tables with the same columns (empty dicts are skipped).

    Returns
    -------
    table : dict of str to ndarray
        All rows. With none, the columns of the (empty) tables given, so a run that
        found no nucleus still has its measurements' columns; :func:`empty_table` when no
        table has any column.
    """
    rows = [t for t in tables if t and len(next(iter(t.values()))) > 0]
    if not rows:  # keep the columns the tiles measured (a fluorescence run's channels)
        template = next((t for t in tables if t), None)
        if template is None:
            return empty_table()
        return {name: np.asarray(v)[:0] for name, v in template.items()}
    return {name: np.concatenate([t[name] for t in rows]) for name in rows[0]}


def write_csv(
    table: dict[str, np.ndarray],
    path: str | os.PathLike[str],
    *,
    chunk: int = 100_000,
    progress: Callable[[int, int], object] | None = None,
) -> Path:
    """Write a table of 1-D columns as CSV with a header row.

    The text is :func:`csv.writer`'s (``excel`` dialect: CR LF line ends, fields
    quoted only when they need it), written a column at a time in chunks of rows: a
    million rows in seconds.

    Parameters
    ----------
    table : dict of str to (K,) ndarray
        Columns of equal length.
    path : str or PathLike
        Output file.
    chunk : int
        Rows formatted at once.
    progress : callable, optional
        Called with ``(rows done, rows)`` after each chunk.

    Returns
    -------
    path : Path
    """
    path = Path(path)
    names = list(table)
    cols = [np.asarray(table[n]) for n in names]
    total = len(cols[0]) if cols else 0
    # (one column: csv quotes an empty field alone on its row; the writer says so)
    fast = len(cols) > 1 and all(c.ndim == 1 and c.dtype.kind in "biufU" for c in cols)
    with atomic_write(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for start in range(0, total, chunk):
            part = [c[start : start + chunk] for c in cols]
            if fast:  # str() per value, as csv.writer does (repr for floats, the same)
                texts = [
                    list(map(_csv_text, c.tolist())) if c.dtype.kind == "U" else
                    list(map(str, c.tolist()))
                    for c in part
                ]  # fmt: skip
                fh.write("\r\n".join(map(",".join, zip(*texts, strict=True))) + "\r\n")
            else:
                writer.writerows(zip(*(c.tolist() for c in part), strict=True))
            if progress is not None:
                progress(min(total, start + chunk), total)
    return path


def _csv_text(value: str) -> str:
    """Quote a text field as :func:`csv.writer` does (``QUOTE_MINIMAL``, excel dialect)."""
    if any(ch in value for ch in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value
