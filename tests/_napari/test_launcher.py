"""`napari-slidescope [PATH]`: napari with the slide and the docked widget."""

import napari
import pytest

from napari_slidescope._napari import launcher

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
    with pytest.raises(SystemExit) as exc:
        launcher.main([str(bad)])
    assert exc.value.code == 2
    assert "broken.svs" in capsys.readouterr().err
