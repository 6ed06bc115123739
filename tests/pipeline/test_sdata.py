"""result.to_spatialdata(): a SpatialData zarr store, read back by spatialdata itself.

spatialdata cannot be installed next to this project (it pins dask and distributed below
ours), so the store is written with zarr, anndata and pyarrow, and read back here by
``spatialdata.read_zarr`` in another interpreter: the one ``SLIDESCOPE_SPATIALDATA_PYTHON``
names (``.ci/run`` makes a virtual environment with spatialdata and sets it). Without it
that test skips; the layout checks with our own readers always run.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import numpy as np
import pytest

from napari_slidescope import classify_cells, segment_nuclei
from napari_slidescope.sample_cells import make_hdab, make_multiplex

anndata = pytest.importorskip("anndata", reason="the scverse extra is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")
zarr = pytest.importorskip("zarr", minversion="3", reason="to_spatialdata needs zarr >= 3")

READER = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
import spatialdata as sd
from spatialdata.transformations import get_transformation

s = sd.read_zarr(sys.argv[1])
out = {"version": sd.__version__, "images": sorted(s.images), "shapes": sorted(s.shapes),
       "tables": sorted(s.tables), "attrs": s.attrs}
t = s.tables["table"]
out["table_attrs"] = {k: (v if isinstance(v, str) else list(v))
                      for k, v in t.uns["spatialdata_attrs"].items()}
out["n_obs"] = int(t.n_obs)
out["var_names"] = [str(v) for v in t.var_names]
out["class"] = [str(v) for v in t.obs["class"]] if "class" in t.obs else None
for name in s.shapes:
    g = s.shapes[name]
    c = g.geometry.centroid
    scale = get_transformation(g, "micrometers").to_affine_matrix(("x", "y"), ("x", "y"))
    um = np.c_[c.x, c.y, np.ones(len(c))] @ scale.T
    out[name] = {"count": len(g), "index": [int(i) for i in g.index],
                 "types": sorted(set(g.geom_type)), "centroid_um": um[:, :2].tolist(),
                 "global": type(get_transformation(g, "global")).__name__}
joined, table = sd.join_spatialelement_table(
    sdata=s, spatial_element_names=out["table_attrs"]["region"], table_name="table", how="inner")
out["joined"] = int(table.n_obs)
if "slide" in s.images:
    img = s.images["slide"]
    scales = sorted(img.keys())
    out["image"] = {"levels": [list(img[k]["image"].shape) for k in scales],
                    "c": [str(v) for v in img["scale0"]["image"].coords["c"].values],
                    "sum0": float(img["scale0"]["image"].sum().compute())}
    for cs in ("global", "micrometers"):
        box = sd.get_extent(s["slide"], coordinate_system=cs)
        out["image"][cs] = {k: [float(v) for v in box[k]] for k in ("x", "y")}
print(json.dumps(out))
"""


def _read_with_spatialdata(path):
    python = os.environ.get("SLIDESCOPE_SPATIALDATA_PYTHON")
    if not python:
        pytest.skip(
            "SLIDESCOPE_SPATIALDATA_PYTHON is not set: it names a Python with spatialdata "
            "installed (its own environment; .ci/run makes one), which reads the store back"
        )
    run = subprocess.run(
        [python, "-c", READER, str(path)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def multiplex(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdata")
    truth = make_multiplex(seed=8, shape=(256, 256))
    path = truth.write(tmp / "mx.ome.tif")
    res = segment_nuclei(path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=4)
    res = classify_cells(res, markers={"CD3": "auto", "PanCK": 300.0})
    return truth, res, res.to_spatialdata(tmp / "cells.zarr")


def test_store_layout_read_with_zarr_anndata_pyarrow(multiplex):
    truth, res, store = multiplex
    root = zarr.open_group(str(store), mode="r")
    assert root.attrs["spatialdata_attrs"] == {"version": "0.2"}
    assert root.attrs["slidescope"]["image_levels"] == [0, 1]
    table = anndata.read_zarr(store / "tables" / "table")
    assert table.n_obs == res.count
    assert list(table.var_names) == list(truth.channels)
    assert (table.obs["region"] == "cells").all()
    assert table.obs["instance_id"].tolist() == res.columns["id"].tolist()
    assert dict(table.uns["spatialdata_attrs"]) == {
        "region": "cells",
        "region_key": "region",
        "instance_key": "instance_id",
    }
    for name in ("cells", "nuclei"):
        shapes = pq.read_table(store / "shapes" / name / "shapes.parquet")
        assert shapes.num_rows == res.count
        assert sorted(shapes.column("__index_level_0__").to_pylist()) == sorted(
            res.columns["id"].tolist()
        )
        assert json.loads(shapes.schema.metadata[b"geo"])["primary_column"] == "geometry"
    s0 = np.asarray(root["images/slide/s0"])
    assert s0.shape == (5, 256, 256)
    assert np.array_equal(s0, truth.image)
    assert root["images/slide/s1"].shape == (5, 128, 128)


def test_spatialdata_reads_shapes_table_and_image(multiplex):
    truth, res, store = multiplex
    out = _read_with_spatialdata(store)
    assert out["images"] == ["slide"]
    assert out["shapes"] == ["cells", "nuclei"]
    assert out["tables"] == ["table"]
    assert out["table_attrs"] == {
        "region": "cells",
        "region_key": "region",
        "instance_key": "instance_id",
    }
    assert out["n_obs"] == res.count
    assert out["var_names"] == list(truth.channels)
    assert out["class"] == res.columns["class"].tolist()
    # every table row joins its cell
    assert out["joined"] == res.count
    for name in ("cells", "nuclei"):
        assert out[name]["count"] == res.count
        assert out[name]["types"] == ["Polygon"]
        assert out[name]["global"] == "Identity"
    # nucleus outlines in µm sit on the table's centroids (µm): the "micrometers" system
    rows = {int(i): k for k, i in enumerate(res.columns["id"])}
    order = [rows[i] for i in out["nuclei"]["index"]]
    um = np.asarray(out["nuclei"]["centroid_um"])
    want = np.c_[res.columns["centroid_x_um"][order], res.columns["centroid_y_um"][order]]
    assert np.abs(um - want).max() < 1.0  # polygon vs pixel centroid: under 2 px of 0.5 µm
    # the image: both levels, the channel names, the pixels, and its extent in each system
    img = out["image"]
    assert img["levels"] == [[5, 256, 256], [5, 128, 128]]
    assert img["c"] == list(truth.channels)
    assert img["sum0"] == pytest.approx(float(truth.image.sum(dtype=np.float64)))
    assert img["global"] == {"x": [0.0, 256.0], "y": [0.0, 256.0]}
    assert img["micrometers"] == {"x": [0.0, 128.0], "y": [0.0, 128.0]}
    assert out["attrs"]["slidescope"]["slide"].endswith("mx.ome.tif")


def test_region_offset_rgb_reference_and_nuclei_only(tmp_path):
    truth = make_hdab(seed=3, shape=(320, 320))
    path = truth.write(tmp_path / "hdab.ome.tif")
    res = segment_nuclei(path, region=(64, 96, 320, 320), tissue=False, segmenter="builtin")
    store = res.to_spatialdata(tmp_path / "nuclei.zarr")
    root = zarr.open_group(str(store), mode="r")
    s0 = np.asarray(root["images/slide/s0"])
    # RGB as c, y, x; the region widened to the coarsest level's 2 px grid: unchanged here
    assert s0.shape == (3, 256, 224)
    assert np.array_equal(s0, truth.image[64:320, 96:320].transpose(2, 0, 1))
    ref = res.to_spatialdata(tmp_path / "ref.zarr", image="reference")
    attrs = zarr.open_group(str(ref), mode="r").attrs["slidescope"]
    assert attrs["image"] == "reference"
    assert attrs["slide"] == str(path)
    assert attrs["region"] == [64, 96, 320, 320]
    assert not list(zarr.open_group(str(ref), mode="r")["images"].keys())
    out = _read_with_spatialdata(store)
    assert out["shapes"] == ["nuclei"]
    assert out["table_attrs"]["region"] == "nuclei"
    assert out["joined"] == res.count == out["nuclei"]["count"]
    assert out["image"]["c"] == ["r", "g", "b"]
    assert out["image"]["global"] == {"x": [96.0, 320.0], "y": [64.0, 320.0]}
    assert out["image"]["micrometers"]["x"] == pytest.approx([96 * truth.mpp, 320 * truth.mpp])


def test_bad_input(multiplex, tmp_path):
    truth, res, store = multiplex
    with pytest.raises(ValueError, match="already exists"):
        res.to_spatialdata(store)
    with pytest.raises(ValueError, match="image: expected one of"):
        res.to_spatialdata(tmp_path / "x.zarr", image="all")
    arr = segment_nuclei(truth.image[0], mpp=0.5, segmenter="builtin-fluorescence")
    with pytest.raises(ValueError, match="segmented from an array"):
        arr.to_spatialdata(tmp_path / "y.zarr")
    assert arr.to_spatialdata(tmp_path / "y.zarr", image="none").is_dir()
    assert not (tmp_path / "x.zarr").exists()


def test_a_result_without_labels_writes_its_outlines(tmp_path):
    """Whole-slide results keep outlines, not label images: the shapes come from them."""
    truth = make_multiplex(seed=4, shape=(256, 256))
    path = truth.write(tmp_path / "mx.ome.tif")
    res = segment_nuclei(
        path, segmenter="builtin-fluorescence", tissue=False, cell_expansion_um=3, labels=False
    )
    assert res.labels is None
    assert res.cells is None
    assert res.count > 20
    store = res.to_spatialdata(tmp_path / "w.zarr", image="reference")
    for name in ("cells", "nuclei"):
        shapes = pq.read_table(store / "shapes" / name / "shapes.parquet")
        assert sorted(shapes.column("__index_level_0__").to_pylist()) == sorted(
            res.columns["id"].tolist()
        )
    out = _read_with_spatialdata(store)
    assert out["images"] == []
    assert out["joined"] == res.count
    assert out["attrs"]["slidescope"]["image"] == "reference"


def test_writing_the_store_warns_nothing(multiplex, tmp_path):
    """anndata's zarr v3 "autosharding will be the default" warning came once per array."""
    _, res, _ = multiplex
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res.to_spatialdata(tmp_path / "again.zarr")
    assert [str(w.message) for w in caught if "shard" in str(w.message)] == []
