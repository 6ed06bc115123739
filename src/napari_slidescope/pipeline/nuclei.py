"""Public nuclei segmentation: :func:`segment_nuclei` and its streaming variant.

A region of a slide (or an RGB array) is cut into overlapping tiles at the
segmenter's working resolution (:mod:`~napari_slidescope.pipeline.tiling`); tiles
without tissue are skipped unread; the others run through the staged
read -> model -> post-process runner (:mod:`~napari_slidescope.pipeline.runner`)
and are stitched into one label image with a measurement table
(:class:`NucleiResult`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Literal

from napari_slidescope.options import NucleiOptions
from napari_slidescope.pipeline.nuclei_prepared import PreparedNuclei
from napari_slidescope.pipeline.nuclei_result import NucleiResult
from napari_slidescope.pipeline.nuclei_setup import (
    AUTO_TISSUE_TILES,
    RUNNER_KEYWORDS,
    NucleiStep,
    TissueArg,
    _Request,
    _request,
    _setup,
    _steps,
)
from napari_slidescope.pipeline.nuclei_stitch import DENSE_LABELS_BYTES, _Assembly, _dense_labels
from napari_slidescope.pipeline.tiling import Box

__all__ = [
    "AUTO_TISSUE_TILES",
    "DEFAULT_TILE_SIZE_UM",
    "DENSE_LABELS_BYTES",
    "RUNNER_KEYWORDS",
    "NucleiOptions",
    "NucleiResult",
    "NucleiStep",
    "PreparedNuclei",
    "iter_segment_nuclei",
    "prepare_nuclei",
    "segment_nuclei",
]


#: Tile side in µm when none is given (a few hundred nuclei per tile at any resolution):
#: ``NucleiOptions().tile_size_um``, kept under this name for existing imports.
DEFAULT_TILE_SIZE_UM = NucleiOptions().tile_size_um


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
    dense = _dense_labels(labels, run.plan, run.array_shape is not None)
    with_cells = bool(getattr(run.measure, "cell_distance_px", 0))
    assembly = _Assembly(run.plan, dense=dense, with_cells=with_cells)
    if progress is not None:
        progress(0, len(run.tiles))
    for step in _steps(run):
        assembly.add(step.result)
        if progress is not None:
            progress(step.done, step.total)
    return assembly.result(
        array_pixels=run.array_shape is not None,
        segmenter=run.segmenter.name,
        parameters=run.parameters,
    )


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
