"""Format detection and calibration for each slide vendor's TIFF dialect.

Everything here reads tags and XML only; no pixel is decoded.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.slide import _tiff
from napari_slidescope.slide._xml import parse_xml

if TYPE_CHECKING:
    import tifffile

#: Pixel sizes outside this range (µm/px) are not microscopy calibration (e.g. 72 dpi defaults).
PLAUSIBLE_MPP = (0.01, 200.0)

#: File name endings only whole-slide TIFF dialects use: a file so named is a slide.
VENDOR_SUFFIXES = (".svs", ".ndpi", ".qptiff", ".scn", ".bif")
#: Generic TIFF endings: a slide when the file is pyramidal or a vendor's (look inside).
TIFF_SUFFIXES = (".tif", ".tiff", ".ome.tif", ".ome.tiff")
#: Endings of the slide files tifffile reads (vendor dialects and TIFF).
SLIDE_SUFFIXES = VENDOR_SUFFIXES + TIFF_SUFFIXES
#: Endings of the slide files only OpenSlide reads (MIRAX, Hamamatsu VMS/VMU, Sakura).
OPENSLIDE_SUFFIXES = (".mrxs", ".vms", ".vmu", ".svslide")
#: Ending of one DICOM instance (a DICOM slide is a folder, or a set, of them).
DICOM_SUFFIX = ".dcm"

_FLAG_ORDER = ("svs", "ndpi", "qpi", "scn", "bif", "ome", "philips")
_FORMAT_NAMES = {"qpi": "qptiff"}


@dataclass
class FormatInfo:
    """What a slide's tags and descriptions say about it."""

    format: str
    mpp: tuple[float, float] | None = None
    magnification: float | None = None
    channel_names: list[str] = field(default_factory=list)
    channel_colors: list[tuple[float, float, float]] = field(default_factory=list)
    fluorescence: bool = False
    properties: dict[str, Any] = field(default_factory=dict)
    calibration_source: str = "none"


def detect_format(tif: tifffile.TiffFile) -> str:
    """Return the slide format name from tifffile's flags."""
    flags = _tiff.format_flags(tif)
    for flag in _FLAG_ORDER:
        if flag in flags:
            return _FORMAT_NAMES.get(flag, flag)
    return "generic"


def parse_aperio_description(description: str) -> dict[str, str]:
    r"""Parse the ``key = value`` pairs of an Aperio ImageDescription.

    Examples
    --------
    >>> parse_aperio_description("Aperio Image Library v11\\r\\n... |AppMag = 20|MPP = 0.4990")
    {'AppMag': '20', 'MPP': '0.4990'}
    """
    props: dict[str, str] = {}
    for part in description.split("|")[1:]:
        if "=" in part:
            key, _, value = part.partition("=")
            props[key.strip()] = value.strip()
    return props


def positive_float(value: Any) -> float | None:
    """Return `value` as a positive finite float (a metadata field), else None."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def _plausible(mpp: float | None) -> bool:
    return mpp is not None and PLAUSIBLE_MPP[0] <= mpp <= PLAUSIBLE_MPP[1]


def resolution_mpp(page: tifffile.TiffPage) -> tuple[float, float] | None:
    """Return (y, x) µm/px from the TIFF resolution tags, or None when absent or implausible."""
    unit = _tiff.tag_value(page, "ResolutionUnit")
    unit = int(getattr(unit, "value", unit) or 2)
    um_per_unit = {2: 25400.0, 3: 10000.0}.get(unit)
    if um_per_unit is None:
        return None
    out = []
    for name in ("YResolution", "XResolution"):
        value = _tiff.tag_value(page, name)
        if not value:
            return None
        num, den = value if isinstance(value, tuple) else (value, 1)
        if not num or not den:
            return None
        out.append(um_per_unit * den / num)
    if not all(_plausible(v) for v in out):
        return None
    return (out[0], out[1])


def _ome_info(tif: tifffile.TiffFile, path: str) -> FormatInfo:
    info = FormatInfo("ome")
    root = parse_xml(tif.ome_metadata or "", path)
    if root is None:
        return info
    ns = {"ome": root.tag.split("}")[0].strip("{")} if root.tag.startswith("{") else {}
    q = "ome:" if ns else ""
    pixels = root.find(f".//{q}Image/{q}Pixels", ns)
    if pixels is not None:
        scale = {"nm": 1e-3, "µm": 1.0, "um": 1.0, "mm": 1e3, "cm": 1e4, "m": 1e6}
        sx = positive_float(pixels.get("PhysicalSizeX"))
        sy = positive_float(pixels.get("PhysicalSizeY")) or sx
        fx = scale.get(pixels.get("PhysicalSizeXUnit", "µm"), 1.0)
        fy = scale.get(pixels.get("PhysicalSizeYUnit", "µm"), 1.0)
        if sx and sy:
            info.mpp = (sy * fy, sx * fx)
            info.calibration_source = "OME PhysicalSizeX/Y"
        for ch in pixels.findall(f"{q}Channel", ns):
            info.channel_names.append(ch.get("Name") or ch.get("ID") or "")
            color = ch.get("Color")
            if color is not None:
                v = int(color) & 0xFFFFFFFF
                info.channel_colors.append(
                    ((v >> 24 & 255) / 255, (v >> 16 & 255) / 255, (v >> 8 & 255) / 255)
                )
    objective = root.find(f".//{q}Objective", ns)
    if objective is not None:
        info.magnification = positive_float(objective.get("NominalMagnification"))
    return info


def _qptiff_info(tif: tifffile.TiffFile, series: tifffile.TiffPageSeries, path: str) -> FormatInfo:
    info = FormatInfo("qptiff", fluorescence=True)
    for page in series.pages:
        desc = getattr(page, "description", "") or ""
        root = parse_xml(desc.encode("utf-16") if "utf-16" in desc[:60] else desc, path)
        if root is None:
            continue
        info.channel_names.append((root.findtext("Name") or "").strip())
        color = root.findtext("Color")
        if color:
            rgb = [int(c) / 255 for c in color.split(",")[:3]]
            info.channel_colors.append((rgb[0], rgb[1], rgb[2]))
        objective = root.findtext("Objective")
        if objective and info.magnification is None:
            info.magnification = positive_float(objective.lower().rstrip("x"))
        if root.findtext("ImageType", "").strip().lower() == "brightfield":
            info.fluorescence = False
    return info


def _bif_info(tif: tifffile.TiffFile, path: str) -> FormatInfo:
    info = FormatInfo("bif")
    for page in tif.pages[:4]:
        xmp = _tiff.tag_value(page, "XMP")
        if not xmp:
            continue
        text = xmp.decode("utf-8", "replace") if isinstance(xmp, bytes) else str(xmp)
        res = re.search(r'ScanRes="([0-9.eE+-]+)"', text)
        mag = re.search(r'Magnification="([0-9.]+)"', text)
        if res and _plausible(positive_float(res.group(1))):
            mpp = float(res.group(1))
            info.mpp, info.calibration_source = (mpp, mpp), "Ventana ScanRes"
        if mag:
            info.magnification = positive_float(mag.group(1))
        break
    return info


def _scn_info(tif: tifffile.TiffFile, series: tifffile.TiffPageSeries, path: str) -> FormatInfo:
    info = FormatInfo("scn")
    root = parse_xml(tif.scn_metadata or "", path)
    if root is None:
        return info
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    width = series.shape[series.axes.index("X")]
    for image in root.iter(f"{ns}image"):
        view = image.find(f"{ns}view")
        dims = [d for d in image.iter(f"{ns}dimension") if d.get("r", "0") == "0"]
        if view is None or not dims:
            continue
        if int(dims[0].get("sizeX", -1)) != width:
            continue
        mpp = positive_float(view.get("sizeX"))
        if mpp:
            mpp = mpp / 1000.0 / width  # view size is in nanometres
            if _plausible(mpp):
                info.mpp, info.calibration_source = (mpp, mpp), "Leica SCN view size"
        mag = image.find(f".//{ns}objective")
        if mag is not None and mag.text:
            info.magnification = positive_float(mag.text)
    return info


#: Ventana BIF associated images by page description, named as OpenSlide names them
#: (the "Label Image" is the whole-slide overview, label included). tifffile's own series
#: names for them changed between versions (Label / Thumbnail, then Overview / Probability).
_BIF_ASSOCIATED = {
    "label image": "macro",
    "label_image": "macro",
    "thumbnail": "thumbnail",
    "probability_image": "probability",
}


def associated_name(fmt: str, series: tifffile.TiffPageSeries, number: int) -> str:
    """Return the name an associated image series is known by (``label``, ``macro``...)."""
    if fmt == "bif":
        desc = str(getattr(first_page_of(series), "description", "") or "").strip().lower()
        if desc in _BIF_ASSOCIATED:
            return _BIF_ASSOCIATED[desc]
    return (str(series.name or "") or f"series {number}").strip().lower()


def first_page_of(series: tifffile.TiffPageSeries) -> tifffile.TiffPage | None:
    """Return a series' first page (None when it cannot be read)."""
    try:
        return _tiff.first_page(series)
    except Exception:
        return None


def describe(tif: tifffile.TiffFile, series: tifffile.TiffPageSeries, path: str) -> FormatInfo:
    """Collect format, calibration, magnification and channel metadata of a slide."""
    fmt = detect_format(tif)
    page = _tiff.first_page(series)
    if fmt == "svs":
        props = parse_aperio_description(page.description or "")
        info = FormatInfo("svs", properties=dict(props))
        mpp = positive_float(props.get("MPP"))
        if _plausible(mpp):
            info.mpp, info.calibration_source = (mpp, mpp), "Aperio MPP"  # type: ignore[assignment]
        info.magnification = positive_float(props.get("AppMag"))
    elif fmt == "ndpi":
        tags = dict(page.ndpi_tags or {})
        info = FormatInfo("ndpi")
        info.properties = {
            k: v for k, v in tags.items() if isinstance(v, str | int | float) and k != "McuStarts"
        }
        info.magnification = positive_float(tags.get("Magnification"))
        if tags.get("Fluorescence"):
            info.fluorescence = True
            info.channel_names = [str(tags["Fluorescence"])]
    elif fmt == "ome":
        info = _ome_info(tif, path)
    elif fmt == "qptiff":
        info = _qptiff_info(tif, series, path)
    elif fmt == "bif":
        info = _bif_info(tif, path)
    elif fmt == "scn":
        info = _scn_info(tif, series, path)
    else:
        info = FormatInfo(fmt)
    if info.mpp is None:
        mpp_res = resolution_mpp(page)
        if mpp_res is not None:
            info.mpp, info.calibration_source = mpp_res, "TIFF resolution tags"
    warn_uncalibrated(path, info)
    return info


def warn_uncalibrated(path: str, info: FormatInfo) -> None:
    """Warn, naming the file, when a slide carries no pixel size (every backend says this)."""
    if info.mpp is None:
        warnings.warn(
            f"{path}: the file carries no pixel size; scale stays 1 and units are pixels",
            SlidescopeWarning,
            stacklevel=4,
        )
