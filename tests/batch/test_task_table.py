"""The task table: tissue and nuclei moved onto it keep every digest of earlier runs."""

from __future__ import annotations

import pytest

import napari_slidescope
from napari_slidescope.batch import _flags, outputs, params
from napari_slidescope.batch.params import BatchParams
from napari_slidescope.options import NucleiOptions, TissueOptions
from napari_slidescope.pipeline.task_table import TASK_NAMES, TASK_TABLE, task, with_needs

# digests BatchParams gave before the task table existed (version pinned to "0.0-pin"):
# a run finished then is still recognised by --resume
PINNED = {
    "default": "4af9f5ecad190c1b403c9f7212e6fb3f4aecd69efb5344f2e4470be4d458c770",
    "default_run": "a310b8bc291a2efe495694ab614df00f43e132f0ae178cf909c29fed8ae2db70",
    "default_segmentation": "8d5d82eee672308278ceb05f0d220dc213facb5837b7e7cda6bde3094f648650",
    "tissue_only": "c9b3c403056798e6e5e9a5a322cdec030af48d780f74eb1a6aac208e962f3b5c",
    "classified": "2a14c8713fbf143166a3b6b2f0e641b42f5033b54ce7d00ac0cdf4f2e124980e",
    "classified_segmentation": "f831169a932d035d498a194bf67740479845fa9d8f79fe54df87af410d04fefc",
}


@pytest.fixture
def pinned_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(napari_slidescope, "__version__", "0.0-pin")
    monkeypatch.setattr(params, "__version__", "0.0-pin")  # read from _version at import


@pytest.mark.usefixtures("pinned_version")
def test_digests_of_earlier_runs_are_unchanged() -> None:
    p = BatchParams()
    assert p.digest() == PINNED["default"]
    assert p.run_digest({"segmenter": "builtin"}) == PINNED["default_run"]
    assert p.segmentation_digest({"segmenter": "builtin"}) == PINNED["default_segmentation"]
    assert BatchParams(("tissue",)).digest() == PINNED["tissue_only"]
    c = BatchParams(classify='{"kind": "rules"}', anndata=True, spatialdata=True)
    assert c.digest() == PINNED["classified"]
    assert c.segmentation_digest({}) == PINNED["classified_segmentation"]


@pytest.mark.usefixtures("pinned_version")
def test_a_changed_option_changes_the_digest() -> None:
    other = BatchParams(tissue_options=TissueOptions(target_mpp=4.0))
    assert other.digest() != PINNED["default"]
    assert BatchParams(nuclei_options=NucleiOptions(tile_size_um=256)).digest() != PINNED["default"]


def test_needs_are_added_in_table_order() -> None:
    assert with_needs(["nuclei"]) == ("tissue", "nuclei")
    assert BatchParams(("nuclei",)).tasks == ("tissue", "nuclei")
    assert BatchParams(("tissue",)).tasks == ("tissue",)
    for spec in TASK_TABLE:  # a task's needs come before it
        assert all(TASK_NAMES.index(n) < TASK_NAMES.index(spec.name) for n in spec.needs)
    with pytest.raises(ValueError, match="expected some of"):
        BatchParams(("cells",))
    with pytest.raises(ValueError, match="expected one of"):
        task("cells")


def test_every_task_has_its_options_in_the_params() -> None:
    p = BatchParams()
    for spec in TASK_TABLE:
        if spec.recorded_always:
            assert isinstance(p.options_of(spec.name), spec.options)
            assert spec.name in p.as_dict()
    with pytest.raises(ValueError, match="tissue_options: expected a TissueOptions"):
        BatchParams(tissue_options=NucleiOptions())  # type: ignore[arg-type]


def test_flags_and_api_come_from_the_table() -> None:
    assert _flags.FLAG_NAMES[("TissueOptions", "target_mpp")] == "--tissue-mpp"
    assert _flags.FLAG_NAMES[("NucleiOptions", "target_mpp")] == "--nuclei-mpp"
    assert task("tissue").function() is napari_slidescope.detect_tissue
    assert task("nuclei").function() is napari_slidescope.segment_nuclei
    assert task("nuclei").result_type() is napari_slidescope.NucleiResult


def test_clear_slide_removes_every_task_output(tmp_path) -> None:
    for spec in TASK_TABLE:
        for name in spec.files:
            (tmp_path / name).write_text("x")
        for name in spec.folders:
            (tmp_path / name).mkdir()
            (tmp_path / name / "zarr.json").write_text("{}")
    (tmp_path / "keep.txt").write_text("mine")
    outputs.clear_slide(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
