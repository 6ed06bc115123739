"""Shared fixtures: the shared test slides and small synthetic slides written per session.

No test reads or writes the user's home: before anything is imported, the session points
``HOME``, the XDG folders, napari's settings file and matplotlib's folder at a temporary
folder (:func:`pytest_configure`), and every test gets a home of its own
(:func:`private_home`): the widget's remembered settings (``QSettings``), the installed
models and the plugin's cache land there (napari's settings file and its icon cache,
which napari locates once per process, stay in the session's temporary home).
``SLIDESCOPE_MODELS`` and ``SLIDESCOPE_TESTDATA``, when set, are read as given (folders a
contributor names).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# the shared helpers' asserts report their operands as a test module's do
pytest.register_assert_rewrite("tests.fakes", "tests.batch_setup")

TESTDATA_ENV = "SLIDESCOPE_TESTDATA"


def home_env(home: Path) -> dict[str, str]:
    """The environment that makes `home` the home folder of everything a test runs."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "NAPARI_CONFIG": str(home / ".config" / "napari" / "settings.yaml"),
        "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
        "SLIDESCOPE_CACHE": str(home / ".cache" / "napari-slidescope"),
    }


def pytest_configure(config: pytest.Config) -> None:
    """Give the session a temporary home before napari, Qt or matplotlib read theirs.

    napari reads its settings path (``NAPARI_CONFIG``, else the user config folder)
    and Qt its settings folder once, when first used; both must be set before that.
    """
    home = Path(tempfile.mkdtemp(prefix="slidescope-test-home-"))
    os.environ.update(home_env(home))
    config.stash[_SESSION_HOME] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's temporary home."""
    home = config.stash.get(_SESSION_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


_SESSION_HOME = pytest.StashKey[Path]()


def _point_qt_settings_at(config_dir: Path) -> None:
    """Move Qt's per-user settings files (the widget's ``QSettings``) to `config_dir`."""
    qtcore = sys.modules.get("qtpy.QtCore")
    if qtcore is None:  # Qt not imported yet: it will read XDG_CONFIG_HOME when it is
        return
    settings = qtcore.QSettings
    for fmt in (settings.Format.IniFormat, settings.Format.NativeFormat):
        settings.setPath(fmt, settings.Scope.UserScope, str(config_dir))


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """A fresh home folder for each test: settings, models and the plugin's cache go there.

    ``XDG_CACHE_HOME`` stays the session's (temporary) one: napari writes its icon
    themes there once per process and shows blank icons if the folder moves.
    """
    home = tmp_path_factory.mktemp("home")
    for name, value in home_env(home).items():
        if name != "XDG_CACHE_HOME":
            monkeypatch.setenv(name, value)
    _point_qt_settings_at(home / ".config")
    return home


@pytest.fixture(scope="session")
def testdata() -> Path:
    """Folder of the shared real slides; skips, naming the path, when there is none.

    A machine without the shared folder (``.ci/run`` points the variable at
    ``../shared/testdata`` whether or not it exists) runs everything else; each test
    that needs a real vendor file says so in the skip reason.
    """
    root = os.environ.get(TESTDATA_ENV)
    if not root:
        pytest.skip(f"{TESTDATA_ENV} is not set")
    path = Path(root).absolute()  # e.g. ../shared/testdata: tests may change folder
    if not path.is_dir():
        pytest.skip(f"{TESTDATA_ENV}={root}: no such folder (the shared real slides)")
    return path


@pytest.fixture(scope="session")
def shared_file(testdata: Path):
    """Return a function giving a shared file's path; fails when the file is missing."""

    def get(name: str) -> Path:
        path = testdata / name
        if not path.is_file():
            pytest.fail(f"{name} is missing from {testdata}")
        return path

    return get


@pytest.fixture(scope="session")
def sample_slide(tmp_path_factory: pytest.TempPathFactory):
    """A small synthetic H&E slide (2048 x 3072 px, 3 levels) and its ground truth."""
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("sample") / "sample.svs"
    truth = write_sample_slide(path, shape=(2048, 3072), mpp=0.5, seed=1, tile=128)
    return path, truth


@pytest.fixture(scope="session")
def ndpi_writer():
    """The module ``tests/ndpi_writer.py``: ``write_ndpi(path, levels, band_width=...)``."""
    from tests import ndpi_writer

    return ndpi_writer


@pytest.fixture(scope="session")
def small_ndpi(tmp_path_factory: pytest.TempPathFactory, ndpi_writer):
    """A 3840 x 2048 NDPI-like file, two levels, one JPEG each with 8 x 1920 px restart bands."""
    level0 = ndpi_writer.textured_rgb((2048, 3840), seed=3)
    level1 = level0.reshape(1024, 2, 1920, 2, 3).mean(axis=(1, 3)).astype("uint8")
    path = tmp_path_factory.mktemp("ndpi") / "small.ndpi"
    return ndpi_writer.write_ndpi(path, [level0, level1], band_width=1920)


@pytest.fixture(scope="session")
def slide_writers():
    """The module ``tests/slide_writers.py``: OME-Zarr, Leica SCN and Ventana BIF writers."""
    from tests import slide_writers

    return slide_writers


#: Shared slides converted to DICOM WSI by :func:`dicom_slides`.
DICOM_SOURCES = ("CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi")


@pytest.fixture(scope="session")
def dicom_slides(shared_file, tmp_path_factory):
    """The shared SVS and NDPI converted to DICOM WSI folders by wsidicomizer.

    wsidicomizer copies the JPEG tiles without re-encoding them (it needs the system's
    libturbojpeg); skips when wsidicomizer is not installed.
    """
    wsidicomizer = pytest.importorskip("wsidicomizer")
    out = {}
    for name in DICOM_SOURCES:
        folder = tmp_path_factory.mktemp("dicom") / name.replace(".", "_")
        wsidicomizer.WsiDicomizer.convert(str(shared_file(name)), str(folder))
        out[name] = folder
    return out
