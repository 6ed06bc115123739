"""A run started in the viewer (widget or console) segments at the one resolution rule."""

import pytest
from tests.fakes import ThresholdSegmenter

pytestmark = pytest.mark.gui


class Fine(ThresholdSegmenter):
    target_mpp = 0.25


#: (slide µm/px, segmenter, working µm/px worked out by hand): the segmenter's own when it
#: is coarser than the slide, else the slide's own pixel size, unrounded
CASES = [
    (0.25, ThresholdSegmenter, 0.5),  # a 0.5 µm/px model on a 0.25 µm/px slide
    (0.499, Fine, 0.499),  # a 0.25 µm/px model on a 0.499 µm/px slide
]


@pytest.mark.parametrize("slide_mpp, segmenter, expected", CASES)
def test_session_runs_segment_at_the_rule_resolution(
    make_napari_viewer, tmp_path, qtbot, slide_mpp, segmenter, expected
):
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope._qt import session
    from napari_slidescope.sample_data import write_sample_slide

    path = tmp_path / "slide.svs"
    write_sample_slide(path, shape=(512, 512), mpp=slide_mpp, seed=4, tile=128)
    viewer = make_napari_viewer()
    [image] = viewer.open(str(path), plugin="napari-slidescope")
    ctl = session.session_for(viewer)
    ctl.run(
        image,
        "nuclei",
        region=(0, 0, 512, 512),
        nuclei_run={"segmenter": segmenter(), "workers": 1},
    )
    qtbot.waitUntil(lambda: not ctl.busy, timeout=60_000)
    assert ctl.outcome.state == "done", ctl.outcome.error
    canvas = canvas_of(viewer.layers[f"{image.name} nuclei"])
    assert canvas.identity["mpp"] == pytest.approx(expected)
    ds = expected / slide_mpp  # labels at the working resolution, on level-0 pixels
    assert canvas.downsample == pytest.approx((ds, ds))
