"""The options model in batch: one CLI flag per option, options from the CLI to the workers."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys

import pytest

from napari_slidescope import analyze_slides
from napari_slidescope.options import NucleiOptions, TissueOptions, option_fields


def _batch_parser():
    from napari_slidescope.batch import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["batch"]


def _flag_actions(parser, cls, name):
    dest = f"_{cls.__name__}__{name}"
    return [a for a in parser._actions if a.dest == dest]


@pytest.mark.parametrize("cls", [TissueOptions, NucleiOptions])
def test_every_option_has_exactly_one_flag_with_the_models_default_and_help(cls):
    parser = _batch_parser()
    names = [name for name, _, _ in option_fields(cls)]
    assert names, cls
    for name, default, info in option_fields(cls):
        actions = _flag_actions(parser, cls, name)
        assert len(actions) == 1, (name, actions)
        action = actions[0]
        assert action.default == default, name
        help_text = " ".join(action.help.replace("%%", "%").split())
        assert info.doc in help_text, name
        if info.unit:
            assert f"[{info.unit}]" in help_text, name
        if info.kind == "float" and default is not None:
            assert f"(default: {default:g})" in help_text, name
        elif info.kind == "str":
            assert f"(default: {default}" in help_text, name
        if info.choices:
            assert action.metavar == "{" + ",".join(info.choices) + "}"
    # every field, the special ones too (a channel by index or name, a dict): one flag
    for f in dataclasses.fields(cls):
        actions = _flag_actions(parser, cls, f.name)
        assert len(actions) == 1, f.name
        assert actions[0].default in (f.default, None), f.name


def test_existing_flags_keep_their_names():
    parser = _batch_parser()
    flags = {s for a in parser._actions for s in a.option_strings}
    for flag in (
        "--segmenter",
        "--nuclei-mpp",
        "--tile-size-um",
        "--cell-expansion-um",
        "--tissue-mpp",
        "--min-tissue-um2",
        "--stain",
        "--channel",
    ):
        assert flag in flags, flag


def test_flags_build_the_options():
    from napari_slidescope.batch._flags import options_from_args

    args = _batch_parser().parse_args(
        [
            "x.svs",
            "-o",
            "out",
            "--tissue-mpp",
            "4",
            "--no-reject-artifacts",
            "--min-tissue-um2",
            "1e4",
            "--nuclei-mpp",
            "0.5",
            "--stain",
            "H-DAB",
            "--channel",
            "2",
            "--segmenter-options",
            '{"min_area_um2": 5}',
        ]
    )
    tissue, nuclei = options_from_args(args)
    assert tissue == TissueOptions(target_mpp=4.0, reject_artifacts=False, min_tissue_um2=1e4)
    assert nuclei == NucleiOptions(
        target_mpp=0.5, stain="H-DAB", channel=2, segmenter_options={"min_area_um2": 5}
    )
    args = _batch_parser().parse_args(["x.svs", "-o", "out", "--channel", "DAPI"])
    assert options_from_args(args) == (TissueOptions(), NucleiOptions(channel="DAPI"))


@pytest.mark.parametrize(
    "flag, text, field, value",
    [
        ("--tile-size-um", "-3", "tile_size_um", -3.0),
        ("--stain", "HE", "stain", "HE"),
        ("--min-tissue-um2", "lots", "min_tissue_um2", "lots"),
        ("--tissue-threshold", "1.5", "threshold", 1.5),
    ],
)
def test_bad_option_value_is_the_models_message_as_a_usage_error(
    capsys, tmp_path, flag, text, field, value
):
    from napari_slidescope.batch.cli import main

    cls = TissueOptions if field in {n for n, _, _ in option_fields(TissueOptions)} else None
    with pytest.raises(ValueError) as expected:
        (cls or NucleiOptions)(**{field: value})
    with pytest.raises(SystemExit) as stop:
        main(["batch", str(tmp_path), "-o", str(tmp_path / "out"), flag, text])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"argument {flag}: {expected.value}" in err


def test_keywords_of_today_map_onto_the_options():
    from napari_slidescope.batch.engine import _nuclei_options

    base = NucleiOptions(stain="H&E", tile_size_um=256)
    got = _nuclei_options(
        base, segmenter="builtin", target_mpp=0.5, tile_size_um=None, cell_expansion_um=2
    )
    assert got == NucleiOptions(
        segmenter="builtin", target_mpp=0.5, stain="H&E", tile_size_um=256, cell_expansion_um=2.0
    )
    assert _nuclei_options(None, segmenter=None, target_mpp=None) == NucleiOptions()
    with pytest.raises(ValueError, match="tile_size_um: expected a positive number"):
        _nuclei_options(None, tile_size_um=0)


def test_slide_task_runs_the_nuclei_options(slides):
    """The slide task plans at the options' working resolution, as prepare_nuclei does."""
    from napari_slidescope.batch.params import BatchParams, stamp_slide
    from napari_slidescope.batch.tasks import slide_task
    from napari_slidescope.pipeline.nuclei import prepare_nuclei

    path = slides / "b.svs"
    stamp = stamp_slide(path).key
    for mpp in (None, 1.0):
        options = NucleiOptions(segmenter="builtin", target_mpp=mpp, tile_size_um=128)
        info = slide_task(str(path), stamp, BatchParams(nuclei_options=options))
        own = prepare_nuclei(str(path), segmenter="builtin", target_mpp=mpp, tile_size_um=128)
        assert info.plan["mpp"] == own.plan.mpp
        assert info.plan["tile_size_px"] == own.plan.tile_size
        assert info.resolved["mpp"] == own.plan.mpp
    assert info.plan["mpp"] == 1.0


def _tissue_mm2(path, options):
    from napari_slidescope.pipeline.tissue import detect_tissue
    from napari_slidescope.slide import open_slide

    with open_slide(path) as slide:
        res = detect_tissue(slide, region=(0, 0, *slide.shape0), **options.as_dict())
    return res.area_um2 / 1e6


def test_tissue_options_reach_the_workers(client, slides, tmp_path):
    path = slides / "b.svs"
    options = TissueOptions(target_mpp=16.0, outer_only=True, min_tissue_um2=5e4)
    assert _tissue_mm2(path, options) != pytest.approx(_tissue_mm2(path, TissueOptions()))
    rows = analyze_slides(path, tmp_path, tasks=["tissue"], client=client, tissue_options=options)
    assert rows[0]["status"] == "done", rows
    assert rows[0]["tissue_area_mm2"] == pytest.approx(_tissue_mm2(path, options), rel=1e-9)
    manifest = json.loads((tmp_path / "b.svs" / "manifest.json").read_text())
    assert manifest["parameters"]["tissue"] == options.as_dict()
    assert manifest["resolved"]["tissue_mpp"] == 16.0


def test_tissue_flags_reach_the_workers_from_the_command_line(slides, tmp_path):
    path = slides / "b.svs"
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "napari_slidescope.batch", "batch", str(path), "-o", str(out)]
        + ["--tasks", "tissue", "--workers", "1", "--no-progress"]
        + ["--tissue-mpp", "16", "--outer-only", "--min-tissue-um2", "50000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    options = TissueOptions(target_mpp=16.0, outer_only=True, min_tissue_um2=5e4)
    manifest = json.loads((out / "b.svs" / "manifest.json").read_text())
    assert manifest["parameters"]["tissue"] == options.as_dict()
    with open(out / "summary.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["tissue_area_mm2"]) == pytest.approx(_tissue_mm2(path, options), rel=1e-5)
