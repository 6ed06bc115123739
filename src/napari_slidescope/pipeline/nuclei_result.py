"""The result of :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` and its exports."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope.analysis.measure import write_csv

__all__ = ["NucleiResult"]


@dataclass
class NucleiResult:
    """Nuclei of a region: labels, geometry and one table row per nucleus.

    Attributes
    ----------
    labels : (M, N) ndarray of int32 or None
        Nuclei ids (0 = background) covering the region at the working level; None when
        :func:`segment_nuclei` was asked not to build it (``labels=False``, or a region
        too large for ``labels="auto"``): the outlines are then kept for
        :meth:`to_geojson`.
    mpp : float or (float, float)
        µm per pixel of ``labels``.
    origin : (int, int)
        Level-0 ``(y, x)`` of the top-left corner of ``labels[0, 0]``.
    downsample : (float, float)
        Level-0 pixels per ``labels`` pixel, ``(y, x)``.
    count : int
        Number of nuclei.
    table : dict of str to (count,) ndarray
        Columns of :data:`~napari_slidescope.analysis.measure.COLUMNS`; ``id`` is the
        label value. Centroids in level-0 px ``(row, col)`` and in µm, area µm²,
        perimeter µm, eccentricity, solidity, mean H and E optical density.
    region : (int, int, int, int)
        The level-0 box segmented.
    segmenter : str
        Name of the segmenter used.
    source : Path or None
        Slide path, None for arrays.
    classes : dict of str to (int, int, int)
        After :func:`~napari_slidescope.pipeline.classify.classify_cells`: every class
        that can occur -> its colour (RGB 0-255), in legend order; ``table["class"]``
        holds each row's class. Empty when unclassified.
    classification : dict or None
        How the classes were made (resolved thresholds, the rules), or None.
    """

    labels: np.ndarray | None
    mpp: float | tuple[float, float]
    origin: tuple[int, int]
    downsample: tuple[float, float]
    count: int
    table: dict[str, np.ndarray]
    region: Box
    segmenter: str = ""
    source: Path | None = None
    outlines: tuple[list[np.ndarray], np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )
    classes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    classification: dict[str, Any] | None = field(default=None, repr=False)

    def to_pandas(self) -> Any:
        """Return the table as a ``pandas.DataFrame`` (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.table)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write the table as CSV (header row of column names); return the path."""
        return write_csv(self.table, path)

    def to_geojson(self, path: str | os.PathLike[str]) -> Path:
        """Write the nuclei as a GeoJSON FeatureCollection QuPath imports as detections.

        Parameters
        ----------
        path : str or PathLike
            Output ``.geojson`` file.

        Returns
        -------
        path : Path
            One ``Polygon`` feature per nucleus in level-0 pixel ``(x, y)``,
            ``objectType: "detection"``, class ``"Nucleus"``, the table row as
            ``measurements``.
        """
        from napari_slidescope.analysis.geojson import write_geojson
        from napari_slidescope.analysis.geometry import labels_to_polygons

        if self.labels is not None:
            polys, ids = labels_to_polygons(
                self.labels, downsample=self.downsample, origin=self.origin
            )
        elif self.outlines is not None:
            polys, ids = self.outlines
        else:
            raise ValueError(
                f"{path}: this result has neither labels nor outlines to write as polygons"
            )
        rows = {int(i): k for k, i in enumerate(self.table["id"])}
        keep = [j for j, i in enumerate(ids) if int(i) in rows]
        meas = []
        for j in keep:
            k = rows[int(ids[j])]
            values = {c: float(self.table[c][k]) for c in self.table}
            meas.append({c: v for c, v in values.items() if math.isfinite(v)})
        write_geojson(
            path,
            [polys[j] for j in keep],
            name="Nucleus",
            color=(30, 30, 200),
            object_type="detection",
            measurements=meas,
        )
        return Path(path)
