"""A `slidescope batch` result folder opens as tissue and nuclei aligned with its slide."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from napari_slidescope._napari.reader import get_reader


@pytest.fixture(scope="module")
def batch_folder(small_slide, tmp_path_factory):
    from distributed import Client

    from napari_slidescope import analyze_slides

    out = tmp_path_factory.mktemp("batch")
    with Client(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as client:
        rows = analyze_slides(
            small_slide, out, segmenter="builtin", tile_size_um=128.0, client=client
        )
    assert rows[0]["status"] == "done"
    assert rows[0]["nuclei"] > 0
    return out / small_slide.name


def _centroids(folder):
    table = pq.read_table(folder / "nuclei.parquet")
    ids = table.column("id").to_numpy()
    rc = np.stack(
        [table.column("centroid_row").to_numpy(), table.column("centroid_col").to_numpy()], 1
    )
    return ids, rc


def _hits(layer, ids, rc, scale, translate):
    """Ids whose centroid, placed on the slide's world coordinates, lands on the nucleus."""
    got = [layer.get_value(translate + scale * p, world=True) for p in rc]
    got = [g[1] if isinstance(g, tuple) else g for g in got]
    return np.mean(np.asarray(got) == ids)


def test_folder_opens_aligned_with_the_slide(make_napari_viewer, small_slide, batch_folder):
    assert get_reader(str(batch_folder.parent)) is None  # OUT itself: no manifest
    assert get_reader(str(batch_folder)) is not None
    viewer = make_napari_viewer()
    # without the slide: at the manifest's µm per pixel
    layers = viewer.open(str(batch_folder), plugin="napari-slidescope")
    by_name = {layer.name: layer for layer in layers}
    tissue, nuclei = by_name["small.svs tissue"], by_name["small.svs nuclei"]
    np.testing.assert_allclose(nuclei.scale[-2:], [0.5, 0.5])
    np.testing.assert_allclose(tissue.scale[-2:], [0.5, 0.5])
    ids, rc = _centroids(batch_folder)
    assert len(nuclei.features) == len(ids)
    assert _hits(nuclei, ids, rc, np.array([0.5, 0.5]), np.zeros(2)) > 0.9
    viewer.layers.clear()
    # with the slide shown (moved): on the slide's layer
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (7.0, 9.0)
    layers = viewer.open(str(batch_folder), plugin="napari-slidescope")
    nuclei = next(layer for layer in layers if layer.name == "small.svs nuclei")
    np.testing.assert_allclose(nuclei.translate[-2:], [7.0, 9.0])
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    assert _hits(nuclei, ids, rc, s, t) > 0.9
    tissue = next(layer for layer in layers if layer.name == "small.svs tissue")
    np.testing.assert_allclose(tissue.translate[-2:], [7.0, 9.0])


def test_nuclei_show_the_folders_label_image_as_it_is_on_disk(make_napari_viewer, batch_folder):
    """The layer reads labels.zarr (OME-NGFF labels) in place: nothing painted on opening."""
    viewer = make_napari_viewer()
    layers = viewer.open(str(batch_folder), plugin="napari-slidescope")
    nuclei = next(layer for layer in layers if layer.name == "small.svs nuclei")
    pyramid = nuclei.metadata["slidescope_pyramid"]
    assert pyramid.path == batch_folder / "labels.zarr" / "labels" / "nuclei"
    assert pyramid.chunks_written == 0  # reopened, read-only: opening wrote no chunk
    ids, _ = _centroids(batch_folder)
    np.testing.assert_array_equal(nuclei.features["index"], ids)


def test_folder_without_label_image_paints_the_parquet(make_napari_viewer, batch_folder, tmp_path):
    """Results written before the label image: the GeoParquet painted into a pyramid."""
    import shutil

    old = tmp_path / batch_folder.name
    shutil.copytree(batch_folder, old, ignore=shutil.ignore_patterns("labels.zarr"))
    viewer = make_napari_viewer()
    layers = viewer.open(str(old), plugin="napari-slidescope")
    nuclei = next(layer for layer in layers if layer.name == "small.svs nuclei")
    assert nuclei.multiscale
    ids, rc = _centroids(old)
    assert _hits(nuclei, ids, rc, np.array([0.5, 0.5]), np.zeros(2)) > 0.9
    viewer.layers.clear()
    fresh = viewer.open(str(batch_folder), plugin="napari-slidescope")
    on_disk = next(layer for layer in fresh if layer.name == "small.svs nuclei")
    painted = nuclei.metadata["slidescope_pyramid"]
    stored = on_disk.metadata["slidescope_pyramid"]
    h, w = stored.levels[0].shape
    np.testing.assert_array_equal(
        np.asarray(painted.levels[0])[:h, :w], np.asarray(stored.levels[0])
    )


def test_nuclei_parquet_alone_is_painted_not_drawn(make_napari_viewer, batch_folder):
    """A batch's nuclei.parquet opened on its own: a label pyramid with the Parquet's ids."""
    viewer = make_napari_viewer()
    [nuclei] = viewer.open(str(batch_folder / "nuclei.parquet"), plugin="napari-slidescope")
    assert nuclei.name == "small.svs nuclei"
    assert nuclei.multiscale
    ids, rc = _centroids(batch_folder)
    np.testing.assert_array_equal(nuclei.features["index"], ids)
    assert _hits(nuclei, ids, rc, np.ones(2), np.zeros(2)) > 0.9
