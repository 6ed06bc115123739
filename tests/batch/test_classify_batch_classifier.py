"""`slidescope batch --classify classifier.npz`: in-process classes, a changed file redone."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("sklearn")

from napari_slidescope import (  # noqa: E402
    SlidescopeWarning,
    analyze_slides,
    classify_cells,
    segment_nuclei,
)
from napari_slidescope.pipeline.cell_forest import train_classifier  # noqa: E402
from napari_slidescope.sample_cell_types import CLASS_NAMES, write_cells_slide  # noqa: E402

TILE_UM = 100.0
SEG = {"segmenter": "builtin", "tile_size_um": TILE_UM}


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cells")
    path = folder / "cells.svs"
    truth = write_cells_slide(path, 200, mpp=0.5, seed=21)
    res = segment_nuclei(path, **SEG)
    return path, truth, res


def _train(res, truth, per_class, path):
    cls = truth.class_at(res.columns["centroid_y_um"], res.columns["centroid_x_um"])
    labels = {}
    for k, name in enumerate(CLASS_NAMES):
        labels.update(
            {int(res.columns["id"][r]): name for r in np.flatnonzero(cls == k)[:per_class]}
        )
    clf = train_classifier(res, labels)
    clf.save(path)
    return clf


def _manifest(out, slide):
    return json.loads((out / slide.name / "manifest.json").read_text())


def test_batch_classes_equal_in_process_and_a_changed_classifier_is_redone(client, cells, tmp_path):
    slide, truth, res = cells
    path = tmp_path / "cells.npz"
    with pytest.warns(SlidescopeWarning, match="too few examples"):
        clf = _train(res, truth, 3, path)
    out = tmp_path / "out"
    rows = analyze_slides(slide, out, client=client, classify=path, **SEG)
    assert rows[0]["status"] == "done", rows[0]["error"]
    table = pq.read_table(out / slide.name / "nuclei.parquet").to_pandas()
    want = classify_cells(res, classifier=clf)
    assert np.array_equal(table["id"], want.columns["id"])
    assert table["class"].tolist() == want.columns["class"].tolist()
    np.testing.assert_allclose(table["class_probability"], want.columns["class_probability"])
    manifest = _manifest(out, slide)
    assert manifest["parameters"]["classify"]["sha256"] == clf.sha256
    first = manifest["parameters_sha256"]

    # the same classifier again: kept
    analyze_slides(slide, out, client=client, classify=path, resume=True, **SEG)
    assert _manifest(out, slide)["parameters_sha256"] == first
    # retrained on other examples, same file name: redone with the new classes
    clf2 = _train(res, truth, 12, path)
    assert clf2.sha256 != clf.sha256
    analyze_slides(slide, out, client=client, classify=path, resume=True, **SEG)
    manifest = _manifest(out, slide)
    assert manifest["parameters_sha256"] != first
    assert manifest["parameters"]["classify"]["sha256"] == clf2.sha256
    again = pq.read_table(out / slide.name / "nuclei.parquet").to_pandas()
    assert again["class"].tolist() == classify_cells(res, classifier=clf2).table["class"].tolist()


def test_corrupt_classifier_file_stops_before_any_work(cells, tmp_path):
    slide, _, _ = cells
    bad = tmp_path / "cells.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "napari_slidescope.batch",
            "batch",
            str(slide),
            "-o",
            str(tmp_path / "out"),
            "--classify",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "cells.npz" in lines[0], lines
    assert "classifier" in lines[0], lines
    assert not (tmp_path / "out").exists()
