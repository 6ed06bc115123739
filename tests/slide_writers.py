"""Small slides written in each format's own layout, for the tests (no test lives here).

Given to tests by the ``slide_writers`` fixture of ``tests/conftest.py``.

OME-Zarr: NGFF 0.4 in a zarr format 2 store, NGFF 0.5 (``attrs['ome']``) in a zarr
format 3 store, written with plain zarr.

Leica SCN and Ventana BIF: the layouts follow OpenSlide's format documentation (and
its readers, which open the same fixtures here as an independent check):

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
import tifffile
import zarr

ZARR3 = int(zarr.__version__.split(".")[0]) >= 3


def _pyramid(level0, n):
    levels = [level0]
    for _ in range(n - 1):
        a = levels[-1]
        h, w = a.shape[-2] // 2 * 2, a.shape[-1] // 2 * 2
        a = a[..., :h, :w]
        levels.append(
            a.reshape(*a.shape[:-2], h // 2, 2, w // 2, 2).mean(axis=(-3, -1)).astype(a.dtype)
        )
    return levels


def write_ngff(
    path,
    level0,
    *,
    version="0.4",
    nlevels=3,
    axes="cyx",
    mpp=(0.25, 0.25),
    unit="micrometer",
    chunks=128,
    channels=None,
):
    """Write an OME-Zarr pyramid with plain zarr (format 2 for 0.4, format 3 for 0.5)."""
    levels = _pyramid(level0, nlevels)
    fmt = 2 if version == "0.4" else 3
    kwargs = {"zarr_format": fmt} if ZARR3 else {}
    root = zarr.open_group(str(path), mode="w", **kwargs)
    datasets = []
    for i, a in enumerate(levels):
        ch = tuple(1 if ax in "tzc" else chunks for ax in axes)
        if ZARR3:
            arr = root.create_array(f"s{i}", shape=a.shape, chunks=ch, dtype=a.dtype)
        else:
            arr = root.create_dataset(f"s{i}", shape=a.shape, chunks=ch, dtype=a.dtype)
        arr[...] = a
        scale = [1.0 if ax in "tzc" else (mpp[0] if ax == "y" else mpp[1]) * 2**i for ax in axes]
        datasets.append(
            {"path": f"s{i}", "coordinateTransformations": [{"type": "scale", "scale": scale}]}
        )
    kinds = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}
    ax_meta = []
    for ax in axes:
        entry = {"name": ax, "type": kinds[ax]}
        if ax in "yx" and unit is not None:
            entry["unit"] = unit
        ax_meta.append(entry)
    ms = {"axes": ax_meta, "datasets": datasets, "name": "slide"}
    if version == "0.4":
        ms["version"] = "0.4"
    meta = {"multiscales": [ms]}
    if channels is not None:
        meta["omero"] = {
            "channels": [{"label": n, "color": c, "active": True} for n, c in channels]
        }
    if version == "0.4":
        root.attrs.update(meta)
    else:
        root.attrs.update({"ome": {"version": "0.5", **meta}})
    return levels


def rgb_planes(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (3, *shape), dtype=np.uint8)


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
    """A Ventana BIF: label (iScan XMP), thumbnail, 3 levels; level 0 lists tile joints.

    With an `overlap` (rows, columns), the scanner's frames overlap their neighbours by
    that much: frame (r, c) is the truth image's ``tile`` pixels at ``(r, c) * (tile -
    overlap)``, stored side by side as the level-0 tiles; each lower level stores the
    frames downsampled, side by side. Returns the truth's levels (what a stitching reader
    shows; the stored levels when there is no overlap), the label and the thumbnail.
    """
    rows, cols = grid
    adv = (tile - overlap[0], tile - overlap[1])
    truth = _textured(((rows - 1) * adv[0] + tile, (cols - 1) * adv[1] + tile), 3)
    main = np.zeros((rows * tile, cols * tile, 3), np.uint8)
    for r in range(rows):
        for c in range(cols):
            frame = truth[r * adv[0] : r * adv[0] + tile, c * adv[1] : c * adv[1] + tile]
            main[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] = frame
    stored = [main, _down(main, 2), _down(main, 4)]
    levels = [truth, _down(truth, 2), _down(truth, 4)]
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
    thumb = _down(truth, 8)
    sw = "ScanOutputManager 1.1.0.15854"
    common = {"photometric": "rgb", "compression": "zlib", "metadata": None, "software": sw}
    with tifffile.TiffWriter(path, bigtiff=True) as tw:
        tw.write(
            label,
            description="Label Image",
            extratags=[(700, 1, len(iscan), iscan, True)],
            **common,
        )
        tw.write(thumb, description="Thumbnail", **common)
        for i, a in enumerate(stored):
            desc = f"level={i} mag={20 / 2**i:g} quality=95"
            extra = [(700, 1, len(encode), encode, True)] if i == 0 else []
            tw.write(a, tile=(tile, tile), description=desc, extratags=extra, **common)
    return levels, label, thumb
