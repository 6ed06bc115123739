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

import uuid

import numpy as np
import pytest
import tifffile

from napari_slidescope import SlidescopeWarning
from napari_slidescope.slide import open_slide

SCN_NS = "http://www.leica-microsystems.com/scn/2010/10/01"


def _textured(shape, seed):
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (shape[0] // 8 + 1, shape[1] // 8 + 1, 3), dtype=np.uint8)
    big = np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)[: shape[0], : shape[1]]
    noise = rng.integers(0, 16, (*shape, 3), dtype=np.uint8)
    return (big // 2 + noise).astype(np.uint8)


def _down(a, f):
    h, w = a.shape[0] // f, a.shape[1] // f
    return a[: h * f, : w * f].reshape(h, f, w, f, 3).mean(axis=(1, 3)).astype(np.uint8)


def write_scn(path, *, mpp=0.5, shape=(768, 1000), offset_nm=(300_000, 200_000)):
    """A Leica SCN: macro (IFD 0) + a 3-resolution main image (IFDs 1-3), zlib tiles."""
    main = _textured(shape, 1)
    levels = [main, _down(main, 4), _down(main, 16)]
    macro = _textured((100, 200), 2)
    nm = mpp * 1000  # nanometres per level-0 pixel
    coll = (2_000_000, 1_000_000)  # collection size (x, y), nm
    settings = (
        "<scanSettings><objectiveSettings><objective>20</objective></objectiveSettings>"
        "<illuminationSettings><numericalAperture>0.4</numericalAperture>"
        "<illuminationSource>brightfield</illuminationSource></illuminationSettings>"
        "</scanSettings>"
    )
    dims = "".join(
        f'<dimension sizeX="{a.shape[1]}" sizeY="{a.shape[0]}" r="{r}" ifd="{r + 1}"/>'
        for r, a in enumerate(levels)
    )
    xml = (
        f'<?xml version="1.0" encoding="utf-8"?><scn xmlns="{SCN_NS}">'
        f'<collection name="fixture" uuid="urn:uuid:{uuid.uuid4()}" '
        f'sizeX="{coll[0]}" sizeY="{coll[1]}"><barcode>SLIDESCOPE-1</barcode>'
        f'<image name="macro" uuid="urn:uuid:{uuid.uuid4()}">'
        "<creationDate>2026-01-01T00:00:00.00Z</creationDate>"
        '<device model="Leica SCN400;Leica SCN" version="1.5.1"/>'
        '<pixels sizeX="200" sizeY="100"><dimension sizeX="200" sizeY="100" r="0" ifd="0"/>'
        f'</pixels><view sizeX="{coll[0]}" sizeY="{coll[1]}" offsetX="0" offsetY="0" '
        f'spacingZ="0"/>{settings}</image>'
        f'<image name="main" uuid="urn:uuid:{uuid.uuid4()}">'
        "<creationDate>2026-01-01T00:00:00.00Z</creationDate>"
        '<device model="Leica SCN400;Leica SCN" version="1.5.1"/>'
        f'<pixels sizeX="{shape[1]}" sizeY="{shape[0]}">{dims}</pixels>'
        f'<view sizeX="{int(shape[1] * nm)}" sizeY="{int(shape[0] * nm)}" '
        f'offsetX="{offset_nm[0]}" offsetY="{offset_nm[1]}" spacingZ="0"/>{settings}'
        "</image></collection></scn>"
    )
    common = {"photometric": "rgb", "compression": "zlib", "metadata": None}
    with tifffile.TiffWriter(path, bigtiff=True) as tw:
        tw.write(macro, tile=(128, 128), description=xml, **common)
        for r, a in enumerate(levels):
            px_per_cm = 1e4 / (mpp * 4**r)
            tw.write(
                a,
                tile=(128, 128),
                resolution=(px_per_cm, px_per_cm),
                resolutionunit="CENTIMETER",
                **common,
            )
    return levels, macro


def _serpentine_number(col, row, cols, rows):
    """BIF tile number (1-based) of the tile at (col, row), row 0 at the top."""
    from_bottom = rows - 1 - row
    c = cols - 1 - col if from_bottom % 2 else col
    return from_bottom * cols + c + 1


def write_bif(path, *, mpp=0.465, grid=(3, 4), tile=128, overlap=(0, 0)):
    """A Ventana BIF: label (iScan XMP), thumbnail, 3 levels; level 0 lists tile joints."""
    rows, cols = grid
    main = _textured((rows * tile, cols * tile), 3)
    levels = [main, _down(main, 2), _down(main, 4)]
    iscan = (
        '<?xml version="1.0" encoding="utf-8"?><iScan BuildDate="1/1/2026" '
        f'BuildVersion="3.3.1.1" Magnification="20" ScanRes="{mpp}" Z-layers="1" '
        'UnitNumber="SLIDESCOPE" ShowLabel="1"/>'
    ).encode()
    joints = []
    for row in range(rows):
        for col in range(cols):
            here = _serpentine_number(col, row, cols, rows)
            if col + 1 < cols:
                right = _serpentine_number(col + 1, row, cols, rows)
                joints.append(
                    f'<TileJointInfo FlagJoined="1" Confidence="100" Direction="RIGHT" '
                    f'Tile1="{here}" Tile2="{right}" OverlapX="{overlap[1]}" OverlapY="0"/>'
                )
            if row + 1 < rows:  # the tile below is Tile1 of an UP joint
                below = _serpentine_number(col, row + 1, cols, rows)
                joints.append(
                    f'<TileJointInfo FlagJoined="1" Confidence="100" Direction="UP" '
                    f'Tile1="{below}" Tile2="{here}" OverlapX="0" OverlapY="{overlap[0]}"/>'
                )
    encode = (
        '<?xml version="1.0" encoding="utf-8"?><EncodeInfo Ver="2"><SlideInfo/>'
        "<SlideStitchInfo>"
        f'<ImageInfo AOIScanned="1" AOIIndex="0" Width="{tile}" Height="{tile}" '
        f'NumRows="{rows}" NumCols="{cols}" Pos-X="0" Pos-Y="0">{"".join(joints)}</ImageInfo>'
        '</SlideStitchInfo><AoiOrigin><AOI0 OriginX="0" OriginY="0"/></AoiOrigin></EncodeInfo>'
    ).encode()
    label = _textured((96, 160), 4)
    thumb = _down(main, 8)
    sw = "ScanOutputManager 1.1.0.15854"
    common = {"photometric": "rgb", "compression": "zlib", "metadata": None, "software": sw}
    with tifffile.TiffWriter(path, bigtiff=True) as tw:
        tw.write(label, description="Label Image", extratags=[(700, 1, len(iscan), iscan, True)], **common)
        tw.write(thumb, description="Thumbnail", **common)
        for i, a in enumerate(levels):
            desc = f"level={i} mag={20 / 2**i:g} quality=95"
            extra = [(700, 1, len(encode), encode, True)] if i == 0 else []
            tw.write(a, tile=(tile, tile), description=desc, extratags=extra, **common)
    return levels, label, thumb


def test_scn_calibration_levels_pixels(tmp_path):
    path = tmp_path / "fixture.scn"
    levels, macro = write_scn(path, mpp=0.5)
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


def test_scn_matches_openslide(tmp_path):
    """OpenSlide places the main image at its view offset in the collection."""
    openslide = pytest.importorskip("openslide")
    path = tmp_path / "fixture.scn"
    levels, _ = write_scn(path, mpp=0.5, offset_nm=(300_000, 200_000))
    osr = openslide.OpenSlide(str(path))
    try:
        assert osr.properties["openslide.vendor"] == "leica"
        assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(0.5)
        h, w = levels[0].shape[:2]
        region = np.asarray(osr.read_region((600, 400), 0, (w, h)))[..., :3]  # 300 µm / 0.5
        np.testing.assert_array_equal(region, levels[0])
    finally:
        osr.close()


def test_bif_calibration_levels_pixels(tmp_path):
    path = tmp_path / "fixture.bif"
    levels, label, thumb = write_bif(path, mpp=0.465)
    with open_slide(path) as slide:
        assert slide.format == "bif"
        assert slide.mpp == pytest.approx((0.465, 0.465))
        assert slide.calibration_source == "Ventana ScanRes"
        assert slide.magnification == 20
        assert slide.level_shapes == [a.shape[:2] for a in levels]
        for got, want in zip(slide.levels, levels, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)
        np.testing.assert_array_equal(slide.associated["label"], label)
        np.testing.assert_array_equal(slide.associated["thumbnail"], thumb)


def test_bif_matches_openslide(tmp_path):
    openslide = pytest.importorskip("openslide")
    path = tmp_path / "fixture.bif"
    levels, _, _ = write_bif(path)
    osr = openslide.OpenSlide(str(path))
    try:
        assert osr.properties["openslide.vendor"] == "ventana"
        assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(0.465)
        for i, want in enumerate(levels):
            h, w = want.shape[:2]
            assert osr.level_dimensions[i] == (w, h)
            got = np.asarray(osr.read_region((0, 0), i, (w, h)))[..., :3]
            np.testing.assert_array_equal(got, want)
    finally:
        osr.close()


def test_bif_tile_overlaps_are_reported(tmp_path):
    path = tmp_path / "overlap.bif"
    write_bif(path, overlap=(6, 10))
    with pytest.warns(SlidescopeWarning, match="overlap"):
        slide = open_slide(path)
    with slide:
        assert slide.metadata["properties"]["ventana.tile_overlap_yx"] == "6, 10"
