"""`napari-slidescope [PATH]`: napari with the slide and the docked widget."""

import napari
import pytest

from napari_slidescope._napari.viewport import camera_of
from napari_slidescope._qt import launcher

pytestmark = pytest.mark.gui


@pytest.fixture
def no_event_loop(monkeypatch):
    monkeypatch.setattr(napari, "run", lambda *a, **k: None)
    viewers = []
    real = napari.Viewer

    def viewer(*args, **kwargs):
        kwargs.setdefault("show", False)
        v = real(*args, **kwargs)
        viewers.append(v)
        return v

    monkeypatch.setattr(napari, "Viewer", viewer)
    yield viewers
    for v in viewers:
        v.close()


def test_launcher_opens_slide_and_docks_widget(no_event_loop, sample_slide):
    path, _ = sample_slide
    assert launcher.main([str(path)]) == 0
    [viewer] = no_event_loop
    assert [ly.name for ly in viewer.layers] == [path.name]
    docks = viewer.window.dock_widgets
    assert any("Slide analysis" in name for name in docks)
    assert any("Slide overview" in name for name in docks)


def test_launcher_without_path_opens_the_sample(no_event_loop, sample_slide, monkeypatch):
    from napari_slidescope import sample_data

    path, _ = sample_slide
    monkeypatch.setattr(sample_data, "sample_slide_path", lambda: path)
    assert launcher.main([]) == 0
    [viewer] = no_event_loop
    assert viewer.layers[0].metadata["path"] == str(path)


def test_launcher_names_a_bad_file(no_event_loop, tmp_path, capsys):
    bad = tmp_path / "broken.svs"
    bad.write_bytes(b"not a tiff")
    assert launcher.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "broken.svs" in err
    assert err.count("\n") == 1
    assert no_event_loop == []  # refused before any window was made


def test_launcher_shows_the_scale_bar_and_fits_after_docking(no_event_loop, sample_slide):
    path, _ = sample_slide
    assert launcher.main([str(path)]) == 0
    [viewer] = no_event_loop
    assert launcher.scale_bar_of(viewer).visible
    assert tuple(str(u) for u in viewer.layers[0].units) in (("µm", "µm"), ("micrometer",) * 2)
    camera = camera_of(viewer)
    zoom = camera.zoom
    viewer.reset_view()
    assert camera.zoom == pytest.approx(zoom)  # already fitted to the final canvas


@pytest.mark.parametrize("kind", ["missing", "bad", "directory"])
def test_launcher_exits_2_with_one_line_for_a_bad_path(tmp_path, kind):
    import os
    import subprocess
    import sys

    path = tmp_path / "slide.svs"
    if kind == "bad":
        path.write_bytes(b"II*\x00" + b"\xff" * 64)
    elif kind == "directory":
        path.mkdir()
    code = "import sys; from napari_slidescope._qt.launcher import main; sys.exit(main())"
    for _ in range(3):  # every time, never a crash on the way out
        proc = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "slide.svs" in lines[0], proc.stderr
        assert lines[0].startswith("napari-slidescope: ")
