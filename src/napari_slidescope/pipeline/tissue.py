"""Public tissue detection on a slide, a path or an RGB array: :func:`detect_tissue`.

The slide is read at the pyramid level nearest to ``target_mpp`` (never level 0 of a
pyramid at the default working resolution). Where that level is finer, the working pixel
is the whole number of its pixels that comes nearest the target
(:func:`~napari_slidescope.slide.level_choice.nearest_factor`: an Aperio level at
4.04 µm/px is read at 8.09 µm/px for the default 8, not at 4.04), and a JPEG level is
decoded at 1/2, 1/4 or 1/8 in the DCT domain straight into the working image
(:meth:`~napari_slidescope.slide.Slide.read_level_scaled`; other levels are read in
strips and block-averaged): a 150000 x 90000 px slide is detected from 13 Mpx without a
whole-level array. The image is handed to
:func:`napari_slidescope.analysis.tissue.tissue_mask`; ``TissueResult.mpp``, ``level``
and ``downsample`` record the working resolution and the level read. The result is a
:class:`TissueResult`: the mask, its place in level-0 pixels, polygons, areas, and a
GeoJSON export for QuPath. The same mask gates later tile work
(:meth:`TissueResult.tiles_with_tissue`).
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis import geojson, geometry
from napari_slidescope.analysis.tissue import Mode, block_mean, infer_mode, tissue_mask
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.options import TissueOptions
from napari_slidescope.pipeline.cancel import check_cancel
from napari_slidescope.pipeline.regions import SlideLike, as_slide, check_region, split_region
from napari_slidescope.pipeline.summary import tissue_area_px
from napari_slidescope.segmenters.stain import slide_is_fluorescence
from napari_slidescope.slide.level_choice import nearest_factor

__all__ = ["DEFAULT_TARGET_MPP", "TissueOptions", "TissueResult", "detect_tissue"]

_DEFAULTS = TissueOptions()
#: Working resolution of tissue detection, µm/px (1.25x objective): ``TissueOptions().target_mpp``.
DEFAULT_TARGET_MPP = _DEFAULTS.target_mpp
#: Tissue pieces smaller than this are dropped, µm²: ``TissueOptions().min_tissue_um2``.
DEFAULT_MIN_TISSUE_UM2 = _DEFAULTS.min_tissue_um2
#: Holes smaller than this are filled, µm²: ``TissueOptions().max_hole_um2``.
DEFAULT_MAX_HOLE_UM2 = _DEFAULTS.max_hole_um2
#: Level-0 pixel size assumed for a slide without calibration (a 20x scan).
NOMINAL_MPP = 0.5
#: Largest block of a level read at once, in bytes (bounds peak memory).
_READ_BYTES = 64 * 2**20
#: Strip size when a run can be cancelled: one strip decodes well within a second.
_CANCEL_READ_BYTES = 8 * 2**20


#: Serialises the tracing of TissueResult outlines (rare, and a few per session).
_OUTLINES_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class TissueResult:
    """Tissue found on a slide or region.

    A frozen value, as :class:`~napari_slidescope.pipeline.nuclei_result.NucleiResult`:
    its attributes cannot be rebound (make a changed copy with ``dataclasses.replace``);
    results compare by identity (they hold arrays).

    Attributes
    ----------
    mask : (M, N) ndarray of bool
        Tissue at the working resolution, covering ``region``.
    mpp : float or None
        µm per mask pixel, or None for an uncalibrated slide.
    origin : (int, int)
        Level-0 ``(y, x)`` of the top-left corner of ``mask[0, 0]`` (to the nearest
        level-0 pixel where a pyramid level's downsample is not a whole number).
    downsample : (float, float)
        Level-0 pixels per mask pixel, ``(y, x)``.
    polygons : list of (N, 2) ndarray of float
        Outer contour of each tissue piece, level-0 ``(row, col)``, largest first. Traced
        from ``mask`` when first asked for (with ``holes``), not by :func:`detect_tissue`:
        most callers gate tiles with the mask and never need outlines, which cost about a
        third of a whole-slide detection.
    holes : list of list of (K, 2) ndarray of float
        ``holes[i]``: the interior rings of ``polygons[i]`` (empty with ``outer_only``).
    area_um2 : float or None
        Tissue area in µm² (None when uncalibrated), as
        :func:`~napari_slidescope.pipeline.summary.tissue_area_um2` defines it (every
        entry point reports this figure).
    area_px : float
        Tissue area in level-0 pixels.
    fraction : float
        Tissue area over region area.
    region : (int, int, int, int)
        The level-0 box analysed ``(y0, x0, y1, x1)``.
    level : int
        Pyramid level read.
    mode : {'brightfield', 'fluorescence'}
        Mode used.
    threshold : float
        Feature threshold used.
    parameters : dict
        What was asked for: ``options``, the run's
        :class:`~napari_slidescope.options.TissueOptions` as ``as_dict()`` (what ``"auto"``
        resolved to is ``mode``, ``threshold`` and ``mpp`` above), as
        ``NucleiResult.parameters["options"]``.
    """

    mask: np.ndarray = field(repr=False)
    mpp: float | None
    origin: tuple[int, int]
    downsample: tuple[float, float]
    area_um2: float | None
    area_px: float
    fraction: float
    region: Box
    level: int
    mode: Mode
    threshold: float
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def _outlines(self) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """Trace the rings of ``mask`` once, whichever threads ask.

        From the result's own fields, so that a ``dataclasses.replace`` copy with another
        mask traces its own. Under a lock: ``cached_property`` has none since Python 3.12,
        and a dock's worker and the GUI thread may ask at once; without it both would
        trace, and ``polygons`` and ``holes`` could come from different tracings.
        """
        with _OUTLINES_LOCK:
            done = self.__dict__.get("_outlines")
            if done is not None:  # traced by another thread while this one waited
                return done  # type: ignore[no-any-return]
            outer_only = bool(self.parameters.get("options", {}).get("outer_only", False))
            return geometry.mask_to_polygons(
                self.mask,
                downsample=self.downsample,
                origin=self.origin,
                holes=not outer_only,
                bounds=self.region,
            )

    @property
    def polygons(self) -> list[np.ndarray]:
        """Outer contour of each tissue piece (see the class docstring)."""
        return self._outlines[0]

    @property
    def holes(self) -> list[list[np.ndarray]]:
        """Interior rings of each piece of :attr:`polygons` (see the class docstring)."""
        return self._outlines[1]

    def to_geojson(
        self,
        path: str | os.PathLike[str],
        *,
        name: str = "Tissue",
        color: Sequence[int] = geojson.TISSUE_COLOR,
    ) -> Path:
        """Write the polygons as a GeoJSON FeatureCollection that QuPath imports.

        One ``"annotation"`` feature per tissue piece, classified as ``name``, with
        holes as interior rings, in level-0 pixel ``(x, y)``. Read it back with
        :func:`napari_slidescope.analysis.geojson.read_geojson`.

        Returns
        -------
        path : Path
            The file written (as :meth:`NucleiResult.to_geojson
            <napari_slidescope.pipeline.nuclei_result.NucleiResult.to_geojson>`).
        """
        geojson.write_geojson(
            path, self.polygons, self.holes, name=name, color=color, object_type="annotation"
        )
        return Path(path)

    def tiles_with_tissue(self, boxes: Any, *, min_fraction: float = 0.0) -> np.ndarray:
        """Which level-0 boxes ``(K, 4)`` hold tissue (see ``geometry.tiles_with_tissue``)."""
        return geometry.tiles_with_tissue(self, boxes, min_fraction=min_fraction)


def _auto_mode(slide: SlideLike) -> Mode | None:
    """Mode from the slide's metadata (the library's one rule), or None when they do not say.

    (A one-channel ``YX`` slide is fluorescence by the rule; its grayscale pixels were
    always found so by :func:`~napari_slidescope.analysis.tissue.infer_mode` too.)
    """
    return "fluorescence" if slide_is_fluorescence(slide) else None


def _read_working(
    slide: SlideLike,
    level: int,
    box: Box,
    factor: int,
    cancel: threading.Event | None = None,
    scale: int = 1,
) -> np.ndarray:
    """Read a level box (channels last) and block-average it by `factor`, in bounded strips.

    On a JPEG level (:func:`_streams`), through
    :meth:`~napari_slidescope.slide.Slide.read_level_scaled` at ``1 / scale`` (a divisor
    of `factor` the slide decodes at in the DCT domain; 1 at full size), block-averaged by
    ``factor // scale``; the box starts on a multiple of `scale`. Else through the slide's
    own ``read_level`` (no dask), else its dask level.
    """
    if scale > 1 or _streams(slide, level):
        scaled = slide.read_level_scaled  # type: ignore[attr-defined]

        def check() -> None:
            check_cancel(cancel, "tissue detection")

        def read_scaled(lv: int, b: Box) -> np.ndarray:
            return np.asarray(scaled(lv, b, scale, check=check))

        return _read_strips(slide, level, box, factor, cancel, read_scaled, scale, whole=True)
    read = getattr(slide, "read_level", None) or _dask_reader(slide)
    return _read_strips(slide, level, box, factor, cancel, read)


def _read_strips(
    slide: SlideLike,
    level: int,
    box: Box,
    factor: int,
    cancel: threading.Event | None,
    read: Callable[[int, Box], np.ndarray],
    scale: int = 1,
    *,
    whole: bool = False,
) -> np.ndarray:
    """Block means of a level box read by `read` (a box of a level, in the slide's axes).

    `read` returns the box at ``1 / scale`` (strips start on multiples of `factor`, which
    `scale` divides). With `whole` (a read that checks for cancellation itself), a read
    whose block means are its own pixels (``factor == scale``) is one strip: the output
    is the array read, with no copy.
    """
    ly0, lx0, ly1, lx1 = box
    axes = slide.axes
    yi, xi = axes.index("Y"), axes.index("X")
    empty = read(level, (ly0, lx0, ly0, lx1))  # no rows: the dtype and channels only
    per_px = empty.dtype.itemsize * math.prod(
        n for i, n in enumerate(empty.shape) if i not in (yi, xi)
    )
    # bytes held per level row: what `read` returns for it (1 / scale of it, in both axes)
    row_bytes = max(per_px * (lx1 - lx0) // (scale * scale), 1)
    budget = _READ_BYTES if cancel is None else _CANCEL_READ_BYTES
    step = max(factor, (budget // row_bytes) // factor * factor)
    if whole and factor == scale:
        step = ly1 - ly0  # no block mean left to do: read straight into the output
    strips = []
    for y in range(ly0, ly1, step):
        check_cancel(cancel, "tissue detection")
        pix = read(level, (y, lx0, min(y + step, ly1), lx1))
        if axes == "CYX":
            pix = np.moveaxis(pix, 0, -1)
        strips.append(block_mean(pix, factor // scale))
    return strips[0] if len(strips) == 1 else np.concatenate(strips, axis=0)


def _streams(slide: SlideLike, level: int) -> bool:
    """Return True when the slide decodes `level` straight into an array (a JPEG level).

    Such a level is read through ``read_level_scaled`` even at full size: one pass into
    the working image, bypassing the shared tile cache (a whole level would only flush it,
    and grow the process by the cache's size).
    """
    scales = getattr(slide, "level_scales", None)
    return scales is not None and len(scales(level)) > 1


def _dct_scale(slide: SlideLike, level: int, factor: int) -> int:
    """Return the largest DCT-domain scale of `level` that divides `factor`."""
    scales = getattr(slide, "level_scales", None)
    if factor < 2 or scales is None:
        return 1
    return max(int(s) for s in scales(level) if factor % s == 0)


def _dask_reader(slide: SlideLike) -> Callable[[int, Box], np.ndarray]:
    """Read a level box through the slide's dask level (a slide with no ``read_level``)."""
    from napari_slidescope.slide import read_pixels

    def read(level: int, box: Box) -> np.ndarray:
        y0, x0, y1, x1 = box
        sl = {"Y": slice(y0, y1), "X": slice(x0, x1)}
        index = tuple(sl.get(a, slice(None)) for a in slide.axes)
        return read_pixels(slide.levels[level][index])

    return read


def _read_working_dask(
    slide: SlideLike,
    level: int,
    box: Box,
    factor: int,
    cancel: threading.Event | None = None,
    scale: int = 1,
) -> np.ndarray:
    """:func:`_read_working` through the slide's dask level, at full size (`scale` unused)."""
    return _read_strips(slide, level, box, factor, cancel, _dask_reader(slide))


def _level_shape(slide: SlideLike, level: int) -> tuple[int, int]:
    """(rows, cols) of `level`, without building the slide's dask levels when it can."""
    shapes = getattr(slide, "level_shapes", None)
    if shapes is not None:
        rows, cols = shapes[level]
        return int(rows), int(cols)
    lvl = slide.levels[level]
    return int(lvl.shape[slide.axes.index("Y")]), int(lvl.shape[slide.axes.index("X")])


def detect_tissue(
    source: Any,
    *,
    region: Sequence[int] | Any = None,
    mpp: float | tuple[float, float] | None = None,
    options: TissueOptions | None = None,
    cancel: threading.Event | None = None,
    envelope_um: float = 0.0,
    **changes: Any,
) -> TissueResult:
    """Find the tissue on a whole slide or a region of it.

    Parameters
    ----------
    source : Slide, str, PathLike or (M, N, 3) ndarray of uint8
        An open slide, a path to one, or an RGB image (then ``mpp`` is required).
    region : (int, int, int, int), polygon or shapely Polygon, optional
        Level-0 box ``(y0, x0, y1, x1)``, half-open, clipped to the slide; or a polygon
        (see :func:`~napari_slidescope.pipeline.regions.split_region`): its bounding box
        is analysed and the tissue clipped to it. Default: the whole slide.
    mpp : float or (float, float), optional
        µm/px of an array source; for a slide, supplies a missing calibration.
    options : TissueOptions, optional
        The options (working resolution, mode, threshold, smoothing, sizes; see
        :class:`~napari_slidescope.options.TissueOptions`, which documents and checks
        each). Default: ``TissueOptions()``.
    **changes
        :class:`~napari_slidescope.options.TissueOptions` fields given by name
        (``target_mpp=4``, ``mode="fluorescence"``, ``min_tissue_um2=1e4``...), applied
        on top of ``options`` (``options.replace(**changes)``): a keyword wins over the
        same field of ``options``.
    cancel : threading.Event, optional
        Checked between the strips read and between analysis steps; once set, the run
        raises :class:`~napari_slidescope.pipeline.cancel.Cancelled`.
    envelope_um : float
        Brightfield: add the pale membranous tissue (fat) that touches the tissue and is
        open to the glass, closed by a disk of this radius in µm
        (:func:`~napari_slidescope.analysis.tissue.pale_tissue_envelope`); 0, the default,
        leaves the mask as tissue detection alone finds it. The tissue-region classifier
        gates with it (:func:`~napari_slidescope.pipeline.region_map.regions_tissue`).
        Recorded as ``parameters["envelope_um"]`` when not 0.

    Returns
    -------
    TissueResult

    Raises
    ------
    ValueError
        If the region is empty, outside the slide, or smaller than one working
        pixel; if ``envelope_um`` is negative; if an option is out of its range
        (``target_mpp`` not positive, ``mode`` unknown...: the message of
        :class:`~napari_slidescope.options.TissueOptions`).
    TypeError
        If a keyword is neither an argument nor a ``TissueOptions`` field.

    Warns
    -----
    SlidescopeWarning
        When the slide has no calibration: sizes then assume a nominal level-0 pixel
        (from the magnification, else 0.5 µm/px) and ``mpp``/``area_um2`` are None.

    Examples
    --------
    >>> with open_slide("slide.svs") as slide:  # doctest: +SKIP
    ...     tissue = detect_tissue(slide)
    ...     tissue.to_geojson("slide_tissue.geojson")
    """
    opts = TissueOptions.merged(options, changes, where="detect_tissue")
    if (
        isinstance(envelope_um, bool)
        or not isinstance(envelope_um, numbers.Real)  # numpy numbers are Real
        or not (math.isfinite(envelope_um) and envelope_um >= 0)
    ):
        raise ValueError(f"envelope_um: expected a radius >= 0 µm, got {envelope_um!r}")
    envelope_um = float(envelope_um)
    slide, owned = as_slide(source, mpp=mpp)
    try:
        return _detect(slide, region=region, options=opts, cancel=cancel, envelope_um=envelope_um)
    finally:
        if owned:
            slide.close()


def _detect(
    slide: SlideLike,
    *,
    region: Any,
    options: TissueOptions,
    cancel: threading.Event | None = None,
    envelope_um: float = 0.0,
) -> TissueResult:
    target_mpp, mode = options.target_mpp, options.mode
    name = str(getattr(slide, "path", "slide"))
    region, polygon = split_region(region)
    region = None if region is None else tuple(region)
    reg = check_region(region, slide.shape0, name="region")
    calibrated = slide.mpp is not None
    if slide.mpp is not None:
        mpp0 = (float(slide.mpp[0]), float(slide.mpp[1]))
    else:
        mag = getattr(slide, "magnification", None)
        nominal = 10.0 / mag if mag else NOMINAL_MPP
        mpp0 = (nominal, nominal)
        warnings.warn(
            f"{name}: no pixel size; tissue sizes assume {nominal:g} µm/px at level 0, "
            "results are in pixels (mpp and area_um2 are None); pass mpp= to calibrate",
            SlidescopeWarning,
            stacklevel=3,
        )
    # level_for_mpp reads the target as a downsample factor when uncalibrated
    level = slide.level_for_mpp(target_mpp if calibrated else target_mpp / mpp0[1])
    dy, dx = slide.downsamples[level]
    level_mpp = max(mpp0[0] * dy, mpp0[1] * dx)
    # the whole number of level pixels per working pixel nearest the target: a level at
    # 4.04 µm/px is read at 8.09 µm/px for 8 (a quarter of the pixels), not at 4.04
    factor = nearest_factor(level_mpp, target_mpp)
    wdy, wdx = dy * factor, dx * factor
    y0, x0, y1, x1 = reg
    if region is not None and (y1 - y0 < wdy or x1 - x0 < wdx):
        raise ValueError(
            f"region {tuple(region)!r} is {y1 - y0} x {x1 - x0} level-0 px, smaller than one "
            f"working pixel ({wdy:g} x {wdx:g} px at target_mpp={target_mpp:g} µm/px); "
            "pass a smaller target_mpp or a larger region"
        )
    ly0, lx0 = int(math.floor(y0 / dy)), int(math.floor(x0 / dx))
    lh, lw = _level_shape(slide, level)
    ly1, lx1 = min(int(math.ceil(y1 / dy)), lh), min(int(math.ceil(x1 / dx)), lw)
    scale = _dct_scale(slide, level, factor)
    # a DCT-scaled read starts on a multiple of its scale (the region's corner moves back
    # by less than one working pixel: the mask still covers the region)
    ly0, lx0 = ly0 // scale * scale, lx0 // scale * scale
    image = _read_working(slide, level, (ly0, lx0, ly1, lx1), factor, cancel, scale)
    check_cancel(cancel, "tissue detection")

    use: Mode
    if mode == "auto":
        use = _auto_mode(slide) or infer_mode(image)
    else:
        use = mode  # type: ignore[assignment]
    work_mpp = math.sqrt(mpp0[0] * wdy * mpp0[1] * wdx)
    mask, thr = tissue_mask(
        image,
        mpp=work_mpp,
        mode=use,
        threshold=options.threshold,
        smooth_um=options.smooth_um,
        min_tissue_um2=options.min_tissue_um2,
        max_hole_um2=options.max_hole_um2,
        outer_only=options.outer_only,
        reject_artifacts=options.reject_artifacts,
        envelope_um=float(envelope_um),
    )
    del image  # the polygons need the mask only
    check_cancel(cancel, "tissue detection")

    origin = (round(ly0 * dy), round(lx0 * dx))
    ds = (wdy, wdx)
    if polygon is not None:  # tissue clipped to the polygon (mask pixel centres inside)
        mask = mask & geometry.polygons_to_mask(
            [polygon], shape=mask.shape, downsample=ds, origin=origin
        )
    # the outlines are traced when first asked for (TissueResult.polygons)
    # the one definition of tissue area (pipeline.summary): mask pixels inside the region
    area_px = tissue_area_px(mask, origin, ds, [reg])
    return TissueResult(
        mask=mask,
        mpp=work_mpp if calibrated else None,
        origin=origin,
        downsample=ds,
        area_um2=area_px * mpp0[0] * mpp0[1] if calibrated else None,
        area_px=area_px,
        fraction=area_px / float((y1 - y0) * (x1 - x0)),
        region=reg,
        level=level,
        mode=use,
        threshold=thr,
        parameters={"options": options.as_dict()}
        | ({"envelope_um": float(envelope_um)} if envelope_um > 0 else {}),
    )
