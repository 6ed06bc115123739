"""Slides read from a real HTTP server and a real S3 server give the local file's pixels."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope.slide import SlideError, open_slide
from napari_slidescope.slide.source import UrlPath, redact, resolve

pytestmark = pytest.mark.filterwarnings("ignore:.*carries no pixel size")

SHARED = [
    "CMU-1-Small-Region.svs",
    "TCGA-CR-7395-01A-01-TS1.svs",
    "test3-DAPI-2-387.ndpi",
    "small_vectra.qptiff",
]


def _same_levels(remote, local) -> None:
    assert remote.format == local.format
    assert remote.mpp == local.mpp
    assert remote.axes == local.axes
    assert len(remote.levels) == len(local.levels)
    for i, (a, b) in enumerate(zip(remote.levels, local.levels, strict=True)):
        assert a.shape == b.shape, i
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"level {i}"


@pytest.mark.parametrize("name", [*SHARED, "sample.svs"])
def test_http_pixels_equal_local_every_level(web, served, name):
    with open_slide(web.url(name)) as remote, open_slide(served / name) as local:
        _same_levels(remote, local)
        assert isinstance(remote.path, UrlPath)
        assert remote.path.name == name
        assert remote.metadata["path"] == web.url(name)
        assert remote.associated.keys() == local.associated.keys()
        for key in local.associated:
            assert np.array_equal(remote.associated[key], local.associated[key])


@pytest.mark.parametrize("name", ["CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi", "sample.svs"])
def test_s3_pixels_equal_local_every_level(s3, served, name):
    options, prefix, _ = s3
    with (
        open_slide(prefix + name, storage_options=options) as remote,
        open_slide(served / name) as local,
    ):
        _same_levels(remote, local)


def test_viewport_fetches_its_tiles_in_one_burst(web):
    """A 1024 x 1024 read of uncached 128-px tiles: ranged GETs only for those tiles."""
    with open_slide(web.url("sample.svs")) as slide:
        opened = len(web.log)
        pixels = slide.read_region((256, 512, 1280, 1536))
        gets = web.log[opened:]
    assert pixels.shape == (1024, 1024, 3)
    assert 0 < len(gets) <= 64  # 8 x 8 tiles, adjacent ones merged into one request
    assert all(method == "GET" and rng is not None for method, _, rng in gets)


def test_region_read_through_a_slice_equals_local(web, served):
    with open_slide(web.url("sample.svs")) as remote, open_slide(served / "sample.svs") as local:
        a = np.asarray(remote.levels[0][100:900, 333:1500])
        b = np.asarray(local.levels[0][100:900, 333:1500])
    assert np.array_equal(a, b)


def test_unknown_scheme_is_a_slide_error_naming_it():
    with pytest.raises(SlideError, match="unknown URL scheme 'nosuch'") as info:
        open_slide("nosuch://host/slide.svs")
    assert "nosuch://host/slide.svs" in str(info.value)


def test_storage_options_with_a_local_path_is_refused(served):
    with pytest.raises(SlideError, match="storage_options apply to URLs only"):
        open_slide(served / "sample.svs", storage_options={"anon": True})


def test_file_url_opens_the_local_file(served):
    with open_slide(f"file://{served / 'sample.svs'}") as slide:
        assert slide.source.is_remote is False
        assert slide.shape0 == (2048, 3072)


def test_redact_strips_credentials_and_tokens():
    url = "https://me:pw@host:8443/dir/a.svs?sig=abc&token=xyz#frag"
    assert redact(url) == "https://host:8443/dir/a.svs"
    source = resolve(url)
    assert source.display == "https://host:8443/dir/a.svs"
    assert source.name == "a.svs"
    text = source.scrub(f"failed for {url} with key abc")
    assert "pw" not in text
    assert "xyz" not in text


def test_open_reads_the_header_in_one_burst_and_stamps_the_object(web):
    """Size, first MiB and last 256 KiB at once; a small slide needs nothing else."""
    with open_slide(web.url("sample.svs")) as slide:
        requests = list(web.log)
        stamp = slide.remote_stamp
    assert len(requests) <= 3
    assert ("GET", "/sample.svs", "bytes=-262144") in requests
    assert stamp is not None
    assert stamp["size"] > 0
    assert stamp["etag"]


def test_local_slide_has_no_remote_stamp(served):
    with open_slide(served / "sample.svs") as slide:
        assert slide.remote_stamp is None
        assert slide.source.is_remote is False


def test_stat_remote_of_an_object_and_of_a_prefix(s3):
    from napari_slidescope.slide.remote import stat_remote

    options, prefix, _ = s3
    obj = stat_remote(resolve(prefix + "sample.svs", options))
    assert obj["size"] > 0
    assert obj["etag"]
    folder = stat_remote(resolve(prefix.rstrip("/"), options))  # an OME-Zarr-like prefix
    assert folder["size"] == 0
