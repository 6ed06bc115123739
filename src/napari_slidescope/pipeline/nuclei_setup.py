"""Set-up of a nuclei run: the request, the plan, tissue, the prepared segmenter, the stream.

What :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`,
:func:`~napari_slidescope.pipeline.nuclei.iter_segment_nuclei` and
:func:`~napari_slidescope.pipeline.nuclei.prepare_nuclei` share: the entry point's
keywords sorted into :class:`~napari_slidescope.options.NucleiOptions` and runner keywords
(:func:`_request`), the source opened, the segmenter chosen and checked against the image,
the tiles planned at the working resolution, the tiles without tissue dropped, the
segmenter prepared on a working-resolution sample (:func:`_setup`), and the run's tiles
streamed through the staged runner (:func:`_steps`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from threading import Event
from typing import Any, Literal, Protocol

import numpy as np

from napari_slidescope.analysis.stains import StainMatrix, estimate_stains, for_stain
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.options import NucleiOptions
from napari_slidescope.pipeline import runner as _runner
from napari_slidescope.pipeline.cancel import check_cancel
from napari_slidescope.pipeline.nuclei_measure import StainSeparator, _measure
from napari_slidescope.pipeline.regions import SlideLike
from napari_slidescope.pipeline.runner import TileResult, iter_tiles
from napari_slidescope.pipeline.tiling import Box, Tile, TilePlan, make_plan, read_tile
from napari_slidescope.segmenters import (
    AUTO,
    ImageKind,
    Segmenter,
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
from napari_slidescope.segmenters.channel_view import ChannelView
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser

__all__ = ["AUTO_TISSUE_TILES", "RUNNER_KEYWORDS", "NucleiStep"]


#: Tissue detection runs first (``tissue="auto"``) when the plan has more tiles than this.
AUTO_TISSUE_TILES = 4


#: Most working-resolution pixels read to prepare a segmenter (stain vectors, threshold,
#: intensity scaling): square crops of up to ``_SAMPLE_TILES`` tiles spread over the region.
_SAMPLE_PIXELS = 2_000_000


_SAMPLE_TILES = 8


#: Tile cores narrower than this (working px) are sampled only when no other tile is left.
_SAMPLE_MIN_SIDE = 64


class TissueMask(Protocol):
    """A tissue mask on a grid (``TissueResult``, the batch's ``TissueGrid``)."""

    @property
    def mask(self) -> np.ndarray: ...  # noqa: D102

    @property
    def downsample(self) -> tuple[float, float]: ...  # noqa: D102

    @property
    def origin(self) -> tuple[float, float]: ...  # noqa: D102


#: The ``tissue`` argument: ``"auto"``, True (detect), False / None (every tile) or a mask.
TissueArg = Literal["auto"] | bool | None | TissueMask


@dataclass
class NucleiStep:
    """One step of ``iter_segment_nuclei``: a finished tile and the progress.

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

    :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`,
    :func:`~napari_slidescope.pipeline.nuclei.iter_segment_nuclei` and
    :func:`~napari_slidescope.pipeline.nuclei.prepare_nuclei` take the
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
    slide: SlideLike
    owned: bool
    plan: TilePlan
    tiles: tuple[Tile, ...]
    segmenter: Segmenter
    measure: Callable[[np.ndarray, np.ndarray, Tile], dict[str, np.ndarray]]
    array_shape: tuple[int, int] | None
    runner_kwargs: dict[str, Any] = field(default_factory=dict)
    #: A region polygon (level-0 ``(row, col)``): only nuclei whose centroid is inside.
    polygon: np.ndarray | None = None
    #: What ran, every default resolved (:func:`_resolved`).
    parameters: dict[str, Any] = field(default_factory=dict)


def _as_source(
    source: Any, mpp: float | tuple[float, float] | None
) -> tuple[SlideLike, bool, bool]:
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
    slide: SlideLike, plan: TilePlan, tiles: tuple[Tile, ...], cancel: Event | None = None
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


def _tissue_tiles(plan: TilePlan, tissue: TissueMask) -> tuple[Tile, ...]:
    """Tiles whose core touches tissue in a ``TissueResult``-like mask."""
    from napari_slidescope.analysis.geometry import tiles_with_tissue

    if not plan.tiles:
        return ()
    cores = [plan.working_to_level0(t.core) for t in plan.tiles]
    keep = tiles_with_tissue(tissue, cores)
    return tuple(t for t, k in zip(plan.tiles, keep, strict=True) if k)


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
    slide: SlideLike,
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
    where = getattr(slide, "path", None)
    array = is_array or getattr(slide, "format", "") == "array"
    path = None if array or where is None else str(where)
    return make_plan(
        region,
        slide_mpp=slide_mpp,
        target_mpp=work_mpp,
        tile_size_um=tile_size_um,
        min_overlap_um=segmenter.min_overlap_um + 2 * (cell_expansion_um or 0.0),
        path=path,
    )


def _tissue_filter(
    slide: SlideLike,
    plan: TilePlan,
    tissue: TissueArg,
    cancel: Event | None = None,
    polygon: np.ndarray | None = None,
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
    slide: SlideLike,
    plan: TilePlan,
    tiles: tuple[Tile, ...],
    segmenter: Segmenter,
    kind: ImageKind,
    cancel: Event | None = None,
    stain: str = "auto",
) -> tuple[Segmenter, ImageKind, StainSeparator | None]:
    """Prepare the segmenter on a working sample; fix the nuclear channel and the stains."""
    if not tiles:
        return segmenter, kind, None
    sample = _working_sample(slide, plan, tiles, cancel)
    kind = signal_channel(kind, sample)
    if segmenter.input == "fluorescence" and kind.nuclear_channel is not None:
        segmenter = ChannelView(segmenter, kind.nuclear_channel)
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
        seg, outlines = _runner.cell_outlines(seg, cells_um)  # a model's own cells or expansion
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
    array_shape = (int(slide.shape0[0]), int(slide.shape0[1])) if is_array else None
    measure = _measure(plan, kind, stains, cells_um)
    runner_kwargs = dict(request.runner_kwargs)
    return _Run(
        slide, owned, plan, tiles, seg, measure, array_shape, runner_kwargs, polygon,
        {**_resolved(seg, kind, plan, options),
         **({"cell_outlines": outlines} if outlines else {})},
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
