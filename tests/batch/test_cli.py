"""The `slidescope batch` command: exit status, messages, SIGKILL and resume, damaged slides."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from tests.batch_setup import cli, sigkill_then_resume, summary

from napari_slidescope import analyze_slides

TILE_UM = 128.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["batch", "{slides}", "-o", "{out}", "--bogus"], "unrecognized arguments: --bogus"),
        (["batch", "{empty}", "-o", "{out}"], "no slides found"),
        (["batch", "{slides}", "-o", "{file}"], "{file}"),
        (["batch", "{slides}", "-o", "{out}", "--segmenter", "nope"], "unknown name 'nope'"),
        (["batch", "{slides}", "-o", "{out}", "--tile-size-um", "-3"], "positive number"),
        (["batch", "{slides}", "-o", "{out}", "--workers", "2", "--scheduler", "x"], "not allowed"),
    ],
)
def test_bad_usage_exits_2_with_one_line(slides, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("not a folder")
    names = {"slides": slides, "out": tmp_path / "out", "empty": tmp_path / "empty"}
    names["file"] = tmp_path / "file"
    res = cli(*[a.format(**names) for a in args])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert message.format(**names) in lines[0]
    assert "Traceback" not in res.stderr


def test_help_documents_every_option_with_default():
    res = cli("batch", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for option in ("--tasks", "--segmenter", "--workers", "--scheduler", "--resume"):
        assert option in text
    assert "--nuclei-mpp UM nuclei working resolution" in text
    assert "[µm/px]" in text
    assert "--tile-size-um UM" in text
    assert "[µm] (default: 512)" in text
    assert "installed, else built-in); registered: builtin," in text
    assert "(default: auto; the manifest records which ran)" in text
    # every registered segmenter, from the registry (the -fluorescence ones too)
    from napari_slidescope.segmenters import registered_segmenters

    listed = text.split("--segmenter NAME", 1)[1].split("(default: auto;", 1)[0]
    for name in registered_segmenters():
        assert f" {name}," in listed or f" {name} " in listed, name
    assert "builtin-fluorescence" in listed
    assert "instanseg-fluorescence" in listed
    assert "--dashboard" in text
    assert "--verbose" in text


def test_damaged_slide_fails_alone_exit_1(client, slides, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    os.link(slides / "b.svs", folder / "good.svs")
    (folder / "bad.svs").write_bytes(b"II*\x00" + os.urandom(4000))
    out = tmp_path / "out"
    res = cli(
        "batch", folder, "-o", out, "--tasks", "tissue", "--scheduler", client.scheduler.address
    )
    assert res.returncode == 1, res.stderr
    rows = summary(out)
    assert rows["good.svs"]["status"] == "done"
    assert float(rows["good.svs"]["tissue_area_mm2"]) > 0
    assert rows["bad.svs"]["status"] == "failed"
    assert "bad.svs" in rows["bad.svs"]["error"]
    assert "FAILED bad.svs" in res.stderr + res.stdout
    manifest = json.loads((out / "bad.svs" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["error"] == rows["bad.svs"]["error"]
    assert (out / "good.svs" / "tissue.geojson").is_file()


def test_sigkill_mid_run_then_resume_gives_the_same_tables(client, slides, tmp_path):
    got, want = sigkill_then_resume(slides / "a.svs", "a.svs", client, tmp_path, TILE_UM)
    assert got.equals(want)
    assert got.schema.metadata[b"slidescope"] == want.schema.metadata[b"slidescope"]


def _corrupt_tile(path, truth):
    """Zero the start of one level-0 JPEG tile with tissue, past the file's first MiB.

    Returns a function that puts the bytes back. The file keeps its size and
    modification time and its first MiB (what the batch's stamp looks at), as a
    transient read error would: only the tile fails to decode.
    """
    import numpy as np
    import tifffile

    mtime = path.stat().st_mtime_ns
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        offsets, counts = page.dataoffsets, page.databytecounts
        per_row = -(-page.imagewidth // page.tilewidth)
        th = page.tilelength
    d = truth.downsample
    candidates = [
        k
        for k, off in enumerate(offsets)
        if off > 2**20
        and truth.tissue_mask[
            (k // per_row) * th // d : (k // per_row + 1) * th // d,
            (k % per_row) * th // d : (k % per_row + 1) * th // d,
        ].mean()
        > 0.9
    ]
    k = candidates[len(candidates) // 2]
    with open(path, "r+b") as fh:
        fh.seek(offsets[k])
        original = fh.read(counts[k])
        fh.seek(offsets[k])
        fh.write(bytes(16))
    os.utime(path, ns=(mtime, mtime))

    def repair():
        with open(path, "r+b") as fh:
            fh.seek(offsets[k])
            fh.write(original)
        os.utime(path, ns=(mtime, mtime))

    assert np.any(truth.tissue_mask)
    return repair


def test_slide_failing_part_way_then_resumed_after_repair(client, slides, tmp_path):
    from napari_slidescope.sample_data import write_sample_slide

    folder = tmp_path / "in"
    folder.mkdir()
    os.link(slides / "b.svs", folder / "good.svs")
    path = folder / "c.svs"
    # 2.3 MB: half its level-0 tiles lie past the first MiB
    truth = write_sample_slide(path, shape=(3072, 3072), mpp=0.5, seed=7, tile=128)
    repair = _corrupt_tile(path, truth)
    out = tmp_path / "out"
    res = cli(
        "batch", folder, "-o", out, "--tile-size-um", 2 * TILE_UM, "--segmenter", "builtin",
        "--no-progress", "--scheduler", client.scheduler.address,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    rows = summary(out)
    assert rows["good.svs"]["status"] == "done"
    assert int(rows["good.svs"]["nuclei"]) > 0
    bad = rows["c.svs"]
    assert bad["status"] == "failed"
    assert str(path) in bad["error"], bad["error"]
    assert "cannot decode pixels" in bad["error"], bad["error"]
    manifest = json.loads((out / "c.svs" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["error"] == bad["error"]
    done = [i for i, t in manifest["tiles"].items() if t["status"] == "done"]
    assert 0 < len(done) < len(manifest["tiles"])  # it failed part-way
    assert len(list((out / "c.svs" / "parts").glob("tile-*.parquet"))) == len(done)

    repair()
    first = []
    rows = analyze_slides(
        path,
        out,
        tile_size_um=2 * TILE_UM,
        client=client,
        segmenter="builtin",
        resume=True,
        progress=lambda s: first.append(s.tiles_done) if not first else None,
    )
    assert rows[0]["status"] == "done"
    assert first == [len(done)]  # the finished tiles were kept, only the rest redone
    ref = tmp_path / "ref"
    analyze_slides(path, ref, tile_size_um=2 * TILE_UM, client=client, segmenter="builtin")
    got = pq.read_table(out / "c.svs" / "nuclei.parquet").sort_by("id")
    want = pq.read_table(ref / "c.svs" / "nuclei.parquet").sort_by("id")
    assert got.num_rows > 0
    assert got.equals(want)


@pytest.fixture
def port_8787_taken():
    """dask's default dashboard port, held as another cluster's dashboard would hold it."""
    import socket

    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", 8787))
        sock.listen()
    except OSError:  # already taken by something else: as good
        pass
    yield
    sock.close()


def test_terminal_one_line_per_slide_once_per_note_no_port_warning(
    slides, tmp_path, port_8787_taken
):
    folder = tmp_path / "in"
    folder.mkdir()
    os.link(slides / "b.svs", folder / "good.svs")
    (folder / "notes.svs").write_text("this is not a slide\n")
    out = tmp_path / "out"
    env = {**os.environ, "SLIDESCOPE_MODELS": str(tmp_path / "no-models")}
    args = ["batch", folder, "-o", out, "--tile-size-um", 2 * TILE_UM, "--workers", "2"]
    res = cli(*args, "--no-progress", env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    text = res.stdout + res.stderr
    failed = [line for line in text.splitlines() if "notes.svs" in line]
    assert failed == [
        f"FAILED notes.svs: SlideError: {folder / 'notes.svs'}: "
        + failed[0].split(f"{folder / 'notes.svs'}: ", 1)[1]
    ], text
    assert "Traceback" not in text
    assert "Compute Failed" not in text
    assert "already in use" not in text
    assert "dashboard" not in text.lower()
    assert text.count("SegmenterInfoWarning") == 1, text  # once per run, not per worker
    rows = summary(out)
    assert rows["good.svs"]["status"] == "done"
    assert rows["notes.svs"]["status"] == "failed"
    assert rows["good.svs"]["path"] == str(folder / "good.svs")  # absolute
    assert "Traceback" in json.loads((out / "notes.svs" / "manifest.json").read_text())["traceback"]

    res = cli(*args, "--no-progress", "--resume", "--verbose", "--dashboard", env=env)
    text = res.stdout + res.stderr
    assert "kept   good.svs (finished earlier)" in text
    assert "done   good.svs" not in text
    assert "Traceback" in text  # --verbose: the traceback
    assert "FAILED notes.svs" in text
    dashboards = [line for line in text.splitlines() if line.startswith("dashboard: ")]
    assert len(dashboards) == 1
    assert dashboards[0].startswith("dashboard: http://127.0.0.1:")
    assert ":8787/" not in dashboards[0]
    assert "already in use" not in text
