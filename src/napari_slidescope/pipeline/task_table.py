"""The analysis tasks, each described once: what a new task adds, it adds here.

A task (tissue detection, nuclei segmentation, tissue-region classification, tiles and
their embeddings) used to be spelled out in every place that runs or shows one: the batch
parameters and their digests, the ``slidescope batch`` flags, what ``--resume`` checks
and clears, the batch steps, the dock's fields and layers. Each of those now reads
:data:`TASK_TABLE` instead: a task's name, its options class, its API function and
result type, what it contributes to the parameter digests, its batch outputs and steps,
the tasks it needs, its command-line flags, the viewer layer its result goes to and the
files the viewer exports it as. The dock's screen-only details (button words, which
fields show at once, spin-box steps) are ``napari_slidescope._qt.task_fields``, which
reads this table; the napari side (``_napari``: jobs, layers, exports) reads it directly.

This module is GUI-free and light: the API functions and result types are imported when
asked for (:meth:`TaskSpec.function`, :meth:`TaskSpec.result_type`), not when the table
is read.

Examples
--------
>>> from napari_slidescope.pipeline.task_table import TASK_NAMES, task, with_needs
>>> TASK_NAMES
('tissue', 'nuclei', 'regions', 'tiles')
>>> with_needs(["nuclei"])
('tissue', 'nuclei')
>>> task("nuclei").options.__name__
'NucleiOptions'
>>> task("tissue").layer_name("slide.svs")
'slide.svs tissue'
>>> [e.kind for e in task("nuclei").exports]
['nuclei', 'csv', 'geoparquet']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from napari_slidescope.options import NucleiOptions, RegionsOptions, TilesOptions, TissueOptions

__all__ = [
    "TASK_NAMES",
    "TASK_TABLE",
    "ExportSpec",
    "TaskSpec",
    "export_kind",
    "task",
    "with_needs",
]


def _detect_tissue() -> Callable[..., Any]:
    from napari_slidescope.pipeline.tissue import detect_tissue

    return detect_tissue


def _tissue_result() -> type:
    from napari_slidescope.pipeline.tissue import TissueResult

    return TissueResult


def _segment_nuclei() -> Callable[..., Any]:
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    return segment_nuclei


def _nuclei_result() -> type:
    from napari_slidescope.pipeline.nuclei_result import NucleiResult

    return NucleiResult


def _classify_regions() -> Callable[..., Any]:
    from napari_slidescope.pipeline.region_map import classify_regions

    return classify_regions


def _regions_result() -> type:
    from napari_slidescope.pipeline.region_map import RegionMap

    return RegionMap


def _tile_slide() -> Callable[..., Any]:
    from napari_slidescope.tiles.tiling import tile_slide

    return tile_slide


def _tile_table() -> type:
    from napari_slidescope.tiles.tiling import TileTable

    return TileTable


@dataclass(frozen=True)
class ExportSpec:
    """One file a task's result exports to from the viewer (the dock's export buttons).

    Attributes
    ----------
    kind : str
        The export's name (unique over the table: ``"tissue"``, ``"csv"``...).
    suffix : str
        Its file name's ending after the slide's stem (``"_nuclei.csv"``).
    words : str
        The export in words, for messages (``"nuclei CSV"``).
    method : str
        The result's writer method (``"to_geojson"``, ``"to_csv"``...), called with the
        target path.
    progress : bool
        Whether that writer takes ``progress=`` (rows or features written so far).
    """

    kind: str
    suffix: str
    words: str
    method: str = "to_geojson"
    progress: bool = True


@dataclass(frozen=True)
class TaskSpec:
    """One analysis task: everything the API, the batch, the CLI and the dock need of it.

    Attributes
    ----------
    name : str
        The task's name (``--tasks``, manifests, the digest's key of its options).
    title : str
        Its name for people (the dock, messages).
    options : type
        Its options class (:mod:`napari_slidescope.options`).
    params_field : str
        The :class:`~napari_slidescope.batch.params.BatchParams` attribute holding its
        options.
    needs : tuple of str
        Tasks it needs, run first (nuclei are looked for only where there is tissue).
    segmentation : bool
        Whether the nuclei outputs depend on it: its options are in the segmentation
        digest, so a change of them redoes the segmentation on ``--resume``. A task that
        only annotates finished nuclei (regions) is not: changing it never segments again.
    recorded_always : bool
        Whether the batch parameters record its options even when it is not asked for.
        Tissue and nuclei always were; a later task is recorded only when asked, so that
        the digests of runs without it stay what they were before it existed.
    batch_steps : tuple of str
        The batch steps that compute it, by the names the scheduler submits
        (``"slide"``: one task per slide; ``"tiles"``: tile tasks; ``"regions"``: one
        whole-slide classification task; ``"tile-table"``: one task per slide that cuts
        it into tiles and embeds them).
    files : tuple of str
        Its files in ``OUT/<slide>/``: ``--resume`` keeps a finished slide only when
        they are all there, and a slide redone from scratch loses them.
    folders : tuple of str
        Its folders (stores) in ``OUT/<slide>/``, removed with the files.
    flag_names : mapping of str to str
        Command-line flag of each option field whose plain name would be ambiguous
        (``target_mpp`` -> ``--tissue-mpp``); other fields get their name with dashes.
    cli_flag : str or None
        The one flag that asks for the task with its value (``--regions CLASSIFIER``),
        for a task whose options are one file; None for tasks chosen by ``--tasks``.
    loader : callable
        Returns the API function (imported when asked for).
    result_loader : callable
        Returns the API function's result type.
    layer : str or None
        What follows the slide layer's name in the name of the viewer layer its result
        goes to (``"<slide> nuclei"``); None for a task shown under names of its own.
    exports : tuple of ExportSpec
        The files the viewer exports its result as.
    """

    name: str
    title: str
    options: type[Any]
    params_field: str
    loader: Callable[[], Callable[..., Any]]
    result_loader: Callable[[], type]
    needs: tuple[str, ...] = ()
    segmentation: bool = True
    recorded_always: bool = False
    batch_steps: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    flag_names: Mapping[str, str] = field(default_factory=dict)
    cli_flag: str | None = None
    layer: str | None = None
    exports: tuple[ExportSpec, ...] = ()

    def layer_name(self, image: str) -> str:
        """Return the name of the viewer layer its result of slide layer `image` goes to.

        Raises
        ------
        ValueError
            If the task's result has no layer named after the slide.
        """
        if self.layer is None:
            raise ValueError(f"task {self.name!r}: its result has no layer named after the slide")
        return f"{image} {self.layer}"

    def function(self) -> Callable[..., Any]:
        """Return the task's API function (``detect_tissue``, ``segment_nuclei``...)."""
        return self.loader()

    def result_type(self) -> type:
        """Return the type of what :meth:`function` returns."""
        return self.result_loader()

    def params_entry(self, options: Any) -> dict[str, Any]:
        """Return what the task adds to the batch parameters (and so to their digests).

        Its options' ``as_dict()``, under the key :attr:`name`.
        """
        if not isinstance(options, self.options):
            raise ValueError(
                f"{self.params_field}: expected a {self.options.__name__}, got {options!r}"
            )
        entry: dict[str, Any] = options.as_dict()
        return dict(entry)


#: The tasks, in the order they run (a task's needs come before it).
TASK_TABLE: tuple[TaskSpec, ...] = (
    TaskSpec(
        "tissue",
        "Tissue",
        TissueOptions,
        "tissue_options",
        _detect_tissue,
        _tissue_result,
        recorded_always=True,
        batch_steps=("slide",),
        files=("tissue.geojson",),
        layer="tissue",
        exports=(ExportSpec("tissue", "_tissue.geojson", "tissue GeoJSON", progress=False),),
        flag_names={
            "target_mpp": "--tissue-mpp",
            "mode": "--tissue-mode",
            "threshold": "--tissue-threshold",
        },
    ),
    TaskSpec(
        "nuclei",
        "Nuclei",
        NucleiOptions,
        "nuclei_options",
        _segment_nuclei,
        _nuclei_result,
        needs=("tissue",),
        recorded_always=True,
        batch_steps=("slide", "tiles"),
        files=("nuclei.parquet", "nuclei.geojson.gz"),
        folders=("labels.zarr",),
        flag_names={"target_mpp": "--nuclei-mpp"},
        layer="nuclei",
        exports=(
            ExportSpec("nuclei", "_nuclei.geojson", "nuclei GeoJSON"),
            ExportSpec("csv", "_nuclei.csv", "nuclei CSV", "to_csv"),
            ExportSpec("geoparquet", "_nuclei.parquet", "nuclei GeoParquet", "to_geoparquet"),
        ),
    ),
    TaskSpec(
        "regions",
        "Tissue regions",
        RegionsOptions,
        "regions_options",
        _classify_regions,
        _regions_result,
        needs=("tissue",),
        segmentation=False,
        batch_steps=("regions",),
        files=("regions.geojson", "regions.csv"),
        folders=("regions.zarr",),
        cli_flag="--regions",
        layer="regions",
    ),
    TaskSpec(
        "tiles",
        "Tiles and embeddings",
        TilesOptions,
        "tiles_options",
        _tile_slide,
        _tile_table,
        needs=("tissue",),
        segmentation=False,
        batch_steps=("tile-table",),
        files=("tiles.parquet",),
        folders=("tile_embeddings.zarr",),
        flag_names={
            "mpp": "--tile-mpp",
            "model": "--embed",
        },
    ),
)

#: The task names, in the order they run.
TASK_NAMES: tuple[str, ...] = tuple(t.name for t in TASK_TABLE)

_BY_NAME = {t.name: t for t in TASK_TABLE}


def task(name: str) -> TaskSpec:
    """Return the task called `name`.

    Raises
    ------
    ValueError
        If there is no such task (naming the known ones).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"task: expected one of {list(TASK_NAMES)}, got {name!r}") from None


def export_kind(kind: str) -> tuple[TaskSpec, ExportSpec]:
    """Return the task whose result exports as `kind`, and that export.

    Raises
    ------
    ValueError
        If no task exports as `kind` (naming the kinds there are).
    """
    for t in TASK_TABLE:
        for e in t.exports:
            if e.kind == kind:
                return t, e
    kinds = [e.kind for t in TASK_TABLE for e in t.exports]
    raise ValueError(f"export: expected one of {kinds}, got {kind!r}")


def with_needs(names: Iterable[str]) -> tuple[str, ...]:
    """Return `names` with the tasks they need, in :data:`TASK_NAMES` order.

    Raises
    ------
    ValueError
        If a name is not a task, or `names` is empty.
    """
    asked = list(names)
    unknown = [n for n in asked if n not in _BY_NAME]
    if unknown or not asked:
        raise ValueError(f"tasks: expected some of {list(TASK_NAMES)}, got {asked}")
    todo, seen = list(asked), set()
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += _BY_NAME[n].needs
    return tuple(n for n in TASK_NAMES if n in seen)
