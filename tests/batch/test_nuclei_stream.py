"""nuclei.parquet / nuclei.geojson.gz written while a slide's tiles finish (batch.nuclei_stream)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from napari_slidescope import analyze_slides
from napari_slidescope.batch import ledger, outputs

TILE_UM = 128.0  # a dozen tiles or more on the small slides


def _run(slides, out, client, **kwargs):
    return analyze_slides(
        slides / "a.svs", out, tile_size_um=TILE_UM, client=client, segmenter="builtin", **kwargs
    )


def _temps(folder):
    return sorted(p.name for p in folder.glob(".nuclei.*.tmp"))


def test_streamed_outputs_are_the_joined_ones_byte_for_byte(client, slides, tmp_path, monkeypatch):
    from napari_slidescope.batch.nuclei_stream import NucleiStream

    added = []
    real_add = NucleiStream._add
    monkeypatch.setattr(NucleiStream, "_add", lambda self, i: (added.append(i), real_add(self, i)))
    early = []  # tiles written into the outputs at each report before the slide's last tile

    def seen(state):
        if state.tiles_done < state.tiles_total:
            early.append(len(added))

    rows = _run(slides, tmp_path / "s", client, progress=seen)
    assert rows[0]["status"] == "done" and rows[0]["nuclei"] > 20
    assert max(early) > 0  # written as the tiles finished, not all at the end
    assert added == sorted(added) and len(added) > 3  # in plan order, each once
    monkeypatch.setattr(ledger.Ledger, "stream_outputs", False)
    joined = _run(slides, tmp_path / "j", client)
    assert joined[0]["nuclei"] == rows[0]["nuclei"]
    for name in ("nuclei.parquet", "nuclei.geojson.gz"):
        streamed = (tmp_path / "s" / "a.svs" / name).read_bytes()
        assert streamed == (tmp_path / "j" / "a.svs" / name).read_bytes(), name
    assert _temps(tmp_path / "s" / "a.svs") == []
    meta = pq.read_metadata(tmp_path / "s" / "a.svs" / "nuclei.parquet")
    assert meta.num_row_groups > 1  # one per tile with nuclei


def test_a_failed_slide_leaves_no_temporary_files_and_its_parts(
    client, slides, tmp_path, monkeypatch
):
    folder = tmp_path / "a.svs"
    real = outputs.write_part
    calls = []

    def failing(slide_dir, tile, digest):
        calls.append(tile.index)
        if len(calls) > 4:
            raise OSError("disk full")
        return real(slide_dir, tile, digest)

    monkeypatch.setattr(outputs, "write_part", failing)
    again = _run(slides, tmp_path, client)
    assert again[0]["status"] == "failed" and "disk full" in again[0]["error"]
    assert _temps(folder) == []
    assert not (folder / "nuclei.parquet").exists()
    # what was done stays for a resumed run
    assert len(list(outputs.parts_dir(folder).glob("tile-*.parquet"))) == 4


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    from napari_slidescope.batch.nuclei_stream import NucleiStream

    (tmp_path / ".nuclei.parquet.0123456789ab.tmp").write_bytes(b"PAR1")
    (tmp_path / ".nuclei.geojson.gz.0123456789ab.tmp").write_bytes(b"\x1f\x8b")
    stream = NucleiStream(tmp_path, file_metadata={}, units={}, feature_ns="x")
    assert len(_temps(tmp_path)) == 2  # its own two
    stream.abort()
    assert _temps(tmp_path) == []
    assert not (tmp_path / "nuclei.parquet").exists()


@pytest.mark.parametrize("nuclei", [False, True])
def test_a_slide_without_tiles_closes_empty_files(tmp_path, nuclei):
    from napari_slidescope.batch.nuclei_stream import NucleiStream

    stream = NucleiStream(tmp_path, file_metadata={}, units={}, feature_ns="x")
    assert stream.advance([], set()) == 0
    summary = stream.close()
    assert summary.nuclei == 0
    assert pq.read_table(tmp_path / "nuclei.parquet").num_rows == 0
    assert _temps(tmp_path) == []
