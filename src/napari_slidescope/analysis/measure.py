"""Per-nucleus measurements in physical units from a label image.

Array in, columns out: a ``dict`` of 1-D numpy arrays, one row per nucleus, so the
core needs no pandas. Coordinates follow the project's conventions: centroids in
level-0 pixel index coordinates ``(row, col)`` and in µm from the slide's top-left
corner (``(row + 0.5) * mpp``, the convention QuPath uses for its centroids).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
from skimage.measure import regionprops_table

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
}

_DTYPES = {"id": np.int32}


def empty_table() -> dict[str, np.ndarray]:
    """Return a table with all :data:`COLUMNS` and no rows."""
    return {name: np.zeros(0, _DTYPES.get(name, np.float64)) for name in COLUMNS}


def _pair(value: float | tuple[float, float], name: str) -> tuple[float, float]:
    pair = (value, value) if np.isscalar(value) else tuple(value)  # type: ignore[arg-type]
    if len(pair) != 2 or not all(float(v) > 0 for v in pair):
        raise ValueError(f"{name}: expected a positive number or (y, x) pair, got {value!r}")
    return (float(pair[0]), float(pair[1]))


def measure_nuclei(
    labels: np.ndarray,
    *,
    mpp: float | tuple[float, float],
    od: np.ndarray | None = None,
    origin: tuple[float, float] = (0, 0),
    downsample: float | tuple[float, float] = 1.0,
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
        are NaN.
    origin : (float, float)
        Level-0 ``(row, col)`` of the top-left corner of ``labels[0, 0]``.
    downsample : float or (float, float)
        Level-0 pixels per pixel of ``labels``.

    Returns
    -------
    table : dict of str to (K,) ndarray
        The :data:`COLUMNS`, one row per label, sorted by id.

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
    my, mx = _pair(mpp, "mpp")
    dy, dx = _pair(downsample, "downsample")
    if od is not None:
        od = np.asarray(od, dtype=np.float32)
        if od.ndim != 3 or od.shape[:2] != labels.shape or od.shape[2] < 2:
            raise ValueError(
                f"od: expected (M, N, >=2) float matching labels {labels.shape}, got {od.shape}"
            )
    if not labels.any():
        return empty_table()
    props = ["label", "centroid", "area", "perimeter", "eccentricity", "solidity"]
    if od is not None:
        props.append("intensity_mean")
    t = regionprops_table(
        labels, intensity_image=None if od is None else od[..., :2], properties=props
    )
    cy, cx = t["centroid-0"], t["centroid-1"]
    n = len(t["label"])
    nan = np.full(n, np.nan)
    return {
        "id": t["label"].astype(np.int32),
        "centroid_row": origin[0] + (cy + 0.5) * dy - 0.5,
        "centroid_col": origin[1] + (cx + 0.5) * dx - 0.5,
        "centroid_y_um": origin[0] * my / dy + (cy + 0.5) * my,
        "centroid_x_um": origin[1] * mx / dx + (cx + 0.5) * mx,
        "area_um2": t["area"].astype(np.float64) * my * mx,
        "perimeter_um": t["perimeter"].astype(np.float64) * float(np.sqrt(my * mx)),
        "eccentricity": t["eccentricity"].astype(np.float64),
        "solidity": t["solidity"].astype(np.float64),
        "hematoxylin_od_mean": t["intensity_mean-0"].astype(np.float64) if od is not None else nan,
        "eosin_od_mean": t["intensity_mean-1"].astype(np.float64) if od is not None else nan.copy(),
    }


def concat_tables(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate tables column-wise (empty tables and missing inputs allowed).

    Parameters
    ----------
    tables : list of dict of str to ndarray
        Tables with the same columns (empty dicts are skipped).

    Returns
    -------
    table : dict of str to ndarray
        All rows; :func:`empty_table` when there are none.
    """
    tables = [t for t in tables if t and len(next(iter(t.values()))) > 0]
    if not tables:
        return empty_table()
    return {name: np.concatenate([t[name] for t in tables]) for name in tables[0]}


def write_csv(table: dict[str, np.ndarray], path: str | os.PathLike[str]) -> Path:
    """Write a table of 1-D columns as CSV with a header row.

    Parameters
    ----------
    table : dict of str to (K,) ndarray
        Columns of equal length.
    path : str or PathLike
        Output file.

    Returns
    -------
    path : Path
    """
    path = Path(path)
    names = list(table)
    cols = [np.asarray(table[n]) for n in names]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for row in zip(*(c.tolist() for c in cols), strict=True):
            writer.writerow(row)
    return path
