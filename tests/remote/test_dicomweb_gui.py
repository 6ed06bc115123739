"""A DICOMweb series in a real viewer: the layer, and the widget's analysis (xvfb)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.gui_fixtures import find_tissue_in_dock

pytestmark = pytest.mark.gui

pytest.importorskip("wsidicom")


def test_viewer_opens_a_dicomweb_series_and_the_widget_analyses_it(
    make_napari_viewer, dicomweb, dicom_slides, qtbot
):
    from napari_slidescope.slide import open_slide

    study, series = dicomweb.series()["CMU-1-Small-Region_svs"]
    url = dicomweb.url(study, series)
    viewer = make_napari_viewer(show=True)
    [layer] = viewer.open(url, plugin="napari-slidescope")
    assert layer.metadata["path"] == url
    with open_slide(dicom_slides["CMU-1-Small-Region.svs"]) as local:
        assert tuple(layer.scale) == pytest.approx(local.mpp)
        got = np.asarray(layer.data[0][:300, :400]) if layer.multiscale else layer.data[:300, :400]
        assert np.array_equal(np.asarray(got), np.asarray(local.levels[0][:300, :400]))
    find_tissue_in_dock(viewer, layer, qtbot, timeout_ms=120_000)
    assert any(ly is not layer for ly in viewer.layers)
