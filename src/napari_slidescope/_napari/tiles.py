"""A tile table drawn over its slide, coloured by what a model (or a column) says of each tile.

One cell per tile, the size of the grid's stride (a tile's core when tiles overlap), drawn as
a raster exactly over the slide's image layer (:func:`~._napari.layers.aligned_transform`):
an RGBA Image for continuous values (a per-tile feature or column through a colormap, or
the first three principal components of the embeddings as red, green, blue) and a Labels
layer for k-means clusters (cluster k is label k + 1; cells without a tile are 0, empty).
A raster, not thousands of Shapes (napari slows down past a few thousand polygons).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope._napari.layers import aligned_transform
from napari_slidescope.tiles.tiling import TileTable

__all__ = ["COLOR_BY", "add_tile_overlay", "tile_values"]

#: What an overlay can show of embeddings.
COLOR_BY = ("pca", "pc1", "pc2", "pc3", "kmeans")


def _matrix(values: Any) -> tuple[np.ndarray, Any]:
    """Return ``(X, obs)``: the features of an AnnData (its obs too) or an array."""
    if hasattr(values, "obs") and hasattr(values, "X"):
        return np.asarray(values.X, dtype=np.float64), values.obs
    return np.asarray(values, dtype=np.float64), None


def tile_values(
    tiles: TileTable,
    values: Any = None,
    *,
    color_by: str | None = None,
    n_clusters: int = 8,
    seed: int = 0,
) -> tuple[str, np.ndarray]:
    """Return what to draw per tile: ``("scalar" | "rgb" | "labels", values)``.

    ``"scalar"``: (K,) values; ``"rgb"``: (K, 3) in 0..1; ``"labels"``: (K,) clusters.

    Parameters
    ----------
    tiles : TileTable
        The tiles.
    values : None, str, (K,) or (K, D) array_like, or AnnData
        None: the tissue fraction; a column of `tiles` (or of an AnnData's ``obs``); one
        value per tile; or embeddings (tiles x features, an AnnData from
        :func:`~napari_slidescope.tiles.embed.embed_tiles`).
    color_by : {"pca", "pc1", "pc2", "pc3", "kmeans"} or str, optional
        For embeddings: the first three principal components as RGB (default), one
        component, or k-means clusters (scikit-learn). With an AnnData, an ``obs``
        column name or ``var`` name (a feature) is accepted too.
    n_clusters, seed : int
        k-means' clusters and random state.
    """
    if values is None:
        values = "tissue_fraction" if color_by is None else color_by
    if isinstance(values, str):
        if values not in tiles.columns:
            raise ValueError(f"no tile column {values!r} (columns: {', '.join(tiles.columns)})")
        return "scalar", np.asarray(tiles[values], dtype=np.float64)
    X, obs = _matrix(values)
    if obs is not None and color_by is not None and color_by not in COLOR_BY:
        if color_by in obs.columns:
            return "scalar", np.asarray(obs[color_by], dtype=np.float64)
        names = list(values.var_names)
        if color_by not in names:
            raise ValueError(f"color_by={color_by!r} is neither a column of obs nor a feature")
        return "scalar", X[:, names.index(color_by)]
    if len(X) != len(tiles):
        raise ValueError(f"{len(X)} values for {len(tiles)} tiles")
    if X.ndim == 1:
        return "scalar", X
    mode = color_by or "pca"
    if mode not in COLOR_BY:
        raise ValueError(f"color_by: expected one of {COLOR_BY} for embeddings, got {mode!r}")
    try:
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA
    except ImportError as e:
        raise ImportError(
            "colouring tiles by embeddings needs scikit-learn: "
            'pip install "napari-slidescope[classify]"'
        ) from e
    if mode == "kmeans":
        k = min(n_clusters, len(X))
        labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(X)
        return "labels", labels.astype(np.int64)
    n = min(3, X.shape[1], len(X))
    pcs = PCA(n_components=n, random_state=seed).fit_transform(X)
    if mode != "pca":
        j = int(mode[2:]) - 1
        if j >= n:
            raise ValueError(f"color_by={mode!r}: the embeddings give {n} components")
        return "scalar", pcs[:, j]
    # one scale for all components (the first's 1-99 % span), so a component that is
    # only noise stays near grey instead of being stretched to the full range
    lo, hi = np.percentile(pcs, [1, 99], axis=0)
    span = float(np.max(hi - lo)) or 1.0
    rgb = np.clip(0.5 + (pcs - np.median(pcs, axis=0)) / span, 0, 1)
    if n < 3:
        rgb = np.concatenate([rgb, np.zeros((len(rgb), 3 - n))], axis=1)
    return "rgb", rgb


def add_tile_overlay(
    viewer: Any,
    tiles: TileTable,
    values: Any = None,
    *,
    color_by: str | None = None,
    image_layer: Any = None,
    name: str | None = None,
    colormap: str = "viridis",
    opacity: float = 0.6,
    n_clusters: int = 8,
) -> Any:
    """Draw `tiles` over the slide in `viewer`, coloured by `values` (see :func:`tile_values`).

    Parameters
    ----------
    viewer : napari.Viewer
        The viewer showing the slide.
    tiles : TileTable
        The tiles (from :func:`~napari_slidescope.tiles.tiling.tile_slide`).
    values, color_by, n_clusters
        What colours each tile: see :func:`tile_values` (principal components share one
        scale, centred on grey).
    image_layer : napari.layers.Image, optional
        The slide's layer to align with (default: the first image layer; without one,
        the slide's µm scale is assumed, as the plugin's reader sets it).
    name : str, optional
        Layer name (default: ``"tiles: <what>"``).
    colormap : str
        Colormap of scalar values.
    opacity : float
        Layer opacity.

    Returns
    -------
    napari.layers.Image or napari.layers.Labels
        The overlay; its ``metadata["tile_values"]`` holds the per-tile values drawn and
        ``metadata["tile_ids"]`` the ids, in table order.
    """
    from napari.utils.colormaps import ensure_colormap

    kind, per_tile = tile_values(tiles, values, color_by=color_by, n_clusters=n_clusters)
    rows, cols = tiles.grid_shape
    gr, gc = tiles["grid_row"], tiles["grid_col"]
    if image_layer is None:
        images = [lay for lay in viewer.layers if type(lay).__name__ == "Image"]
        image_layer = images[0] if images else None
    stride0 = tuple(tiles.stride_px * tiles.mpp / m for m in tiles.slide_mpp)
    if image_layer is not None:
        scale, translate = aligned_transform(image_layer, (0.0, 0.0), stride0)
    else:
        s = np.asarray(tiles.slide_mpp)
        d = np.asarray(stride0)
        scale, translate = tuple(s * d), tuple(s * (d / 2 - 0.5))
    what = (
        color_by or (values if isinstance(values, str) else None) or
        ("tissue_fraction" if values is None else "pca" if kind == "rgb" else "values")
    )  # fmt: skip
    label = name or f"tiles: {what}"
    meta = {"tile_values": per_tile, "tile_ids": tiles["id"].copy(), "kind": kind}
    if kind == "labels":
        grid = np.zeros((rows, cols), np.int32)
        grid[gr, gc] = per_tile + 1
        return viewer.add_labels(
            grid, name=label, scale=scale, translate=translate, opacity=opacity, metadata=meta
        )
    rgba = np.zeros((rows, cols, 4), np.float32)
    if kind == "rgb":
        rgba[gr, gc, :3] = per_tile
    else:
        finite = np.isfinite(per_tile)
        lo, hi = (np.nanmin(per_tile), np.nanmax(per_tile)) if finite.any() else (0.0, 1.0)
        norm = np.where(finite, (per_tile - lo) / (hi - lo if hi > lo else 1.0), 0.0)
        rgba[gr, gc, :3] = ensure_colormap(colormap).map(norm)[:, :3]
        meta["range"] = (float(lo), float(hi))
    rgba[gr, gc, 3] = 1.0
    return viewer.add_image(
        rgba, name=label, rgb=True, scale=scale, translate=translate, opacity=opacity,
        metadata=meta,
    )  # fmt: skip
