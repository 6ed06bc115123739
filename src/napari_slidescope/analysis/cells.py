"""Cells from nuclei: expansion that never enters a neighbour, and per-compartment means.

A cell is its nucleus grown by up to a distance, each background pixel going to the
nearest nucleus (a Voronoi partition bounded by the distance; QuPath's cell expansion and
``skimage.segmentation.expand_labels``). Its compartments partition it: ``nucleus``, the
``cytoplasm`` (cell minus nucleus) and the whole ``cell``.

A segmentation model that outlines cells itself (InstanSeg's
``fluorescence_nuclei_and_cells``) gives :func:`model_cells`: each nucleus keeps the part
of that expansion region lying in the model's cell it overlaps most, so the cell follows
the model's boundary but stays within the distance and out of its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "COMPARTMENTS",
    "compartment_means",
    "expand_cells",
    "model_cells",
    "owned_cells",
]

#: The compartments measured on every cell, in column order.
COMPARTMENTS = ("nucleus", "cytoplasm", "cell")


def expand_cells(nuclei: np.ndarray, distance_px: float) -> np.ndarray:
    """Grow each nucleus into its cell, up to `distance_px`, never into a neighbour.

    Parameters
    ----------
    nuclei : (M, N) ndarray of int
        Nuclei labels, 0 = background.
    distance_px : float
        Largest growth in pixels (Euclidean distance to the nucleus).

    Returns
    -------
    cells : (M, N) ndarray of int32
        Cell labels with the nuclei's ids; every nucleus pixel keeps its id.

    Raises
    ------
    ValueError
        If the distance is negative or not finite.

    Examples
    --------
    >>> lab = np.zeros((1, 9), np.int32); lab[0, 1] = 1; lab[0, 6] = 2
    >>> expand_cells(lab, 2).tolist()
    [[1, 1, 1, 1, 2, 2, 2, 2, 2]]
    """
    from skimage.segmentation import expand_labels

    d = float(distance_px)
    if not np.isfinite(d) or d < 0:
        raise ValueError(f"distance_px: expected a finite distance >= 0, got {distance_px!r}")
    nuclei = np.asarray(nuclei)
    if d == 0 or not nuclei.any():
        return nuclei.astype(np.int32, copy=True)
    cells: np.ndarray = expand_labels(nuclei, distance=d)
    return cells.astype(np.int32, copy=False)


def model_cells(nuclei: np.ndarray, model: np.ndarray, distance_px: float) -> np.ndarray:
    """Cells of the nuclei from a model's own cell labels, bounded as an expansion is.

    Each nucleus is matched with the model cell that covers most of its pixels. Its cell
    is the part of its expansion region (:func:`expand_cells`: within `distance_px`,
    nearest to it) that lies in that model cell, plus the nucleus itself. A nucleus the
    model gives no cell keeps the whole expansion region; two nuclei in one model cell
    split it at their Voronoi boundary.

    Parameters
    ----------
    nuclei : (M, N) ndarray of int
        Nuclei labels, 0 = background.
    model : (M, N) ndarray of int
        The model's cell labels (any ids, 0 = background).
    distance_px : float
        Largest distance of a cell pixel from its nucleus.

    Returns
    -------
    (M, N) ndarray of int32
        Cells with the nuclei's ids; every nucleus lies inside its cell.

    Examples
    --------
    >>> nuc = np.zeros((1, 9), np.int32); nuc[0, 1] = 1; nuc[0, 6] = 2
    >>> mod = np.array([[5, 5, 5, 0, 0, 0, 7, 7, 7]])
    >>> model_cells(nuc, mod, 3).tolist()
    [[1, 1, 1, 0, 0, 0, 2, 2, 2]]
    """
    nuclei = np.asarray(nuclei)
    model = np.asarray(model).astype(np.int64, copy=False)
    if nuclei.shape != model.shape:
        raise ValueError(f"model: expected shape {nuclei.shape}, got {model.shape}")
    grown = expand_cells(nuclei, distance_px)
    top = int(max(nuclei.max(initial=0), 0))
    match = np.zeros(top + 1, np.int64)  # nucleus id -> its model cell (0: none)
    inside = (nuclei > 0) & (model > 0)
    if inside.any():
        base = int(model.max()) + 1
        pairs, counts = np.unique(
            nuclei[inside].astype(np.int64) * base + model[inside], return_counts=True
        )
        nucleus, cell = pairs // base, pairs % base
        order = np.lexsort((-counts, nucleus))  # per nucleus, the largest overlap first
        first = np.unique(nucleus[order], return_index=True)[1]
        match[nucleus[order][first]] = cell[order][first]
    own = match[np.clip(grown, 0, top)]
    keep = (grown > 0) & ((own == 0) | (model == own) | (nuclei > 0))
    return np.where(keep, grown, 0).astype(np.int32, copy=False)


def owned_cells(
    labels: np.ndarray,
    owned: np.ndarray,
    distance_px: float,
    model: np.ndarray | None = None,
) -> np.ndarray:
    """Cells of a tile's owned nuclei, grown among all the tile's nuclei.

    Neighbours the tile does not own still stop the growth, so a cell comes out the same
    whichever tile owns it (given an overlap of at least twice the distance beyond the
    nuclei's own).

    Parameters
    ----------
    labels : (M, N) ndarray of int
        All nuclei of the tile (any ids, <= 0 background).
    owned : (M, N) ndarray of int32
        The owned nuclei, renumbered (``owned_labels(labels, tile)``).
    distance_px : float
        Largest growth in pixels.
    model : (M, N) ndarray of int, optional
        A model's own cell labels: cells as :func:`model_cells` makes them.

    Returns
    -------
    (M, N) ndarray of int32
        Cells with the ids of `owned`, 0 elsewhere (including other nuclei's cells).
    """
    labels = np.asarray(labels)
    lab = np.where(labels > 0, labels, 0).astype(np.int64, copy=False)
    compact = _compact(lab)  # ids 1..K in the order of the labels, 0 stays 0
    if model is None:
        cells = expand_cells(compact, distance_px)
    else:
        cells = model_cells(compact, model, distance_px)
    lut = np.zeros(int(np.max(compact)) + 1, np.int32)
    where = owned > 0
    lut[compact[where]] = owned[where]
    relabelled: np.ndarray = lut[cells]
    return relabelled


def _compact(lab: np.ndarray) -> np.ndarray:
    """Return the labels of `lab` (>= 0) renumbered 1..K in their order; 0 stays 0.

    A table lookup when the ids are small (a segmenter's labels of one tile): a sort of
    every pixel (``np.unique``) took a quarter of the cell step's time.
    """
    top = int(lab.max(initial=0))
    if top <= 4 * lab.size + 1024:
        present = np.bincount(lab.ravel(), minlength=top + 1) > 0
        present[0] = False
        lut = np.zeros(top + 1, np.int32)
        lut[present] = np.arange(1, int(present.sum()) + 1, dtype=np.int32)
        compact: np.ndarray = lut[lab]
        return compact
    ids, inverse = np.unique(lab, return_inverse=True)
    compact = inverse.reshape(lab.shape).astype(np.int32)
    if ids.size and ids[0] != 0:
        compact += 1
    return compact


def compartment_means(
    nuclei: np.ndarray,
    cells: np.ndarray,
    ids: np.ndarray,
    values: np.ndarray,
    names: Sequence[str],
) -> dict[str, np.ndarray]:
    """Mean of each value channel on each compartment of each cell.

    Parameters
    ----------
    nuclei, cells : (M, N) ndarray of int
        Nuclei and their cells (same ids; a nucleus lies inside its cell).
    ids : (K,) ndarray of int
        The ids to report, in row order.
    values : (M, N, C) ndarray
        Intensities (channels) or stain optical densities.
    names : sequence of str
        One name per channel: columns are ``{name}_{compartment}_mean``.

    Returns
    -------
    dict of str to (K,) ndarray of float64
        ``{name}_nucleus_mean``, ``{name}_cytoplasm_mean``, ``{name}_cell_mean`` per
        channel (NaN for an empty compartment, e.g. a cell with no cytoplasm), and
        ``cell_area_px``, ``cytoplasm_area_px``.

    Examples
    --------
    >>> nuc = np.array([[1, 0, 0]]); cell = np.array([[1, 1, 0]])
    >>> m = compartment_means(nuc, cell, np.array([1]), np.array([[[2.0], [4.0], [9.0]]]), ["X"])
    >>> m["X_nucleus_mean"], m["X_cytoplasm_mean"], m["X_cell_mean"]
    (array([2.]), array([4.]), array([3.]))
    """
    values = np.asarray(values)
    if values.ndim != 3 or values.shape[:2] != nuclei.shape or values.shape[2] != len(names):
        raise ValueError(
            f"values: expected (M, N, {len(names)}) matching labels {nuclei.shape}, "
            f"got {values.shape}"
        )
    if cells.shape != nuclei.shape:
        raise ValueError(f"cells: expected shape {nuclei.shape}, got {cells.shape}")
    ids = np.asarray(ids, np.int64)
    n = int(max(int(ids.max(initial=0)), int(cells.max(initial=0)))) + 1
    cy, cx = np.nonzero(cells > 0)
    cid = cells[cy, cx].astype(np.intp)
    in_nucleus = nuclei[cy, cx] == cells[cy, cx]
    count_cell = np.bincount(cid, minlength=n).astype(np.float64)
    count_nuc = np.bincount(cid[in_nucleus], minlength=n).astype(np.float64)
    count_cyto = count_cell - count_nuc
    out: dict[str, np.ndarray] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, name in enumerate(names):
            v = values[cy, cx, k].astype(np.float64)
            s_cell = np.bincount(cid, v, minlength=n)
            s_nuc = np.bincount(cid[in_nucleus], v[in_nucleus], minlength=n)
            out[f"{name}_nucleus_mean"] = (s_nuc / count_nuc)[ids]
            out[f"{name}_cytoplasm_mean"] = ((s_cell - s_nuc) / count_cyto)[ids]
            out[f"{name}_cell_mean"] = (s_cell / count_cell)[ids]
    out["cell_area_px"] = count_cell[ids]
    out["cytoplasm_area_px"] = count_cyto[ids]
    return out
