""" "Add (skip duplicates)" adds only runs that compute the same thing; others replace."""

import pytest
from tests.fakes import FAKE_MODEL as MODEL
from tests.fakes import FakeLearned

pytestmark = pytest.mark.gui


def test_add_mode_never_mixes_models_or_resolutions(
    make_napari_viewer, small_slide, qtbot, monkeypatch
):
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope._qt import session
    from napari_slidescope.segmenters import register_segmenter, registry

    monkeypatch.setitem(registry._REGISTRY, "instanseg", registry._REGISTRY["instanseg"])
    register_segmenter("instanseg", FakeLearned, identity=lambda: dict(MODEL))
    viewer = make_napari_viewer()
    [image] = viewer.open(str(small_slide), plugin="napari-slidescope")
    ctl = session.session_for(viewer)

    def run(box, **opts):
        ctl.run(image, "nuclei", region=box, mode="add", nuclei_run={"workers": 1, **opts})
        qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
        assert ctl.outcome.state == "done", ctl.outcome.error
        return canvas_of(viewer.layers[f"{image.name} nuclei"])

    first = run((0, 0, 512, 512))  # "auto": the learned model, as installed
    assert first.identity["segmenter"] == "instanseg"
    assert first.identity["weights_sha256"] == MODEL["weights_sha256"]
    assert first.identity["mpp"] == 0.5
    assert first.identity["stain_mode"] == "brightfield"
    # the same identity: added, the earlier area kept
    canvas = run((0, 512, 512, 1024))
    assert canvas.regions == [(0, 0, 512, 512), (0, 512, 512, 1024)]
    # another model file now ("auto" resolves to another model): replaced, never mixed
    monkeypatch.setitem(MODEL, "weights_sha256", "cd" * 32)
    canvas = run((512, 0, 1024, 512))
    assert canvas.regions == [(512, 0, 1024, 512)]
    assert canvas.identity["weights_sha256"] == "cd" * 32
    assert (canvas.table()["centroid_row"] >= 512 - 8).all()  # only the new run's nuclei
    # another working resolution: replaced too
    canvas = run((512, 512, 1024, 1024), target_mpp=1.0)
    assert canvas.regions == [(512, 512, 1024, 1024)]
    assert canvas.identity["mpp"] == 1.0
