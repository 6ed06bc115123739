"""analyze_slides on a 2-process cluster: the same nuclei as segment_nuclei, files as documented."""

from __future__ import annotations

import csv
import gzip
import json
import os
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely

from napari_slidescope import analyze_slides, segment_nuclei
from napari_slidescope.analysis.measure import COLUMNS
from napari_slidescope.batch.outputs import NUCLEI_COLUMNS, SUMMARY_COLUMNS
from napari_slidescope.options import NucleiOptions, TissueOptions

#: Owned part of a tile, µm: small, so the small slides still have a dozen tiles or more.
TILE_UM = 128.0


@pytest.fixture(scope="module")
def reference(slides):
    """In-process segment_nuclei of each slide, same parameters as the batch."""
    return {
        name: segment_nuclei(
            slides / name,
            segmenter="builtin",  # as the batch runs below
            tissue=True,
            tile_size_um=TILE_UM,
            labels=False,
            workers=1,
        )
        for name in ("a.svs", "b.svs")
    }


@pytest.fixture(scope="module")
def batch_out(client, slides, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    rows = analyze_slides(slides, out, tile_size_um=TILE_UM, client=client, segmenter="builtin")
    return out, rows


def sorted_table(path):
    return pq.read_table(path).sort_by("id")


def test_same_nuclei_as_segment_nuclei(batch_out, reference):
    out, rows = batch_out
    assert [r["slide"] for r in rows] == ["a.svs", "b.svs"]
    for row in rows:
        res = reference[row["slide"]]
        assert row["status"] == "done", row
        assert row["nuclei"] == res.count > 20
        table = pq.read_table(out / row["slide"] / "nuclei.parquet")
        for col in COLUMNS:  # same ids, centroids and measurements, bit for bit
            np.testing.assert_array_equal(
                table.column(col).to_numpy(), res.columns[col], err_msg=col
            )
        polys, ids = res.outlines
        by_id = dict(zip(ids.tolist(), polys, strict=True))
        geoms = table.column("geometry").to_pylist()
        for nid, wkb in zip(table.column("id").to_pylist(), geoms, strict=True):
            xy = np.asarray(shapely.from_wkb(wkb).exterior.coords)
            np.testing.assert_array_equal(xy[:-1, ::-1], by_id[nid])
        assert row["mean_nucleus_area_um2"] == pytest.approx(res.columns["area_um2"].mean())


def test_summary_csv(batch_out):
    out, rows = batch_out
    with open(out / "summary.csv", newline="") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == list(SUMMARY_COLUMNS)
    assert [(g["slide"], g["status"], int(g["nuclei"])) for g in got] == [
        (r["slide"], "done", r["nuclei"]) for r in rows
    ]
    for g in got:
        assert float(g["tissue_area_mm2"]) > 0
        area = float(g["tissue_area_mm2"])
        assert float(g["nuclei_per_mm2"]) == pytest.approx(int(g["nuclei"]) / area, rel=1e-5)


def test_geoparquet_reads_back_with_documented_columns(batch_out, slides):
    out, _ = batch_out
    path = out / "a.svs" / "nuclei.parquet"
    table = pq.read_table(path)
    assert table.column_names == [
        "id",
        "tile",
        *[c for c in COLUMNS if c != "id"],
        "bbox_row0",
        "bbox_col0",
        "bbox_row1",
        "bbox_col1",
        "geometry",
    ]
    assert set(NUCLEI_COLUMNS) <= set(table.column_names)
    meta = table.schema.metadata
    geo = json.loads(meta[b"geo"])
    assert geo["primary_column"] == "geometry"
    assert geo["columns"]["geometry"]["encoding"] == "WKB"
    assert geo["columns"]["geometry"]["geometry_types"] == ["Polygon"]
    info = json.loads(meta[b"slidescope"])
    assert info["slide"] == "a.svs"
    assert info["mpp"] == [0.5, 0.5]
    assert (
        info["parameters"]["nuclei"]
        == NucleiOptions(segmenter="builtin", tile_size_um=TILE_UM).as_dict()
    )
    assert info["parameters"]["tissue"] == TissueOptions().as_dict()
    assert info["software"].startswith("napari-slidescope ")
    assert table.schema.field("area_um2").metadata[b"unit"] == "µm²".encode()
    geoms = shapely.from_wkb(table.column("geometry").to_numpy(zero_copy_only=False))
    assert all(g.geom_type == "Polygon" and g.is_valid for g in geoms)
    # centroids in level-0 px lie inside each outline's bounding box, which lies in the slide
    r, c = table.column("centroid_row").to_numpy(), table.column("centroid_col").to_numpy()
    y0, x0 = table.column("bbox_row0").to_numpy(), table.column("bbox_col0").to_numpy()
    y1, x1 = table.column("bbox_row1").to_numpy(), table.column("bbox_col1").to_numpy()
    assert np.all((y0 <= r) & (r <= y1) & (x0 <= c) & (c <= x1))
    assert y0.min() >= 0
    assert x0.min() >= 0
    assert y1.max() <= 1024
    assert x1.max() <= 1536
    ids = table.column("id").to_numpy()
    assert np.array_equal(ids, np.arange(1, len(ids) + 1))


def test_geojson_is_qupath_detections(batch_out):
    out, rows = batch_out
    with gzip.open(out / "a.svs" / "nuclei.geojson.gz", "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    assert doc["type"] == "FeatureCollection"
    feats = doc["features"]
    assert len(feats) == rows[0]["nuclei"]
    assert len({f["id"] for f in feats}) == len(feats)
    for f in feats:
        assert f["type"] == "Feature"
        assert f["geometry"]["type"] == "Polygon"
        ring = f["geometry"]["coordinates"][0]
        assert len(ring) >= 4
        assert ring[0] == ring[-1]
        props = f["properties"]
        assert props["objectType"] == "detection"
        assert props["classification"]["name"] == "Nucleus"
        assert {"area_um2", "centroid_x_um", "id"} <= set(props["measurements"])
    tissue = json.loads((out / "a.svs" / "tissue.geojson").read_text())
    assert tissue["type"] == "FeatureCollection"
    assert tissue["features"]
    assert {f["properties"]["objectType"] for f in tissue["features"]} == {"annotation"}


def test_manifest_records_slide_parameters_and_tiles(batch_out, slides):
    out, _ = batch_out
    m = json.loads((out / "a.svs" / "manifest.json").read_text())
    st = os.stat(slides / "a.svs")
    assert m["status"] == "done"
    assert m["error"] is None
    assert m["slide_stamp"]["size"] == st.st_size
    assert m["slide_stamp"]["mtime_ns"] == st.st_mtime_ns
    assert len(m["slide_stamp"]["head_sha256"]) == 64
    assert m["parameters"]["nuclei"]["tile_size_um"] == TILE_UM
    assert len(m["parameters_sha256"]) == 64
    assert m["slide_info"]["shape0"] == [1024, 1536]
    tiles = m["tiles"]
    assert len(tiles) == m["plan"]["tiles_with_tissue"] < m["plan"]["tiles_in_plan"]
    assert all(t["status"] == "done" and t["seconds"] > 0 for t in tiles.values())
    assert not (out / "a.svs" / "parts").exists()


def test_worker_killed_mid_run_gives_identical_output(client, slides, batch_out, tmp_path):
    out0, _ = batch_out
    killed = []

    def kill_one(state):
        if not killed and state.tiles_done >= 3:
            pids = client.run(os.getpid)
            pid = sorted(pids.values())[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    rows = analyze_slides(
        slides / "a.svs",
        tmp_path,
        tile_size_um=TILE_UM,
        client=client,
        segmenter="builtin",
        progress=kill_one,
    )
    assert killed, "no worker was killed"
    assert rows[0]["status"] == "done", rows
    assert sorted_table(tmp_path / "a.svs" / "nuclei.parquet").equals(
        sorted_table(out0 / "a.svs" / "nuclei.parquet")
    )
    client.wait_for_workers(2, timeout=60)


def test_resume_keeps_finished_slides(client, slides, tmp_path):
    tissue_only = dict(tasks=["tissue"], client=client, segmenter="builtin")
    analyze_slides(slides / "b.svs", tmp_path, **tissue_only)
    first = (tmp_path / "b.svs" / "tissue.geojson").stat().st_mtime_ns
    seen = []
    rows = analyze_slides(
        slides / "b.svs",
        tmp_path,
        resume=True,
        progress=lambda s: seen.append(s.finished),
        **tissue_only,
    )
    assert rows[0]["status"] == "done"
    assert seen[0]["slide"] == "b.svs"
    assert (tmp_path / "b.svs" / "tissue.geojson").stat().st_mtime_ns == first
    # other parameters: redone even when resuming, never mixed with the old results
    analyze_slides(slides / "b.svs", tmp_path, resume=True, tile_size_um=256, **tissue_only)
    assert (tmp_path / "b.svs" / "tissue.geojson").stat().st_mtime_ns != first
    rows = analyze_slides(
        slides / "b.svs", tmp_path, client=client, segmenter="builtin", tile_size_um=TILE_UM
    )
    assert rows[0]["status"] == "done"
    assert rows[0]["nuclei"] > 0
    assert (tmp_path / "b.svs" / "nuclei.parquet").is_file()


def test_changed_slide_is_redone(client, slides, tmp_path):
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path / "in" / "c.svs"
    path.parent.mkdir()
    write_sample_slide(path, shape=(512, 768), mpp=0.5, seed=3, tile=128)
    out = tmp_path / "out"
    first = analyze_slides(path, out, tasks=["tissue"], client=client, segmenter="builtin")[0]
    write_sample_slide(path, shape=(512, 768), mpp=0.5, seed=4, tile=128)
    again = analyze_slides(
        path, out, tasks=["tissue"], client=client, segmenter="builtin", resume=True
    )[0]
    m = json.loads((out / "c.svs" / "manifest.json").read_text())
    assert m["slide_stamp"]["size"] == path.stat().st_size
    assert again["status"] == "done"
    assert again["tissue_area_mm2"] != first["tissue_area_mm2"]


def test_several_tiles_per_task_same_nuclei(client, slides, reference, tmp_path):
    rows = analyze_slides(
        slides / "b.svs",
        tmp_path,
        tile_size_um=TILE_UM,
        client=client,
        segmenter="builtin",
        tiles_per_task=3,
    )
    table = pq.read_table(tmp_path / "b.svs" / "nuclei.parquet")
    assert rows[0]["nuclei"] == reference["b.svs"].count
    for col in COLUMNS:
        np.testing.assert_array_equal(table.column(col).to_numpy(), reference["b.svs"].columns[col])


def _worker_cache():
    from napari_slidescope.batch import tasks
    from napari_slidescope.slide.cache import tile_cache

    return len(tasks._slides), tile_cache().maxbytes, tile_cache().nbytes


def test_workers_keep_a_small_tile_cache_and_the_client_its_own(batch_out, client, monkeypatch):
    from napari_slidescope.batch import tasks
    from napari_slidescope.slide.cache import default_cache_bytes, tile_cache

    assert tasks.WORKER_CACHE_BYTES < default_cache_bytes()
    # every worker that opened a slide read it through a cache of WORKER_CACHE_BYTES
    opened = [c for c in client.run(_worker_cache).values() if c[0]]
    assert opened
    for _, maxbytes, nbytes in opened:
        assert maxbytes == tasks.WORKER_CACHE_BYTES
        assert 0 <= nbytes <= maxbytes
    # in the user's own process (threads of Client(processes=False), a viewer's console)
    # the tasks leave the process's cache as it is
    monkeypatch.setattr(tasks, "_cache_bounded", False)
    before = tile_cache().maxbytes
    tasks._bound_tile_cache()
    assert tile_cache().maxbytes == before


def test_a_local_cluster_that_does_not_close_in_time_is_left_with_a_warning():
    """Closing the batch's own client and cluster is bounded: past it, a warning, no hang."""
    from napari_slidescope.batch.engine import CLOSE_TIMEOUT_S, close_local
    from napari_slidescope.errors import SlidescopeWarning

    class Stuck:  # what close_local calls of a Client / LocalCluster whose close times out
        def __init__(self):
            self.timeouts = []

        def close(self, timeout=None):
            self.timeouts.append(timeout)
            raise TimeoutError(f"timed out after {timeout} s")

    client, cluster = Stuck(), Stuck()
    with pytest.warns(SlidescopeWarning, match="did not close within 60 s") as seen:
        close_local(client, cluster)
    assert client.timeouts == cluster.timeouts == [CLOSE_TIMEOUT_S]  # both tried, each bounded
    assert [str(w.message).split(" did")[0] for w in seen] == [
        "the batch's local dask client",
        "the batch's local dask cluster",
    ]


def test_a_local_cluster_whose_client_fails_is_closed(monkeypatch):
    """``local_client``: a client that cannot be made does not leave the cluster running."""
    import distributed

    from napari_slidescope.batch import engine

    started = []
    real = engine.local_cluster

    def spy(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    def refuse(cluster, *args, **kwargs):
        raise OSError("no client today")

    monkeypatch.setattr(engine, "local_cluster", spy)
    monkeypatch.setattr(distributed, "Client", refuse)
    with pytest.raises(OSError, match="no client today"):
        engine.local_client(1)
    [cluster] = started
    assert cluster.status.name == "closed"
    assert not cluster.workers
