"""The batch's whole-slide label image: OME-NGFF labels whose ids are nuclei.parquet's."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr

from napari_slidescope import analyze_slides
from napari_slidescope.batch import outputs
from napari_slidescope.batch.label_image import (
    label_image_path,
    parquet_label_pyramid,
    write_label_image,
)
from napari_slidescope.batch.tasks import TileOut, wkb_polygon
from napari_slidescope.pipeline.label_pyramid import LabelPyramid
from napari_slidescope.slide._ngff import ngff_metadata


def _square(y, x, s):
    return np.array([[y, x], [y, x + s], [y + s, x + s], [y + s, x]], float)


def test_label_image_from_parts_numbers_ids_as_the_parquet(tmp_path):
    """Tile 5 then tile 2 (plan order): tile 2's local ids follow tile 5's nuclei."""
    rings = {5: [_square(10, 10, 4), _square(30, 40, 6)], 2: [_square(100, 200, 5)]}
    for index, rs in rings.items():
        table = {"id": np.arange(1, len(rs) + 1), "area_um2": np.ones(len(rs))}
        outputs.write_part(tmp_path, TileOut(index, 0.1, table, [wkb_polygon(r) for r in rs]), "d")
    store = write_label_image(tmp_path, [5, 2], shape0=(300, 500), mpp=(0.5, 0.5))
    assert store == tmp_path / "labels.zarr"
    assert not list(tmp_path.glob(".labels.zarr*"))  # the temporary folder was renamed
    root = zarr.open_group(store=str(store / "labels"), mode="r")
    assert dict(root.attrs)["labels"] == ["nuclei"]
    pyr = LabelPyramid.open(label_image_path(tmp_path))
    lv = np.asarray(pyr.levels[0])
    expected = np.zeros_like(lv)
    expected[10:14, 10:14] = 1
    expected[30:36, 40:46] = 2
    expected[100:105, 200:205] = 3
    np.testing.assert_array_equal(lv, expected)
    meta, version = ngff_metadata(dict(zarr.open_group(store=str(pyr.path), mode="r").attrs))
    assert version == "0.4"
    assert meta["multiscales"][0]["axes"][0]["unit"] == "micrometer"


def test_parquet_label_pyramid_paints_what_the_batch_wrote(tmp_path, client, slides):
    out = tmp_path / "out"
    analyze_slides(slides / "a.svs", out, tile_size_um=128.0, client=client, segmenter="builtin")
    folder = out / "a.svs"
    table = pq.read_table(folder / "nuclei.parquet")
    ids = table.column("id").to_numpy()
    assert ids.size > 50
    written = LabelPyramid.open(label_image_path(folder))
    level0 = np.asarray(written.levels[0])
    assert set(np.unique(level0)) - {0} == set(ids.tolist())
    # the label at a nucleus's bounding-box centre is that nucleus (convex blobs: nearly all)
    r = (table.column("bbox_row0").to_numpy() + table.column("bbox_row1").to_numpy()) / 2
    c = (table.column("bbox_col0").to_numpy() + table.column("bbox_col1").to_numpy()) / 2
    assert np.mean(level0[r.astype(int), c.astype(int)] == ids) > 0.95
    # results without a label image: the same image painted from the GeoParquet alone
    again = parquet_label_pyramid(folder / "nuclei.parquet", level0.shape)
    h, w = level0.shape
    np.testing.assert_array_equal(np.asarray(again.levels[0])[:h, :w], level0)
    assert not (folder / "parts").exists()


def test_label_image_in_zarr_format_3(tmp_path):
    from napari_slidescope.pipeline.label_pyramid import zarr_major

    if zarr_major() < 3:
        pytest.skip("zarr format 3 needs zarr >= 3")
    tile = TileOut(0, 0.1, {"id": np.array([1])}, [wkb_polygon(_square(3, 3, 3))])
    outputs.write_part(tmp_path, tile, "d")
    write_label_image(tmp_path, [0], shape0=(64, 64), mpp=None, zarr_format=3)
    attrs = dict(zarr.open_group(store=str(tmp_path / "labels.zarr" / "labels"), mode="r").attrs)
    assert attrs["ome"]["labels"] == ["nuclei"]
    assert LabelPyramid.open(label_image_path(tmp_path)).levels[0][4, 4] == 1


def test_cells_get_their_own_label_image(tmp_path):
    nucleus, cell = _square(10, 10, 4), _square(8, 8, 8)
    tile = TileOut(0, 0.1, {"id": np.array([1])}, [wkb_polygon(nucleus)], [wkb_polygon(cell)])
    outputs.write_part(tmp_path, tile, "d")
    write_label_image(tmp_path, [0], shape0=(64, 64), mpp=(0.5, 0.5))
    labels = zarr.open_group(store=str(tmp_path / "labels.zarr" / "labels"), mode="r")
    assert dict(labels.attrs)["labels"] == ["nuclei", "cells"]
    cells = np.asarray(LabelPyramid.open(label_image_path(tmp_path, "cells")).levels[0])
    nuclei = np.asarray(LabelPyramid.open(label_image_path(tmp_path)).levels[0])
    assert (cells == 1).sum() == 64
    assert (nuclei == 1).sum() == 16
