"""Shared fixtures: the shared test slides and small synthetic slides written per session."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

TESTDATA_ENV = "SLIDESCOPE_TESTDATA"


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
    path = Path(root)
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


def _load_ndpi_writer():
    """The NDPI-like file writer that lives beside this conftest (tests are not a package)."""
    spec = importlib.util.spec_from_file_location(
        "slidescope_ndpi_writer", Path(__file__).with_name("ndpi_writer.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def ndpi_writer():
    """The module ``tests/ndpi_writer.py``: ``write_ndpi(path, levels, band_width=...)``."""
    return _load_ndpi_writer()


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
    spec = importlib.util.spec_from_file_location(
        "slidescope_slide_writers", Path(__file__).with_name("slide_writers.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
