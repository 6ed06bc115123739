import json
import warnings
import zipfile

import numpy as np
import pytest

pytest.importorskip("sklearn")

from napari_slidescope.pipeline.cell_forest import (  # noqa: E402
    ClassifierFileError,
    ObjectClassifier,
    load_classifier,
    train_classifier,
)

NAMES = np.array(["Lymphocyte", "Tumor", "Spindle"])


def _table(n=600, seed=0):
    """Three separable populations: small dark round, large pale, elongated."""
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, 3, n)
    area = np.array([25.0, 110.0, 45.0])[cls] * rng.uniform(0.85, 1.15, n)
    ecc = np.array([0.3, 0.5, 0.95])[cls] + rng.normal(0, 0.03, n)
    table = {
        "id": np.arange(1, n + 1, dtype=np.int32) * 3,
        "centroid_y_um": rng.uniform(0, 500, n),
        "centroid_x_um": rng.uniform(0, 500, n),
        "area_um2": area,
        "perimeter_um": 2 * np.sqrt(np.pi * area) * np.array([1.0, 1.05, 1.4])[cls],
        "eccentricity": ecc.clip(0, 1),
        "solidity": rng.uniform(0.9, 1.0, n),
        "hematoxylin_od_mean": np.array([1.1, 0.45, 0.7])[cls] + rng.normal(0, 0.05, n),
        "eosin_od_mean": rng.uniform(0.2, 0.4, n),
        "hematoxylin_od_std": np.array([0.04, 0.3, 0.05])[cls] + rng.normal(0, 0.01, n),
        "hematoxylin_od_skew": rng.normal(0, 0.5, n),
    }
    return table, NAMES[cls]


def _examples(table, truth, per_class=10):
    labels = {}
    for name in NAMES:
        rows = np.flatnonzero(truth == name)[:per_class]
        labels.update({int(table["id"][r]): str(name) for r in rows})
    return labels


@pytest.fixture(scope="module")
def trained():
    table, truth = _table()
    clf = train_classifier(table, _examples(table, truth), colors={"Tumor": (200, 0, 0)})
    return table, truth, clf


def test_separable_classes_are_predicted(trained):
    table, truth, clf = trained
    names, prob, colors = clf.predict_classes(table)
    assert names.shape == prob.shape == (len(truth),)
    assert (names == truth).mean() > 0.97
    assert ((prob > 0) & (prob <= 1)).all()
    assert colors["Tumor"] == (200, 0, 0)
    assert set(colors) == set(NAMES)
    assert clf.examples == {"Lymphocyte": 10, "Spindle": 10, "Tumor": 10}


def test_rows_preview_equals_full(trained):
    table, _, clf = trained
    full, pfull, _ = clf.predict_classes(table)
    rows = np.array([5, 0, 77])
    part, ppart, _ = clf.predict_classes(table, rows=rows)
    np.testing.assert_array_equal(part, full[rows])
    np.testing.assert_allclose(ppart, pfull[rows])


def test_same_examples_same_classifier(trained):
    table, truth, clf = trained
    again = train_classifier(table, _examples(table, truth), colors={"Tumor": (200, 0, 0)})
    assert again.sha256 == clf.sha256
    other = train_classifier(table, _examples(table, truth, 12))
    assert other.sha256 != clf.sha256


def test_save_load_identical(trained, tmp_path):
    table, _, clf = trained
    path = clf.save(tmp_path / "clf.npz")
    loaded = load_classifier(path)
    assert isinstance(loaded, ObjectClassifier)
    assert loaded.sha256 == clf.sha256
    assert loaded.features == clf.features
    assert loaded.class_names == clf.class_names
    assert loaded.colors == clf.colors
    assert loaded.examples == clf.examples
    a, pa, _ = clf.predict_classes(table)
    b, pb, _ = loaded.predict_classes(table)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(pa, pb)
    assert [p.name for p in tmp_path.iterdir()] == ["clf.npz"]  # no temporary left


def _rewrite(src, dst, change):
    """Copy a classifier file with its JSON document changed (checksum kept)."""
    with np.load(src) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    change(meta, arrays)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(dst, **arrays)
    return dst


def test_other_versions_and_damage_are_refused(trained, tmp_path):
    _, _, clf = trained
    good = clf.save(tmp_path / "good.npz")

    def fmt(meta, _):
        meta["format_version"] = 99

    def feats(meta, _):
        meta["features_version"] = 0

    def thresholds(_, arrays):
        arrays["node_threshold"] = arrays["node_threshold"] + 1.0

    def other_features(meta, _):
        meta["features"] = meta["features"][::-1]

    with pytest.raises(ClassifierFileError, match="format 99.*retrain"):
        load_classifier(_rewrite(good, tmp_path / "f.npz", fmt))
    with pytest.raises(ClassifierFileError, match="feature definitions 0"):
        load_classifier(_rewrite(good, tmp_path / "d.npz", feats))
    with pytest.raises(ClassifierFileError, match="damaged"):
        load_classifier(_rewrite(good, tmp_path / "t.npz", thresholds))
    with pytest.raises(ClassifierFileError, match="damaged"):
        load_classifier(_rewrite(good, tmp_path / "o.npz", other_features))


def test_foreign_and_corrupt_files_are_refused(trained, tmp_path):
    _, _, clf = trained
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(ClassifierFileError, match="notes.npz: not a napari-slidescope"):
        load_classifier(text)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.arange(3))
    with pytest.raises(ClassifierFileError, match="not a napari-slidescope classifier"):
        load_classifier(foreign)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, meta=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(ClassifierFileError, match="pickled.npz"):
        load_classifier(pickled)
    good = clf.save(tmp_path / "good.npz")
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ClassifierFileError, match="cut.npz"):
        load_classifier(cut)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_classifier(tmp_path / "missing.npz")
    assert zipfile.is_zipfile(good)


def test_failed_save_leaves_old_file(trained, tmp_path, monkeypatch):
    _, _, clf = trained
    path = clf.save(tmp_path / "c.npz")
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(OSError, match="disk full"):
        clf.save(path)
    assert path.read_bytes() == before


def test_bad_training_input_is_refused():
    table, truth = _table(60)
    ids = table["id"]
    with pytest.raises(ValueError, match="at least two classes"):
        train_classifier(table, {int(i): "Tumor" for i in ids[:5]})
    with pytest.raises(ValueError, match="no example of class.*'Spindle'"):
        train_classifier(
            table,
            {int(ids[0]): "Tumor", int(ids[1]): "Lymphocyte"},
            classes=["Tumor", "Lymphocyte", "Spindle"],
        )
    with pytest.raises(ValueError, match="2 nucleus id.*not in the table: 1, 2"):
        train_classifier(table, {1: "Tumor", 2: "Lymphocyte", int(ids[0]): "Tumor"})
    with pytest.raises(ValueError, match="not one of classes"):
        train_classifier(table, {int(ids[0]): "T", int(ids[1]): "L"}, classes=["T", "X"])
    with pytest.raises(ValueError, match="colors"):
        train_classifier(table, {int(ids[0]): "T", int(ids[1]): "L"}, colors={"T": (300, 0, 0)})
    with pytest.raises(ValueError, match="no texture_x column"):
        train_classifier(
            table, {int(ids[0]): "T", int(ids[1]): "L"}, features=["area_um2", "texture_x"]
        )


def test_result_lacking_features_is_refused(trained):
    table, _, clf = trained
    slim = {k: v for k, v in table.items() if k != "hematoxylin_od_std"}
    with pytest.raises(ValueError, match="classifier: .*hematoxylin_od_std"):
        clf.predict_classes(slim)


def test_too_few_examples_are_said_with_the_counts():
    """Three examples of each class made 2,580 of 2,970 nuclei one class without a word."""
    from napari_slidescope import SlidescopeWarning

    table, truth = _table(60)
    with pytest.warns(
        SlidescopeWarning, match=r"too few examples.*Lymphocyte 3, Spindle 3, Tumor 3"
    ):
        train_classifier(table, _examples(table, truth, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_classifier(table, _examples(table, truth, 10))
