"""An object replaced on the server while a slide is open: never bytes of two files.

A remote slide remembers its object's ETag at open; every later ranged read asks for it
(If-Match) and checks the answer's ETag, so a replaced object gives a SlideError instead
of tiles cut from the new file at the old file's offsets.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from napari_slidescope.slide import SlideError, open_slide

BOX_BEFORE = (0, 0, 256, 256)
BOX_AFTER = (1024, 1536, 1400, 1900)  # tiles not read (nor cached) before the change


@pytest.fixture
def folder(tmp_path):
    from napari_slidescope.sample_data import write_sample_slide

    write_sample_slide(tmp_path / "a.svs", shape=(2048, 3072), mpp=0.5, seed=1, tile=128)
    write_sample_slide(tmp_path / "b.svs", shape=(2048, 3072), mpp=0.5, seed=2, tile=128)
    shutil.copyfile(tmp_path / "a.svs", tmp_path / "slide.svs")
    return tmp_path


def _replace(folder) -> None:
    """Put b.svs under the served name (a new modification time, so a new ETag)."""
    target = folder / "slide.svs"
    before = target.stat().st_mtime_ns
    shutil.copyfile(folder / "b.svs", folder / "new.svs")
    os.replace(folder / "new.svs", target)
    if target.stat().st_mtime_ns == before:  # a coarse clock: make the change visible
        os.utime(target, ns=(before + 10**9, before + 10**9))


@pytest.mark.parametrize("kind", ["if-match", "etag-checked", "weak-etag"])
def test_http_object_replaced_mid_session(remote_server, folder, kind):
    with remote_server.serve(folder) as server:
        server.ignore_if_match = kind == "etag-checked"
        server.weak_etags = kind == "weak-etag"  # no If-Match sent: the answer's ETag checked
        url = server.url("slide.svs")
        with open_slide(url) as slide, open_slide(folder / "a.svs") as a:
            np.testing.assert_array_equal(slide.read_region(BOX_BEFORE), a.read_region(BOX_BEFORE))
            _replace(folder)
            with pytest.raises(SlideError, match="changed on the server since it was opened") as e:
                slide.read_region(BOX_AFTER)
            assert url in str(e.value)
            # what was read before the change is still the old file's
            np.testing.assert_array_equal(slide.read_region(BOX_BEFORE), a.read_region(BOX_BEFORE))
        with open_slide(url) as again, open_slide(folder / "b.svs") as b:  # reopened: new
            np.testing.assert_array_equal(again.read_region(BOX_AFTER), b.read_region(BOX_AFTER))


def test_http_blank_mode_raises_too(remote_server, folder):
    with remote_server.serve(folder) as server:
        with open_slide(server.url("slide.svs"), on_error="blank") as slide:
            slide.read_region(BOX_BEFORE)
            _replace(folder)
            with pytest.raises(SlideError, match="changed on the server"):
                slide.read_region(BOX_AFTER)


def test_s3_object_replaced_mid_session(s3, folder):
    import boto3

    options, prefix, secret = s3
    client = boto3.client(
        "s3",
        endpoint_url=options["client_kwargs"]["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key=secret,
    )
    bucket, key = prefix[len("s3://") :].split("/", 1)
    key += "changing.svs"
    client.put_object(Bucket=bucket, Key=key, Body=(folder / "a.svs").read_bytes())
    url = f"s3://{bucket}/{key}"
    with open_slide(url, storage_options=options) as slide, open_slide(folder / "a.svs") as a:
        np.testing.assert_array_equal(slide.read_region(BOX_BEFORE), a.read_region(BOX_BEFORE))
        client.put_object(Bucket=bucket, Key=key, Body=(folder / "b.svs").read_bytes())
        with pytest.raises(SlideError, match="changed on the server since it was opened") as e:
            slide.read_region(BOX_AFTER)
        assert url in str(e.value)
        assert secret not in str(e.value)
