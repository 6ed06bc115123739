"""DICOM WSI from a DICOMweb server on 127.0.0.1 (QIDO-RS, WADO-RS metadata and frames).

The server (``tests/dicomweb_server.py``) serves the folders wsidicomizer converted from
the shared SVS and NDPI; every level read over DICOMweb equals the local folder's.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tests.remote_server import fails_within_bound

from napari_slidescope.slide import SlideError, open_slide

pytest.importorskip("wsidicom")

TOKEN = "secret-token-4321"


@pytest.fixture(autouse=True)
def _few_retries(monkeypatch):
    monkeypatch.setenv("SLIDESCOPE_REMOTE_RETRIES", "1")
    monkeypatch.delenv("SLIDESCOPE_DICOMWEB_TOKEN", raising=False)


def _url(server, name: str) -> str:
    study, series = server.series()[name.replace(".", "_")]
    return server.url(study, series)


def _fails(call) -> SlideError:
    """Run `call`; it must raise a SlideError within the hang guard's bound."""
    exc = fails_within_bound(call)
    assert isinstance(exc, SlideError), repr(exc)
    return exc


@pytest.mark.parametrize("name", ["CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi"])
def test_every_level_equals_the_local_folder(dicomweb, dicom_slides, name):
    url = _url(dicomweb, name)
    with open_slide(url) as remote, open_slide(dicom_slides[name]) as local:
        assert remote.format == local.format == "dicom"
        assert remote.backend == "dicom"
        assert str(remote.path) == url
        assert remote.mpp == local.mpp
        assert remote.calibration_source == "DICOM PixelSpacing"
        assert remote.axes == local.axes
        assert remote.level_shapes == local.level_shapes
        assert set(remote.associated) == set(local.associated)
        for key in remote.associated:
            assert np.array_equal(remote.associated[key], local.associated[key]), key
        for i, (a, b) in enumerate(zip(remote.levels, local.levels, strict=True)):
            assert np.array_equal(np.asarray(a), np.asarray(b)), f"level {i}"


def test_a_read_fetches_its_tiles_in_one_request(dicomweb, dicom_slides):
    with open_slide(_url(dicomweb, "test3-DAPI-2-387.ndpi")) as slide:
        dicomweb.log.clear()
        region = slide.read_region((0, 0, 1024, 1024))
        frames = [p for p, _ in dicomweb.log if "/frames/" in p]
        assert len(frames) == 1
        assert frames[0].count(",") >= 3
        with open_slide(dicom_slides["test3-DAPI-2-387.ndpi"]) as local:
            assert np.array_equal(region, local.read_region((0, 0, 1024, 1024)))


def test_a_study_url_opens_its_only_series(dicomweb, dicom_slides):
    study, _ = dicomweb.series()["CMU-1-Small-Region_svs"]
    with open_slide(dicomweb.url(study)) as slide:
        with open_slide(dicom_slides["CMU-1-Small-Region.svs"]) as local:
            assert slide.level_shapes == local.level_shapes


def test_reader_layers_from_a_dicomweb_url(dicomweb, dicom_slides):
    from napari_slidescope._napari.reader import get_reader

    url = _url(dicomweb, "test3-DAPI-2-387.ndpi")
    reader = get_reader(url)
    assert reader is not None  # claimed by its scheme: no request
    assert dicomweb.log == []
    [(data, kwargs, kind)] = reader(url)
    assert kind == "image"
    assert kwargs["multiscale"]
    assert kwargs["metadata"]["path"] == url
    with open_slide(dicom_slides["test3-DAPI-2-387.ndpi"]) as local:
        assert kwargs["scale"] == tuple(local.mpp)
        assert len(data) == len(local.levels)
        assert np.array_equal(np.asarray(data[-1]), np.asarray(local.levels[-1]))


def test_token_from_storage_options_or_the_environment(dicomweb, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)  # dicomweb-client, urllib3 and wsidicom log requests
    url = _url(dicomweb, "CMU-1-Small-Region.svs")
    dicomweb.token = TOKEN
    exc = _fails(lambda: open_slide(url))
    assert url in str(exc)
    assert "401" in str(exc)
    with open_slide(url, storage_options={"token": TOKEN}) as slide:
        assert slide.level_shapes == [(2967, 2220)]
    monkeypatch.setenv("SLIDESCOPE_DICOMWEB_TOKEN", TOKEN)
    with open_slide(url) as slide:
        assert slide.level_shapes == [(2967, 2220)]
    assert {auth for _, auth in dicomweb.log} <= {None, f"Bearer {TOKEN}"}
    assert "GET" in caplog.text  # never in a log
    assert TOKEN not in caplog.text


def test_credentials_never_in_messages(dicomweb):
    url = _url(dicomweb, "CMU-1-Small-Region.svs")
    dicomweb.fault = "403"
    secret = url.replace("dicomweb+http://", "dicomweb+http://me:pw98765@")
    exc = _fails(lambda: open_slide(secret, timeout=1))
    assert url in str(exc)
    assert "403" in str(exc)
    assert "pw98765" not in str(exc)
    exc = _fails(lambda: open_slide(url, storage_options={"token": TOKEN}, timeout=1))
    assert TOKEN not in str(exc)


def test_refused_connection(remote_server):
    port = remote_server.free_port()
    url = f"dicomweb+http://127.0.0.1:{port}/dicomweb/studies/1.2.3/series/4.5.6"
    exc = _fails(lambda: open_slide(url, timeout=1))
    assert url in str(exc)
    assert "refused" in str(exc)


def test_unknown_study_is_404_naming_the_url(dicomweb):
    url = dicomweb.url("1.2.3.4", "5.6.7.8")
    exc = _fails(lambda: open_slide(url, timeout=1))
    assert url in str(exc)
    assert "404" in str(exc)


def test_unknown_series_holds_no_slide(dicomweb):
    study, _ = dicomweb.series()["CMU-1-Small-Region_svs"]
    url = dicomweb.url(study, "9.9.9.9")
    exc = _fails(lambda: open_slide(url, timeout=1))
    assert url in str(exc)
    assert "no DICOM instance" in str(exc)


def test_stall_past_the_timeout(dicomweb):
    url = _url(dicomweb, "CMU-1-Small-Region.svs")
    dicomweb.fault = "stall"
    exc = _fails(lambda: open_slide(url, timeout=1))
    assert url in str(exc)
    assert "timeout" in str(exc)


@pytest.mark.parametrize("fault", ["404", "503"])
def test_failure_while_reading_raises_even_in_blank_mode(dicomweb, fault):
    with open_slide(_url(dicomweb, "test3-DAPI-2-387.ndpi"), on_error="blank", timeout=1) as s:
        dicomweb.fault = fault
        exc = _fails(lambda: s.read_region((2000, 2000, 2600, 2600)))
        assert fault in str(exc)
        assert str(s.path) in str(exc)
        exc = _fails(lambda: s.read_region((4000, 3000, 4100, 3100)))  # one tile
        assert fault in str(exc)


def test_bad_dicomweb_urls():
    with pytest.raises(SlideError, match="not a DICOMweb slide URL"):
        open_slide("dicomweb+http://127.0.0.1:1/dicomweb/series/1.2")
    with pytest.raises(SlideError, match="do not apply to a DICOMweb URL"):
        open_slide(
            "dicomweb+http://127.0.0.1:1/dicomweb/studies/1/series/2",
            storage_options={"anon": True},
        )


def test_stamp_names_the_series_instances(dicomweb):
    from napari_slidescope.slide.remote import stat_remote
    from napari_slidescope.slide.source import resolve

    a = stat_remote(resolve(_url(dicomweb, "CMU-1-Small-Region.svs")))
    b = stat_remote(resolve(_url(dicomweb, "test3-DAPI-2-387.ndpi")))
    assert a == stat_remote(resolve(_url(dicomweb, "CMU-1-Small-Region.svs")))
    assert a["etag"] != b["etag"]
    assert a["size"] == 0


def test_a_dicomweb_url_is_no_file(dicomweb):
    url = _url(dicomweb, "CMU-1-Small-Region.svs")
    with pytest.raises(SlideError, match="is a DICOMweb series") as info:
        open_slide(url, backend="tifffile")
    assert url in str(info.value)


def test_a_server_that_lists_no_transfer_syntax(dicomweb, dicom_slides):
    dicomweb.list_syntaxes = False  # wsidicom asks for frame 1 in the syntaxes it prefers
    with open_slide(_url(dicomweb, "test3-DAPI-2-387.ndpi")) as remote:
        with open_slide(dicom_slides["test3-DAPI-2-387.ndpi"]) as local:
            assert remote.level_shapes == local.level_shapes
            assert np.array_equal(np.asarray(remote.levels[-1]), np.asarray(local.levels[-1]))


def test_tiles_our_cache_dropped_are_read_again(dicomweb, dicom_slides):
    # wsidicom keeps the frames' bytes in its own cache: when it holds every frame of a
    # burst it asks its client for none, which must not become a request for ".../frames/"
    # (answered 404: the read failed once the decoded-tile cache had dropped the tiles)
    from napari_slidescope.slide.cache import tile_cache

    with open_slide(_url(dicomweb, "CMU-1-Small-Region.svs")) as slide:
        first = slide.read_region((0, 0, 600, 600))
        tile_cache().clear()
        dicomweb.log.clear()
        again = slide.read_region((0, 0, 600, 600))
        assert not [p for p, _ in dicomweb.log if p.rstrip("/").endswith("frames")]
    assert np.array_equal(first, again)
    with open_slide(dicom_slides["CMU-1-Small-Region.svs"]) as local:
        assert np.array_equal(again, local.read_region((0, 0, 600, 600)))
