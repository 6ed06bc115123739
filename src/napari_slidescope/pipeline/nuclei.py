"""Public nuclei segmentation: :func:`segment_nuclei` and its streaming variant.

A region of a slide (or an RGB array) is cut into overlapping tiles at the
segmenter's working resolution (:mod:`~napari_slidescope.pipeline.tiling`); tiles
without tissue are skipped unread; the others run through the staged
read -> model -> post-process runner (:mod:`~napari_slidescope.pipeline.runner`)
and are stitched into one label image with a measurement table
(:class:`NucleiResult`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from napari_slidescope._warnings import SlidescopeWarning
from napari_slidescope.analysis.cells import compartment_means
from napari_slidescope.analysis.geometry import labels_to_polygons
from napari_slidescope.analysis.measure import concat_tables, measure_nuclei
from napari_slidescope.analysis.resample import resample_nearest
from napari_slidescope.analysis.stains import StainMatrix, estimate_stains, for_stain
from napari_slidescope.options import NucleiOptions
from napari_slidescope.pipeline.cancel import check_cancel
from napari_slidescope.pipeline.nuclei_result import NucleiResult
from napari_slidescope.pipeline.runner import TileResult, iter_tiles, postprocess_tile
from napari_slidescope.pipeline.tiling import (
    Box,
    Tile,
    TilePlan,
    make_plan,
    paste_owned,
    read_tile,
)
from napari_slidescope.segmenters import (
    AUTO,
    ImageKind,
    Segmenter,
    SegmenterBase,
    SegmenterMismatchWarning,
    as_segmenter,
    available_segmenters,
    get_segmenter,
    identity_of,
    image_kind,
    resolve_auto,
    signal_channel,
    working_mpp,
)
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser

__all__ = [
    "NucleiOptions",
    "NucleiResult",
    "NucleiStep",
    "PreparedNuclei",
    "iter_segment_nuclei",
    "prepare_nuclei",
    "segment_nuclei",
]

#: Tissue detection runs first (``tissue="auto"``) when the plan has more tiles than this.
AUTO_TISSUE_TILES = 4

#: Tile side in µm when none is given (a few hundred nuclei per tile at any resolution):
#: ``NucleiOptions().tile_size_um``, kept under this name for existing imports.
DEFAULT_TILE_SIZE_UM = NucleiOptions().tile_size_um
#: Largest label image :func:`segment_nuclei` builds with ``labels="auto"`` (1 GiB of
#: int32: 16k x 16k px at the working resolution, a 4 x 4 mm region at 0.25 µm/px).
#: Beyond it the result keeps the table and one outline per nucleus, not the image.
DENSE_LABELS_BYTES = 2**30
#: Most working-resolution pixels read to prepare a segmenter (stain vectors, threshold,
#: intensity scaling): square crops of up to ``_SAMPLE_TILES`` tiles spread over the region.
_SAMPLE_PIXELS = 2_000_000
_SAMPLE_TILES = 8
#: Tile cores narrower than this (working px) are sampled only when no other tile is left.
_SAMPLE_MIN_SIDE = 64

#: Pixels per stain-unmixing call. A (n, 3) @ (3, 3) product of a million rows makes
#: OpenBLAS start its threads: 8x slower than in chunks on one thread, and those threads
#: compete with the pipeline's workers.
_UNMIX_ROWS = 32_768

TissueArg = Literal["auto"] | bool | Any


@dataclass
class NucleiStep:
    """One step of :func:`iter_segment_nuclei`: a finished tile and the progress.

    Attributes
    ----------
    result : TileResult
        The tile's owned nuclei (region-unique ids) and their table rows.
    done, total : int
        Tiles finished so far and tiles to segment (tiles with tissue).
    plan : TilePlan
        The plan of the whole run (working grid of the output labels).
    """

    result: TileResult
    done: int
    total: int
    plan: TilePlan


#: Keywords of the entry points that go to the tiled runner
#: (:func:`~napari_slidescope.pipeline.runner.iter_tiles`): how a run executes, never what
#: it computes.
RUNNER_KEYWORDS = frozenset(
    ("level", "workers", "read_threads", "batch_size", "queue_size", "max_in_flight")
    + ("model_threads", "reader", "monitor", "cancel")
)


@dataclass(frozen=True)
class _Request:
    """What a caller of an entry point asked for, checked, as one value.

    :func:`segment_nuclei`, :func:`iter_segment_nuclei` and :func:`prepare_nuclei` take the
    same arguments: the options of the run as one
    :class:`~napari_slidescope.options.NucleiOptions` (or its fields by name, applied on
    top) and the runner's keywords; :func:`_request` sorts them into one of these.
    """

    region: Any
    mpp: float | tuple[float, float] | None
    options: NucleiOptions
    #: A segmenter object given as ``segmenter=`` (then ``options.segmenter`` is its name).
    segmenter: Segmenter | None
    tissue: TissueArg
    runner_kwargs: dict[str, Any]


def _request(
    where: str,
    *,
    region: Any,
    mpp: float | tuple[float, float] | None,
    options: NucleiOptions | None,
    tissue: TissueArg,
    workers: int | None,
    keywords: dict[str, Any],
) -> _Request:
    """Sort an entry point's keywords into options (checked) and runner keywords.

    Keywords naming :class:`~napari_slidescope.options.NucleiOptions` fields are applied on
    top of `options` (a keyword wins over the same field); ``segmenter=`` may also be a
    segmenter object; :data:`RUNNER_KEYWORDS` go to the runner.

    Raises
    ------
    TypeError
        For a keyword that is neither, or ``segmenter_options`` with a segmenter object.
    ValueError
        For a bad option value (the message of ``NucleiOptions``).
    """
    fields = {f.name for f in dataclasses.fields(NucleiOptions)}
    changes = {k: v for k, v in keywords.items() if k in fields}
    runner = {k: v for k, v in keywords.items() if k not in fields}
    unknown = sorted(set(runner) - RUNNER_KEYWORDS)
    if unknown:
        raise TypeError(
            f"{where}() got unexpected keyword argument(s) {unknown}; expected NucleiOptions "
            f"fields {sorted(fields)} or runner keywords {sorted(RUNNER_KEYWORDS)}"
        )
    if workers is not None:
        runner["workers"] = workers
    if "segmenter_options" in changes and changes["segmenter_options"] is None:
        changes["segmenter_options"] = {}  # None always meant "no options"
    seg_object = None
    if "segmenter" in changes and not isinstance(changes["segmenter"], str):
        seg_object = as_segmenter(changes["segmenter"])
        name = getattr(seg_object, "name", None)
        changes["segmenter"] = name if isinstance(name, str) else type(seg_object).__name__
    opts = NucleiOptions.merged(options, changes, where=where)
    if seg_object is not None and opts.segmenter_options:
        raise TypeError("segmenter_options need a segmenter given by name")
    return _Request(region, mpp, opts, seg_object, tissue, runner)


@dataclass
class _Run:
    slide: Any
    owned: bool
    plan: TilePlan
    tiles: tuple[Tile, ...]
    segmenter: Any
    measure: Callable[[np.ndarray, np.ndarray, Tile], dict[str, np.ndarray]]
    array_shape: tuple[int, int] | None
    runner_kwargs: dict[str, Any] = field(default_factory=dict)
    #: A region polygon (level-0 ``(row, col)``): only nuclei whose centroid is inside.
    polygon: np.ndarray | None = None
    #: What ran, every default resolved (:func:`_resolved`).
    parameters: dict[str, Any] = field(default_factory=dict)


def _as_source(source: Any, mpp: float | tuple[float, float] | None) -> tuple[Any, bool, bool]:
    """Return ``(slide, owned, is_array)`` for a Slide, a path or an RGB array."""
    from napari_slidescope.pipeline.regions import as_slide

    is_array = (
        not isinstance(source, str | os.PathLike)
        and not hasattr(source, "read_region")
        and (hasattr(source, "shape") and hasattr(source, "dtype"))
    )
    slide, owned = as_slide(source, mpp=mpp)
    return slide, owned, is_array


def _working_sample(
    slide: Any, plan: TilePlan, tiles: tuple[Tile, ...], cancel: Any = None
) -> np.ndarray:
    """Pixels of the region's tiles at the working resolution, for ``segmenter.prepare``.

    The stain vectors, the hematoxylin threshold and a model's intensity scaling are
    estimated once per run from what the tiles will look like: square crops from the
    middle of the cores of up to ``_SAMPLE_TILES`` tiles spread evenly over the (tissue)
    tiles, ``_SAMPLE_PIXELS`` at most, read exactly as the tiles are read and stacked
    vertically. A region of one small tile gives its whole core.
    """
    wide = [t for t in tiles if min(_box_shape(t.core)) >= _SAMPLE_MIN_SIDE] or list(tiles)
    step = max(1, math.ceil(len(wide) / _SAMPLE_TILES))
    picks = wide[::step][:_SAMPLE_TILES]
    side = min(
        math.isqrt(_SAMPLE_PIXELS // len(picks)),
        *(min(_box_shape(t.core)) for t in picks),
    )
    level = coarsest_level_not_coarser(slide.downsamples, plan.downsample)
    crops = []
    for t in picks:
        check_cancel(cancel, "segmenter preparation")
        cy0, cx0, cy1, cx1 = t.core
        y0, x0 = cy0 + (cy1 - cy0 - side) // 2, cx0 + (cx1 - cx0 - side) // 2
        box = (y0, x0, y0 + side, x0 + side)
        crop = dataclasses.replace(t, box=box, core=box, box0=plan.working_to_level0(box))
        crops.append(read_tile(slide, crop, plan, level=level))
    return np.concatenate(crops, axis=0)


def _box_shape(box: Box) -> tuple[int, int]:
    return box[2] - box[0], box[3] - box[1]


def _tissue_tiles(plan: TilePlan, tissue: Any) -> tuple[Tile, ...]:
    """Tiles whose core touches tissue in a ``TissueResult``-like mask."""
    from napari_slidescope.analysis.geometry import tiles_with_tissue

    if not plan.tiles:
        return ()
    cores = [plan.working_to_level0(t.core) for t in plan.tiles]
    keep = tiles_with_tissue(tissue, cores)
    return tuple(t for t, k in zip(plan.tiles, keep, strict=True) if k)


class _ChannelView(SegmenterBase):
    """A fluorescence segmenter given one channel of multichannel tiles."""

    def __init__(self, segmenter: Segmenter, channel: int) -> None:
        super().__init__(target_mpp=segmenter.target_mpp, min_overlap_um=segmenter.min_overlap_um)
        self.inner, self.channel = segmenter, channel
        self.name, self.input = segmenter.name, segmenter.input
        self.parallel_predict = segmenter.parallel_predict

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Prepare the segmenter on the channel."""
        self.inner.prepare(reference[..., self.channel : self.channel + 1], mpp=mpp)

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Predict on the channel."""
        return self.inner.predict(tiles[..., self.channel : self.channel + 1], mpp=mpp)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Run the segmenter's own post-processing."""
        return self.inner.postprocess(raw, mpp=mpp)

    def identity(self) -> dict[str, Any]:
        """Return the wrapped segmenter's identity."""
        return identity_of(self.inner)


def _resolved(
    segmenter: Segmenter, kind: ImageKind, plan: TilePlan, options: NucleiOptions
) -> dict[str, Any]:
    """Return what a run computes with, every default (``"auto"`` included) resolved.

    The segmenter's identity (name, model, model version, SHA-256 of the weights), what
    ran its network when it has a choice (``runtime``: InstanSeg's ``"torch"`` or
    ``"onnxruntime"``, else None), the working resolution, the stain mode
    (``"brightfield"`` or ``"fluorescence"``), the nuclear channel's name (fluorescence),
    the segmenter's options (by name) and, as ``options``, the
    :class:`~napari_slidescope.options.NucleiOptions` asked for (``as_dict()``).
    """
    channel = None
    if kind.input == "fluorescence" and kind.nuclear_channel is not None:
        channel = kind.channel_names[kind.nuclear_channel]
    return {
        **identity_of(segmenter),
        "runtime": getattr(segmenter, "runtime", None),
        "mpp": float(plan.mpp),
        "stain_mode": kind.input,
        "nuclear_channel": channel,
        "segmenter_options": dict(options.segmenter_options),
        "options": options.as_dict(),
    }


def _segmenter(name: str, kind: ImageKind, options: dict[str, Any]) -> Segmenter:
    """Return the segmenter named (``"auto"`` resolved for the image), created."""
    return get_segmenter(resolve_auto(kind.input) if name == AUTO else name, **options)


def _check_input(segmenter: Segmenter, kind: ImageKind, where: str) -> None:
    """Warn (RGB-encoded fluorescence) or refuse when a segmenter reads the other kind."""
    if segmenter.input == kind.input:
        return
    right = [resolve_auto(kind.input, warn=False), *available_segmenters(kind.input)]
    names = ", ".join(dict.fromkeys(repr(n) for n in right))
    message = (
        f"{where}: segmenter {segmenter.name!r} reads {segmenter.input} images but this is a "
        f"{kind.input} image ({', '.join(kind.channel_names)}); use {names} "
        '(or segmenter="auto")'
    )
    if kind.input == "fluorescence" and kind.rgb_encoded:
        warnings.warn(message, SegmenterMismatchWarning, stacklevel=4)
        return
    raise ValueError(message)


def _work_plan(
    slide: Any,
    segmenter: Segmenter,
    kind: ImageKind,
    *,
    region: Box | None,
    target_mpp: float | None,
    tile_size_um: float,
    is_array: bool,
    cell_expansion_um: float | None = None,
) -> TilePlan:
    """Plan the tiles at the working resolution (:func:`~.segmenters.working_mpp`).

    Cells widen the overlap by twice the expansion: an owned nucleus's cell and every
    neighbour that could stop its growth then lie inside the tile.
    """
    from napari_slidescope.pipeline.regions import check_region

    region = check_region(region, slide.shape0, name="region")
    work_mpp = working_mpp(segmenter, slide.mpp, target_mpp, input=kind.input)
    slide_mpp = slide.mpp if slide.mpp is not None else (work_mpp, work_mpp)
    if work_mpp < 0.66 * min(slide_mpp):
        warnings.warn(
            f"target_mpp={work_mpp} is finer than the slide ({min(slide_mpp)} µm/px): "
            "tiles are upsampled",
            SlidescopeWarning,
            stacklevel=4,
        )
    path = None if is_array or getattr(slide, "format", "") == "array" else str(slide.path)
    return make_plan(
        region,
        slide_mpp=slide_mpp,
        target_mpp=work_mpp,
        tile_size_um=tile_size_um,
        min_overlap_um=segmenter.min_overlap_um + 2 * (cell_expansion_um or 0.0),
        path=path,
    )


def _tissue_filter(
    slide: Any, plan: TilePlan, tissue: TissueArg, cancel: Any = None, polygon: Any = None
) -> tuple[Tile, ...]:
    """Return the tiles that touch tissue (``tissue="auto"``: detect on big plans)."""
    if tissue == "auto":
        tissue = len(plan) > AUTO_TISSUE_TILES
    if tissue is True:
        from napari_slidescope.pipeline.tissue import detect_tissue

        where = plan.region if polygon is None else polygon
        tissue = detect_tissue(slide, region=where, cancel=cancel)
    return plan.tiles if tissue is False or tissue is None else _tissue_tiles(plan, tissue)


def _prepare_run(
    slide: Any,
    plan: TilePlan,
    tiles: tuple[Tile, ...],
    segmenter: Segmenter,
    kind: ImageKind,
    cancel: Any = None,
    stain: str = "auto",
) -> tuple[Segmenter, ImageKind, Any]:
    """Prepare the segmenter on a working sample; fix the nuclear channel and the stains."""
    if not tiles:
        return segmenter, kind, None
    sample = _working_sample(slide, plan, tiles, cancel)
    kind = signal_channel(kind, sample)
    if segmenter.input == "fluorescence" and kind.nuclear_channel is not None:
        segmenter = _ChannelView(segmenter, kind.nuclear_channel)
    segmenter.prepare(sample, mpp=plan.mpp)
    check_cancel(cancel, "segmenter preparation")
    stains = None
    if kind.input == "brightfield":
        stains = getattr(segmenter, "stains", None)  # a segmenter's own (the built-in's)
        if not callable(getattr(stains, "separate", None)):
            stains = estimate_stains(sample[..., :3])
        if isinstance(stains, StainMatrix):
            stains = for_stain(stains, stain)
    return segmenter, kind, stains


def _measure(
    plan: TilePlan, kind: ImageKind, stains: Any, cell_expansion_um: float | None = None
) -> Callable[..., dict[str, np.ndarray]]:
    """Measurements that fit the image: stain ODs (H&E, H-DAB), channel means (fluorescence).

    With cells (``cell_expansion_um``) the table also has every channel's (or stain's)
    mean per compartment, ``{name}_{nucleus|cytoplasm|cell}_mean``, and the cell and
    cytoplasm areas.
    """
    columns = kind.mean_columns() if kind.input == "fluorescence" else {}
    second = getattr(stains, "second", "eosin")

    def measure(
        owned_labels: np.ndarray,
        pixels: np.ndarray,
        tile: Tile,
        cells: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        dy, dx = plan.downsample
        origin = (plan.origin[0] + tile.box[0] * dy, plan.origin[1] + tile.box[1] * dx)
        mask = owned_labels > 0 if cells is None else cells > 0
        od = None
        if stains is not None and mask.any():  # unmix only the nuclei's pixels
            rgb = pixels[mask][:, :3]
            unmixed = [
                stains.separate(rgb[i : i + _UNMIX_ROWS]) for i in range(0, len(rgb), _UNMIX_ROWS)
            ]
            od = np.zeros((*mask.shape, unmixed[0].shape[-1]), np.float32)
            od[mask] = np.concatenate(unmixed)
        table = measure_nuclei(
            owned_labels,
            mpp=plan.mpp,
            od=od,
            origin=origin,
            downsample=plan.downsample,
            channels=pixels[..., list(columns)] if columns else None,
            channel_columns=tuple(columns.values()),
        )
        if second == "dab" and "eosin_od_mean" in table:
            table = {("dab_od_mean" if k == "eosin_od_mean" else k): v for k, v in table.items()}
        if cells is not None:
            table.update(_compartments(owned_labels, cells, table["id"], pixels, od))
        return table

    def _compartments(
        nuclei: np.ndarray, cells: np.ndarray, ids: np.ndarray, pixels: np.ndarray, od: Any
    ) -> dict[str, np.ndarray]:
        if columns:
            names = [c.removesuffix("_mean") for c in columns.values()]
            values = pixels[..., list(columns)]
        elif stains is not None:
            names = ["hematoxylin_od", f"{second}_od"]
            values = od[..., :2] if od is not None else np.zeros((*nuclei.shape, 2), np.float32)
        else:
            names, values = [], np.zeros((*nuclei.shape, 0), np.float32)
        out = compartment_means(nuclei, cells, ids, values, names)
        px_area = plan.mpp * plan.mpp
        out["cell_area_um2"] = out.pop("cell_area_px") * px_area
        out["cytoplasm_area_um2"] = out.pop("cytoplasm_area_px") * px_area
        return out

    if cell_expansion_um:
        measure.cell_distance_px = cell_expansion_um / plan.mpp  # type: ignore[attr-defined]
    return measure


def _setup(source: Any, request: _Request) -> _Run:
    """Open the source, plan the tiles, find tissue and prepare the segmenter."""
    from napari_slidescope.pipeline.regions import split_region

    options = request.options
    region, polygon = split_region(request.region)
    cancel = request.runner_kwargs.get("cancel")  # the runner checks it too
    cells_um = options.cell_expansion_um
    slide, owned, is_array = _as_source(source, request.mpp)
    try:
        check_cancel(cancel, "set-up")
        kind = image_kind(slide, channel=options.channel)
        seg = (
            request.segmenter
            if request.segmenter is not None
            else _segmenter(options.segmenter, kind, dict(options.segmenter_options))
        )
        _check_input(seg, kind, str(getattr(slide, "path", "image")))
        plan = _work_plan(
            slide,
            seg,
            kind,
            region=region,
            target_mpp=options.target_mpp,
            tile_size_um=options.tile_size_um,
            is_array=is_array,
            cell_expansion_um=cells_um,
        )
        tiles = _tissue_filter(slide, plan, request.tissue, cancel, polygon)
        seg, kind, stains = _prepare_run(slide, plan, tiles, seg, kind, cancel, options.stain)
    except BaseException:
        if owned:
            slide.close()
        raise
    array_shape = tuple(slide.shape0) if is_array else None
    measure = _measure(plan, kind, stains, cells_um)
    runner_kwargs = dict(request.runner_kwargs)
    return _Run(
        slide, owned, plan, tiles, seg, measure, array_shape, runner_kwargs, polygon,
        _resolved(seg, kind, plan, options),
    )  # fmt: skip


def _steps(run: _Run) -> Generator[NucleiStep, None, None]:
    try:
        gen = iter_tiles(
            run.slide,
            run.plan,
            run.segmenter,
            tiles=run.tiles,
            measure=run.measure,
            **run.runner_kwargs,
        )
        try:
            for done, res in enumerate(gen, 1):
                if run.polygon is not None:
                    res = _inside(res, run.polygon)
                yield NucleiStep(res, done, len(run.tiles), run.plan)
        finally:
            gen.close()
    finally:
        if run.owned:
            run.slide.close()


def _inside(res: TileResult, polygon: np.ndarray) -> TileResult:
    """Keep a tile's nuclei whose centroid lies inside `polygon` (level-0 (row, col))."""
    from napari_slidescope.pipeline.regions import inside_polygon

    table = res.table
    if not table or "id" not in table or not table["id"].size:
        return res
    keep = inside_polygon(table["centroid_row"], table["centroid_col"], polygon)
    if keep.all():
        return res
    labels = np.where(np.isin(res.labels, table["id"][~keep]), 0, res.labels).astype(np.int32)
    cells = res.cells
    if cells is not None:
        cells = np.where(np.isin(cells, table["id"][~keep]), 0, cells).astype(np.int32)
    table = {k: np.asarray(v)[keep] for k, v in table.items()}
    return dataclasses.replace(res, labels=labels, count=int(keep.sum()), table=table, cells=cells)


def iter_segment_nuclei(
    source: Any,
    *,
    region: Box | None = None,
    mpp: float | tuple[float, float] | None = None,
    options: NucleiOptions | None = None,
    tissue: TissueArg = "auto",
    workers: int | None = None,
    **keywords: Any,
) -> Generator[NucleiStep, None, None]:
    """Segment nuclei tile by tile, yielding each finished tile (see :func:`segment_nuclei`).

    The options are checked on the call; set-up (opening, tissue detection, stain
    estimation) runs on the first ``next()``. Closing the generator stops the run and
    joins its threads. The arguments are those of :func:`segment_nuclei`; keywords of
    :data:`RUNNER_KEYWORDS` go to :func:`~napari_slidescope.pipeline.runner.iter_tiles`
    (``batch_size``, ``queue_size``, ``read_threads``, ``max_in_flight``, ``monitor``).

    Yields
    ------
    step : NucleiStep
        Tiles in plan order; ``step.result.labels`` covers ``step.result.tile.box``
        of the working grid ``step.plan``.
    """
    request = _request(
        "iter_segment_nuclei", region=region, mpp=mpp, options=options, tissue=tissue,
        workers=workers, keywords=keywords,
    )  # fmt: skip
    return _iter_steps(source, request)


def _iter_steps(source: Any, request: _Request) -> Generator[NucleiStep, None, None]:
    yield from _steps(_setup(source, request))


def segment_nuclei(
    source: Any,
    *,
    region: Box | None = None,
    mpp: float | tuple[float, float] | None = None,
    options: NucleiOptions | None = None,
    tissue: TissueArg = "auto",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels: bool | Literal["auto"] = "auto",
    **keywords: Any,
) -> NucleiResult:
    """Segment and measure the nuclei of a region of a slide (H&E or fluorescence).

    The table has the geometry of every nucleus, and the stain optical densities
    (``hematoxylin_od_mean``, ``eosin_od_mean``) for brightfield slides, or the mean of
    every channel under each nucleus (``DAPI_mean``, ``FITC_mean``...) for fluorescence
    and multiplex slides.

    Parameters
    ----------
    source : Slide, str, Path or (M, N, 3) ndarray of uint8 or (M, N) ndarray
        A slide, a slide path, an RGB array or one fluorescence channel (arrays need
        ``mpp``).
    region : tuple of int, polygon or shapely Polygon, optional
        Level-0 box ``(y0, x0, y1, x1)``; default the whole slide. A polygon (level-0
        ``(row, col)`` vertices, or a shapely ``Polygon`` in ``(x, y)``, see
        :func:`~napari_slidescope.pipeline.regions.split_region`): its bounding box is
        segmented and only the nuclei whose centroid lies inside it are kept.
    mpp : float or (float, float), optional
        µm per pixel of an array source (required); for a slide, supplies a missing
        calibration.
    options : NucleiOptions, optional
        What the run computes with: segmenter, working resolution (``target_mpp``),
        ``tile_size_um``, fluorescence ``channel``, brightfield ``stain``,
        ``cell_expansion_um`` and ``segmenter_options``, each documented and checked by
        :class:`~napari_slidescope.options.NucleiOptions`. Default: ``NucleiOptions()``.
    tissue : "auto", bool or TissueResult
        Skip tiles without tissue (never read at full resolution). ``"auto"`` runs
        :func:`~napari_slidescope.pipeline.tissue.detect_tissue` first when the
        region spans more than ``AUTO_TISSUE_TILES`` tiles.
    workers : int, optional
        Post-processing threads; default ``os.cpu_count()``.
    progress : callable, optional
        ``progress(done, total)`` called with ``(0, total)`` once set up and after each
        tile (the one progress signature of the library).
    labels : "auto" or bool
        Build the label image of the region (True), or keep only the table and each
        nucleus's outline (False: memory grows with the number of nuclei, not with the
        region). ``"auto"`` builds it up to :data:`DENSE_LABELS_BYTES` and otherwise warns
        and keeps the outlines (a whole slide at 0.25 µm/px is tens of GB of labels).
        Array sources always get labels in the array's own pixels.
    **keywords
        ``NucleiOptions`` fields by name (``target_mpp=0.5``, ``segmenter="builtin"``,
        ``tile_size_um=256``, ``channel="DAPI"``, ``stain="H-DAB"``,
        ``cell_expansion_um=5``, ``segmenter_options={...}``), applied on top of
        ``options`` (``options.replace(...)``): a keyword wins over the same field of
        ``options``. ``segmenter=`` also takes a
        :class:`~napari_slidescope.segmenters.Segmenter` object (an object with only
        ``predict``/``postprocess`` gets the protocol's defaults); the recorded
        ``options.segmenter`` is then its name. The other keywords
        (:data:`RUNNER_KEYWORDS`) go to :func:`~napari_slidescope.pipeline.runner.iter_tiles`
        and change how fast, never what, a run computes.

    Returns
    -------
    NucleiResult
        Labels at the working resolution over the region (for an array source:
        in the array's own pixels over the region) and the measurement table.

    Raises
    ------
    ValueError
        Bad array, missing ``mpp``, an empty / out-of-bounds region, an option out of its
        range (the message of ``NucleiOptions``) or a segmenter that reads the other kind of
        image (brightfield / fluorescence; on an RGB-encoded fluorescence scan it runs with a
        :class:`~napari_slidescope.segmenters.SegmenterMismatchWarning`).
    TypeError
        A keyword that is neither an option nor a runner keyword.

    Examples
    --------
    >>> res = segment_nuclei("slide.svs", region=(0, 0, 4096, 4096))  # doctest: +SKIP
    >>> res.count, res.table["area_um2"].mean()  # doctest: +SKIP
    """
    request = _request(
        "segment_nuclei", region=region, mpp=mpp, options=options, tissue=tissue,
        workers=workers, keywords=keywords,
    )  # fmt: skip
    if labels not in (True, False, "auto"):
        raise ValueError(f"labels must be True, False or 'auto'; got {labels!r}")
    run = _setup(source, request)
    plan = run.plan
    dense = _dense_labels(labels, plan, run.array_shape is not None)
    image = np.zeros(plan.shape, np.int32) if dense else None
    with_cells = bool(getattr(run.measure, "cell_distance_px", 0))
    cell_image = np.zeros(plan.shape, np.int32) if dense and with_cells else None
    polys: list[np.ndarray] = []
    poly_ids: list[np.ndarray] = []
    cell_polys: list[np.ndarray] = []
    cell_ids: list[np.ndarray] = []
    tables = []
    if progress is not None:
        progress(0, len(run.tiles))
    for step in _steps(run):
        cells = step.result.cells
        if image is not None:
            paste_owned(image, step.result.labels, step.result.tile)
            if cell_image is not None and cells is not None:
                paste_owned(cell_image, cells, step.result.tile)
        else:  # outlines in level-0 px, tile by tile: memory grows with the nuclei only
            dy, dx = plan.downsample
            y0, x0 = step.result.tile.box[:2]
            tile_origin = (plan.origin[0] + y0 * dy, plan.origin[1] + x0 * dx)
            p, i = labels_to_polygons(
                step.result.labels, downsample=plan.downsample, origin=tile_origin
            )
            polys.extend(p)
            poly_ids.append(i)
            if cells is not None:
                p, i = labels_to_polygons(cells, downsample=plan.downsample, origin=tile_origin)
                cell_polys.extend(p)
                cell_ids.append(i)
        tables.append(step.result.table)
        if progress is not None:
            progress(step.done, step.total)
    table = concat_tables(tables)
    origin, downsample = plan.origin, plan.downsample
    out_mpp: float | tuple[float, float] = plan.mpp
    if image is not None and run.array_shape is not None and plan.downsample != (1.0, 1.0):
        image = _to_level0(image, plan)
        if cell_image is not None:
            cell_image = _to_level0(cell_image, plan)
        downsample = (1.0, 1.0)
        out_mpp = (plan.mpp / plan.downsample[0], plan.mpp / plan.downsample[1])
        if out_mpp[0] == out_mpp[1]:
            out_mpp = out_mpp[0]
    outlines = cell_outlines = None
    if image is None:
        ids = np.concatenate(poly_ids) if poly_ids else np.zeros(0, np.int64)
        outlines = (polys, ids)
        if with_cells:
            ids = np.concatenate(cell_ids) if cell_ids else np.zeros(0, np.int64)
            cell_outlines = (cell_polys, ids)
    return NucleiResult(
        labels=image,
        mpp=out_mpp,
        origin=origin,
        downsample=downsample,
        count=int(table["id"].size),
        table=table,
        region=plan.region,
        segmenter=run.segmenter.name,
        source=None if plan.path is None else Path(plan.path),
        parameters=dict(run.parameters),
        outlines=outlines,
        cells=cell_image,
        cell_outlines=cell_outlines,
    )


def _dense_labels(labels: bool | str, plan: TilePlan, is_array: bool) -> bool:
    """Whether segment_nuclei builds the label image (see its ``labels`` parameter)."""
    if is_array or labels is True:
        return True
    if labels is False:
        return False
    nbytes = 4 * math.prod(plan.shape)
    if nbytes <= DENSE_LABELS_BYTES:
        return True
    warnings.warn(
        f"segment_nuclei: the labels of this region ({plan.shape[0]} x {plan.shape[1]} px at "
        f"{plan.mpp:g} µm/px) would take {nbytes / 2**30:.1f} GiB; the result keeps the "
        "table and each nucleus's outline (labels=None). Pass labels=True to build the "
        "image anyway, or use iter_segment_nuclei to stream the tiles.",
        SlidescopeWarning,
        stacklevel=3,
    )
    return False


def _to_level0(labels: np.ndarray, plan: TilePlan) -> np.ndarray:
    """Nearest-neighbour labels on the level-0 pixels of the plan's region."""
    y0, x0, y1, x1 = plan.region
    out = np.zeros((y1 - y0, x1 - x0), labels.dtype)
    sampled = resample_nearest(
        labels,
        src_origin=plan.origin,
        src_downsample=plan.downsample,
        dst_origin=(y0, x0),
        dst_downsample=(1.0, 1.0),
        dst_shape=out.shape,
    )
    if sampled is not None:
        (r0, c0, r1, c1), patch = sampled
        out[r0:r1, c0:c1] = patch
    return out


class PreparedNuclei:
    """A nuclei run set up and not yet run: its plan, its tiles and a prepared segmenter.

    Made by :func:`prepare_nuclei`. :meth:`segment` runs any subset of the tiles with
    exactly the per-tile steps of :func:`segment_nuclei` (read, model, post-process,
    ownership, measurements), so a tile segmented here, in another process or on
    another machine gives the same nuclei as in one ``segment_nuclei`` call. This is
    the entry point for engines that spread a slide's tiles over processes (the batch
    engine in :mod:`napari_slidescope.batch`).

    Attributes
    ----------
    plan : TilePlan
        The plan of the whole region.
    tiles : tuple of Tile
        The tiles ``segment_nuclei`` would segment (those with tissue), in plan order.
    segmenter : Segmenter
        The prepared segmenter.
    parameters : dict
        What the run computes with, every default resolved (see
        :attr:`NucleiResult.parameters`).
    """

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def plan(self) -> TilePlan:  # noqa: D102
        return self._run.plan

    @property
    def tiles(self) -> tuple[Tile, ...]:  # noqa: D102
        return self._run.tiles

    @property
    def segmenter(self) -> Segmenter:  # noqa: D102
        return self._run.segmenter

    @property
    def parameters(self) -> dict[str, Any]:
        """What the run computes with, every default resolved (as ``NucleiResult.parameters``)."""
        return dict(self._run.parameters)

    def segment(self, indices: Sequence[int], **runner_kwargs: Any) -> Iterator[TileResult]:
        """Segment the tiles with these plan indices, yielding one result per tile.

        Parameters
        ----------
        indices : sequence of int
            ``Tile.index`` values of tiles in :attr:`tiles`.
        **runner_kwargs
            Passed to :func:`~napari_slidescope.pipeline.runner.iter_tiles`
            (``workers``, ``read_threads``, ...; they change speed, never results).

        Yields
        ------
        TileResult
            In the order of ``indices`` (one staged run: reading, the model and
            post-processing of different tiles overlap); ids are local to each tile
            (``1 .. count``):
            add the counts of the tiles before it in :attr:`tiles` to get the ids
            :func:`segment_nuclei` gives.

        Raises
        ------
        ValueError
            If an index is not one of :attr:`tiles`.
        """
        by_index = {t.index: t for t in self._run.tiles}
        missing = [int(i) for i in indices if int(i) not in by_index]
        if missing:
            raise ValueError(f"indices: tiles {missing} are not among the tiles to segment")
        kwargs = {**self._run.runner_kwargs, **runner_kwargs}
        # one staged run over all the tiles (reading and post-processing overlap the
        # model), ids made local to each tile again
        gen = iter_tiles(
            self._run.slide,
            self._run.plan,
            self._run.segmenter,
            tiles=[by_index[int(i)] for i in indices],
            measure=self._run.measure,
            **kwargs,
        )
        try:
            for res in gen:
                if res.offset:
                    shift = np.int32(res.offset)
                    labels = np.where(res.labels > 0, res.labels - shift, 0).astype(np.int32)
                    table = {**res.table, "id": np.asarray(res.table["id"]) - shift}
                    cells = res.cells
                    if cells is not None:
                        cells = np.where(cells > 0, cells - shift, 0).astype(np.int32)
                    res = dataclasses.replace(
                        res, labels=labels, table=table, offset=0, cells=cells
                    )
                yield res
        finally:
            gen.close()

    def columns(self) -> list[str]:
        """Return table columns this run's tiles will have (one tile read, nothing segmented)."""
        if not self._run.tiles:
            return []
        tile = self._run.tiles[0]
        pixels = self._read(tile)
        empty = np.zeros(pixels.shape[:2], np.int32)
        measure: Any = self._run.measure
        if getattr(measure, "cell_distance_px", 0):
            return list(measure(empty, pixels, tile, empty))
        return list(measure(empty, pixels, tile))

    def _tile(self, index: int) -> Tile:
        for t in self._run.tiles:
            if t.index == int(index):
                return t
        raise ValueError(f"index: tile {index} is not among the tiles to segment")

    def _read(self, tile: Tile) -> np.ndarray:
        kwargs = self._run.runner_kwargs
        if kwargs.get("reader") is not None:
            return np.asarray(kwargs["reader"](tile))
        level = kwargs.get("level")
        if level is None:
            level = coarsest_level_not_coarser(
                self._run.slide.downsamples, self._run.plan.downsample
            )
        return read_tile(self._run.slide, tile, self._run.plan, level=int(level))

    def predict(self, index: int) -> np.ndarray:
        """Read one tile and run the model stage on it alone (for a model on another worker).

        Parameters
        ----------
        index : int
            ``Tile.index`` of a tile in :attr:`tiles`.

        Returns
        -------
        ndarray
            The segmenter's ``predict`` output for the tile (without the batch axis);
            :meth:`postprocess` turns it into the nuclei :meth:`segment` gives.
        """
        rgb = self._read(self._tile(index))
        raw = np.asarray(self._run.segmenter.predict(rgb[None], mpp=self._run.plan.mpp))
        if raw.shape[0] != 1:
            raise ValueError(f"predict: expected 1 output, got shape {raw.shape}")
        return raw[0]

    def postprocess(self, index: int, raw: np.ndarray) -> TileResult:
        """Post-process one tile's model output: the nuclei it owns and their measurements.

        The tile is read again for its measurements, so this runs where the slide can be
        read, apart from the model.

        Parameters
        ----------
        index : int
            ``Tile.index`` of a tile in :attr:`tiles`.
        raw : ndarray
            :meth:`predict`'s output for that tile.

        Returns
        -------
        TileResult
            As :meth:`segment` yields it (ids local to the tile).
        """
        tile = self._tile(index)
        owned, table, cells = postprocess_tile(
            self._run.segmenter,
            raw,
            self._read(tile),
            tile,
            mpp=self._run.plan.mpp,
            measure=self._run.measure,
            with_cells=True,
        )
        count = int(owned.max()) if owned.size else 0
        return TileResult(tile=tile, labels=owned, count=count, offset=0, table=table, cells=cells)

    def close(self) -> None:
        """Close the slide when :func:`prepare_nuclei` opened it."""
        if self._run.owned:
            self._run.slide.close()


def prepare_nuclei(
    source: Any,
    *,
    region: Box | None = None,
    mpp: float | tuple[float, float] | None = None,
    options: NucleiOptions | None = None,
    tissue: TissueArg = "auto",
    workers: int | None = None,
    **keywords: Any,
) -> PreparedNuclei:
    """Set up a nuclei run as :func:`segment_nuclei` does, without segmenting.

    Plans the tiles, selects those with tissue and prepares the segmenter from
    working-resolution crops of them, exactly as :func:`segment_nuclei` with the same
    arguments; the parameters are those of :func:`segment_nuclei` (``workers`` and the
    other runner keywords become the defaults of :meth:`PreparedNuclei.segment`). Pass a
    ``TissueResult`` (or an object with ``mask``, ``downsample`` and ``origin``) as
    ``tissue`` to reuse a tissue mask found elsewhere.

    Returns
    -------
    PreparedNuclei
        Close it (or let it be collected) when done when ``source`` was a path.

    Examples
    --------
    >>> run = prepare_nuclei("slide.svs", tissue=True)  # doctest: +SKIP
    >>> [r.count for r in run.segment([t.index for t in run.tiles[:2]])]  # doctest: +SKIP
    """
    request = _request(
        "prepare_nuclei", region=region, mpp=mpp, options=options, tissue=tissue,
        workers=workers, keywords=keywords,
    )  # fmt: skip
    return PreparedNuclei(_setup(source, request))
