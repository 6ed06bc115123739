"""A slide's output folder as a whole: clearing it before the slide is redone."""

from __future__ import annotations

import shutil
from collections.abc import Collection
from pathlib import Path

from napari_slidescope.batch.outputs.parts import parts_dir
from napari_slidescope.batch.outputs.scverse import remove_spatialdata


def clear_slide(slide_dir: Path, *, keep: Collection[str] = ()) -> None:
    """Remove a slide's parts and outputs (before it is redone from scratch).

    The outputs of the tasks named in `keep` stay (tiles whose parameters are unchanged).
    """
    from napari_slidescope.pipeline.task_table import TASK_TABLE

    tasks = [t for t in TASK_TABLE if t.name not in keep]
    shutil.rmtree(parts_dir(slide_dir), ignore_errors=True)
    for name in (*(f for t in tasks for f in t.files), "manifest.json"):
        (slide_dir / name).unlink(missing_ok=True)
    for name in (f for t in tasks for f in t.folders):  # labels.zarr: batch.label_image
        shutil.rmtree(slide_dir / name, ignore_errors=True)
    remove_spatialdata(slide_dir)
