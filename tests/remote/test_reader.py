"""The npe2 reader, the launcher's check and the console helper take URLs."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope._napari.reader import get_reader, read_slide
from napari_slidescope._qt.launcher import EXIT_BAD_PATH, check_path, main
from napari_slidescope.slide import SlideError, open_slide


def test_reader_claims_slide_urls_only(web):
    assert get_reader(web.url("sample.svs")) is read_slide
    assert get_reader(web.url("sample.svs") + "?token=abc") is read_slide
    assert get_reader(web.url("notes.txt")) is None
    assert web.log == []  # claimed by name: no request


def test_reader_layer_from_http_equals_local(web, served):
    [(data, kwargs, kind)] = get_reader(web.url("sample.svs"))(web.url("sample.svs"))
    assert kind == "image"
    assert kwargs["name"] == "sample.svs"
    assert kwargs["multiscale"]
    assert kwargs["rgb"]
    assert kwargs["metadata"]["path"] == web.url("sample.svs")
    with open_slide(served / "sample.svs") as local:
        assert kwargs["scale"] == tuple(local.mpp)
        for a, b in zip(data, local.levels, strict=True):
            assert np.array_equal(np.asarray(a[:700, 900:1700]), np.asarray(b[:700, 900:1700]))


def test_reader_from_s3_with_storage_options(s3, served):
    options, prefix, _ = s3
    [(data, kwargs, _)] = read_slide(prefix + "sample.svs", storage_options=options)
    with open_slide(served / "sample.svs") as local:
        assert np.array_equal(np.asarray(data[-1]), np.asarray(local.levels[-1]))


def test_reader_error_names_the_url(web):
    with pytest.raises(SlideError, match="404") as info:
        read_slide(web.url("missing.svs"))
    assert web.url("missing.svs") in str(info.value)


def test_launcher_checks_a_url(web):
    assert check_path(web.url("sample.svs")) is None
    problem = check_path(web.url("missing.svs"))
    assert problem is not None
    assert web.url("missing.svs") in problem
    assert "404" in problem


def test_launcher_exits_2_naming_a_bad_url(web, capsys):
    url = web.url("missing.svs").replace("http://", "http://me:pw1234@")
    assert main([url]) == EXIT_BAD_PATH
    err = capsys.readouterr().err
    assert web.url("missing.svs") in err
    assert "pw1234" not in err


def test_launcher_exits_2_for_an_unknown_scheme(capsys):
    assert main(["nosuch://host/a.svs"]) == EXIT_BAD_PATH
    assert "unknown URL scheme 'nosuch'" in capsys.readouterr().err
