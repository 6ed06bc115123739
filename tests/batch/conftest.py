"""Small synthetic slides and one dask.distributed cluster shared by a test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def slides(tmp_path_factory):
    """Two small synthetic H&E slides (0.5 µm/px, 3 levels) in one folder."""
    from napari_slidescope.sample_data import write_sample_slide

    folder = tmp_path_factory.mktemp("slides")
    write_sample_slide(folder / "a.svs", shape=(1024, 1536), mpp=0.5, seed=1, tile=128)
    write_sample_slide(folder / "b.svs", shape=(1024, 1024), mpp=0.5, seed=5, tile=128)
    return folder


@pytest.fixture(scope="module")
def client():
    """``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` and its client."""
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c
