"""Tissue regions: training on strokes, whole-slide tiling without seams, files, cells."""

from __future__ import annotations

import json
import sys
import zipfile

import numpy as np
import pytest
from tests.region_examples import strokes as _strokes

from napari_slidescope import (
    ClassifierFileError,
    RegionMap,
    assign_regions,
    classify_regions,
    load_region_classifier,
    open_slide,
    region_summary,
    train_region_classifier,
)
from napari_slidescope.analysis.measure import measure_nuclei
from napari_slidescope.pipeline.nuclei_result import NucleiResult
from napari_slidescope.sample_regions import REGION_CLASSES, write_region_slide
from napari_slidescope.slide import ArraySlide

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def region_slide(tmp_path_factory):
    path = tmp_path_factory.mktemp("regions") / "regions.svs"
    truth = write_region_slide(path, shape=(2048, 2048), mpp=0.5, region_um=200.0, seed=3)
    return path, truth


@pytest.fixture(scope="module")
def trained(region_slide):
    path, truth = region_slide
    return train_region_classifier(path, _strokes(truth, 5), scales_um=(1.0, 2.0, 4.0, 8.0))


def _iou(pred: np.ndarray, truth: np.ndarray) -> dict[int, float]:
    ok = truth > 0
    out = {}
    for k in range(1, len(REGION_CLASSES) + 1):
        a, b = (pred == k) & ok, (truth == k) & ok
        out[k] = (a & b).sum() / max((a | b).sum(), 1)
    return out


def test_strokes_recover_the_synthetic_regions(region_slide, trained):
    path, truth = region_slide
    rm = classify_regions(path, trained, tissue=False)
    assert rm.labels.shape == (512, 512) and rm.mpp == pytest.approx(2.0)
    want = truth.grid(rm.downsample[0], rm.labels.shape)
    ok = want > 0
    accuracy = (rm.labels[ok] == want[ok]).mean()
    assert accuracy > 0.85, accuracy
    iou = _iou(rm.labels, want)
    assert min(iou.values()) > 0.6, iou
    # an untrained guess would not do it: shuffled truth gives a low score
    assert (rm.labels[ok] == np.roll(want, 64, axis=1)[ok]).mean() < 0.6


def test_tiled_run_equals_untiled_run(region_slide, trained):
    path, _ = region_slide
    with open_slide(path) as slide:
        small = classify_regions(slide, trained, tile_px=96, tissue=False, workers=2)
        whole = classify_regions(slide, trained, tile_px=4096, tissue=False)
        assert np.array_equal(small.labels, whole.labels)
        gated_small = classify_regions(slide, trained, tile_px=64)
        gated_whole = classify_regions(slide, trained, tile_px=4096)
    assert np.array_equal(gated_small.labels, gated_whole.labels)
    # tissue gating leaves the glass unclassified and keeps the tissue's classes
    on = gated_whole.labels > 0
    assert 0 < on.mean() < 1
    assert np.array_equal(gated_whole.labels[on], whole.labels[on])


def test_region_box_matches_the_whole_slide_map(region_slide, trained):
    path, _ = region_slide
    whole = classify_regions(path, trained, tissue=False)
    part = classify_regions(path, trained, region=(400, 600, 1200, 1400), tissue=False)
    assert part.origin == (400.0, 600.0) and part.labels.shape == (200, 200)
    assert np.array_equal(part.labels, whole.labels[100:300, 150:350])


def test_save_load_round_trip_gives_identical_predictions(region_slide, trained, tmp_path):
    path, _ = region_slide
    out = trained.save(tmp_path / "regions.npz")
    back = load_region_classifier(out)
    assert back.sha256 == trained.sha256
    assert back.class_names == trained.class_names and back.colors == trained.colors
    a = classify_regions(path, trained, region=(0, 0, 1024, 1024), tissue=False)
    b = classify_regions(path, back, region=(0, 0, 1024, 1024), tissue=False)
    assert np.array_equal(a.labels, b.labels)
    assert a.parameters["classifier_sha256"] == b.parameters["classifier_sha256"]


def test_other_options_give_another_hash(region_slide, trained):
    path, truth = region_slide
    other = train_region_classifier(path, _strokes(truth, 5), scales_um=(1.0, 2.0, 4.0))
    assert other.sha256 != trained.sha256
    again = train_region_classifier(path, _strokes(truth, 5), scales_um=(1.0, 2.0, 4.0, 8.0))
    assert again.sha256 == trained.sha256  # fixed seed: the same examples, the same forest


def test_corrupt_foreign_and_code_carrying_files_are_refused(trained, tmp_path):
    good = trained.save(tmp_path / "good.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(ClassifierFileError, match="junk.npz"):
        load_region_classifier(junk)
    # a pickled object array inside the zip: refused, never unpickled
    evil = tmp_path / "evil.npz"
    np.savez(evil, meta=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(ClassifierFileError, match="evil.npz"):
        load_region_classifier(evil)
    # a changed tree: the checksum catches it
    with np.load(good) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["node_threshold"] = arrays["node_threshold"] + 1.0
    tampered = tmp_path / "tampered.npz"
    np.savez(tampered, **arrays)
    with pytest.raises(ClassifierFileError, match="damaged"):
        load_region_classifier(tampered)
    # truncated
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ClassifierFileError, match="cut.npz"):
        load_region_classifier(cut)
    # another format (the meta document says so)
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["format"] = "napari-slidescope object classifier"
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, **arrays)
    with pytest.raises(ClassifierFileError, match="not a napari-slidescope region classifier"):
        load_region_classifier(foreign)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_region_classifier(tmp_path / "missing.npz")
    assert zipfile.is_zipfile(good)


def test_uncalibrated_slide_is_refused():
    rgb = np.full((256, 256, 3), 200, np.uint8)
    slide = ArraySlide(rgb, mpp=None, name="plain.png")
    lines = {"A": [np.array([[10.0, 10], [10, 100]])], "B": [np.array([[100.0, 10], [100, 100]])]}
    with pytest.raises(ValueError, match=r"plain.png.*no pixel size"):
        train_region_classifier(slide, lines)


def test_missing_sklearn_names_the_extra(monkeypatch, region_slide):
    path, truth = region_slide
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.ensemble", None)
    with pytest.raises(ImportError, match=r"napari-slidescope\[classify\]"):
        train_region_classifier(path, _strokes(truth, 1))


def test_bad_examples_are_named(region_slide):
    path, truth = region_slide
    with pytest.raises(ValueError, match="at least two classes"):
        train_region_classifier(path, {"Tumor": _strokes(truth, 1)["Tumor"]})
    with pytest.raises(ValueError, match=r"examples\['Tumor'\]\[0\]"):
        train_region_classifier(path, {"Tumor": [np.zeros((3, 3))], "Fat": [np.zeros((3, 2))]})
    far = np.array([[1e6, 1e6], [1e6 + 10, 1e6], [1e6, 1e6 + 10]])
    with pytest.raises(ValueError, match="no working pixel"):
        train_region_classifier(path, {"Tumor": [far], "Fat": _strokes(truth, 1)["Fat"]})


def test_qupath_geojson_examples_train_the_same_classes(region_slide, tmp_path):
    path, truth = region_slide
    strokes = _strokes(truth, 3)
    feats = []
    for name, items in strokes.items():
        for s in items:
            xy = s.vertices[:, ::-1].tolist()
            geom = {"type": "LineString", "coordinates": xy}
            if name == "Fat":  # one polygon example too
                r, c = s.vertices[1]
                ring = [[c - 20, r - 20], [c + 20, r - 20], [c + 20, r + 20], [c - 20, r + 20]]
                geom = {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}
            feats.append(
                {
                    "type": "Feature",
                    "geometry": geom,
                    "properties": {
                        "objectType": "annotation",
                        "classification": {"name": name, "color": [1, 2, 3]},
                    },
                }
            )
    gj = tmp_path / "examples.geojson"
    gj.write_text(json.dumps({"type": "FeatureCollection", "features": feats}))
    clf = train_region_classifier(path, gj, stroke_width_um=10.0)
    assert clf.class_names == REGION_CLASSES
    assert clf.colors["Tumor"] == (1, 2, 3)


def test_areas_outlines_and_geojson(region_slide, trained, tmp_path):
    from napari_slidescope.analysis.qupath import read_objects

    path, _ = region_slide
    rm = classify_regions(path, trained)
    assert isinstance(rm, RegionMap)
    counts = np.bincount(rm.labels.ravel(), minlength=6)
    assert rm.area_um2["Tumor"] == pytest.approx(counts[1] * 4.0)
    assert sum(rm.fractions.values()) == pytest.approx(1.0)
    box = np.array([[0.0, 0], [0, 2048], [2048, 2048], [2048, 0]])
    assert rm.areas_in([box]) == pytest.approx(rm.area_um2)
    half = np.array([[0.0, 0], [0, 1024], [2048, 1024], [2048, 0]])
    assert rm.areas_in([half])["Tumor"] == pytest.approx((rm.labels[:, :256] == 1).sum() * 4.0)
    out = rm.to_geojson(tmp_path / "regions.geojson")
    objs = read_objects(out)
    assert {o.class_name for o in objs} <= set(REGION_CLASSES)
    got = {}
    for o in objs:
        got[o.class_name] = got.get(o.class_name, 0.0) + o.measurements["area_um2"]
    for name, area in rm.area_um2.items():
        if area > 1e5:  # outlines (with holes; marching squares cut corners) give its area
            assert got[name] == pytest.approx(area, rel=0.05)
    levels = rm.pyramid(min_size=64)
    assert levels[0] is rm.labels and levels[1].shape == (256, 256)


def test_ignore_class_is_left_out_of_fractions(region_slide):
    path, truth = region_slide
    ex = _strokes(truth, 3)
    ex["Ignore"] = ex.pop("Fat")
    clf = train_region_classifier(path, ex, scales_um=(2.0, 4.0), kinds=("gaussian", "gradient"))
    assert len(clf.features) == 5 * 2 * 2
    rm = classify_regions(path, clf, tissue=False)
    assert "Ignore" not in rm.fractions and "Ignore" in rm.area_um2
    assert sum(rm.fractions.values()) == pytest.approx(1.0)


def test_assign_regions_gives_each_nucleus_its_region(region_slide, trained, tmp_path):
    path, _ = region_slide
    rm = classify_regions(path, trained, tissue=False)
    lab = np.zeros((2048, 2048), np.int32)
    centres = [(100, 100), (1000, 1000), (1500, 300), (300, 1700)]
    for i, (r, c) in enumerate(centres, start=1):
        lab[r - 3 : r + 4, c - 3 : c + 4] = i
    table = measure_nuclei(lab, mpp=0.5)
    table["class"] = np.array(["CD8+", "Other", "CD8+", "Other"])
    table["dab_score"] = np.array([2, 0, 3, 0])
    res = NucleiResult(lab, 0.5, (0, 0), (1.0, 1.0), 4, table, (0, 0, 2048, 2048))
    out = assign_regions(res, rm)
    want = [REGION_CLASSES[rm.labels[r // 4, c // 4] - 1] for r, c in centres]
    assert out.table["region"].tolist() == want
    assert out.table["region_id"].tolist() == [rm.labels[r // 4, c // 4] for r, c in centres]
    assert "region" not in res.table  # the input is not changed
    summary = region_summary(out, rm)
    for name in REGION_CLASSES:
        n = want.count(name)
        assert summary[f"{name}_cells"] == n
        mm2 = rm.area_um2[name] / 1e6
        assert summary[f"{name}_area_mm2"] == pytest.approx(mm2)
        if n:
            assert summary[f"{name}_cells_per_mm2"] == pytest.approx(n / mm2)
            k = sum(
                1 for w, cl in zip(want, table["class"], strict=True) if w == name and cl == "CD8+"
            )
            assert summary[f"{name}_CD8+_count"] == k
    t, s = rm.area_um2["Tumor"], rm.area_um2["Stroma"]
    assert summary["tumour_stroma_ratio"] == pytest.approx(t / (t + s))
    # the text column reaches GeoParquet and AnnData, region_id the QuPath measurements
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out_pq = out.to_geoparquet(tmp_path / "cells.parquet")
    assert pq.read_table(out_pq).column("region").to_pylist() == want
    doc = json.loads(out.to_geojson(tmp_path / "cells.geojson").read_text())
    assert [f["properties"]["measurements"]["region_id"] for f in doc["features"]] == [
        float(v) for v in out.table["region_id"]
    ]
    pytest.importorskip("anndata")
    assert out.to_anndata().obs["region"].astype(str).tolist() == want


def test_a_slide_coarser_than_the_classifier_warns(trained):
    from napari_slidescope import SlidescopeWarning

    coarse = ArraySlide(np.full((200, 200, 3), 220, np.uint8), mpp=3.0, name="coarse")
    with pytest.warns(SlidescopeWarning, match="trained at 2"):
        rm = classify_regions(coarse, trained, tissue=False)
    assert rm.mpp == pytest.approx(3.0) and rm.labels.shape == (200, 200)
