"""Per-nucleus features for an object classifier, in physical units.

A cell classifier sees each nucleus as one row of numbers. They come from the nuclei table
(:func:`~napari_slidescope.analysis.measure.measure_nuclei`): morphology in µm and µm², stain
optical densities and the hematoxylin texture (spread and skewness of the OD inside the
nucleus), one derived shape measure (circularity), and the neighbourhood of each nucleus, as
QuPath's "Add smoothed features" gives it: every measurement averaged over the nuclei whose
centroid lies within a radius in µm, and the local density of nuclei (per mm²).

Everything is in µm, µm² or dimensionless, never in pixels, so one classifier applies to a
40x and a 20x scan of the same tissue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.spatial import cKDTree

__all__ = [
    "BASE_FEATURES",
    "DEFAULT_RADIUS_UM",
    "FEATURES_VERSION",
    "cell_features",
    "default_features",
    "neighbourhood_mean",
]

#: Table measurements a classifier uses by default (those present in the table), and the
#: derived ``circularity`` (4 pi area / perimeter², 1 for a disc).
BASE_FEATURES: tuple[str, ...] = (
    "area_um2",
    "perimeter_um",
    "circularity",
    "eccentricity",
    "solidity",
    "hematoxylin_od_mean",
    "eosin_od_mean",
    "hematoxylin_od_std",
    "hematoxylin_od_skew",
)
#: Neighbourhood radius in µm (QuPath's smoothed features default to an FWHM of 25 µm).
DEFAULT_RADIUS_UM = 25.0
#: Bumped when a feature's definition changes: a classifier trained on other definitions
#: would silently misclassify, so :func:`load_classifier` refuses it.
FEATURES_VERSION = 1

_SMOOTHED = "_smoothed_"
_DENSITY = "density_"
#: Query points per KD-tree pass: bounds the pairs array (~24 bytes a pair).
_CHUNK = 32_768


def smoothed_name(name: str, radius_um: float) -> str:
    """Feature name of `name` averaged over neighbours within `radius_um`."""
    return f"{name}{_SMOOTHED}{radius_um:g}um"


def density_name(radius_um: float) -> str:
    """Feature name of the local density (nuclei per mm² within `radius_um`)."""
    return f"{_DENSITY}{radius_um:g}um_per_mm2"


def default_features(
    table: Mapping[str, np.ndarray], *, radius_um: float | None = DEFAULT_RADIUS_UM
) -> tuple[str, ...]:
    """Return the default feature names for a nuclei table.

    Parameters
    ----------
    table : dict of str to (K,) ndarray
        A nuclei table.
    radius_um : float or None
        Neighbourhood radius; None for no neighbourhood features.

    Returns
    -------
    tuple of str
        The :data:`BASE_FEATURES` the table can give (columns present, not all NaN),
        their smoothed versions and the local density.
    """
    base = [
        f
        for f in BASE_FEATURES
        if (f == "circularity" and {"area_um2", "perimeter_um"} <= set(table))
        or (f in table and (len(table[f]) == 0 or np.isfinite(table[f]).any()))
    ]
    if radius_um is None:
        return tuple(base)
    return (*base, *(smoothed_name(f, radius_um) for f in base), density_name(radius_um))


def _base_column(table: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name == "circularity":
        area = np.asarray(table["area_um2"], np.float64)
        perim = np.asarray(table["perimeter_um"], np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(perim > 0, 4 * np.pi * area / perim**2, np.nan)
    if name not in table:
        raise KeyError(name)
    return np.asarray(table[name], np.float64)


def _parse(name: str) -> tuple[str, str, float | None]:
    """Split a feature name into (kind, base, radius): kind is base, smoothed or density."""
    if name.startswith(_DENSITY) and name.endswith("um_per_mm2"):
        return "density", "", float(name[len(_DENSITY) : -len("um_per_mm2")])
    if _SMOOTHED in name and name.endswith("um"):
        base, _, r = name.rpartition(_SMOOTHED)
        return "smoothed", base, float(r[:-2])
    return "base", name, None


def neighbourhood_mean(
    points_um: np.ndarray,
    values: np.ndarray,
    radius_um: float,
    *,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Average `values` over the points within `radius_um` of each point (itself included).

    Parameters
    ----------
    points_um : (K, 2) ndarray of float
        Centroids in µm.
    values : (K, F) ndarray of float
        Measurements; NaN values are left out of the means.
    radius_um : float
        Neighbourhood radius in µm (distance <= radius).
    rows : (R,) ndarray of int, optional
        Only the neighbourhoods of these points (their neighbours come from all `K`).

    Returns
    -------
    means : (K, F) or (R, F) ndarray of float64
        Mean of each column over each point's neighbourhood (NaN where all were NaN).
    counts : (K,) or (R,) ndarray of int64
        Points in each neighbourhood, the point itself included.

    Raises
    ------
    ValueError
        If the shapes do not match or the radius is not positive.

    Examples
    --------
    >>> pts = np.array([[0.0, 0.0], [0.0, 3.0], [0.0, 10.0]])
    >>> m, n = neighbourhood_mean(pts, np.array([[1.0], [3.0], [8.0]]), 5.0)
    >>> m.ravel().tolist(), n.tolist()
    ([2.0, 2.0, 8.0], [2, 2, 1])
    """
    points_um = np.asarray(points_um, np.float64)
    values = np.asarray(values, np.float64)
    if values.ndim == 1:
        values = values[:, None]
    if points_um.ndim != 2 or points_um.shape[1] != 2 or values.shape[0] != points_um.shape[0]:
        raise ValueError(
            f"points_um: expected (K, 2) matching values (K, F); got {points_um.shape} "
            f"and {values.shape}"
        )
    if not radius_um > 0:
        raise ValueError(f"radius_um: expected a positive radius in µm, got {radius_um}")
    query = points_um if rows is None else points_um[np.asarray(rows, np.intp)]
    k, f = len(query), values.shape[1]
    sums = np.zeros((k, f))
    finite = np.zeros((k, f))
    counts = np.zeros(k, np.int64)
    if k == 0:
        return sums, counts
    tree = cKDTree(points_um)
    if rows is None:  # every point: each pair once (i < j), counted both ways, plus itself
        pairs = tree.query_pairs(radius_um, output_type="ndarray")
        first, second = pairs[:, 0], pairs[:, 1]
        counts[:] = np.bincount(first, minlength=k) + np.bincount(second, minlength=k) + 1
        for c in range(f):  # one column at a time: temporaries of one column only
            ok = np.isfinite(values[:, c])
            v = np.where(ok, values[:, c], 0.0)
            sums[:, c] = (
                np.bincount(first, v[second], minlength=k)
                + np.bincount(second, v[first], minlength=k)
                + v
            )
            finite[:, c] = (
                np.bincount(first, ok[second], minlength=k)
                + np.bincount(second, ok[first], minlength=k)
                + ok
            )
        del pairs, first, second
    else:
        ok_all = np.isfinite(values)
        clean = np.where(ok_all, values, 0.0)
        for start in range(0, k, _CHUNK):
            stop = min(start + _CHUNK, k)
            sub = cKDTree(query[start:stop])
            # every pair within the radius, zero distances (the point itself) included
            found = sub.sparse_distance_matrix(tree, radius_um, output_type="ndarray")
            i = found["i"].astype(np.intp)
            j = found["j"].astype(np.intp)
            n = stop - start
            counts[start:stop] = np.bincount(i, minlength=n)
            for c in range(f):
                sums[start:stop, c] = np.bincount(i, clean[j, c], minlength=n)
                finite[start:stop, c] = np.bincount(i, ok_all[j, c], minlength=n)
    empty = finite == 0
    np.divide(sums, np.maximum(finite, 1, out=finite), out=sums)  # in place: no more copies
    sums[empty] = np.nan
    return sums, counts


def as_columns(table: Any) -> Any:
    """Return the numpy columns of a result, a DataFrame or a dict of columns (else `table`).

    A :class:`~napari_slidescope.pipeline.nuclei_result.NucleiResult` gives its
    ``columns``; a ``pandas.DataFrame`` (``result.table``) gives each column as an array.
    """
    columns = getattr(table, "columns", None)
    if isinstance(columns, Mapping):
        return columns
    if columns is not None and hasattr(table, "to_numpy") and not isinstance(table, Mapping):
        return {str(c): table[c].to_numpy() for c in columns}
    return table


def cell_features(
    table: Mapping[str, np.ndarray] | object,
    features: Sequence[str] | None = None,
    *,
    radius_um: float | None = DEFAULT_RADIUS_UM,
    rows: np.ndarray | None = None,
) -> tuple[tuple[str, ...], np.ndarray]:
    """Compute a feature matrix for the nuclei of a table or a result.

    Parameters
    ----------
    table : dict of str to (K,) ndarray, or NucleiResult
        Nuclei table (a result's ``table``), with ``centroid_y_um`` / ``centroid_x_um``.
    features : sequence of str, optional
        Feature names: table columns, ``circularity``, ``<column>_smoothed_<r>um`` and
        ``density_<r>um_per_mm2``. Default :func:`default_features` with `radius_um`.
    radius_um : float or None
        Neighbourhood radius of the default features.
    rows : (R,) ndarray of int, optional
        Compute only these rows (training examples, visible nuclei); neighbourhoods still
        count every nucleus of the table.

    Returns
    -------
    names : tuple of str
        The feature names, in column order.
    X : (K, F) or (R, F) ndarray of float32
        One row per table row (NaN where a measurement is missing).

    Raises
    ------
    ValueError
        If a feature needs a column the table lacks, or a name is not a feature.
    """
    table = as_columns(table)
    if not isinstance(table, Mapping):
        raise ValueError(f"table: expected a nuclei table (dict) or result, got {type(table)}")
    names = tuple(default_features(table, radius_um=radius_um) if features is None else features)
    k = len(table["id"]) if "id" in table else len(next(iter(table.values()), []))
    parsed = [_parse(n) for n in names]
    missing = sorted({b for kind, b, _ in parsed if kind != "density" and not _has(table, b)})
    if missing:
        raise ValueError(
            f"features: the nuclei table has no {', '.join(missing)} column(s) "
            f"(it has {', '.join(table)})"
        )
    sel = np.arange(k) if rows is None else np.asarray(rows, np.intp)
    x = np.empty((len(sel), len(names)), np.float32)
    radii = sorted({r for kind, _, r in parsed if r is not None})
    if radii and not {"centroid_y_um", "centroid_x_um"} <= set(table):
        raise ValueError("features: neighbourhood features need centroid_y_um and centroid_x_um")
    for j, (kind, base, _) in enumerate(parsed):
        if kind == "base":
            x[:, j] = _base_column(table, base)[sel]
    if radii:
        points = np.column_stack(
            [np.asarray(table["centroid_y_um"], np.float64), table["centroid_x_um"]]
        )
        for r in radii:
            cols = [j for j, (kind, _, rr) in enumerate(parsed) if rr == r and kind == "smoothed"]
            values = np.column_stack(
                [_base_column(table, parsed[j][1]) for j in cols] or [np.zeros(k)]
            )
            means, counts = neighbourhood_mean(points, values, r, rows=rows)
            for c, j in enumerate(cols):
                x[:, j] = means[:, c]
            for j, (kind, _, rr) in enumerate(parsed):
                if kind == "density" and rr == r:
                    x[:, j] = counts / (np.pi * r * r) * 1e6
    return names, x


def _has(table: Mapping[str, np.ndarray], name: str) -> bool:
    if name == "circularity":
        return {"area_um2", "perimeter_um"} <= set(table)
    return name in table
