"""Atomic writes: a reader sees the old file or the new one, never half of one."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from napari_slidescope import _io
from napari_slidescope._io import atomic_copy, atomic_write, is_writable_folder

SRC = str(Path(__file__).parents[1] / "src")


def _no_temps(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_writes_and_replaces(tmp_path):
    target = tmp_path / "a.bin"
    with atomic_write(target) as fh:
        fh.write(b"one")
    with atomic_write(target) as fh:
        fh.write(b"two")
    assert target.read_bytes() == b"two"
    assert _no_temps(tmp_path)


def test_text_mode_and_permissions(tmp_path):
    target = tmp_path / "a.txt"
    with atomic_write(target, "w") as fh:
        fh.write("µm\n")
    assert target.read_text(encoding="utf-8") == "µm\n"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_exception_keeps_old_file_and_removes_temp(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target, "w") as fh:
        fh.write("half of the new")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert _no_temps(tmp_path)


def test_exception_with_no_old_file_leaves_none(tmp_path):
    target = tmp_path / "a.txt"
    with pytest.raises(RuntimeError), atomic_write(target, "w") as fh:
        fh.write("half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_missing_folder_names_it(tmp_path):
    folder = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        with atomic_write(folder / "a.txt", "w"):
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses chmod and /proc")
def test_unwritable_folder_names_it(tmp_path):
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    else:  # root writes into any folder of a disk, but not into /proc's
        folder = Path("/proc/self")
    try:
        with pytest.raises(OSError, match=f"{folder}.*not writable"):
            with atomic_write(folder / "a.txt", "w"):
                pass
    finally:
        if folder.parent == tmp_path:
            folder.chmod(0o700)
    assert not (folder / "a.txt").exists()


def test_is_writable_folder_on_ordinary_paths(tmp_path):
    assert is_writable_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    assert not is_writable_folder(tmp_path / "missing")
    (tmp_path / "plain.txt").write_text("x")
    assert not is_writable_folder(tmp_path / "plain.txt")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses chmod and /proc")
def test_is_writable_folder_probes_past_the_permission_bits(tmp_path):
    # /proc passes os.access for root, yet takes no new file: only the probe tells
    assert not is_writable_folder("/proc")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        # root may write into a 0o555 folder of a disk, anyone else may not
        assert is_writable_folder(folder) == (os.geteuid() == 0)
    finally:
        folder.chmod(0o755)


def test_is_writable_folder_says_no_when_the_probe_is_refused(tmp_path, monkeypatch):
    def refuse(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(_io, "_probe_write", refuse)  # a read-only share, as seen by root
    assert not is_writable_folder(tmp_path)


def test_a_file_in_place_of_the_folder_names_it(tmp_path):
    not_a_folder = tmp_path / "plain.txt"
    not_a_folder.write_text("x")
    with pytest.raises(OSError, match="plain.txt.*not a folder"):
        with atomic_write(not_a_folder / "a.txt", "w"):
            pass


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        with atomic_write("x", "a"):
            pass


def test_atomic_copy(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    dst = atomic_copy(src, tmp_path / "dst.bin")
    assert dst.read_bytes() == src.read_bytes()


def test_geojson_failure_mid_write_keeps_old_file(tmp_path, monkeypatch):
    from napari_slidescope.analysis import geojson

    target = tmp_path / "t.geojson"
    square = np.array([[0, 0], [0, 10], [10, 10], [10, 0]], float)
    geojson.write_geojson(target, [square])
    before = target.read_bytes()

    def half_dump(obj, fh):
        fh.write('{"type": "FeatureCollection", "features": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(geojson.json, "dump", half_dump)
    with pytest.raises(OSError, match="space"):
        geojson.write_geojson(target, [square, square + 20])
    assert target.read_bytes() == before
    assert json.loads(before)["features"]
    assert _no_temps(tmp_path)


# A child writes through the real exporter, is told to stop half-way (it sleeps
# there), and is killed with SIGKILL: the old file must still be whole.
CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from napari_slidescope.analysis import measure, geojson
    kind, target = sys.argv[1], sys.argv[2]
    if kind == "csv":
        import contextlib
        real, opened = measure.atomic_write, []
        @contextlib.contextmanager
        def keep(*args, **kwargs):
            with real(*args, **kwargs) as fh:
                opened.append(fh)
                yield fh
        def stall(done, total):  # half the rows written (in chunks): stop there
            if done == 5000:
                opened[0].flush()
                print("ready", flush=True)
                time.sleep(60)
        measure.atomic_write = keep
        measure.write_csv(
            {"a": np.arange(10000.0), "b": np.arange(10000.0)}, target, chunk=1000, progress=stall
        )
    elif kind == "geojson":
        real = geojson.json.dump
        def slow(obj, fh):
            text = __import__("json").dumps(obj)
            fh.write(text[: len(text) // 2])
            fh.flush()
            print("ready", flush=True)
            time.sleep(60)
        geojson.json.dump = slow
        sq = np.array([[0, 0], [0, 10], [10, 10], [10, 0]], float)
        geojson.write_geojson(target, [sq + i for i in range(200)])
    elif kind == "raw":
        from napari_slidescope._io import atomic_write
        with atomic_write(target) as fh:
            fh.write(b"x" * (1 << 20))
            fh.flush()
            print("ready", flush=True)
            time.sleep(60)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
@pytest.mark.parametrize("kind", ["raw", "csv", "geojson"])
@pytest.mark.parametrize("existing", [True, False])
def test_child_killed_mid_write_leaves_old_file_or_none(tmp_path, kind, existing):
    target = tmp_path / f"out.{kind}"
    if existing:
        target.write_bytes(b"previous complete file")
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
        # the half-written data is on disk, in the temporary file only
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert len(temps) == 1
        assert temps[0].stat().st_size > 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    if existing:
        assert target.read_bytes() == b"previous complete file"
    else:
        assert not target.exists()


def test_one_line_says_what_went_wrong_in_one_line():
    """The one formatter of an exception for users, logs and failure records."""
    from napari_slidescope._io import one_line

    exc = ValueError("bad tile\n   at level 2")
    exc.add_note("while reading a.svs")
    assert one_line(exc) == "bad tile at level 2"
    assert one_line(exc, typed=True) == "ValueError: bad tile at level 2 while reading a.svs"
    assert one_line(RuntimeError()) == "RuntimeError"  # no message: its type
    assert one_line(OSError("x" * 10), limit=5) == "xxxx…"
    assert len(one_line(OSError("y" * 1000), limit=400)) == 400
