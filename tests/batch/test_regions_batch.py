"""``--regions``: the third task, added through the task table only.

A slide with known regions (``sample_regions``) is run with a region classifier: the
class map, outlines and per-region figures are written, the cells gain their region, and
``resume`` with another classifier redoes the regions and the tables but never segments
again (no nuclei task reaches the cluster).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from tests.batch_setup import cli
from tests.region_examples import strokes as _strokes

pytest.importorskip("sklearn")

from napari_slidescope import (
    analyze_slides,
    load_region_classifier,
    train_region_classifier,
)
from napari_slidescope.batch.params import BatchParams
from napari_slidescope.options import RegionsOptions
from napari_slidescope.sample_regions import write_region_slide

TILE_UM = 256.0


@pytest.fixture(scope="module")
def region_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("regions")
    (root / "slides").mkdir()
    truth = write_region_slide(
        root / "slides" / "regions.svs", shape=(1024, 1024), mpp=0.5, region_um=150.0, seed=3
    )
    files = []
    for seed in (1, 2):  # two classifiers of different strokes: different files
        clf = train_region_classifier(
            root / "slides" / "regions.svs", _strokes(truth, 5, seed), scales_um=(1.0, 2.0, 4.0)
        )
        files.append(clf.save(root / f"classifier-{seed}.npz"))
    return root, files


def _tasks_run(client, run):
    """Run `run()` and return the keys of the tasks the cluster ran meanwhile."""
    from distributed import get_task_stream

    with get_task_stream(client) as ts:
        rows = run()
    return rows, [str(t["key"]) for t in ts.data]


def test_regions_outputs_columns_and_resume(region_run, client):
    root, (first, second) = region_run
    out = root / "out"
    kwargs = dict(client=client, segmenter="builtin", tile_size_um=TILE_UM)
    rows, keys = _tasks_run(
        client, lambda: analyze_slides(root / "slides", out, regions=first, **kwargs)
    )
    assert rows[0]["status"] == "done", rows[0]["error"]
    assert [k for k in keys if "slidescope-regions-" in k]
    slide = out / "regions.svs"
    for name in ("regions.geojson", "regions.csv", "regions.zarr"):
        assert (slide / name).exists(), name
    classes = load_region_classifier(first).class_names
    table = pq.read_table(slide / "nuclei.parquet")
    assert "region" in table.column_names and "region_id" in table.column_names
    ids = table.column("region_id").to_numpy()
    names = table.column("region").to_pylist()
    assert len(ids) == rows[0]["nuclei"] > 0
    assert ids.max() <= len(classes) and (ids > 0).any()
    assert all(n == ("" if k == 0 else classes[k - 1]) for n, k in zip(names, ids, strict=True))
    with open(slide / "regions.csv", newline="") as fh:
        per_region = list(csv.DictReader(fh))
    assert [r["region"] for r in per_region] == list(classes)
    assert sum(int(float(r["cells"])) for r in per_region) == int(np.count_nonzero(ids))
    for r in per_region:  # summary.csv has the same figures, one column each
        assert float(r["area_mm2"]) == pytest.approx(rows[0][f"{r['region']}_area_mm2"], rel=1e-5)
        assert int(float(r["cells"])) == rows[0][f"{r['region']}_cells"]
    with open(out / "summary.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert f"{classes[0]}_cells_per_mm2" in header
    features = json.loads((slide / "regions.geojson").read_text())["features"]
    assert {f["properties"]["classification"]["name"] for f in features} <= set(classes)
    manifest = json.loads((slide / "manifest.json").read_text())
    assert manifest["parameters"]["regions"]["classifier_sha256"]
    before = (manifest["segmentation_sha256"], manifest["parameters_sha256"])
    geometry = table.column("geometry")

    # another classifier: the regions and the tables are redone, the nuclei are not
    rows, keys = _tasks_run(
        client,
        lambda: analyze_slides(root / "slides", out, regions=second, resume=True, **kwargs),
    )
    assert rows[0]["status"] == "done", rows[0]["error"]
    assert not [k for k in keys if "slidescope-nuclei-" in k or "slidescope-slide-" in k]
    assert [k for k in keys if "slidescope-regions-" in k]
    manifest = json.loads((slide / "manifest.json").read_text())
    assert manifest["segmentation_sha256"] == before[0]
    assert manifest["parameters_sha256"] != before[1]
    again = pq.read_table(slide / "nuclei.parquet")
    assert again.column("geometry").equals(geometry)
    assert "region_id" in again.column_names

    # the same classifier again: kept whole, nothing runs
    rows, keys = _tasks_run(
        client,
        lambda: analyze_slides(root / "slides", out, regions=second, resume=True, **kwargs),
    )
    assert rows[0]["status"] == "done"
    assert rows[0][f"{classes[0]}_area_mm2"] is not None
    ran = ("slidescope-slide-", "slidescope-nuclei-", "slidescope-regions-")
    assert not [k for k in keys if any(r in k for r in ran)]

    # no --regions any more: the region files and columns go, the nuclei stay
    rows = analyze_slides(root / "slides", out, resume=True, **kwargs)
    assert rows[0]["status"] == "done"
    assert not [k for k in rows[0] if k.endswith("_area_mm2") and k != "tissue_area_mm2"]
    assert not [p.name for p in slide.iterdir() if p.name.startswith("regions")]
    table = pq.read_table(slide / "nuclei.parquet")
    assert "region_id" not in table.column_names
    assert table.column("geometry").equals(geometry)


def test_regions_digest_is_the_classifier_content(region_run):
    _, (first, second) = region_run
    a, b = RegionsOptions.of_file(first), RegionsOptions.of_file(second)
    assert a.classifier_sha256 != b.classifier_sha256
    pa = BatchParams(("nuclei", "regions"), regions_options=a)
    pb = BatchParams(("nuclei", "regions"), regions_options=b)
    assert pa.tasks == ("tissue", "nuclei", "regions")
    assert pa.digest() != pb.digest()
    plain = BatchParams().segmentation_digest({})
    assert pa.segmentation_digest({}) == pb.segmentation_digest({}) == plain


def test_cli_refuses_a_file_that_is_not_a_region_classifier(region_run, tmp_path):
    root, _ = region_run
    bogus = tmp_path / "bogus.npz"
    bogus.write_bytes(b"not a classifier")
    res = cli("batch", str(root / "slides"), "-o", str(tmp_path / "out"), "--regions", str(bogus))
    assert res.returncode == 2, res.stderr
    assert str(bogus) in res.stderr and "Traceback" not in res.stderr
