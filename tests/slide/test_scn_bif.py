"""Leica SCN and Ventana BIF: small fixtures written in each vendor's layout.

The layouts follow OpenSlide's format documentation (and its readers, which open the
same fixtures here as an independent check):

* SCN: a BigTIFF whose first ImageDescription is the ``<scn>`` XML: a ``collection``
  (its size in nanometres) of ``image`` elements, each with ``pixels`` / ``dimension``
  (one per resolution, with the IFD that holds it) and a ``view`` (size and offset in
  nanometres). The macro image's view is the whole collection; the main image's view
  gives the calibration (view size / pixels).
* BIF: the label image first with the XMP ``<iScan>`` packet (ScanRes in µm/px,
  Magnification, Z-layers), a thumbnail, then the pyramid levels described
  ``level=N mag=M quality=Q``; level 0's XMP ``<EncodeInfo>`` lists the tile joints
  (tiles numbered from the bottom-left, serpentine) with their overlaps.
"""

import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.slide import open_slide


def test_scn_calibration_levels_pixels(slide_writers, tmp_path):
    path = tmp_path / "fixture.scn"
    levels, macro = slide_writers.write_scn(path, mpp=0.5)
    with open_slide(path) as slide:
        assert slide.format == "scn"
        assert slide.mpp == pytest.approx((0.5, 0.5))
        assert slide.calibration_source == "Leica SCN view size"
        assert slide.magnification == 20
        assert slide.level_shapes == [a.shape[:2] for a in levels]
        for got, want in zip(slide.levels, levels, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)
        assert "macro" in slide.associated
        np.testing.assert_array_equal(slide.associated["macro"], macro)


def test_scn_matches_openslide(slide_writers, tmp_path):
    """OpenSlide places the main image at its view offset in the collection."""
    openslide = pytest.importorskip("openslide")
    path = tmp_path / "fixture.scn"
    levels, _ = slide_writers.write_scn(path, mpp=0.5, offset_nm=(300_000, 200_000))
    osr = openslide.OpenSlide(str(path))
    try:
        assert osr.properties["openslide.vendor"] == "leica"
        assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(0.5)
        h, w = levels[0].shape[:2]
        region = np.asarray(osr.read_region((600, 400), 0, (w, h)))[..., :3]  # 300 µm / 0.5
        np.testing.assert_array_equal(region, levels[0])
    finally:
        osr.close()


def test_bif_calibration_levels_pixels(slide_writers, tmp_path):
    path = tmp_path / "fixture.bif"
    levels, label, thumb = slide_writers.write_bif(path, mpp=0.465)
    with open_slide(path) as slide:
        assert slide.format == "bif"
        assert slide.mpp == pytest.approx((0.465, 0.465))
        assert slide.calibration_source == "Ventana ScanRes"
        assert slide.magnification == 20
        assert slide.level_shapes == [a.shape[:2] for a in levels]
        for got, want in zip(slide.levels, levels, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)
        # OpenSlide's names: the "Label Image" is the overview with the label on it
        np.testing.assert_array_equal(slide.associated["macro"], label)
        np.testing.assert_array_equal(slide.associated["thumbnail"], thumb)


def test_bif_matches_openslide(slide_writers, tmp_path):
    openslide = pytest.importorskip("openslide")
    path = tmp_path / "fixture.bif"
    levels, _, _ = slide_writers.write_bif(path)
    osr = openslide.OpenSlide(str(path))
    try:
        assert osr.properties["openslide.vendor"] == "ventana"
        assert set(osr.associated_images) == {"macro", "thumbnail"}  # our names too
        assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(0.465)
        for i, want in enumerate(levels):
            h, w = want.shape[:2]
            assert osr.level_dimensions[i] == (w, h)
            got = np.asarray(osr.read_region((0, 0), i, (w, h)))[..., :3]
            np.testing.assert_array_equal(got, want)
    finally:
        osr.close()


#: Overlaps (rows, columns) whose advances (120, 116) the level downsamples 2 and 4 divide.
OVERLAP = (8, 12)


def test_bif_overlapping_tiles_are_stitched(slide_writers, tmp_path, recwarn):
    path = tmp_path / "overlap.bif"
    levels, _, _ = slide_writers.write_bif(path, overlap=OVERLAP)
    with open_slide(path) as slide:
        assert slide.metadata["properties"]["ventana.tile_overlap_yx"] == "8, 12"
        assert slide.level_shapes == [a.shape[:2] for a in levels]
        assert slide.level_shapes[0] == (2 * 120 + 128, 3 * 116 + 128)
        for i, (got, want) in enumerate(zip(slide.levels, levels, strict=True)):
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"level {i}")
        box = (100, 50, 300, 400)  # across frame joints, in level-0 pixels
        np.testing.assert_array_equal(slide.read_region(box), levels[0][100:300, 50:400])
    assert not [w for w in recwarn if "overlap" in str(w.message)]


def test_bif_stitched_like_openslide(slide_writers, tmp_path):
    openslide = pytest.importorskip("openslide")
    path = tmp_path / "overlap.bif"
    slide_writers.write_bif(path, overlap=OVERLAP)
    osr = openslide.OpenSlide(str(path))
    try:
        with open_slide(path) as slide:
            for i, level in enumerate(slide.levels):
                h, w = level.shape[:2]
                assert osr.level_dimensions[i] == (w, h), f"level {i}"
                got = np.asarray(osr.read_region((0, 0), i, (w, h)))[..., :3]
                np.testing.assert_array_equal(got, np.asarray(level), err_msg=f"level {i}")
    finally:
        osr.close()


@pytest.mark.parametrize("rows", [b"0", b"9"], ids=["no grid", "grid past level 0"])
def test_bif_overlaps_that_cannot_be_stitched_are_reported(slide_writers, tmp_path, rows):
    path = tmp_path / "overlap.bif"
    slide_writers.write_bif(path, overlap=(6, 10))
    data = bytearray(path.read_bytes())
    at = data.index(b'NumRows="3"')
    data[at : at + 11] = b'NumRows="' + rows + b'"'  # nothing sane to stitch with
    path.write_bytes(bytes(data))
    with pytest.warns(SlidescopeWarning, match="not stitched"):
        slide = open_slide(path)
    with slide:
        assert slide.metadata["properties"]["ventana.tile_overlap_yx"] == "6, 10"
        assert slide.level_shapes[0] == (3 * 128, 4 * 128)  # as stored


def test_bif_stored_tiles_kept_for_their_frames_and_dropped_on_close(slide_writers, tmp_path):
    from napari_slidescope.slide import tile_cache

    path = tmp_path / "overlap.bif"
    levels, _, _ = slide_writers.write_bif(path, overlap=OVERLAP)
    slide = open_slide(path)
    np.testing.assert_array_equal(np.asarray(slide.levels[2]), levels[2])
    assert [k for k in tile_cache()._items if "bif-stored" in k]  # a tile of 4 x 4 frames
    slide.close()
    assert not [k for k in tile_cache()._items if "bif-stored" in k]
