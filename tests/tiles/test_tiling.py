"""tile_slide: the grid at a stated µm/px, tissue gating, ids, tables and files."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_slidescope import open_slide
from napari_slidescope.tiles import TileTable, read_tile, tile_slide


def test_grid_covers_the_slide_at_the_requested_size(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
    # 2048 x 2560 px at 0.25 µm/px = 512 x 640 µm; 56 µm tiles: 10 x 12 (the last hangs over)
    assert tiles.tile_px == 112
    assert tiles.grid_shape == (10, 12)
    assert len(tiles) == 120
    assert np.isnan(tiles["tissue_fraction"]).all()
    assert tiles["id"].tolist() == list(range(120))
    row = tiles.row(13)  # grid (1, 1)
    assert (row["grid_row"], row["grid_col"]) == (1, 1)
    assert (row["y_um"], row["x_um"]) == (56.0, 56.0)
    assert (row["row0"], row["col0"], row["row1"], row["col1"]) == (224, 224, 448, 448)
    assert row["level"] == 0 and row["mpp"] == 0.5


def test_tissue_gating_drops_glass_and_keeps_ids(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        every = tile_slide(slide, tile_um=56, mpp=0.5, tissue=None)
        gated = tile_slide(slide, tile_um=56, mpp=0.5, min_tissue_fraction=0.5)
        loose = tile_slide(slide, tile_um=56, mpp=0.5, min_tissue_fraction=0.0)
    assert 0 < len(gated) < len(loose) < len(every)
    assert (gated["tissue_fraction"] >= 0.5).all()
    assert (loose["tissue_fraction"] > 0).all()
    # same grid: a kept tile has the id and box it has in the full grid
    assert set(gated["id"]) <= set(loose["id"])
    full = every.to_pandas().set_index("id")
    kept = gated.to_pandas().set_index("id")
    for col in ("row0", "col0", "row1", "col1", "y_um", "x_um"):
        assert (full.loc[kept.index, col] == kept[col]).all()
    assert "detect_tissue" in gated.parameters["tissue"]


def test_same_slide_and_parameters_give_the_same_table(tile_slide_path):
    with open_slide(tile_slide_path) as a, open_slide(tile_slide_path) as b:
        ta = tile_slide(a, tile_um=64, mpp=0.5, overlap_um=8)
        tb = tile_slide(b, tile_um=64, mpp=0.5, overlap_um=8)
    for k in ta.columns:
        np.testing.assert_array_equal(ta[k], tb[k])
    assert ta.stride_px == 128 - 16


def test_level_is_the_coarsest_not_coarser(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        assert slide.downsamples[1] == (4.0, 4.0)
        t1 = tile_slide(slide, tile_um=64, mpp=1.0, tissue=None)
        t2 = tile_slide(slide, tile_um=64, mpp=0.9, tissue=None)
        assert set(t1["level"]) == {1} and set(t1["downsample"]) == {4.0}
        assert set(t2["level"]) == {0}
        # at level 1's own pixel size a tile is a plain crop of that level
        r = t1.row(5)
        crop = slide.read_level(
            1, (r["row0"] // 4, r["col0"] // 4, r["row0"] // 4 + 64, r["col0"] // 4 + 64)
        )
        np.testing.assert_array_equal(read_tile(slide, t1, 5), crop)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::napari_slidescope.SlidescopeWarning")
def test_uncalibrated_slide_is_refused_unless_stated(tmp_path):
    path = tmp_path / "plain.tif"
    rng = np.random.default_rng(0)
    tifffile.imwrite(path, rng.integers(0, 255, (512, 512, 3), np.uint8), tile=(128, 128))
    with open_slide(path) as slide:
        assert slide.mpp is None
        with pytest.raises(ValueError, match=r"plain\.tif.*no pixel size.*slide_mpp"):
            tile_slide(slide, tile_um=64, mpp=0.5, tissue=None)
        tiles = tile_slide(slide, tile_um=64, mpp=0.5, tissue=None, slide_mpp=0.25)
        assert tiles.slide_mpp == (0.25, 0.25)
        assert tiles.parameters["slide_mpp_stated"] is True
        assert read_tile(slide, tiles, 0).shape == (128, 128, 3)


def test_bad_arguments_say_what_is_wrong(tile_slide_path):
    with open_slide(tile_slide_path) as slide:
        with pytest.raises(ValueError, match="overlap_um"):
            tile_slide(slide, tile_um=64, mpp=0.5, overlap_um=64, tissue=None)
        with pytest.raises(ValueError, match="mpp must be positive|positive"):
            tile_slide(slide, tile_um=64, mpp=0, tissue=None)
        with pytest.raises(ValueError, match="tissue"):
            tile_slide(slide, tile_um=64, mpp=0.5, tissue="yes")


def test_geoparquet_round_trip_and_footprints(tile_slide_path, tmp_path):
    shapely = pytest.importorskip("shapely")
    pq = pytest.importorskip("pyarrow.parquet")
    with open_slide(tile_slide_path) as slide:
        tiles = tile_slide(slide, tile_um=60, mpp=0.6)
    out = tiles.to_geoparquet(tmp_path / "tiles.parquet")
    back = TileTable.from_geoparquet(out)
    for k in tiles.columns:
        np.testing.assert_array_equal(back[k], tiles[k])
    assert back.metadata() == tiles.metadata()
    table = pq.read_table(out)
    assert b"geo" in table.schema.metadata
    poly = shapely.from_wkb(table["geometry"][0].as_py())
    # a 60 µm square in level-0 pixels of 0.25 µm: 240 x 240, at the tile's exact place
    assert poly.area == pytest.approx(240 * 240)
    x0, y0, _, _ = poly.bounds
    assert (y0, x0) == (tiles["y_um"][0] / 0.25, tiles["x_um"][0] / 0.25)
    shapes = tiles.to_spatialdata_shapes()
    assert len(shapes["polygons"]) == len(tiles)
    np.testing.assert_array_equal(shapes["ids"], tiles["id"])
