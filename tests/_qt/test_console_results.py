"""The console helpers find the slide's results whatever layer is active (issue: after
add_nuclei on a multichannel slide the tissue layer was active, and summary() returned None
and classify() looked at the last channel)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.sample_cells import make_multiplex

pytestmark = pytest.mark.gui


@pytest.fixture
def multiplex_path(tmp_path):
    return make_multiplex(seed=3, shape=(256, 256)).write(tmp_path / "mx.ome.tif")


def test_summary_and_classify_find_the_nuclei_whatever_is_active(
    make_napari_viewer, multiplex_path
):
    from napari_slidescope.viewer import add_nuclei, add_slide, add_tissue, classify, summary

    viewer = make_napari_viewer()
    layers = add_slide(viewer, multiplex_path)
    assert len(layers if isinstance(layers, list) else [layers]) >= 1
    channels = [ly for ly in viewer.layers if "slidescope" in ly.metadata]
    assert len(channels) > 1  # one layer per channel: the last one is not the nuclear one
    dapi = next(ly for ly in channels if "DAPI" in ly.name)
    viewer.layers.selection.active = dapi
    add_tissue(viewer, scope="slide")
    viewer.layers.selection.active = dapi
    add_nuclei(viewer, segmenter="builtin-fluorescence", target_mpp=0.5)
    assert f"{dapi.name} nuclei" in viewer.layers
    for active in (f"{dapi.name} tissue", f"{dapi.name} nuclei", channels[-1].name):
        if active not in viewer.layers:
            continue
        viewer.layers.selection.active = viewer.layers[active]
        if active == channels[-1].name:  # a slide layer selected: that slide, as before
            assert summary(viewer) is None
            continue
        found = summary(viewer)
        assert found is not None and found.count > 0, active
    viewer.layers.selection.active = viewer.layers[f"{dapi.name} tissue"]
    result = classify(viewer, markers={"CD3": "auto"})
    assert result.count == summary(viewer, dapi).count


def test_several_slides_with_nuclei_say_which_is_used(make_napari_viewer):
    from napari_slidescope._napari.jobs import slide_with_results

    viewer = make_napari_viewer()
    rgb = np.zeros((64, 64, 3), np.uint8)
    a = viewer.add_image(rgb, name="a", rgb=True)
    b = viewer.add_image(rgb, name="b", rgb=True)
    viewer.add_labels(np.zeros((64, 64), np.int32), name="a nuclei")
    viewer.add_labels(np.zeros((64, 64), np.int32), name="b nuclei")
    viewer.add_points(name="notes")
    with pytest.warns(SlidescopeWarning, match="2 slides have nuclei: using 'b'"):
        assert slide_with_results(viewer, "nuclei") is b
    viewer.layers.selection.active = viewer.layers["a nuclei"]
    assert slide_with_results(viewer, "nuclei") is a


def test_whole_slide_nuclei_on_a_slide_smaller_than_a_chunk(make_napari_viewer, multiplex_path):
    """The whole-slide label pyramid of a 256 px slide had one level, which napari cannot
    show as a multiscale layer (add_nuclei failed in napari's transform)."""
    from napari_slidescope.viewer import add_nuclei, add_slide

    viewer = make_napari_viewer()
    add_slide(viewer, multiplex_path)
    dapi = next(ly for ly in viewer.layers if "DAPI" in ly.name)
    viewer.layers.selection.active = dapi
    nuclei = add_nuclei(viewer, scope="slide", segmenter="builtin-fluorescence", target_mpp=0.5)
    assert nuclei.multiscale
    assert nuclei.name == f"{dapi.name} nuclei"
    assert len(nuclei.data) >= 2
