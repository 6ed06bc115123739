"""Small synthetic slides for the tile tests (written once per session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tile_slide_path(tmp_path_factory: pytest.TempPathFactory):
    """A 2048 x 2560 synthetic H&E slide at 0.25 µm/px (levels 1, 4, 16) with glass around."""
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path_factory.mktemp("tiles") / "sample.svs"
    write_sample_slide(path, shape=(2048, 2560), mpp=0.25, seed=3, tile=128)
    return path
