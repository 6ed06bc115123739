"""A slide opened from a URL in a real viewer: the layer, and the widget's analysis (xvfb)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.gui_fixtures import find_tissue_in_dock

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """tests/remote_server.py serving a small synthetic slide on 127.0.0.1."""
    from tests import remote_server as module

    from napari_slidescope.sample_data import write_sample_slide

    folder = tmp_path_factory.mktemp("web")
    write_sample_slide(folder / "web.svs", shape=(1024, 1536), mpp=0.5, seed=2, tile=128)
    with module.serve(folder) as srv:
        yield srv, folder / "web.svs"


def test_viewer_opens_a_url_and_the_widget_analyses_it(make_napari_viewer, server, qtbot):
    srv, local = server
    url = srv.url("web.svs") + "?token=s3cr3t"
    viewer = make_napari_viewer(show=True)
    [layer] = viewer.open(url, plugin="napari-slidescope")
    assert layer.name == "web.svs"
    assert layer.multiscale
    assert layer.metadata["path"] == srv.url("web.svs")  # no token
    assert tuple(layer.scale) == pytest.approx((0.5, 0.5))
    from napari_slidescope.slide import open_slide

    with open_slide(local) as slide:
        assert np.array_equal(np.asarray(layer.data[1]), np.asarray(slide.levels[1]))
    find_tissue_in_dock(viewer, layer, qtbot)
    assert any(ly.name.startswith("web.svs") and ly is not layer for ly in viewer.layers)
    assert all("s3cr3t" not in ly.name for ly in viewer.layers)
