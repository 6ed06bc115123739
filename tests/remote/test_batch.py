"""`slidescope batch` from URLs: workers open the slides themselves, resume uses store stamps."""

from __future__ import annotations

import json

import pytest
from tests.batch_setup import cli, process_cluster, sigkill_then_resume, summary, write_two_slides

from napari_slidescope import analyze_slides

TILE_UM = 128.0


@pytest.fixture(scope="module")
def cohort(remote_server, tmp_path_factory):
    """Two small synthetic slides served over HTTP (their own server)."""
    folder = write_two_slides(tmp_path_factory.mktemp("cohort"))
    with remote_server.serve(folder) as server:
        yield folder, server


@pytest.fixture(scope="module")
def client():
    """``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` and its client."""
    with process_cluster() as c:
        yield c


def test_cli_workers_2_from_urls_equals_local(cohort, tmp_path):
    folder, server = cohort
    out, ref = tmp_path / "out", tmp_path / "ref"
    urls = [server.url("a.svs"), server.url("b.svs") + "?token=s3cr3t"]
    res = cli("batch", *urls, "-o", out, "--tasks", "tissue", "--workers", 2, "--no-progress")
    assert res.returncode == 0, res.stderr
    analyze_slides([folder / "a.svs", folder / "b.svs"], ref, tasks=["tissue"], workers=1)
    got, want = summary(out), summary(ref)
    assert set(got) == {"a.svs", "b.svs"}
    for name in got:
        assert got[name]["status"] == "done"
        assert got[name]["tissue_area_mm2"] == want[name]["tissue_area_mm2"]
        assert got[name]["path"] == server.url(name)  # no token
        a = json.loads((out / name / "tissue.geojson").read_text())
        b = json.loads((ref / name / "tissue.geojson").read_text())
        assert a == b
    manifest = json.loads((out / "b.svs" / "manifest.json").read_text())
    assert manifest["slide_stamp"]["etag"]
    text = "".join(p.read_text() for p in out.rglob("*.json")) + res.stdout + res.stderr
    assert "s3cr3t" not in text


def test_missing_url_fails_alone(cohort, client, tmp_path):
    _, server = cohort
    rows = analyze_slides(
        [server.url("a.svs"), server.url("gone.svs")],
        tmp_path / "out",
        tasks=["tissue"],
        client=client,
    )
    status = {r["slide"]: r for r in rows}
    assert status["a.svs"]["status"] == "done"
    assert status["gone.svs"]["status"] == "failed"
    assert server.url("gone.svs") in status["gone.svs"]["error"]
    assert "404" in status["gone.svs"]["error"]


def test_s3_prefix_with_storage_options(s3, served, client, tmp_path):
    import s3fs

    options, prefix, secret = s3
    fs = s3fs.S3FileSystem(**options)
    batch = prefix.replace("cohort/", "batch/")
    fs.put_file(str(served / "sample.svs"), batch + "sample.svs")
    rows = analyze_slides(
        [batch], tmp_path / "out", tasks=["tissue"], client=client, storage_options=options
    )
    assert [(r["slide"], r["status"]) for r in rows] == [("sample.svs", "done")]
    ref = analyze_slides(served / "sample.svs", tmp_path / "ref", tasks=["tissue"], client=client)
    assert rows[0]["tissue_area_mm2"] == ref[0]["tissue_area_mm2"]
    manifest = (tmp_path / "out" / "sample.svs" / "manifest.json").read_text()
    assert json.loads(manifest)["slide_stamp"]["etag"]
    assert secret not in manifest


def test_sigkill_mid_run_then_resume_from_url_equals_uninterrupted(cohort, client, tmp_path):
    _, server = cohort
    got, want = sigkill_then_resume(server.url("a.svs"), "a.svs", client, tmp_path, TILE_UM)
    assert got.equals(want)


def test_resume_redoes_an_object_whose_etag_changed(remote_server, client, tmp_path):
    """Resume keeps a slide whose store stamp is unchanged and redoes one that changed."""
    import shutil

    from napari_slidescope.sample_data import write_sample_slide

    folder = tmp_path / "web"
    folder.mkdir()
    write_sample_slide(folder / "c.svs", shape=(1024, 1024), mpp=0.5, seed=7, tile=128)
    out = tmp_path / "out"
    with remote_server.serve(folder) as server:
        url = server.url("c.svs")
        first = analyze_slides(url, out, tasks=["tissue"], client=client)
        stamp = json.loads((out / "c.svs" / "manifest.json").read_text())["slide_stamp"]
        kept = analyze_slides(url, out, tasks=["tissue"], client=client, resume=True)
        assert kept == first
        seen: list[int] = []
        write_sample_slide(folder / "new.svs", shape=(1024, 1024), mpp=0.5, seed=8, tile=128)
        shutil.move(folder / "new.svs", folder / "c.svs")  # same name, new content
        again = analyze_slides(
            url,
            out,
            tasks=["tissue"],
            client=client,
            resume=True,
            progress=lambda s: seen.append(s.slides_done),
        )
    new_stamp = json.loads((out / "c.svs" / "manifest.json").read_text())["slide_stamp"]
    assert new_stamp["etag"] != stamp["etag"]
    assert again[0]["status"] == "done"
    assert again[0]["tissue_area_mm2"] != first[0]["tissue_area_mm2"]


def test_output_to_a_url_is_a_usage_error(cohort, tmp_path):
    _, server = cohort
    res = cli(
        "batch", server.url("a.svs"), "-o", "s3://bucket/out", "--tasks", "tissue", cwd=tmp_path
    )
    assert res.returncode == 2
    assert "writing outputs to a URL is not supported" in res.stderr
    assert not (tmp_path / "s3:").exists()


def test_bad_storage_options_is_a_usage_error(cohort, tmp_path):
    _, server = cohort
    args = ["batch", server.url("a.svs"), "-o", "x", "--storage-options", "{not json"]
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert "--storage-options: not valid JSON" in res.stderr
