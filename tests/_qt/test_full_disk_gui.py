"""The widget's writers on a full disk: settings and exports (run under xvfb-run).

The core writers are tested in tests/slide/test_hostile_corpus.py on the same
size-limited tmpfs; this adds Qt's settings file, written by QSettings.
"""

import errno
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gui

_CORPUS = Path(__file__).parents[1] / "slide" / "test_hostile_corpus.py"


def _corpus():
    """tests/slide/test_hostile_corpus.py, for its tmpfs helpers (tests are no package)."""
    name = "slidescope_hostile_corpus"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _CORPUS)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def full_settings_disk(tmp_path):
    from qtpy.QtCore import QSettings

    corpus = _corpus()
    path = tmp_path / "settings-disk"
    why = corpus._mount_tmpfs(path, "256k")
    if why is not None:
        pytest.skip(why)
    fmt, scope = QSettings.Format.IniFormat, QSettings.Scope.UserScope
    QSettings.setPath(fmt, scope, str(path))
    try:
        yield corpus.Disk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_settings_on_a_full_disk_raise_naming_the_file_and_keep_it(
    make_napari_viewer, full_settings_disk, monkeypatch
):
    from napari_slidescope._qt.settings import settings_store
    from napari_slidescope._qt.widget import SlideAnalysisWidget

    viewer = make_napari_viewer(show=False)
    widget = SlideAnalysisWidget(viewer)
    widget.tile_size_um.value = 256.0  # saved while there is room
    ini = Path(settings_store().fileName())
    before = ini.read_bytes()
    assert b"256" in before
    (full_settings_disk.path / "filler").unlink(missing_ok=True)
    full_settings_disk.fill()
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_warning", shown.append)
    # a change in the widget: one notification naming the file, never a traceback
    widget.tile_size_um.value = 384.0
    widget.tile_size_um.value = 512.0
    assert len(shown) == 1
    assert str(ini) in shown[0]
    assert "not remembered" in shown[0]
    # the API: an OSError naming the file and the cause
    with pytest.raises(OSError) as info:
        widget.save_settings()
    assert info.value.errno == errno.ENOSPC
    assert str(ini) in str(info.value)
    assert "No space left on device" in str(info.value)
    assert ini.read_bytes() == before
    leftovers = [p for p in ini.parent.rglob("*") if p != ini and p.name != "filler"]
    assert all(p.is_dir() for p in leftovers), leftovers


def test_qupath_writer_on_a_full_disk(make_napari_viewer, tmp_path):
    from napari_slidescope._napari.qupath import write_geojson_layers

    corpus = _corpus()
    path = tmp_path / "qupath-disk"
    why = corpus._mount_tmpfs(path, "256k")
    if why is not None:
        pytest.skip(why)
    try:
        viewer = make_napari_viewer(show=False)
        rng = np.random.default_rng(0)
        rings = [rng.random((4, 2)) * 1000 for _ in range(3000)]
        shapes = viewer.add_shapes(rings, shape_type="polygon", name="many")
        target = path / "saved.geojson"

        def write():
            write_geojson_layers(str(target), [shapes.as_layer_data_tuple()])

        corpus._refused(corpus.Disk(path), target, write)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
