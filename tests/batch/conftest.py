"""Small synthetic slides and one dask.distributed cluster shared by a test module."""

from __future__ import annotations

import pytest
from tests.batch_setup import process_cluster, write_two_slides


@pytest.fixture(scope="package")
def slides(tmp_path_factory):
    """Two small synthetic H&E slides (0.5 µm/px, 3 levels) in one folder."""
    return write_two_slides(tmp_path_factory.mktemp("slides"))


@pytest.fixture(scope="module")
def client():
    """``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` and its client."""
    with process_cluster() as c:
        yield c
