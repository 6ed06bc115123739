"""Damaged tiles in the viewer: blank only with one notification and a red outline.

Copies of a shared slide (and a synthetic one) with a few level-0 tiles damaged the
ways the hostile corpus damages them (tests/slide/test_hostile_corpus.py builds the same
cases for the API): random bytes and a 0 byte count. Run under xvfb-run.
"""

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile

pytestmark = pytest.mark.gui

SHOTS = os.environ.get("SLIDESCOPE_SHOTS")  # a folder to keep the screenshots in


def _damage(src: Path, dst: Path, *, random: tuple[int, ...], zero_count: tuple[int, ...]):
    shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        page = tif.pages[0]
        offsets, counts = page.dataoffsets, page.databytecounts
        tag = page.tags["TileByteCounts"]
        bo, voff, typ = tif.byteorder, tag.valueoffset, int(tag.dtype)
    fmt = bo + {3: "H", 4: "I", 16: "Q"}[typ]
    raw = bytearray(dst.read_bytes())
    rng = np.random.default_rng(7)
    for k in random:
        raw[offsets[k] : offsets[k] + counts[k]] = rng.integers(
            0, 256, counts[k], np.uint8
        ).tobytes()
    for k in zero_count:
        struct.pack_into(fmt, raw, voff + k * struct.calcsize(fmt), 0)
    dst.write_bytes(bytes(raw))
    return dst


def _records():
    from napari.utils.notifications import notification_manager

    return notification_manager.records


def _show(viewer, qtbot, center_px, mpp, screen_px_per_px=1.0, until=None):
    """Move the camera, then let napari slice and report; `until`: wait for it (60 s max)."""
    from napari_slidescope._napari.viewport import camera_of

    camera = camera_of(viewer)
    camera.center = (center_px[0] * mpp, center_px[1] * mpp)
    camera.zoom = screen_px_per_px / mpp
    if until is not None:  # slicing, then the queued damage report: slow on a busy machine
        qtbot.waitUntil(lambda: bool(until()), timeout=60_000)
    qtbot.wait(300)  # and anything queued behind it (a second notification would show)


def test_damaged_tiles_are_outlined_and_notified_once(
    make_napari_viewer, shared_file, qtbot, tmp_path
):
    from napari_slidescope._napari.damage import DAMAGE_KEY

    src = shared_file("CMU-1-Small-Region.svs")
    path = _damage(src, tmp_path / "damaged-cmu.svs", random=(1, 2), zero_count=(10,))
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(900, 700)
    before = len(_records())
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    mpp = layer.scale[0]

    def reported():
        overlays = [ly for ly in viewer.layers if DAMAGE_KEY in ly.metadata]
        notes = [r for r in _records()[before:] if "damaged-cmu.svs" in str(r.message)]
        return layer.data_level == 0 and overlays and len(overlays[0].data) >= 3 and notes

    _show(viewer, qtbot, (240, 360), mpp, until=reported)
    assert layer.data_level == 0
    overlays = [ly for ly in viewer.layers if DAMAGE_KEY in ly.metadata]
    assert len(overlays) == 1
    overlay = overlays[0]
    assert overlay.name == "damaged-cmu.svs damaged tiles"
    assert viewer.layers.selection.active is layer  # the overlay does not take the focus
    boxes = set(zip(overlay.features["rows"], overlay.features["cols"], strict=True))
    assert boxes == {("0:240", "240:480"), ("0:240", "480:720"), ("240:480", "0:240")}
    assert set(overlay.features["level"]) == {0}
    assert any("byte count is 0" in r for r in overlay.features["reason"])
    # the rectangles sit on the tiles, in level-0 px shown at the image's scale
    np.testing.assert_allclose(overlay.scale, layer.scale)
    corners = np.concatenate(overlay.data)
    assert corners.min() == pytest.approx(-0.5)
    notes = [str(n.message) for n in _records()[before:]]
    ours = [n for n in notes if "damaged-cmu.svs" in n]
    assert len(ours) == 1, notes
    assert "level 0" in ours[0]
    assert "rows 0:240 cols 240:480" in ours[0]
    assert "outlined in red" in ours[0]
    shot = viewer.screenshot(canvas_only=True, flash=False)
    if SHOTS:
        from skimage.io import imsave

        imsave(Path(SHOTS) / "damaged_tiles.png", shot, check_contrast=False)
        window = viewer.screenshot(canvas_only=False, flash=False)
        imsave(Path(SHOTS) / "damaged_tiles_window.png", window, check_contrast=False)
    rgb = shot[..., :3].astype(int)
    red = (rgb[..., 0] > 120) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)
    assert red.mean() > 0.02  # the outlined tiles are on screen
    # panning over more damage adds outlines, never a second notification
    count = len(overlay.data)
    _show(viewer, qtbot, (1200, 1100), mpp)
    assert len([n for n in _records()[before:] if "damaged-cmu.svs" in str(n.message)]) == 1
    assert len(overlay.data) >= count
    # removing the slide removes its outlines
    viewer.layers.remove(layer)
    assert not [ly for ly in viewer.layers if DAMAGE_KEY in ly.metadata]


def test_reopening_a_damaged_file_notifies_again(make_napari_viewer, small_slide, qtbot, tmp_path):
    path = _damage(small_slide, tmp_path / "again.svs", random=(0,), zero_count=())
    for _ in range(2):
        viewer = make_napari_viewer(show=True)
        before = len(_records())
        [layer] = viewer.open(str(path), plugin="napari-slidescope")

        def ours(before=before):
            return [n for n in _records()[before:] if "again.svs" in str(n.message)]

        _show(viewer, qtbot, (64, 64), layer.scale[0], 2.0, until=ours)
        ours = ours()
        assert len(ours) == 1
        viewer.close()


def test_unknown_codec_at_level_0_is_refused_in_the_viewer(
    make_napari_viewer, small_slide, tmp_path
):
    from napari_slidescope import SlideError

    path = tmp_path / "codec.svs"
    shutil.copyfile(small_slide, path)
    with tifffile.TiffFile(path) as tif:
        voff = tif.pages[0].tags["Compression"].valueoffset
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, voff, 34999)
    path.write_bytes(bytes(raw))
    viewer = make_napari_viewer()
    with pytest.raises(SlideError, match=r"codec\.svs: is damaged: level 0: .*codec 34999"):
        from napari_slidescope._napari.reader import read_slide

        read_slide(str(path))
    assert not list(viewer.layers)
