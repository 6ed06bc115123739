"""OME-Zarr and DICOM WSI from real servers on 127.0.0.1 (HTTP with ranges, moto's S3)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.slide import SlideError, open_slide


def _same(remote, local) -> None:
    assert remote.format == local.format
    assert remote.backend == local.backend
    assert remote.mpp == local.mpp
    assert remote.axes == local.axes
    assert remote.level_shapes == local.level_shapes
    for i, (a, b) in enumerate(zip(remote.levels, local.levels, strict=True)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"level {i}"


@pytest.fixture(scope="module")
def zarr_folder(slide_writers, tmp_path_factory):
    folder = tmp_path_factory.mktemp("zarr")
    for version in ("0.4", "0.5"):
        slide_writers.write_ngff(
            folder / f"v{version}.ome.zarr",
            slide_writers.rgb_planes((300, 500)),
            version=version,
            mpp=(0.5, 0.5),
            chunks=64,
        )
    return folder


@pytest.fixture(scope="module")
def bucket(s3):
    """A second bucket, ``formats``, on the tests' moto server; returns (options, put)."""
    import boto3

    options, _, secret = s3
    client = boto3.client(
        "s3",
        endpoint_url=options["client_kwargs"]["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key=secret,
    )
    client.create_bucket(Bucket="formats")

    def put(folder, prefix):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(folder).as_posix()}"
                client.put_object(Bucket="formats", Key=key, Body=path.read_bytes())
        return f"s3://formats/{prefix}"

    return options, put


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ome_zarr_over_http(remote_server, zarr_folder, version):
    pytest.importorskip("aiohttp", reason="aiohttp (the 'remote' extra) is not installed")
    with remote_server.serve(zarr_folder) as server:
        url = server.url(f"v{version}.ome.zarr")
        with open_slide(url) as remote, open_slide(zarr_folder / f"v{version}.ome.zarr") as local:
            _same(remote, local)
            assert remote.metadata["path"] == url


def test_ome_zarr_on_s3(bucket, zarr_folder):
    options, put = bucket
    url = put(zarr_folder / "v0.5.ome.zarr", "zarr/v0.5.ome.zarr")
    with open_slide(url, storage_options=options) as remote:
        with open_slide(zarr_folder / "v0.5.ome.zarr") as local:
            _same(remote, local)


def test_missing_ome_zarr_over_http(remote_server, tmp_path):
    pytest.importorskip("aiohttp", reason="aiohttp (the 'remote' extra) is not installed")
    with remote_server.serve(tmp_path) as server:
        url = server.url("absent.zarr")
        with pytest.raises(SlideError) as info:
            open_slide(url)
        assert url in str(info.value)


def test_dicom_folder_on_s3(bucket, dicom_slides):
    options, put = bucket
    folder = dicom_slides["CMU-1-Small-Region.svs"]
    url = put(folder, "dicom/cmu")
    with open_slide(url, storage_options=options) as remote, open_slide(folder) as local:
        _same(remote, local)
        assert set(remote.associated) == set(local.associated)


def test_s3_prefix_without_slide(bucket, tmp_path):
    options, put = bucket
    (tmp_path / "readme.txt").write_text("no slide here")
    url = put(tmp_path, "empty")
    with pytest.raises(SlideError, match="no DICOM instance") as info:
        open_slide(url, storage_options=options)
    assert "s3://formats/empty" in str(info.value)
    assert options["secret"] not in str(info.value)


def test_bif_stitched_over_http(remote_server, slide_writers, tmp_path):
    levels, _, _ = slide_writers.write_bif(tmp_path / "overlap.bif", overlap=(8, 12))
    with remote_server.serve(tmp_path) as server:
        with open_slide(server.url("overlap.bif")) as slide:
            assert slide.level_shapes == [a.shape[:2] for a in levels]
            for i, (got, want) in enumerate(zip(slide.levels, levels, strict=True)):
                assert np.array_equal(np.asarray(got), want), f"level {i}"
