"""Every network failure is a SlideError naming the URL and the problem, in bounded time."""

from __future__ import annotations

import numpy as np
import pytest
from tests.remote_server import fails_within_bound

from napari_slidescope.slide import SlideError, open_slide


def _fails(call) -> SlideError:
    """Run `call`; it must raise a SlideError within the hang guard's bound."""
    exc = fails_within_bound(call)
    assert isinstance(exc, SlideError), repr(exc)
    return exc


def _open(url: str, **kwargs):
    return open_slide(url, timeout=1, **kwargs)


@pytest.fixture(autouse=True)
def _few_retries(monkeypatch):
    monkeypatch.setenv("SLIDESCOPE_REMOTE_RETRIES", "2")


def test_refused_connection(remote_server):
    url = f"http://127.0.0.1:{remote_server.free_port()}/a.svs"
    err = _fails(lambda: _open(url))
    assert url in str(err)
    assert "connection refused" in str(err)


@pytest.mark.parametrize(("fault", "word"), [("403", "HTTP 403"), ("404", "404")])
def test_status_errors_are_not_retried(web, fault, word):
    web.fault = fault
    err = _fails(lambda: _open(web.url("sample.svs")))
    assert word in str(err)
    assert web.url("sample.svs") in str(err)
    assert "attempts" not in str(err)  # not transient: no retry


def test_missing_file_names_the_url(web):
    err = _fails(lambda: _open(web.url("missing.svs")))
    assert web.url("missing.svs") in str(err)
    assert "404" in str(err)


def test_cut_mid_body(web):
    web.fault = "cut"
    err = _fails(lambda: _open(web.url("sample.svs")))
    assert "mid-response" in str(err)
    assert "after 3 attempts" in str(err)


def test_stall_past_the_timeout(web):
    web.fault = "stall"
    err = _fails(lambda: _open(web.url("sample.svs")))
    assert "timeout (1 s)" in str(err)
    assert web.url("sample.svs") in str(err)


def test_a_silent_server_fails_within_one_timeout(web):
    """A server that accepts and never answers is not asked again (retries would multiply
    the wait: 4 x 30 s by default): the open's first round of requests is never sent
    again. (A stall after the server has answered is retried: see the test below.)"""
    web.fault = "stall"
    err = _fails(lambda: _open(web.url("sample.svs")))
    assert "attempts" not in str(err)
    assert "SLIDESCOPE_REMOTE_TIMEOUT" in str(err)
    assert web.log and len(set(web.log)) == len(web.log), web.log


def test_transient_cut_is_retried_and_pixels_are_right(web, served):
    web.fault, web.flaky = "flaky", 2
    with open_slide(web.url("sample.svs"), timeout=5) as remote:
        web.fault, web.flaky = "flaky", 2
        a = np.asarray(remote.levels[1])
    with open_slide(served / "sample.svs") as local:
        assert np.array_equal(a, np.asarray(local.levels[1]))


@pytest.mark.parametrize("fault", ["404", "cut", "stall"])
def test_failure_while_reading_tiles_raises_even_in_blank_mode(web, fault):
    """A viewport whose tiles cannot be fetched is an error, never black tiles."""
    slide = _open(web.url("sample.svs"), on_error="blank")
    try:
        web.fault = fault
        err = _fails(lambda: np.asarray(slide.levels[0][0:1024, 0:1024]))
        assert web.url("sample.svs") in str(err)
        web.fault = None  # and nothing stale was cached: the same read now succeeds
        pixels = np.asarray(slide.levels[0][0:1024, 0:1024])
        assert pixels.any()
    finally:
        slide.close()


def test_credentials_never_in_the_message(web):
    url = web.url("missing.svs").replace("http://", "http://user:hunter22@") + "?token=s3cr3t"
    err = _fails(lambda: _open(url))
    assert "hunter22" not in str(err)
    assert "s3cr3t" not in str(err)
    assert web.url("missing.svs") in str(err)


def test_s3_missing_key_and_secret_not_shown(s3):
    options, prefix, secret = s3
    err = _fails(lambda: _open(prefix + "nothing.svs", storage_options=options))
    assert prefix + "nothing.svs" in str(err)
    assert "not found" in str(err) or "404" in str(err)
    assert secret not in str(err)
