"""classify_cells: positivity, IHC scores, phenotype rules, rules JSON, bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tests.fakes import BAD_RULES_FILES

from napari_slidescope import CellClassifier, PhenotypeRules, classify_cells, load_rules
from napari_slidescope.analysis.phenotypes import auto_threshold, dab_scores, ihc_summary
from napari_slidescope.pipeline.cell_classes import RULES_KIND, class_summary
from napari_slidescope.pipeline.nuclei_result import NucleiResult


def _result(**columns: np.ndarray) -> NucleiResult:
    n = len(next(iter(columns.values())))
    table = {"id": np.arange(1, n + 1, dtype=np.int32), **columns}
    return NucleiResult(None, 0.5, (0, 0), (1.0, 1.0), n, table, (0, 0, 100, 100))


def _multiplex(seed: int = 0) -> tuple[NucleiResult, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 400
    cd3 = rng.random(n) < 0.3
    cd8 = cd3 & (rng.random(n) < 0.5)

    def level(pos):
        return np.where(pos, rng.lognormal(6, 0.3, n), rng.lognormal(3, 0.3, n))

    return _result(CD3_cell_mean=level(cd3), CD8_cell_mean=level(cd8)), cd3, cd8


def test_auto_threshold_separates_two_log_normal_populations():
    res, cd3, _ = _multiplex()
    t = auto_threshold(res.columns["CD3_cell_mean"])
    assert np.array_equal(res.columns["CD3_cell_mean"] > t, cd3)


def test_phenotypes_take_the_first_rule_a_cell_matches_else_other():
    res, cd3, cd8 = _multiplex()
    out = classify_cells(
        res, phenotypes={"Cytotoxic T": "CD3+ CD8+", "T cell": "CD3+", "T helper": "CD3+ CD8-"}
    )
    cls = out.columns["class"]
    assert np.array_equal(cls == "Cytotoxic T", cd3 & cd8)
    assert np.array_equal(cls == "T cell", cd3 & ~cd8)  # before "T helper": first match
    assert not (cls == "T helper").any()
    assert np.array_equal(cls == "Other", ~cd3)
    assert np.array_equal(out.columns["CD3_positive"], cd3)
    assert list(out.classes) == ["Cytotoxic T", "T cell", "T helper", "Other"]
    assert out.classification["compartment"] == "cell"
    assert "class" not in res.columns  # the input is not changed


def test_a_numeric_threshold_moves_classes():
    res = _result(CD8_nucleus_mean=np.array([1.0, 5.0, 10.0]))
    low = classify_cells(res, markers={"CD8": 2.0})
    high = classify_cells(res, markers={"CD8": 7.0})
    assert low.columns["class"].tolist() == ["Negative", "CD8", "CD8"]
    assert high.columns["class"].tolist() == ["Negative", "Negative", "CD8"]
    assert high.classification["thresholds"] == {"CD8": 7.0}


def test_ihc_scores_positive_percent_and_h_score():
    od = np.array([0.05, 0.1, 0.25, 0.45, 0.45, 0.7, 0.2, 0.6])
    out = classify_cells(_result(dab_od_mean=od), dab=True)
    assert out.columns["dab_score"].tolist() == [0, 0, 1, 2, 2, 3, 1, 3]
    want = ["Negative", "Negative", "1+", "2+", "2+", "3+", "1+", "3+"]
    assert out.columns["class"].tolist() == want
    s = class_summary(out, area_mm2=0.5)
    assert s["positive_percent"] == pytest.approx(75.0)
    assert s["h_score"] == pytest.approx(1 * 25 + 2 * 25 + 3 * 25)
    assert s["positive_per_mm2"] == pytest.approx(12.0)
    assert s["3+_count"] == 2
    moved = classify_cells(_result(dab_od_mean=od), dab=(0.3, 0.5, 0.65))
    assert moved.columns["dab_score"].tolist() == [0, 0, 0, 1, 1, 3, 0, 2]


def test_ihc_summary_edge_cases():
    assert dab_scores(np.array([np.nan, 0.2])).tolist() == [0, 1]
    assert np.isnan(ihc_summary(np.zeros(0, int))["h_score"])


def test_dab_on_the_cell_compartment_for_membrane_markers():
    res = _result(dab_od_mean=np.array([0.0, 0.0]), dab_od_cell_mean=np.array([0.1, 0.5]))
    out = classify_cells(res, dab={"thresholds": [0.2, 0.4, 0.6], "compartment": "cell"})
    assert out.columns["class"].tolist() == ["Negative", "2+"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"markers": {"CD4": 1.0}}, "unknown marker 'CD4'"),
        ({"markers": {"CD3": "10"}}, "must be a number or 'auto'"),
        ({"markers": {"CD3": True}}, "must be a number or 'auto'"),
        ({"dab": (0.5, 0.2, 0.6)}, "must increase"),
        ({"dab": (0.2, 0.4)}, "three"),
        ({"phenotypes": {"T": "CD3"}}, "needs a + or -"),
        ({"phenotypes": {"T": "CD4+"}}, "unknown marker 'CD4'"),
        ({}, "no marker"),
        ({"markers": {"CD3": 1.0}, "compartment": "membrane"}, "compartment"),
        ({"markers": {"CD3": 1.0}, "compartment": "cytoplasm"}, "no cytoplasm measurement"),
        ({"dab": True}, "no DAB measurements"),
    ],
)
def test_bad_rules_are_refused_naming_the_problem(kwargs, message):
    res = _result(CD3_mean=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=re.escape(message)):
        classify_cells(res, **kwargs)


def test_rules_json_round_trip_and_digest(tmp_path):
    rules = PhenotypeRules.of(
        markers={"CD3": 12.5, "PanCK": {"threshold": "auto", "compartment": "cytoplasm"}},
        phenotypes={"Tumour": "PanCK+", "T cell": "CD3+"},
    )
    path = rules.save(tmp_path / "rules.json")
    data = json.loads(path.read_text())
    assert data["kind"] == RULES_KIND
    back = load_rules(path)
    assert back == rules
    assert back.digest() == rules.digest()
    other = PhenotypeRules.of(markers={"CD3": 13.0}, phenotypes={"T cell": "CD3+"})
    assert other.digest() != rules.digest()
    res = _result(CD3_cell_mean=np.array([1.0, 20.0]), PanCK_cytoplasm_mean=np.array([900.0, 5.0]))
    assert classify_cells(res, rules=path).table["class"].tolist() == ["Tumour", "T cell"]


@pytest.mark.parametrize(
    ("content", "message"),
    [*BAD_RULES_FILES, (json.dumps({"markers": {"CD3": 1}}), "not slidescope phenotype rules")],
)
def test_bad_rules_files(tmp_path, content, message):
    path = tmp_path / "rules.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"rules\\.json: .*{re.escape(message)}"):
        load_rules(path)


class _Fixed:
    def predict_classes(self, result):
        n = result.count
        names = np.array(["Tumour", "Stroma"] * (n // 2))
        return names, np.full(n, 0.9), {"Tumour": (200, 0, 0), "Stroma": (0, 200, 0)}


def test_a_classifier_plugs_in_through_the_protocol():
    res = _result(CD3_mean=np.arange(4.0))
    assert isinstance(_Fixed(), CellClassifier)
    out = classify_cells(res, classifier=_Fixed())
    assert out.columns["class"].tolist() == ["Tumour", "Stroma", "Tumour", "Stroma"]
    assert out.columns["class_probability"].tolist() == [0.9] * 4
    assert out.classes == {"Tumour": (200, 0, 0), "Stroma": (0, 200, 0)}
    with pytest.raises(ValueError, match="not both"):
        classify_cells(res, classifier=_Fixed(), markers=["CD3"])


def test_densities_per_annotation_count_the_cells_inside_on_its_area():
    from napari_slidescope.pipeline.cell_classes import annotation_summary

    # a 4 x 4 grid of cells 250 px apart; level-0 pixels of 0.5 µm (downsample 2 at 1 µm)
    rows, cols = np.meshgrid(np.arange(4) * 250.0 + 100, np.arange(4) * 250.0 + 100)
    cd8 = np.array([10.0, 1.0] * 8)
    res = NucleiResult(
        None, 1.0, (0, 0), (2.0, 2.0), 16,
        {"id": np.arange(1, 17), "centroid_row": rows.ravel(), "centroid_col": cols.ravel(),
         "CD8_nucleus_mean": cd8}, (0, 0, 1000, 1000),
    )  # fmt: skip
    res = classify_cells(res, markers={"CD8": 5.0})
    square = np.array([[0, 0], [0, 500], [500, 500], [500, 0]], float)  # 4 cells
    s = annotation_summary(res, square)
    assert s["cells"] == 4
    assert s["area_mm2"] == pytest.approx(500 * 500 * 0.25 / 1e6)
    inside = (rows.ravel() < 500) & (cols.ravel() < 500)
    want = int((cd8[inside] > 5).sum())
    assert want == 2
    assert s["CD8_count"] == want
    assert s["CD8_per_mm2"] == pytest.approx(want / 0.0625)
    # a hole takes its cells and its area away
    hole = np.array([[50, 50], [50, 150], [150, 150], [150, 50]], float)
    h = annotation_summary(res, square, holes=[hole])
    assert h["cells"] == 3
    assert h["area_mm2"] == pytest.approx((250000 - 10000) * 0.25 / 1e6)
    with pytest.raises(ValueError, match="rings of 3 or more"):
        annotation_summary(res, square[:2])
    with pytest.raises(ValueError, match="no classes"):
        annotation_summary(_result(CD8_nucleus_mean=cd8[:3]), square)


def _zip(path, members):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize(
    ("members", "what"),
    [
        ({"project.qpproj": "{}", "data/1/summary.json": "{}"}, "zipped QuPath project"),
        ({".zgroup": "{}", "0/.zarray": "{}"}, "zipped zarr store"),
        ({"x.npy": b"\x93NUMPY"}, "numpy .npz archive"),
        ({"readme.txt": "hello"}, "zip archive of 1 member(s) (readme.txt)"),
    ],
)
def test_load_classification_says_what_a_zip_that_is_no_classifier_is(tmp_path, members, what):
    from napari_slidescope.pipeline.cell_classes import load_classification

    path = _zip(tmp_path / "thing.zip", members)
    with pytest.raises(ValueError, match=re.escape(what)) as info:
        load_classification(path)
    assert str(path) in str(info.value)
    assert "not a napari-slidescope classifier file" in str(info.value)


def test_load_classification_names_geojson_and_qupath_classifiers(tmp_path):
    from napari_slidescope.pipeline.cell_classes import load_classification

    geo = tmp_path / "cells.geojson"
    geo.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    with pytest.raises(ValueError, match="it is GeoJSON"):
        load_classification(geo)
    qp = tmp_path / "classifier.json"
    qp.write_text(json.dumps({"object_classifier_type": "OpenCVMLClassifier"}))
    with pytest.raises(ValueError, match="QuPath classifier"):
        load_classification(qp)


def test_load_classification_still_loads_a_saved_classifier(tmp_path):
    pytest.importorskip("sklearn")
    from tests.pipeline.test_cell_forest import _examples, _table

    from napari_slidescope import train_classifier
    from napari_slidescope.pipeline.cell_classes import load_classification

    table, truth = _table(n=200)
    path = train_classifier(table, _examples(table, truth)).save(tmp_path / "c.npz")
    spec, descriptor = load_classification(path)
    assert descriptor["kind"] == "classifier"
    assert callable(spec.predict_classes)
