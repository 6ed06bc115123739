"""InstanSeg's embedding clustering (brightfield model), in numpy and scipy (no torch).

The model's TorchScript ``forward`` turns the network's output into labels: seeds at the
local maxima of its seed map, a small MLP scoring each pixel of a 64 x 64 window around
each seed, flood fill and hole filling, then merging windows that overlap. Here the same
steps run in numpy, op for op as the model's code has them, in float32 (torch's
``linspace`` arithmetic reproduced; sigmoid and the MLP's matrix products by numpy's
kernels, which can round differently from torch's in the last bit), but for the peak
finding (a separable maximum filter, ties resolved as the max-pool resolves them) and the
fills (scipy). The labels are those of the model's own TorchScript clustering on the model
card's test tile, a CMU-1 region and the 13 MoNuSeg images (tests/segmenters/
test_instanseg.py, benchmarks/instanseg_torchfree.py): a pixel score rounding to the other
side of the mask threshold would be needed to tell them apart. That happens, rarely: on the
fluorescence model's 7 tiles of ``benchmarks/instanseg_fluorescence.py`` (its card tile, NDPI
and QPTIFF crops, nuclei and cells) one cell pixel of one QPTIFF crop scores 0.53000015 here
(3 float32 steps above the 0.53 threshold) but is background in torch's labels, all other
labels identical. The cause is not pinned down: numpy's sigmoid and classifier products
differ from torch's in the last bits, yet running torch's own sigmoid and classifier
(eager) inside this clustering leaves that pixel as it is; what remains is float32
arithmetic the TorchScript run does its own way. Bit-equality is not promised, only that.

Both published models' branches are written here (no precomputed seeds, no target
segmentation argument, one seed map as both have): the brightfield model's (nuclei) and the
fluorescence model's (nuclei from the first half of the network's channels, cells from the
second, then the model's ``resolve_cell_and_nucleus_boundaries``:
:func:`resolve_cell_and_nucleus_boundaries`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "Clustering",
    "fill_holes",
    "flood_fill",
    "peak_local_max",
    "resolve_cell_and_nucleus_boundaries",
]


def flood_fill(mask: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Run the model's ``flood_fill`` of (N, 1, H, W) windows in one pass of scipy.

    The model grows the seeds by one 3 x 3 step inside the mask until nothing changes,
    at most max(H, W) steps; a geodesic dilation by max(H, W) steps inside the mask is
    the same set (identical labels on the model card's test tile and the MoNuSeg images).
    """
    from scipy import ndimage as ndi

    inside = mask > 0
    steps = max(inside.shape[-2:])
    square = np.ones((1,) * (inside.ndim - 2) + (3, 3), bool)
    grown: np.ndarray = ndi.binary_dilation(seed > 0, square, iterations=steps, mask=inside)
    return grown & inside


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """Run the model's ``fill_holes``: the mask and what of the rest its outside cannot reach.

    Outside is what lies more than 3 steps (3 x 3) from the mask; it floods the rest of
    the window as the model's ``flood_fill`` does.
    """
    from scipy import ndimage as ndi

    inside = mask > 0
    square = np.ones((1,) * (inside.ndim - 2) + (3, 3), bool)
    near = ndi.binary_dilation(inside, square, iterations=3)
    return ~flood_fill(~inside, ~near)


def peak_local_max(image: np.ndarray, distance: int, threshold: float) -> np.ndarray:
    """Return the model's ``torch_peak_local_max`` seeds of a (H, W) float32 map, (N, 2) int64.

    A pixel is a seed when its value is above `threshold` and it is where torch's
    ``max_pool2d_with_indices`` (window ``2 * distance + 1``, padded) puts its window's
    maximum: the first pixel holding it, row by row. Rows then columns, in raster order.
    """
    from scipy import ndimage as ndi

    img = np.ascontiguousarray(image, dtype=np.float32)
    size = 2 * distance + 1
    top = ndi.maximum_filter(img, size=size, mode="constant", cval=-np.inf)
    ys, xs = np.nonzero((img == top) & (img > np.float32(threshold)))
    keep = np.ones(len(ys), bool)
    h, w = img.shape
    for k, (y, x) in enumerate(zip(ys.tolist(), xs.tolist(), strict=True)):
        y0, x0 = max(y - distance, 0), max(x - distance, 0)
        win = img[y0 : min(y + distance + 1, h), x0 : min(x + distance + 1, w)]
        ties = win == img[y, x]
        if ties.sum() > 1:  # the max-pool keeps the first of equal maxima, row by row
            ty, tx = np.unravel_index(int(np.argmax(ties)), ties.shape)
            keep[k] = (y0 + int(ty), x0 + int(tx)) == (y, x)
    return np.stack([ys[keep], xs[keep]], axis=1).astype(np.int64)


def _linspace(end: float, steps: int) -> np.ndarray:
    """``torch.linspace(0, end, steps)`` in float32, as torch's CPU kernel computes it.

    The step in float32, the first half counted up from 0, the second down from `end`.
    """
    f32 = np.float32
    if steps == 1:
        return np.zeros(1, f32)
    step = f32(end) / f32(steps - 1)
    idx = np.arange(steps)
    half = steps // 2
    out = np.empty(steps, f32)
    out[:half] = idx[:half].astype(f32) * step
    out[half:] = f32(end) - step * (steps - idx[half:] - 1).astype(f32)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float32, ``1 / (1 + exp(-x))`` as torch's CPU sigmoid."""
    one = np.float32(1.0)
    out: np.ndarray = one / (one + np.exp(-x, dtype=np.float32))
    return out


class Clustering:
    """An InstanSeg model's clustering, from its network's output to labels, in numpy.

    Parameters
    ----------
    net : ScriptObject
        The model's top module as :class:`~napari_slidescope.segmenters._torchscript.
        TorchScriptArchive` reads it (its thresholds and pixel classifier are used).
    flood_fill, fill_holes : callable
        The fills, on (N, 1, H, W) numpy masks (``instanseg._flood_fill``, ``_fill_holes``).
    """

    def __init__(self, net: Any, flood_fill: Any, fill_holes: Any) -> None:
        self.dim_coords = int(net.dim_coords)
        self.n_sigma = int(net.n_sigma)
        self.mask_threshold = float(net.default_mask_threshold)
        self.peak_distance = int(net.default_peak_distance)
        self.seed_threshold = float(net.default_seed_threshold)
        self.overlap_threshold = float(net.default_overlap_threshold)
        self.window_size = int(net.default_window_size)
        self.cleanup = bool(net.default_cleanup_fragments)
        self.cells_and_nuclei = bool(net.cells_and_nuclei)
        self.resolve = bool(net.default_resolve_cell_and_nucleus)
        pc = net.pixel_classifier

        def params(layer: Any) -> tuple[np.ndarray, np.ndarray]:
            weight = np.ascontiguousarray(layer.weight, np.float32)
            return weight, np.asarray(layer.bias, np.float32)[:, None]

        self.layers = [params(pc.fc1), params(pc.fc2)]
        self.last = params(pc.fc3)
        self._flood_fill, self._fill_holes = flood_fill, fill_holes

    @staticmethod
    def supports(net: Any) -> bool:
        """Whether `net` is a model this clustering is written for (either published one)."""
        try:
            return (
                int(net.dim_seeds) == 1
                and hasattr(net, "cells_and_nuclei")
                and hasattr(net, "default_resolve_cell_and_nucleus")
                and int(net.dim_coords) == 2
                and int(net.n_sigma) == 2
                and int(net.index_dtype) == 4  # int64
                and hasattr(net.pixel_classifier, "fc3")
            )
        except (AttributeError, RuntimeError):
            return False

    def __call__(self, x_full: np.ndarray, height: int, width: int) -> np.ndarray:
        """Labels (B, K, height, width) float32 of the network's padded (B, D, H', W') output.

        K = 1 (nuclei) for a nuclei model; K = 2 (nuclei, cells) for a cells-and-nuclei
        model, whose first D / 2 channels are the nuclei's and the others the cells'.
        """
        x_full = np.asarray(x_full, np.float32)
        out = []
        for i in range(x_full.shape[0]):
            image = x_full[i, :, :height, :width]
            if not self.cells_and_nuclei:
                out.append(self._one(image)[None])
                continue
            half = image.shape[0] // 2
            lab = np.stack([self._one(image[:half]), self._one(image[half:])])
            if self.resolve:
                lab = resolve_cell_and_nucleus_boundaries(lab)
            out.append(lab)
        return np.stack(out).astype(np.float32)

    def _mlp(self, x: np.ndarray) -> np.ndarray:
        """Score (F, M) features stored feature-major with the pixel classifier: (1, M).

        ``W @ x`` computes the same dot products as torch's ``x @ W.T``, as one wide
        matrix product instead of millions of rows of 4 (the layers are 4 -> 5 -> 5 -> 1).
        """
        for weight, bias in self.layers:
            x = weight @ x
            x += bias
            np.maximum(x, 0, out=x)
        weight, bias = self.last
        out: np.ndarray = weight @ x
        out += bias
        return out

    def _one(self, x6: np.ndarray) -> np.ndarray:
        dc = self.dim_coords
        f32 = np.float32
        h, w = int(x6.shape[1]), int(x6.shape[2])
        xx = np.broadcast_to(_linspace(w * 64 / 256, w)[None, None, :], (1, h, w))
        yy = np.broadcast_to(_linspace(h * 64 / 256, h)[None, :, None], (1, h, w))
        xxyy = np.concatenate([xx, yy])
        fields = (_sigmoid(x6[0:dc]) - f32(0.5)) * f32(8)
        sigma = x6[dc : dc + self.n_sigma]
        mask_map = x6[-1] / f32(15) + f32(0.5)  # one seed map (dim_seeds 1: both models)
        centroids_idx = peak_local_max(mask_map, self.peak_distance, self.seed_threshold)
        fields0 = fields + xxyy
        c = fields0[:, centroids_idx[:, 0], centroids_idx[:, 1]].T
        n = int(c.shape[0])
        if n == 0:
            return np.zeros((h, w), np.float32)
        ws = min(self.window_size, h, w)
        centroids = centroids_idx.copy()
        centroids[:, 0] = np.clip(centroids[:, 0], ws, h - ws)
        centroids[:, 1] = np.clip(centroids[:, 1], ws, w - ws)
        top_left = centroids - ws
        size = 2 * ws
        rows = (top_left[:, 0, None] + np.arange(size))[:, :, None]  # (n, size, 1)
        cols = (top_left[:, 1, None] + np.arange(size))[:, None, :]  # (n, 1, size)
        # feature_engineering_slow: per window, field minus its seed's, then sigma
        x_slices = fields0[:, rows, cols]  # (E, n, size, size)
        sigma_slices = sigma[:, rows, cols]
        diff = x_slices - c.T[:, :, None, None]
        x14 = np.concatenate([diff, sigma_slices], 0)  # (E + S, n, size, size)
        x9 = _sigmoid(self._mlp(x14.reshape(x14.shape[0], -1))).reshape(n, 1, size, size)
        thr = self.mask_threshold
        if self.cleanup:
            shifted = centroids_idx - top_left
            seeds = np.zeros(x9.shape, bool)
            seeds[np.arange(n), 0, shifted[:, 0], shifted[:, 1]] = True
            filled = self._flood_fill(x9 >= f32(thr), seeds) > 0
            holes = self._fill_holes(filled) ^ filled
            x9[~filled] = 0.0
            x9[holes] = f32(thr)
        return _labels(x9, top_left, (h, w), thr, self.overlap_threshold)


def _labels(
    prob: np.ndarray,
    top_left: np.ndarray,
    shape: tuple[int, int],
    threshold: float,
    overlap_threshold: float,
) -> np.ndarray:
    """Run the model's ``convert``, overlap matrix, connected components and remapping.

    Each pixel goes to the window scoring it highest (ties: the first window), then
    windows whose foregrounds overlap by more than `overlap_threshold` of the smaller one
    are merged under the lowest window number, as the model's (float32) arithmetic has it.

    Parameters
    ----------
    prob : (N, 1, S, S) ndarray of float32
        Each window's cleaned-up pixel scores.
    top_left : (N, 2) ndarray of int64
        Each window's first row and column in the tile.
    shape : (int, int)
        The tile's (H, W).

    Returns
    -------
    (H, W) ndarray of float32
        Labels, 0 background (not consecutive, as the model's).
    """
    from scipy import sparse

    n, size = prob.shape[0], prob.shape[-1]
    h, w = shape
    k, p = np.nonzero(prob.reshape(n, size * size) >= np.float32(threshold))
    score = prob.reshape(n, size * size)[k, p]
    rows = top_left[k, 0] + p // size
    cols = top_left[k, 1] + p % size
    pos = rows * w + cols
    # convert: sorted by position, then score (descending), then window; first of each
    order = np.lexsort((np.arange(len(k)), -score, pos))
    first = np.ones(len(order), bool)
    first[1:] = pos[order][1:] != pos[order][:-1]
    win = order[first]
    out = np.zeros((h, w), np.float32)
    out[rows[win], cols[win]] = (k[win] + 1).astype(np.float32)
    # overlap over the smaller foreground (float32 counts, as the model's sparse product)
    onehot = sparse.csr_matrix((np.ones(len(k), np.float32), (k, pos)), shape=(n, h * w))
    inter = (onehot @ onehot.T).toarray()
    area = np.bincount(k, minlength=n).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = inter / np.minimum(area[:, None], area[None, :])
    row, col = np.nonzero((overlap > np.float32(overlap_threshold)) | np.eye(n, dtype=bool))
    # find_connected_components: every node takes its neighbours' lowest label, at most
    # 100 rounds, all at once
    label = np.arange(1, n + 1, dtype=np.float64)
    for _ in range(100):
        low = np.full(n, np.inf)
        np.minimum.at(low, row, label[col])
        new = np.minimum(label, low)
        if np.array_equal(new, label):
            break
        label = new
    table = np.concatenate([[0.0], label]).astype(np.float32)
    labels: np.ndarray = table[out.astype(np.int64)]
    return labels


# -- the fluorescence model's reconciliation of nuclei and cells ---------------------------------


def _fastremap(x: np.ndarray) -> np.ndarray:
    """Replace each value by its rank among the values (the model's ``torch_fastremap``).

    0 stays 0 where the array holds a 0 (labels numbered 1..n by size of value).
    """
    if x.max() == 0:
        return x
    unique, inverse = np.unique(x, return_inverse=True)
    out: np.ndarray = np.arange(len(unique), dtype=x.dtype)[inverse.reshape(x.shape)]
    return out


def _remap_values(keys: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Look each value of `x` up among `keys` (the model's ``remap_values``: bucketize).

    A value not among the keys gets the next larger key's value, as ``torch.bucketize``
    (left) finds it; of equal keys the first after a stable sort.
    """
    order = np.argsort(keys, kind="stable")
    index = np.searchsorted(keys[order], x.ravel(), side="left")
    out: np.ndarray = values[order][index].reshape(x.shape)
    return out


def _over_nucleus_area(nuclei: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (nN, nC) overlaps and (nN, 1) areas (``get_intersection_over_nucleus_area``).

    Each nucleus's overlap with each cell over the nucleus's area, in float32 (counts are
    exact, so the division is torch's), nuclei and cells numbered as :func:`_fastremap`.
    """
    from scipy import sparse

    nuclei, cells = _fastremap(nuclei), _fastremap(cells)
    n_nuc, n_cell = int(nuclei.max()), int(cells.max())
    nuc, cel = nuclei.ravel().astype(np.int64), cells.ravel().astype(np.int64)
    both = (nuc > 0) & (cel > 0)
    inter = sparse.coo_matrix(
        (np.ones(int(both.sum()), np.float32), (nuc[both] - 1, cel[both] - 1)),
        shape=(n_nuc, n_cell),
    ).toarray()
    area = np.bincount(nuc, minlength=n_nuc + 1)[1:].astype(np.float32)[:, None]
    return (inter / area).astype(np.float32), area


def _keep_largest_nucleus_per_cell(lab: np.ndarray) -> np.ndarray:
    """Keep the largest nucleus per cell, (2, H, W) (``keep_only_largest_nucleus_per_cell``).

    Keeps each nucleus that is the largest of those lying (more than half) in its cell, and
    each cell holding (more than half of) a nucleus; all renumbered together first.
    """
    lab = _fastremap(lab)
    iou, area = _over_nucleus_area(lab[0], lab[1])
    inside = (iou > np.float32(0.5)).astype(np.float32)
    weighted = inside * area
    biggest = (weighted == weighted.max(axis=0)).astype(np.float32) * iou > np.float32(0.5)
    nuclei_ids = np.unique(lab[0][lab[0] > 0])
    cell_ids = np.unique(lab[1][lab[1] > 0])
    largest = biggest.sum(axis=1) == 1
    nucleated = inside.sum(axis=0) >= 1
    return np.stack(
        [
            lab[0] * np.isin(lab[0], nuclei_ids[largest]),
            lab[1] * np.isin(lab[1], cell_ids[nucleated]),
        ]
    )


def _each(lab: np.ndarray) -> np.ndarray:
    """Renumber nuclei and cells each on its own (:func:`_fastremap`)."""
    return np.stack([_fastremap(lab[0]), _fastremap(lab[1])])


def resolve_cell_and_nucleus_boundaries(lab: np.ndarray) -> np.ndarray:
    """Reconcile nuclei and cells as the model's ``resolve_cell_and_nucleus_boundaries``.

    Each cell keeps its largest nucleus and takes its number; the nuclei left over are
    numbered after the kept ones, their pixels taken from the cells; pixels of the model's
    cells that no kept cell covers become cells of their own (numbered after the others),
    as the model's TorchScript does it, step for step.

    Parameters
    ----------
    lab : (2, H, W) ndarray of float32
        Nuclei and cells as the clustering labels them.

    Returns
    -------
    (2, H, W) ndarray of float32
        Nuclei and cells, each cell numbered as its nucleus.
    """
    nuclei, cells = lab[0], lab[1]
    if nuclei.max() == 0:
        return np.zeros_like(lab) if cells.max() == 0 else lab
    if cells.max() == 0:
        return np.stack([nuclei, nuclei])
    lab0 = _each(lab)
    original_nuclei, original_cells = lab0[0].copy(), lab0[1].copy()
    lab2 = _each(_keep_largest_nucleus_per_cell(lab0))
    if lab2[0].max() == 0:
        return np.zeros_like(lab2) if lab2[1].max() == 0 else lab2
    if lab2[1].max() == 0:
        return np.stack([lab2[0], lab2[0]])
    iou, _ = _over_nucleus_area(lab2[0], lab2[1])
    nucleus, cell = np.nonzero(iou > np.float32(0.5))
    keys = np.concatenate([[0.0], cell + 1]).astype(np.float32)
    values = np.concatenate([[0.0], nucleus + 1]).astype(np.float32)
    nuclei_labels = lab2[0]
    cell_labels = _remap_values(keys, values, lab2[1]).astype(np.int32).astype(np.float32)
    original_nuclei[nuclei_labels > 0] = 0
    leftover = _fastremap(original_nuclei)
    leftover[leftover > 0] += nuclei_labels.max()
    nuclei_labels = nuclei_labels + leftover
    cell_labels[nuclei_labels > 0] = 0
    cell_labels = cell_labels + nuclei_labels
    empty = cell_labels == 0
    top = cell_labels.max()
    cell_labels[empty] = (original_cells[empty] + top) * (original_cells[empty] > 0)
    return np.stack([nuclei_labels, cell_labels]).astype(np.float32)
