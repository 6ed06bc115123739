"""A slide's cell classes (``--classify``), computed from its parts once all are in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.batch.outputs.parts import part_measurements


@dataclass
class SlideClasses:
    """A slide's cell classes, made once all its tiles are in (``--classify``).

    Attributes
    ----------
    columns : dict of str to (K,) ndarray
        ``class`` and the positivity / score columns, one row per nucleus in slide order.
    colors : dict of str to (int, int, int)
        Class -> colour.
    summary : dict
        :func:`~napari_slidescope.pipeline.cell_classes.class_summary` of the slide.
    """

    columns: dict[str, np.ndarray]
    colors: dict[str, tuple[int, int, int]]
    summary: dict[str, Any]

    def row(self) -> dict[str, Any]:
        """Return ``summary.csv`` fields: counts per class (``name: n; ...``) and IHC figures."""
        counts = "; ".join(
            f"{k.removesuffix('_count')}: {v}"
            for k, v in self.summary.items()
            if k.endswith("_count")
        )
        out: dict[str, Any] = {"classes": counts}
        for k in ("positive_percent", "h_score", "positive_per_mm2"):
            if k in self.summary:
                out[k] = self.summary[k]
        return out


def classify_parts(
    slide_dir: Path, tiles: Sequence[int], descriptor: dict[str, Any], area_mm2: float | None
) -> SlideClasses:
    """Classify a slide's nuclei from its parts: thresholds see the whole slide's cells.

    Only the measurement columns are read (never the outlines), tile by tile in plan
    order, with the ids :func:`write_nuclei` gives them.
    """
    from napari_slidescope.pipeline.cell_classes import (
        class_summary,
        classification_from,
        classify_table,
    )

    table = part_measurements(slide_dir, tiles)
    res = classify_table(table, classification_from(descriptor))
    extra = {k: np.asarray(v) for k, v in res.columns.items() if k not in table}
    return SlideClasses(extra, dict(res.classes), class_summary(res, area_mm2=area_mm2))
