"""InstanSeg's embedding clustering (brightfield model), run eagerly in torch and scipy.

The model's TorchScript ``forward`` turns the network's output into labels: seeds at the
local maxima of its seed map, a small MLP scoring each pixel of a 64 x 64 window around
each seed, flood fill and hole filling, then merging windows that overlap. Run as
TorchScript, the first call of each process costs 1.5-2.5 s of graph compilation on a CPU,
and its peak finding (an 11 x 11 max-pool with indices over the whole tile) is a third of
what is left. Here the same steps run eagerly, op for op as the model's code has them (the
same torch kernels, so the same floats), but for the peak finding (a separable
maximum filter, ties resolved as the max-pool resolves them) and the fills (scipy, as for
the TorchScript runtimes): the labels are identical (the model card's test tile, the 13
MoNuSeg images, tests/segmenters/test_instanseg.py).

Only the brightfield model's branch (nuclei only, no precomputed seeds) is written here; the
fluorescence model keeps the TorchScript.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Clustering", "peak_local_max"]


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


class Clustering:
    """The brightfield model's clustering, from its network's output to labels.

    Parameters
    ----------
    net : torch.jit.ScriptModule
        The loaded InstanSeg model (its thresholds and pixel classifier are read).
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
        pc = net.pixel_classifier
        self.layers = [(pc.fc1.weight, pc.fc1.bias), (pc.fc2.weight, pc.fc2.bias)]
        self.last = (pc.fc3.weight, pc.fc3.bias)
        self._flood_fill, self._fill_holes = flood_fill, fill_holes

    @staticmethod
    def supports(net: Any) -> bool:
        """Whether `net` is a model this clustering is written for (brightfield, nuclei)."""
        try:
            return (
                not bool(net.cells_and_nuclei)
                and int(net.dim_seeds) == 1
                and int(net.dim_coords) == 2
                and int(net.n_sigma) == 2
                and int(net.index_dtype) == 4  # int64
                and hasattr(net.pixel_classifier, "fc3")
            )
        except (AttributeError, RuntimeError):
            return False

    def __call__(self, x_full: Any, height: int, width: int) -> Any:
        """Labels (B, 1, height, width) float32 of the network's padded (B, 5, H', W') output."""
        import torch

        out = [self._one(x_full[i, :, :height, :width], torch) for i in range(x_full.shape[0])]
        return torch.stack([o[None] for o in out]).to(torch.float32)

    def _mlp(self, x: Any, torch: Any) -> Any:
        fn = torch.nn.functional
        for weight, bias in self.layers:
            x = fn.linear(x, weight, bias)
            if x.numel():
                x = torch.relu_(x)
        return fn.linear(x, *self.last)

    def _one(self, x6: Any, torch: Any) -> Any:  # noqa: PLR0915  # the model's own sequence
        dc = self.dim_coords
        h, w = int(x6.shape[1]), int(x6.shape[2])
        xx = torch.linspace(0, w * 64 / 256, w).view(1, 1, -1).expand(1, h, w)
        yy = torch.linspace(0, h * 64 / 256, h).view(1, -1, 1).expand(1, h, w)
        xxyy = torch.cat([xx, yy])
        fields = torch.mul(torch.sub(torch.sigmoid(x6[0:dc]), 0.5), 8)
        sigma = x6[dc : dc + self.n_sigma]
        mask_map = torch.add(torch.div(x6[-1], 15), 0.5)
        peaks = peak_local_max(mask_map.numpy(), self.peak_distance, self.seed_threshold)
        centroids_idx = torch.from_numpy(peaks)
        fields0 = torch.add(fields, xxyy)
        c = fields0[:, centroids_idx[:, 0], centroids_idx[:, 1]].T
        n = int(c.shape[0])
        if n == 0:
            return torch.zeros((h, w), dtype=torch.float32)
        ws = min(self.window_size, h, w)
        centroids = centroids_idx.clone()
        centroids[:, 0].clamp_(ws, h - ws)
        centroids[:, 1].clamp_(ws, w - ws)
        corners = torch.tensor([[-1, -1], [1, 1]], dtype=centroids.dtype) * ws
        window_slices = centroids[:, None] + corners
        size = 2 * ws
        grid = torch.meshgrid(
            [torch.arange(size, dtype=torch.int64), torch.arange(size, dtype=torch.int64)],
            indexing="ij",
        )
        mesh = torch.stack(list(grid)).expand(n, 2, size, size)
        flat = mesh.flatten(2).permute(1, 0, 2)
        flat = (flat + window_slices[:, 0].permute(1, 0)[:, :, None]).flatten(1)
        # feature_engineering_slow
        e, s = int(fields0.shape[0]), int(sigma.shape[0])
        x_slices = fields0[:, flat[0], flat[1]].reshape(e, n, size, size).permute(1, 0, 2, 3)
        sigma_slices = sigma[:, flat[0], flat[1]].reshape(s, n, size, size).permute(1, 0, 2, 3)
        diff = torch.sub(x_slices, c.reshape(-1, e, 1, 1))
        x14 = torch.cat([diff, sigma_slices], 1).flatten(2).permute(0, 2, 1)
        x7 = x14.reshape(x14.shape[0] * x14.shape[1], x14.shape[2])
        x9 = torch.sigmoid(self._mlp(x7, torch)).reshape(n, 1, size, size)
        thr = self.mask_threshold
        if self.cleanup:
            shifted = torch.sub(centroids_idx, window_slices[:, 0])
            seeds = torch.zeros_like(x9)
            seeds[:, 0][torch.arange(n), shifted[:, 0], shifted[:, 1]] = 1.0
            filled_np = self._flood_fill(torch.ge(x9, thr).numpy(), seeds.numpy()) > 0
            holes_np = self._fill_holes(filled_np) ^ filled_np
            x9[torch.from_numpy(~filled_np)] = 0.0
            x9[torch.from_numpy(holes_np)] = torch.tensor(thr, dtype=x9.dtype)
        top_left = window_slices[:, 0].numpy()
        labels = _labels(x9.numpy(), top_left, (h, w), thr, self.overlap_threshold)
        return torch.from_numpy(labels)


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
