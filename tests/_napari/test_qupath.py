"""The QuPath round trip: GeoJSON objects open aligned with the slide and save back (xvfb-run)."""

import gzip
import json

import numpy as np
import pytest

from napari_slidescope._napari.reader import get_reader
from napari_slidescope.analysis.qupath import looks_like_geojson, read_objects

pytestmark = pytest.mark.gui


def _square(y, x, s):
    """Closed GeoJSON ring (x, y) of the level-0 square [y, y + s) x [x, x + s)."""
    return [[x, y], [x + s, y], [x + s, y + s], [x, y + s], [x, y]]


def _qupath_doc():
    return {
        "type": "FeatureCollection",
        "features": [
            {  # an annotation with a hole, a name, a class and measurements
                "type": "Feature",
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [_square(100, 200, 300), _square(200, 300, 50)],
                },
                "properties": {
                    "objectType": "annotation",
                    "name": "Tumour A",
                    "classification": {"name": "Tumor", "color": [200, 0, 0]},
                    "measurements": {"Area µm^2": 1234.5},
                },
            },
            {  # a multipolygon annotation: two parts
                "type": "Feature",
                "geometry": {
                    "type": "MultiPolygon",
                    "coordinates": [[_square(600, 100, 40)], [_square(700, 900, 60)]],
                },
                "properties": {
                    "objectType": "annotation",
                    "classification": {"name": "Stroma", "color": [0, 150, 0]},
                },
            },
            *(
                {  # detections with measurements (QuPath >= 0.4 object form)
                    "type": "Feature",
                    "geometry": {"type": "Polygon", "coordinates": [_square(y, x, 10)]},
                    "properties": {
                        "objectType": "detection" if k else "cell",
                        "classification": {"name": "Nucleus"},
                        "measurements": {"Nucleus: Area": 100.0 + k},
                    },
                }
                for k, (y, x) in enumerate([(50, 60), (800, 1200), (400, 1000)])
            ),
        ],
    }


def test_reader_claims_geojson_and_leaves_other_json(tmp_path):
    good = tmp_path / "objects.geojson"
    good.write_text(json.dumps(_qupath_doc()))
    gz = tmp_path / "objects.geojson.gz"
    gz.write_bytes(gzip.compress(good.read_bytes()))
    listed = tmp_path / "list.geojson"  # a bare list of features, as QuPath also writes
    listed.write_text(json.dumps(_qupath_doc()["features"]))
    other = tmp_path / "config.geojson"
    other.write_text(json.dumps({"name": "not geometry", "values": [1, 2, 3]}))
    broken = tmp_path / "broken.geojson"
    broken.write_bytes(b"\x00\x01 not json")
    for p in (good, gz, listed):
        assert looks_like_geojson(p)
        assert get_reader(str(p)) is not None
    for p in (other, broken, tmp_path / "missing.geojson"):
        assert get_reader(str(p)) is None
    objs = read_objects(gz)
    assert [o.object_type for o in objs] == [
        "annotation",
        "annotation",
        "cell",
        "detection",
        "detection",
    ]
    assert objs[0].name == "Tumour A"
    assert objs[0].class_name == "Tumor"
    assert objs[0].color == (200, 0, 0)
    assert objs[0].measurements == {"Area µm^2": 1234.5}
    assert len(objs[0].polygons[0][1]) == 1
    assert len(objs[1].polygons) == 2
    np.testing.assert_array_equal(objs[2].polygons[0][0][0], [50, 60])  # (row, col)


@pytest.mark.parametrize("gz", [False, True])
def test_qupath_objects_open_aligned_with_the_slide(make_napari_viewer, small_slide, tmp_path, gz):
    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (100.0, -40.0)
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    path = tmp_path / ("objects.geojson.gz" if gz else "objects.geojson")
    raw = json.dumps(_qupath_doc()).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    layers = viewer.open(str(path), plugin="napari-slidescope")
    ann, det = layers
    assert ann.name == "objects annotations"
    assert det.name == "objects detections"
    # annotations: polygons whose world vertices sit on the slide's level-0 pixels
    feats = ann.features
    assert list(feats["role"]) == ["annotation", "hole", "annotation", "annotation"]
    assert list(feats["class"]) == ["Tumor", "Tumor", "Stroma", "Stroma"]
    assert feats["name"][0] == "Tumour A"
    assert feats["Area µm^2"][0] == 1234.5
    world = np.array([ann.data_to_world(v) for v in ann.data[0]])
    corners = np.array([[100, 200], [100, 500], [400, 500], [400, 200]], float)  # (row, col)
    np.testing.assert_allclose(world, t + s * (corners - 0.5), atol=1e-6)
    hole = np.array([ann.data_to_world(v) for v in ann.data[1]])
    np.testing.assert_allclose(hole.min(axis=0), t + s * (np.array([200, 300]) - 0.5))
    # the slide's pixel (100, 200) is centred at t + s * (100, 200): the square's corner is
    # its top-left edge, half a pixel before
    np.testing.assert_allclose(image.data_to_world([100, 200]), t + s * [100, 200])
    # detections: a multiscale label layer, ids 1..3 at the squares, measurements as features
    assert det.multiscale
    for k, (y, x) in enumerate([(50, 60), (800, 1200), (400, 1000)]):
        inside = t + s * np.array([y + 5, x + 5])
        assert det.get_value(inside, world=True)[1] == k + 1
        outside = t + s * np.array([y - 2, x - 2])
        assert det.get_value(outside, world=True)[1] == 0
        level0 = np.asarray(det.data[0][y : y + 10, x : x + 10])
        assert (level0 == k + 1).all()  # exactly the 10 x 10 pixels of the square
        assert det.data[0][y - 1, x] == 0
        assert det.data[0][y + 10, x] == 0
    row = det.features[det.features["index"] == 2]
    assert row["Nucleus: Area"].iloc[0] == 101.0
    assert row["class"].iloc[0] == "Nucleus"


def test_project_geojson_opens_aligned_and_layers_save_back(
    make_napari_viewer, small_slide, tmp_path
):
    from napari_slidescope._napari.qupath import write_geojson_layers
    from napari_slidescope.analysis.geojson import write_geojson

    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (10.0, 20.0)
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    ring = np.array([[10.0, 10.0], [10.0, 90.0], [70.0, 90.0], [70.0, 10.0]])  # (row, col)
    path = tmp_path / "tissue.geojson"
    write_geojson(path, [ring], [[ring[:, :] * 0.5 + 20]], name="Tissue")
    [ann] = viewer.open(str(path), plugin="napari-slidescope")
    world = np.array([ann.data_to_world(v) for v in ann.data[0]])
    expected = t + s * (ring - 0.5)
    assert {tuple(np.round(w, 6)) for w in world} == {tuple(np.round(e, 6)) for e in expected}
    # save the shapes and a labels layer through the writer: back in slide level-0 px
    from napari_slidescope._napari.qupath import detections_layer
    from napari_slidescope.analysis.qupath import QuPathObject

    sq = np.array([[300.0, 400.0], [300.0, 412.0], [312.0, 412.0], [312.0, 400.0]])
    data, meta, _ = detections_layer(
        [QuPathObject("detection", [(sq, [])], measurements={"m": 7.0})],
        "nuc",
        {"scale": tuple(s), "translate": tuple(t)},
        (1024, 1536),
    )
    labels = viewer.add_labels(data, **meta)
    out = tmp_path / "saved.geojson"
    write_geojson_layers(str(out), [ann.as_layer_data_tuple(), labels.as_layer_data_tuple()])
    back = read_objects(out)
    assert [o.object_type for o in back] == ["annotation", "detection"]
    ext, holes = back[0].polygons[0]
    assert {tuple(p) for p in np.round(ext, 6)} == {tuple(p) for p in ring}
    assert len(holes) == 1
    det_ring = back[1].polygons[0][0]
    np.testing.assert_allclose(det_ring.min(axis=0), [300, 400])
    np.testing.assert_allclose(det_ring.max(axis=0), [312, 412])
    assert back[1].measurements["m"] == 7.0
    # File > Save Selected Layers goes through the npe2 writer contribution
    viewer.layers.selection = {ann}
    written = viewer.layers.save(
        str(tmp_path / "menu.geojson"), selected=True, plugin="napari-slidescope"
    )
    assert written
    assert read_objects(written[0])[0].object_type == "annotation"


def test_batch_nuclei_parquet_opens_aligned(make_napari_viewer, small_slide, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import shapely

    polys = [shapely.box(60, 50, 70, 60), shapely.box(1200, 800, 1210, 810)]  # (x, y)
    table = pa.table(
        {
            "id": pa.array([1, 2]),
            "tile": pa.array([0, 0]),
            "area_um2": pa.array([25.0, 26.0]),
            "geometry": pa.array(shapely.to_wkb(polys).tolist(), pa.binary()),
        }
    ).replace_schema_metadata({"geo": json.dumps({"primary_column": "geometry"})})
    folder = tmp_path / "small.svs"
    folder.mkdir()
    pq.write_table(table, folder / "nuclei.parquet")
    other = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"a": [1]}), other)
    assert get_reader(str(other)) is None
    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    image.translate = (7.0, 9.0)
    s, t = np.asarray(image.scale), np.asarray(image.translate)
    [det] = viewer.open(str(folder / "nuclei.parquet"), plugin="napari-slidescope")
    assert det.multiscale
    assert det.name == "small.svs nuclei"
    for k, (y, x) in enumerate([(50, 60), (800, 1200)]):
        assert det.get_value(t + s * np.array([y + 5, x + 5]), world=True)[1] == k + 1
        assert (np.asarray(det.data[0][y : y + 10, x : x + 10]) == k + 1).all()
    assert list(det.features["area_um2"]) == [25.0, 26.0]
