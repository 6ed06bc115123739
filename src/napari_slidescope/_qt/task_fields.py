"""The dock's side of the task table: how each task shows in the dock.

The core table (:mod:`napari_slidescope.pipeline.task_table`) says what a task is: its
options class, API function, batch outputs. This one says what only a screen needs of it:
the words of its choice in the dock's "Task" buttons, which of its option fields are shown
at once (the others under "Advanced options"), how its spin boxes step and stop
(:class:`Hint`); the name of the layer its result goes to is the core table's. The dock
builds its task buttons and option fields from this table, so a task the dock can run is
added here once (and its job step in ``_napari/jobs.py``'s ``JOB_STEPS``).

Examples
--------
>>> from napari_slidescope._qt.task_fields import dock_task
>>> dock_task("nuclei").main
('segmenter', 'target_mpp', 'tile_size_um')
>>> dock_task("tissue").layer_name("slide.svs")
'slide.svs tissue'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from napari_slidescope.pipeline.task_table import TaskSpec, task

__all__ = ["DOCK_TASKS", "DockTask", "Hint", "dock_task", "hints"]


@dataclass(frozen=True)
class Hint:
    """How one option's spin box steps and where it stops (within the model's bounds)."""

    step: float = 1.0
    low: float | None = None
    high: float | None = None
    none_text: str = "auto"


@dataclass(frozen=True)
class DockTask:
    """One task as the dock shows it.

    Attributes
    ----------
    name : str
        The task's name in the core table (:func:`~napari_slidescope.pipeline.task_table.task`).
    action : str
        Its choice in the dock's "Task" buttons (``"Detect tissue"``).
    main : tuple of str
        Option fields shown at once, in order; the others go under "Advanced options".
    hints : mapping of str to Hint
        Screen-only details of its option fields' spin boxes, by field name.
    """

    name: str
    action: str
    main: tuple[str, ...]
    hints: Mapping[str, Hint] = field(default_factory=dict)

    @property
    def spec(self) -> TaskSpec:
        """The task's row of the core table."""
        return task(self.name)

    def layer_name(self, image: str) -> str:
        """Return the name of the layer the task's result of slide layer `image` goes to.

        The core table's (:meth:`~napari_slidescope.pipeline.task_table.TaskSpec.layer_name`).
        """
        return self.spec.layer_name(image)


#: The tasks the dock runs, in the order of its "Task" buttons.
DOCK_TASKS: tuple[DockTask, ...] = (
    DockTask(
        "tissue",
        "Detect tissue",
        ("target_mpp", "min_tissue_um2"),
        {
            "target_mpp": Hint(step=1.0, low=0.5, high=128.0),
            "threshold": Hint(step=0.01),
            "smooth_um": Hint(step=1.0, high=1000.0),
            "min_tissue_um2": Hint(step=100.0),
            "max_hole_um2": Hint(step=100.0),
        },
    ),
    DockTask(
        "nuclei",
        "Segment nuclei",
        ("segmenter", "target_mpp", "tile_size_um"),
        {
            "target_mpp": Hint(step=0.05, high=8.0),
            "tile_size_um": Hint(step=64.0, low=32.0, high=8192.0),
            "cell_expansion_um": Hint(step=1.0, high=100.0, none_text="off"),
        },
    ),
)

_BY_NAME = {t.name: t for t in DOCK_TASKS}


def dock_task(name: str) -> DockTask:
    """Return how the task called `name` shows in the dock.

    Raises
    ------
    ValueError
        If the dock has no such task (naming those it has).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"dock task: expected one of {list(_BY_NAME)}, got {name!r}") from None


def dock_task_of(options: type) -> DockTask:
    """Return the dock task whose options class is `options`."""
    for t in DOCK_TASKS:
        if t.spec.options is options:
            return t
    raise ValueError(f"dock task: no task of the dock takes {options.__name__}")


def hints() -> dict[str, Hint]:
    """Return every hint by ``"<task>.<option>"`` (the key :mod:`.fields` looks them up by)."""
    return {f"{t.name}.{k}": h for t in DOCK_TASKS for k, h in t.hints.items()}
