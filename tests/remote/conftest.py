"""Real servers on 127.0.0.1 for the remote-slide tests: HTTP with ranges, and moto's S3.

Both serve the shared slides (read where they lie, never copied into the repository)
and a small synthetic slide.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = [
    "CMU-1-Small-Region.svs",
    "TCGA-CR-7395-01A-01-TS1.svs",
    "test3-DAPI-2-387.ndpi",
    "small_vectra.qptiff",
]
BUCKET = "slides"
SECRET = "very-secret-key-123"


@pytest.fixture(scope="session")
def remote_server():
    """The module ``tests/remote_server.py``."""
    from tests import remote_server

    return remote_server


@pytest.fixture(scope="session")
def served(testdata: Path, tmp_path_factory: pytest.TempPathFactory):
    """A folder of links to the shared slides and a synthetic 2048 x 3072 slide."""
    from napari_slidescope.sample_data import write_sample_slide

    folder = tmp_path_factory.mktemp("served")
    for name in SHARED:
        (folder / name).symlink_to(testdata / name)
    write_sample_slide(folder / "sample.svs", shape=(2048, 3072), mpp=0.5, seed=1, tile=128)
    return folder


@pytest.fixture(scope="session")
def http(remote_server, served):
    """The range-capable HTTP server over :func:`served`; reset before each use."""
    server = remote_server.serve(served)
    yield server
    server.close()


@pytest.fixture
def web(http):
    """:func:`http`, with no delay, no fault and an empty log."""
    http.reset()
    yield http
    http.reset()


@pytest.fixture(scope="session")
def s3(remote_server, served, tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 server on 127.0.0.1 with the served slides in bucket ``slides``.

    Returns ``(storage options s3fs needs, "s3://slides/cohort/", the secret key)``.
    """
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs (the 'remote' extra) is not installed")
    import os

    import boto3
    from moto.server import ThreadedMotoServer

    home = tmp_path_factory.mktemp("aws")
    saved = {k: os.environ.get(k) for k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")}
    os.environ["AWS_CONFIG_FILE"] = str(home / "config")  # never the user's ~/.aws
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(home / "credentials")
    port = remote_server.free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "key": "testing",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key=SECRET,
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(served.iterdir()):
        with open(path, "rb") as fh:
            client.put_object(Bucket=BUCKET, Key=f"cohort/{path.name}", Body=fh.read())
    yield options, f"s3://{BUCKET}/cohort/", SECRET
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def dicomweb_server(dicom_slides):
    """A DICOMweb server (``tests/dicomweb_server.py``) over the wsidicomizer fixtures."""
    pytest.importorskip("dicomweb_client")
    from tests import dicomweb_server

    server = dicomweb_server.serve(list(dicom_slides.values()))
    yield server
    server.close()


@pytest.fixture
def dicomweb(dicomweb_server):
    """:func:`dicomweb_server` with no fault, no token and an empty log."""
    dicomweb_server.reset()
    yield dicomweb_server
    dicomweb_server.reset()
