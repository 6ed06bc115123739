"""The batch engine: many slides, or one huge one, on a dask.distributed cluster.

:func:`analyze_slides` checks what it is asked, finds the slides, starts a local
cluster when none is given, and runs the batch: the scheduler
(:mod:`~napari_slidescope.batch.scheduler`) decides what to submit to the cluster and
when; the slide ledger (:mod:`~napari_slidescope.batch.ledger`) decides what an earlier
run left, and writes each slide's outputs, manifest and summary row as results arrive
(a part per tile), so an interrupted run loses only the tiles in flight and
``resume=True`` picks up where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari_slidescope.batch.ledger import BatchProgress, Ledger, _Slide
from napari_slidescope.batch.params import (
    DEFAULT_TASKS,
    BatchParams,
    check_writable,
    find_slides,
    output_names,
)
from napari_slidescope.batch.scheduler import Scheduler, cluster_model
from napari_slidescope.options import NucleiOptions, RegionsOptions, TilesOptions, TissueOptions
from napari_slidescope.slide.source import redact

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

__all__ = [
    "CLOSE_TIMEOUT_S",
    "WORKER_UNSET_ENV",
    "BatchProgress",
    "analyze_slides",
    "check_extras",
    "close_local",
    "local_client",
    "local_cluster",
]

#: Variables dask's Nanny sets for its workers that the engine's local cluster leaves
#: unset. ``MALLOC_TRIM_THRESHOLD_=65536`` (dask's ``distributed.nanny.pre-spawn-environ``)
#: switches off glibc's dynamic mmap threshold: every temporary array above 128 KiB is
#: then mmap'd and unmapped again and its pages fault in anew, a quarter more CPU time on
#: the tile tasks. With glibc's defaults the tile tasks' arrays are reused from the heap
#: tile after tile and the worker's memory stays flat over a run
#: (``benchmarks/batch_malloc.py``).
WORKER_UNSET_ENV = ("MALLOC_TRIM_THRESHOLD_",)


def check_extras(*, anndata: bool = False, spatialdata: bool = False) -> None:
    """Check that the ``scverse`` extra the outputs asked for is installed (before any work).

    Raises
    ------
    ValueError
        ``anndata`` (for either) or ``pyarrow`` / ``zarr >= 3`` (for `spatialdata`) is
        missing; the message names the extra.
    """
    if anndata:
        try:
            import anndata as _anndata  # noqa: F401
        except ImportError as e:
            raise ValueError(
                'anndata=True needs anndata: pip install "napari-slidescope[scverse]"'
            ) from e
    if spatialdata:
        from napari_slidescope.pipeline.sdata import _requirements

        try:
            _requirements()
        except ImportError as e:
            raise ValueError(f"spatialdata=True: {e}") from e


def analyze_slides(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tasks: Sequence[str] = DEFAULT_TASKS,
    tissue_options: TissueOptions | None = None,
    nuclei_options: NucleiOptions | None = None,
    segmenter: str | None = None,
    nuclei_mpp: float | None = None,
    tile_size_um: float | None = None,
    cell_expansion_um: float | None = None,
    classify: str | os.PathLike[str] | None = None,
    regions: str | os.PathLike[str] | None = None,
    tiles_options: TilesOptions | None = None,
    anndata: bool = False,
    spatialdata: bool = False,
    client: Client | None = None,
    workers: int | None = None,
    resume: bool = False,
    retries: int = 1,
    tiles_per_task: int | None = None,
    gpu: bool = False,
    progress: Callable[[BatchProgress], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Analyse slides on a dask.distributed cluster; write one folder of results per slide.

    Parameters
    ----------
    paths : path or iterable of paths
        Slide files and folders (searched recursively for the slide formats), slide
        URLs (``https://``, ``s3://``... any fsspec URL) and URL prefixes ending in ``/``
        (listed recursively). Workers open the URLs themselves: no shared disk needed.
    out : str or PathLike
        Output folder: ``OUT/<slide file name>/`` per slide and ``OUT/summary.csv``.
    tasks : sequence of {"tissue", "nuclei"}
        What to compute; nuclei are segmented only in tiles with tissue.
    tissue_options : TissueOptions, optional
        Options of each slide's tissue detection (default: ``TissueOptions()``).
    nuclei_options : NucleiOptions, optional
        Options of the nuclei segmentation (default: ``NucleiOptions()``): segmenter
        (``"auto"``: per slide, the learned model for its stain when installed, else
        the built-in method), working resolution, tile size, stain, nuclear channel,
        cell expansion, segmenter options, as :func:`~napari_slidescope.segment_nuclei`.
    segmenter, tile_size_um, cell_expansion_um : optional
        The :class:`~napari_slidescope.options.NucleiOptions` fields of these names;
        when given (not None) they replace those of `nuclei_options`.
    nuclei_mpp : float, optional
        ``NucleiOptions.target_mpp``, the working resolution of the segmentation in
        µm/px; when given, it replaces that of `nuclei_options`.
    classify : str or PathLike, optional
        A phenotype rules JSON file (``"kind": "slidescope-phenotype-rules"``) or a
        learned classifier's file: once a slide's tiles are all in, its cells are
        classified (thresholds see the whole slide), ``nuclei.parquet`` gains ``class``
        and the positivity columns, the GeoJSON features their class and colour, and
        ``summary.csv`` the counts per class and the IHC figures. The rules' content is
        hashed into the parameters.
    regions : str or PathLike, optional
        A region classifier's file (``train_region_classifier(...).save(path)``): each
        slide's tissue is classified into regions. Writes ``regions.zarr`` (the class
        map, OME-NGFF labels), ``regions.geojson`` (the outlines) and ``regions.csv``
        (area, cells, cells per mm², cell classes and IHC figures per region); the cells
        gain ``region`` and ``region_id`` columns and ``summary.csv`` (and the rows
        returned) the per-region figures of ``region_summary``. The file's SHA-256 is in
        the parameters: with ``resume``, a changed classifier redoes the regions and the
        tables, never the segmentation.
    tiles_options : TilesOptions, optional
        Cut each slide into tissue tiles at a stated µm/px (gated by the tissue the
        tissue task found) and, with ``model``, embed them: writes ``tiles.parquet`` (the
        tile table, GeoParquet) and ``tile_embeddings.zarr`` (tiles x features, AnnData);
        the manifest and ``summary.csv`` gain the tile count, tiles per second and the
        model's wait on reading. Adds ``"tiles"`` to `tasks` (``"tiles"`` in `tasks`
        without options: ``TilesOptions()``). The model file's SHA-256 is in the
        parameters: with ``resume``, a changed model or tiling redoes the tiles alone,
        never the tissue or the nuclei.
    anndata : bool
        Also write ``cells.h5ad`` per slide (cells x markers, as ``result.to_anndata()``;
        needs the ``scverse`` extra).
    spatialdata : bool
        Also write ``cells.zarr`` per slide, beside ``cells.h5ad``: a SpatialData store
        (nucleus and cell shapes, the table linked to them) as
        ``result.to_spatialdata(path, image="reference")`` writes it. The slide is referenced
        (its path and level-0 frame in the store's attributes), not copied: a copy would add
        the size of every slide to the outputs, and the slide is where it was. Written
        whole or not at all (a temporary folder renamed into place); ``resume`` of a slide
        finished without it writes the store from the slide's outputs, without segmenting
        again. Needs the ``scverse`` extra.
    client : distributed.Client, optional
        Run on this client's cluster; default a local cluster of ``workers`` processes,
        closed at the end.
    workers : int, optional
        Worker processes of the local cluster; default one per core.
    resume : bool
        Keep what an earlier run into ``out`` finished with the same slide file (size,
        modification time, hash of its first MiB), the same parameters and the same
        model: what ``segmenter`` (``"auto"`` included) resolves to on the cluster now
        (name, model, version, weights' SHA-256) must be what the earlier run recorded,
        so a slide finished before a model was installed or changed is redone, never
        kept beside slides of the new model. Redo the rest. Without it every slide is
        redone.
    retries : int
        Times dask re-runs a task that raised before its slide counts as failed (a task
        on a worker that died is re-run by dask whatever this says).
    tiles_per_task : int, optional
        Tiles per nuclei task (more tiles per task: fewer tasks for the scheduler, and
        one staged run per task overlaps reading, model and post-processing of its
        tiles); default 1. Not used with ``gpu``.
    gpu : bool
        Split each tile into a model task (read + ``predict``) that runs only on workers
        with a ``GPU`` resource, one at a time per GPU, and a post-processing task
        (``postprocess``, ownership, measurements, outlines) that runs on workers without
        one while there are any; at most a few model outputs per worker thread wait for
        post-processing. A local cluster then gives each worker ``{"GPU": 1}``.
    progress : callable, optional
        ``progress(BatchProgress)`` after each finished task and slide.
    storage_options : dict, optional
        fsspec storage options for the URLs (credentials, endpoint); sent to the workers
        with the tasks, never written to a manifest, a summary or a log. Resume
        recognises an object by its size and what its store says of its version (ETag,
        version id, last-modified).

    Warns
    -----
    SegmenterInfoWarning
        Once per run (not once per worker) when ``"auto"`` ran a built-in method because
        the learned model is not installed.

    Returns
    -------
    list of dict
        One row per slide, in input order, with the columns of ``summary.csv``
        (:data:`~napari_slidescope.batch.outputs.SUMMARY_COLUMNS`); ``status`` is
        ``"done"`` or ``"failed"`` (then ``error`` says why).

    Raises
    ------
    ValueError
        Bad parameters, no slides found, or two slides with the same file name.
    FileNotFoundError
        If an input path does not exist.
    OSError
        If ``out`` cannot be created or written.

    Examples
    --------
    >>> rows = analyze_slides("cohort/", "results/", workers=8)  # doctest: +SKIP
    >>> [r["nuclei"] for r in rows if r["status"] == "done"]  # doctest: +SKIP
    """
    nuclei_options = _nuclei_options(
        nuclei_options,
        segmenter=segmenter,
        target_mpp=nuclei_mpp,
        tile_size_um=tile_size_um,
        cell_expansion_um=cell_expansion_um,
    )
    descriptor = None
    if classify is not None:
        from napari_slidescope.pipeline.cell_classes import load_classification

        descriptor = json.dumps(load_classification(classify)[1], sort_keys=True)
    regions_options = None
    if regions is not None:
        regions_options = _regions_options(regions)
        tasks = (*tasks, "regions")
    if tiles_options is not None and "tiles" not in tasks:
        tasks = (*tasks, "tiles")
    if "tiles" in tasks:
        tiles_options = _tiles_options(tiles_options)
    params = BatchParams(
        tuple(tasks),
        TissueOptions() if tissue_options is None else tissue_options,
        nuclei_options,
        descriptor,
        bool(anndata),
        bool(spatialdata),
        storage_options=storage_options,
        regions_options=regions_options,
        tiles_options=tiles_options,
    )
    check_extras(anndata=bool(anndata), spatialdata=bool(spatialdata))
    if params.nuclei:
        from napari_slidescope.segmenters import missing_reason

        name = nuclei_options.segmenter
        reason = missing_reason(name)  # KeyError for unknown names
        if reason is not None:
            raise ValueError(f"segmenter {name!r} is not available: {reason}")
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    slides = find_slides(paths, storage_options)
    if not slides:
        raise ValueError(f"no slides found in {[redact(str(p)) for p in paths]}")
    names = output_names(slides)
    out = Path(out)
    check_writable(out)
    if tiles_per_task is None or gpu:
        tiles_per_task = 1
    if int(tiles_per_task) < 1:
        raise ValueError(f"tiles_per_task: expected >= 1, got {tiles_per_task!r}")
    cluster = None
    if client is None:
        client, cluster = local_client(
            workers or os.cpu_count() or 1, resources={"GPU": 1} if gpu else None
        )
    try:
        ledger = Ledger(
            params,
            out,
            [_Slide(i, p, n, out / n) for i, (p, n) in enumerate(zip(slides, names, strict=True))],
            resume=resume,
            progress=progress,
            model_now=cluster_model(client),
        )
        scheduler = Scheduler(
            client, ledger, retries=int(retries), tiles_per_task=int(tiles_per_task), gpu=gpu
        )
        return scheduler.run()
    finally:
        if cluster is not None:
            close_local(client, cluster)


def _regions_options(path: str | os.PathLike[str]) -> RegionsOptions:
    """Return the options of the region classifier in `path`, checked by loading it once.

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ValueError
        If the file is not a region classifier (the loader's message).
    """
    from napari_slidescope.pipeline.region_classifier import load_region_classifier

    options = RegionsOptions.of_file(path)
    load_region_classifier(options.classifier)  # a file that is not one fails now
    return options


def _tiles_options(options: TilesOptions | None) -> TilesOptions:
    """Return the tiles options (default ``TilesOptions()``), their model loaded once.

    Raises
    ------
    ValueError
        If `options` is not a TilesOptions, or its model file cannot be loaded (naming
        the file), or its runtime is not installed (naming the extra).
    """
    options = TilesOptions() if options is None else options
    if not isinstance(options, TilesOptions):
        raise ValueError(f"tiles_options: expected a TilesOptions, got {options!r}")
    if options.model:
        from napari_slidescope.tiles.embed import load_model

        try:
            load_model(options.model, device="cpu")  # a file that is not a model fails now
        except ImportError as exc:
            raise ValueError(f"{options.model}: {exc}") from exc
    try:
        import pyarrow  # noqa: F401  (tiles.parquet)
    except ImportError as exc:
        raise ValueError('--tiles needs pyarrow: pip install "napari-slidescope[batch]"') from exc
    return options


def _nuclei_options(options: NucleiOptions | None, **fields: Any) -> NucleiOptions:
    """`options` (default ``NucleiOptions()``) with the fields given (not None) replaced."""
    options = NucleiOptions() if options is None else options
    if not isinstance(options, NucleiOptions):
        raise ValueError(f"nuclei_options: expected a NucleiOptions, got {options!r}")
    changes = {k: v for k, v in fields.items() if v is not None}
    return options.replace(**changes) if changes else options


#: Seconds that closing a batch's own client, then its own cluster, may each take. The
#: results are written by then: a cluster whose workers do not stop in time is left to end
#: with this process (a warning says so) rather than holding the batch open.
CLOSE_TIMEOUT_S = 60.0


def close_local(client: Client | None, cluster: LocalCluster | None) -> None:
    """Close `client`, then the `cluster` this process started, each within a time limit.

    Parameters
    ----------
    client : distributed.Client or None
        The client of `cluster`.
    cluster : distributed.LocalCluster or None
        A cluster started by :func:`local_cluster`.

    Warns
    -----
    SlidescopeWarning
        When one of them does not close within :data:`CLOSE_TIMEOUT_S` seconds.
    """
    import warnings

    from napari_slidescope._io import one_line
    from napari_slidescope.errors import SlidescopeWarning

    for what, thing in (("client", client), ("cluster", cluster)):
        if thing is None:
            continue
        try:
            thing.close(timeout=CLOSE_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            warnings.warn(
                f"the batch's local dask {what} did not close within {CLOSE_TIMEOUT_S:g} s "
                f"({one_line(exc, typed=True)}); its results are written, its worker "
                "processes end with this one",
                SlidescopeWarning,
                stacklevel=2,
            )


def local_client(
    n_workers: int, *, dashboard: bool = False, **kwargs: Any
) -> tuple[Client, LocalCluster]:
    """Start a :func:`local_cluster` and a client of it; close both with :func:`close_local`.

    Parameters
    ----------
    n_workers, dashboard, **kwargs
        As :func:`local_cluster` takes them.

    Returns
    -------
    client : distributed.Client
    cluster : distributed.LocalCluster
        If the client cannot be made, the cluster is closed before the error is raised:
        its worker processes are not left behind.
    """
    from distributed import Client

    cluster = local_cluster(n_workers, dashboard=dashboard, **kwargs)
    try:
        return Client(cluster), cluster
    except BaseException:
        close_local(None, cluster)
        raise


def local_cluster(n_workers: int, *, dashboard: bool = False, **kwargs: Any) -> LocalCluster:
    """Start a ``LocalCluster`` of single-thread worker processes for the batch engine.

    Its workers start without :data:`WORKER_UNSET_ENV` (dask sets
    ``MALLOC_TRIM_THRESHOLD_=65536``), so glibc's malloc keeps its heap. Its scheduler's
    HTTP server listens on a free port of 127.0.0.1 (dask's default, 8787, may be taken
    by another cluster: dask would then warn "Port 8787 is already in use").

    Parameters
    ----------
    n_workers : int
        Worker processes.
    dashboard : bool
        Serve dask's dashboard (on that free port: ``client.dashboard_link``).
    **kwargs
        Passed to ``distributed.LocalCluster`` (e.g. ``resources``).

    Returns
    -------
    distributed.LocalCluster
        Close it when done.
    """
    import dask
    from distributed import LocalCluster

    kwargs = {
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": "127.0.0.1:0",
        **kwargs,
    }
    if not dashboard:
        kwargs["scheduler_kwargs"] = {"dashboard": False, **kwargs.get("scheduler_kwargs", {})}
    # a worker process inherits this process's environment plus the nanny's pre-spawn
    # variables (config; a variable already in os.environ wins): an earlier dask cluster
    # in this process leaves them in os.environ, so they are out of it while ours spawn
    saved = {k: os.environ.pop(k, None) for k in WORKER_UNSET_ENV}
    try:
        with dask.config.set(
            {f"distributed.nanny.pre-spawn-environ.{k}": None for k in WORKER_UNSET_ENV}
        ):
            return LocalCluster(n_workers=int(n_workers), **kwargs)
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
