"""The analysis tasks, each described once: what a new task adds, it adds here.

A task (tissue detection, nuclei segmentation, tissue-region classification, tiles and
their embeddings) used to be spelled out in every place that runs or shows one: the batch
parameters and their digests, the ``slidescope batch`` flags, what ``--resume`` checks
and clears, the batch steps, the dock's fields and layers. Each of those now reads
:data:`TASK_TABLE` instead: a task's name, its options class, its API function and
result type, what it contributes to the parameter digests, its batch outputs and steps,
the tasks it needs and its command-line flags. The GUI side (dock fields, layers) keeps
its own table in ``napari_slidescope._qt.task_fields``, which reads this one.

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from napari_slidescope.options import NucleiOptions, RegionsOptions, TilesOptions, TissueOptions

__all__ = ["TASK_NAMES", "TASK_TABLE", "TaskSpec", "task", "with_needs"]


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
