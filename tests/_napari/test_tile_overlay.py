"""Tiles drawn over their slide, coloured by a column, PCs or k-means (run under xvfb-run)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import open_slide
from napari_slidescope._napari.tiles import add_tile_overlay, tile_values
from napari_slidescope.tiles import tile_slide

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def tiled(tmp_path_factory):
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("overlay") / "s.svs"
    write_sample_slide(path, shape=(1024, 1536), mpp=0.5, seed=2, tile=128)
    with open_slide(path) as slide:
        tiles = tile_slide(slide, tile_um=64, mpp=1.0, min_tissue_fraction=0.1)
    return path, tiles


def _embeddings(tiles, groups=3):
    """Features with `groups` well-separated clusters by grid column."""
    rng = np.random.default_rng(0)
    group = tiles["grid_col"] % groups
    centres = rng.normal(scale=20, size=(groups, 16))
    return centres[group] + rng.normal(scale=0.1, size=(len(tiles), 16)), group


def test_overlay_lies_exactly_over_the_slide(make_napari_viewer, tiled):
    path, tiles = tiled
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    layer = add_tile_overlay(viewer, tiles)
    assert layer.name == "tiles: tissue_fraction"
    rows, cols = tiles.grid_shape
    assert layer.data.shape == (rows, cols, 4)
    # a tile's cell centre in world coordinates is its footprint's centre in µm on the slide
    i = len(tiles) // 2
    r, c = int(tiles["grid_row"][i]), int(tiles["grid_col"][i])
    world = np.asarray(layer.data_to_world((r, c)))
    centre_px = np.array([tiles["y_um"][i] + 32, tiles["x_um"][i] + 32]) / 0.5  # level-0 px
    expected = np.asarray(image.data_to_world(centre_px - 0.5))
    np.testing.assert_allclose(world, expected, atol=1e-6)
    # empty cells (tiles dropped as glass) are transparent, kept ones opaque
    alpha = layer.data[..., 3]
    assert alpha.sum() == len(tiles)
    assert alpha[tiles["grid_row"], tiles["grid_col"]].all()


def test_kmeans_clusters_are_labels_that_follow_the_groups(make_napari_viewer, tiled):
    _, tiles = tiled
    X, group = _embeddings(tiles)
    viewer = make_napari_viewer()
    layer = add_tile_overlay(viewer, tiles, X, color_by="kmeans", n_clusters=3)
    assert type(layer).__name__ == "Labels"
    labels = layer.data[tiles["grid_row"], tiles["grid_col"]]
    assert labels.min() >= 1 and (layer.data > 0).sum() == len(tiles)
    # one cluster per group: the partition equals the grid-column groups
    pairs = set(zip(labels.tolist(), group.tolist(), strict=True))
    assert len(pairs) == 3 == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def test_pcs_and_features_of_an_anndata(make_napari_viewer, tiled):
    anndata = pytest.importorskip("anndata")
    _, tiles = tiled
    X, group = _embeddings(tiles)
    adata = anndata.AnnData(X=X.astype(np.float32))
    adata.var_names = [f"feature_{j}" for j in range(16)]
    kind, rgb = tile_values(tiles, adata)
    assert kind == "rgb" and rgb.shape == (len(tiles), 3)
    # tiles of one group get (nearly) one colour, tiles of different groups differ
    means = np.array([rgb[group == g].mean(0) for g in range(3)])
    spread = max(np.abs(rgb[group == g] - means[g]).max() for g in range(3))
    assert spread < 0.1 < np.abs(means[0] - means[1]).max()
    kind, f3 = tile_values(tiles, adata, color_by="feature_3")
    np.testing.assert_allclose(f3, X[:, 3].astype(np.float32))
    viewer = make_napari_viewer()
    layer = add_tile_overlay(viewer, tiles, adata, color_by="pc1", name="pc1")
    assert layer.name == "pc1" and layer.metadata["kind"] == "scalar"
    with pytest.raises(ValueError, match="no tile column"):
        tile_values(tiles, "nope")
    with pytest.raises(ValueError, match="values for"):
        tile_values(tiles, np.zeros(3))
