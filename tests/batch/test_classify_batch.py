"""`slidescope batch --classify rules.json`: the classes of in-process classify_cells, resumable."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from tests.batch_setup import cli, summary
from tests.fakes import BAD_RULES_FILES

from napari_slidescope import PhenotypeRules, analyze_slides, classify_cells, segment_nuclei
from napari_slidescope.analysis.qupath import read_objects
from napari_slidescope.sample_cells import make_hdab

TILE_UM = 100.0


@pytest.fixture(scope="module")
def hdab_slide(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ihc")
    return make_hdab(seed=11, shape=(512, 512)).write(folder / "ki67.ome.tif")


def test_batch_classes_equal_in_process_and_a_changed_rules_file_is_redone(
    client, hdab_slide, tmp_path
):
    rules = tmp_path / "rules.json"
    PhenotypeRules.of(dab=True).save(rules)
    out = tmp_path / "out"
    rows = analyze_slides(
        hdab_slide, out, client=client, segmenter="builtin", tile_size_um=TILE_UM, classify=rules
    )
    assert rows[0]["status"] == "done", rows[0]["error"]
    table = pq.read_table(out / hdab_slide.name / "nuclei.parquet").to_pandas()
    want = classify_cells(
        segment_nuclei(hdab_slide, segmenter="builtin", tile_size_um=TILE_UM), dab=True
    )
    assert np.array_equal(table["id"], want.columns["id"])
    assert table["class"].tolist() == want.columns["class"].tolist()
    assert np.array_equal(table["dab_score"], want.columns["dab_score"])
    row = summary(out)[hdab_slide.name]
    assert float(row["h_score"]) == pytest.approx(
        np.mean(want.columns["dab_score"]) * 100, rel=1e-4
    )
    assert "Negative:" in row["classes"]
    objects = read_objects(out / hdab_slide.name / "nuclei.geojson.gz")
    assert {o.class_name for o in objects} <= {"Negative", "1+", "2+", "3+"}
    assert {o.color for o in objects if o.class_name == "3+"} == {want.classes["3+"]}
    digest = json.loads((out / hdab_slide.name / "manifest.json").read_text())["parameters_sha256"]

    def resume():
        """Run again with --resume; return the slide's manifest."""
        analyze_slides(
            hdab_slide,
            out,
            client=client,
            segmenter="builtin",
            tile_size_um=TILE_UM,
            classify=rules,
            resume=True,
        )
        return json.loads((out / hdab_slide.name / "manifest.json").read_text())

    # the same rules again: kept; other thresholds: redone, classes move
    manifest = resume()
    assert manifest["parameters_sha256"] == digest
    PhenotypeRules.of(dab=(0.1, 0.2, 0.3)).save(rules)
    manifest = resume()
    assert manifest["parameters_sha256"] != digest
    assert manifest["parameters"]["classify"]["rules"]["dab"]["thresholds"] == [0.1, 0.2, 0.3]
    moved = pq.read_table(out / hdab_slide.name / "nuclei.parquet").to_pandas()
    assert (moved["dab_score"].to_numpy() >= table["dab_score"].to_numpy()).all()
    assert float(summary(out)[hdab_slide.name]["h_score"]) > float(row["h_score"])


@pytest.mark.parametrize(("content", "message"), BAD_RULES_FILES)
def test_bad_rules_files_stop_before_any_work(hdab_slide, tmp_path, content, message):
    rules = tmp_path / "rules.json"
    rules.write_text(content)
    res = cli("batch", hdab_slide, "-o", tmp_path / "out", "--classify", rules)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert message in lines[0]
    assert "rules.json" in lines[0]
    assert not (tmp_path / "out").exists()


def test_batch_cells_write_both_outlines(client, hdab_slide, tmp_path):
    from shapely import from_wkb

    out = tmp_path / "out"
    rows = analyze_slides(
        hdab_slide, out, client=client, segmenter="builtin", tile_size_um=TILE_UM,
        cell_expansion_um=3.0,
    )  # fmt: skip
    assert rows[0]["status"] == "done", rows[0]["error"]
    pf = pq.ParquetFile(out / hdab_slide.name / "nuclei.parquet")
    geo = json.loads(pf.metadata.metadata[b"geo"])
    assert set(geo["columns"]) == {"geometry", "cell_geometry"}
    table = pf.read().to_pandas()
    want = segment_nuclei(
        hdab_slide, segmenter="builtin", tile_size_um=TILE_UM, cell_expansion_um=3.0
    )
    assert np.allclose(table["dab_od_cell_mean"], want.columns["dab_od_cell_mean"])
    nuclei = from_wkb(table["geometry"].to_numpy())
    cells = from_wkb(table["cell_geometry"].to_numpy())
    assert all(c.buffer(1e-6).contains(n) for c, n in zip(cells, nuclei, strict=True))
    assert np.mean([c.area > n.area for c, n in zip(cells, nuclei, strict=True)]) > 0.95
    objects = read_objects(out / hdab_slide.name / "nuclei.geojson.gz")
    assert {o.object_type for o in objects} == {"cell"}
    assert all(o.nucleus for o in objects)


def test_batch_writes_cells_h5ad_on_request(client, hdab_slide, tmp_path):
    anndata = pytest.importorskip("anndata", reason="the scverse extra is not installed")
    rules = PhenotypeRules.of(dab=True).save(tmp_path / "rules.json")
    out = tmp_path / "out"
    rows = analyze_slides(
        hdab_slide, out, client=client, segmenter="builtin", tile_size_um=TILE_UM,
        cell_expansion_um=3.0, classify=rules, anndata=True,
    )  # fmt: skip
    assert rows[0]["status"] == "done", rows[0]["error"]
    adata = anndata.read_h5ad(out / hdab_slide.name / "cells.h5ad")
    table = pq.read_table(out / hdab_slide.name / "nuclei.parquet").to_pandas()
    assert adata.n_obs == len(table)  # stains, by name
    assert "DAB" not in adata.var_names
    assert list(adata.var_names) == ["hematoxylin_od", "dab_od"]
    assert list(adata.obs["class"].astype(str)) == table["class"].tolist()
    assert np.allclose(adata.obsm["spatial"][:, 0], table["centroid_x_um"])


def test_rules_naming_an_unknown_marker_fail_the_slide_before_any_tile(
    client, hdab_slide, tmp_path
):
    rules = PhenotypeRules.of(markers={"CD8": 10.0}).save(tmp_path / "rules.json")
    out = tmp_path / "out"
    rows = analyze_slides(
        hdab_slide, out, client=client, segmenter="builtin", tile_size_um=TILE_UM, classify=rules
    )
    assert rows[0]["status"] == "failed"
    assert "unknown marker 'CD8'" in rows[0]["error"]
    assert "DAB" in rows[0]["error"]
    assert not list((out / hdab_slide.name).glob("parts/*.parquet"))
    # a compartment the slide will have is accepted before the run
    ok = PhenotypeRules.of(dab={"thresholds": [0.2, 0.4, 0.6], "compartment": "cell"})
    rows = analyze_slides(
        hdab_slide, out, client=client, segmenter="builtin", tile_size_um=TILE_UM,
        classify=ok.save(tmp_path / "ok.json"), cell_expansion_um=3.0,
    )  # fmt: skip
    assert rows[0]["status"] == "done", rows[0]["error"]


def test_changed_rules_on_resume_redo_only_the_classification(client, hdab_slide, tmp_path):
    """Same slide, options and model: the classes are computed again from the stored
    measurements; tissue, nuclei, outlines and ids are untouched, and every output equals a
    run from scratch with the new rules."""
    rules = tmp_path / "rules.json"
    PhenotypeRules.of(dab=True).save(rules)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    kw = dict(client=client, segmenter="builtin", tile_size_um=TILE_UM, classify=rules)
    assert analyze_slides(hdab_slide, out, **kw)[0]["status"] == "done"
    folder = out / hdab_slide.name
    before = json.loads((folder / "manifest.json").read_text())
    table = pq.read_table(folder / "nuclei.parquet")
    tissue_mtime = (folder / "tissue.geojson").stat().st_mtime_ns

    PhenotypeRules.of(dab=(0.1, 0.2, 0.3)).save(rules)
    seen = []
    rows = analyze_slides(hdab_slide, out, resume=True, progress=seen.append, **kw)
    assert rows[0]["status"] == "done", rows[0]["error"]
    after = json.loads((folder / "manifest.json").read_text())
    # nothing was segmented again: no slide task (tissue.geojson untouched, the slide
    # task's seconds kept) and no tile task (each tile's seconds kept)
    assert (folder / "tissue.geojson").stat().st_mtime_ns == tissue_mtime
    assert after["slide_task_seconds"] == before["slide_task_seconds"]
    assert after["tiles"] == before["tiles"]
    assert after["segmentation_sha256"] == before["segmentation_sha256"]
    assert after["parameters_sha256"] != before["parameters_sha256"]
    assert after["parameters"]["classify"]["rules"]["dab"]["thresholds"] == [0.1, 0.2, 0.3]
    assert not (folder / "parts").exists()
    moved = pq.read_table(folder / "nuclei.parquet")
    segmentation = [c for c in table.column_names if c in moved.column_names]
    segmentation = segmentation[: segmentation.index("bbox_col1") + 1] + ["geometry"]
    assert moved.select(segmentation).equals(table.select(segmentation))
    assert moved.column("class").to_pylist() != table.column("class").to_pylist()

    # what a run from scratch with the new rules writes, byte for byte
    assert analyze_slides(hdab_slide, fresh, **kw)[0]["status"] == "done"
    for name in ("nuclei.parquet", "nuclei.geojson.gz"):
        assert (folder / name).read_bytes() == (fresh / hdab_slide.name / name).read_bytes(), name
    want = summary(fresh)[hdab_slide.name]
    got = summary(out)[hdab_slide.name]
    for column in ("nuclei", "classes", "h_score", "positive_percent", "tissue_area_mm2"):
        assert got[column] == want[column], column
