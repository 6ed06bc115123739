"""Shared fixtures: the shared test slides and small synthetic slides written per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTDATA_ENV = "SLIDESCOPE_TESTDATA"


@pytest.fixture(scope="session")
def testdata() -> Path:
    """Folder of the shared real slides; skips when $SLIDESCOPE_TESTDATA is unset."""
    root = os.environ.get(TESTDATA_ENV)
    if not root:
        pytest.skip(f"{TESTDATA_ENV} is not set")
    path = Path(root)
    if not path.is_dir():
        pytest.fail(f"{TESTDATA_ENV}={root} is not a folder")
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
