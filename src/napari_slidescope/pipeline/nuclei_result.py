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
from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR

__all__ = ["NucleiResult"]


@dataclass(frozen=True, eq=False)
class NucleiResult:
    """Nuclei of a region: labels, geometry and one table row per nucleus.

    A frozen value, as :class:`~napari_slidescope.pipeline.tissue.TissueResult`: its
    attributes cannot be rebound, so a result handed to a viewer layer, an export or
    another thread stays what it was; steps that add to it return a copy
    (:func:`~napari_slidescope.pipeline.classify.classify_cells` uses
    ``dataclasses.replace``). Results compare by identity (they hold arrays). The arrays
    and the table are not copied: do not write into them.

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
    parameters : dict
        What was asked for, ``options`` (the run's
        :class:`~napari_slidescope.options.NucleiOptions` as ``as_dict()``), and what ran,
        every default (``"auto"`` included) resolved: ``segmenter`` (its
        name), ``model``, ``model_version`` and ``weights_sha256`` (the model and the
        SHA-256 of the weights it loaded; None for the built-in methods), ``mpp`` (the
        working resolution, µm/px), ``stain_mode`` (``"brightfield"`` or
        ``"fluorescence"``), ``nuclear_channel`` (its name, fluorescence only) and
        ``segmenter_options``; with cells, ``cell_outlines`` (``"model"``: the
        segmenter's own cells bound them, InstanSeg's fluorescence model; ``"expansion"``).
        Two results computed differently never have the same parameters.
    outlines : (list of (K, 2) ndarray, (count,) ndarray) or None
        When ``labels`` is None: each nucleus's outline, a level-0 ``(row, col)`` ring of
        floats (the outer contour of its largest piece, traced tile by tile as
        :func:`~napari_slidescope.analysis.geometry.labels_to_polygons` does), and, in the
        same order, its id (the table's ``id``). None when ``labels`` holds the nuclei
        (:meth:`outlines_of` traces them from it).
    cells : (M, N) ndarray of int32 or None
        With ``segment_nuclei(cell_expansion_um=...)``: the cells (same ids as the
        nuclei) on the grid of ``labels``; None otherwise or when ``labels`` is None.
    cell_outlines : (list of (K, 2) ndarray, ndarray) or None
        The cells' level-0 ``(row, col)`` outlines and ids when cells were grown without
        a label image.
    classes : dict of str to (int, int, int)
        After :func:`~napari_slidescope.pipeline.classify.classify_cells`: every class
        that can occur -> its colour (RGB 0-255), in legend order; ``table["class"]``
        holds each row's class. Empty when unclassified.
    classification : dict or None
        How the classes were made (resolved thresholds, the rules), or None.
    """

    labels: np.ndarray | None = field(repr=False)
    mpp: float | tuple[float, float]
    origin: tuple[int, int]
    downsample: tuple[float, float]
    count: int
    table: dict[str, np.ndarray] = field(repr=False)
    region: Box
    segmenter: str = ""
    source: Path | None = None
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)
    outlines: tuple[list[np.ndarray], np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )
    cells: np.ndarray | None = field(default=None, repr=False, compare=False)
    cell_outlines: tuple[list[np.ndarray], np.ndarray] | None = field(
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

    def outlines_of(self, what: str = "nuclei") -> tuple[list[np.ndarray], np.ndarray]:
        """Level-0 ``(row, col)`` outlines and ids of the nuclei, or of the cells.

        Parameters
        ----------
        what : {"nuclei", "cells"}
            Which outlines.

        Raises
        ------
        ValueError
            If the result has no such outlines (cells need ``cell_expansion_um``).
        """
        from napari_slidescope.analysis.geometry import labels_to_polygons

        labels, outlines = (
            (self.labels, self.outlines) if what == "nuclei" else (self.cells, self.cell_outlines)
        )
        if labels is not None:
            return labels_to_polygons(labels, downsample=self.downsample, origin=self.origin)
        if outlines is not None:
            return outlines
        if what == "cells":
            raise ValueError(
                "this result has no cells; segment with segment_nuclei(..., cell_expansion_um=...)"
            )
        raise ValueError("this result has neither labels nor outlines to write as polygons")

    @property
    def has_cells(self) -> bool:
        """Whether the nuclei were grown into cells (``cell_expansion_um``)."""
        return self.cells is not None or self.cell_outlines is not None

    def measurements(self, row: int) -> dict[str, float]:
        """Row `row` of the table as finite numbers (text columns such as ``class`` left out)."""
        out = {}
        for c, col in self.table.items():
            col = np.asarray(col)
            if col.dtype.kind in "biuf":
                v = float(col[row])
                if math.isfinite(v):
                    out[c] = v
        return out

    def to_anndata(self, *, compartment: str = "auto") -> Any:
        """Cells x markers as ``anndata.AnnData`` (needs the ``scverse`` extra).

        See :func:`~napari_slidescope.pipeline.scverse.to_anndata`: ``X`` the chosen
        compartment's means, ``var_names`` the channels, ``obs`` the other columns and
        the class, ``obsm["spatial"]`` the centroids in µm.
        """
        from napari_slidescope.pipeline.scverse import to_anndata

        return to_anndata(self, compartment=compartment)

    def to_spatialdata(
        self,
        path: str | os.PathLike[str],
        *,
        image: str = "copy",
        compartment: str = "auto",
        overwrite: bool = False,
    ) -> Path:
        """Write a SpatialData zarr store (needs the ``scverse`` extra; not spatialdata).

        See :func:`~napari_slidescope.pipeline.sdata.to_spatialdata`: shapes ``"cells"``
        and ``"nuclei"``, the :meth:`to_anndata` table linked to them, and the slide's
        pyramid over the region as the image ``"slide"`` (``image="reference"`` or
        ``"none"`` to leave the pixels out).
        """
        from napari_slidescope.pipeline.sdata import to_spatialdata

        return to_spatialdata(self, path, image=image, compartment=compartment, overwrite=overwrite)

    def to_geojson(self, path: str | os.PathLike[str]) -> Path:
        """Write the nuclei (or cells) as a GeoJSON FeatureCollection QuPath imports.

        Parameters
        ----------
        path : str or PathLike
            Output ``.geojson`` file (``.geojson.gz``: gzip-compressed, which QuPath
            opens too). Features are streamed, one at a time.

        Returns
        -------
        path : Path
            One ``Polygon`` feature per nucleus in level-0 pixel ``(x, y)``,
            ``objectType: "detection"``, the table row's numbers as ``measurements``.
            With cells (``cell_expansion_um``): ``objectType: "cell"``, the cell as
            ``geometry`` and the nucleus as ``nucleusGeometry``. The classification is the
            row's class and colour after
            :func:`~napari_slidescope.pipeline.classify.classify_cells`, else ``"Nucleus"``.
        """
        import gzip

        from napari_slidescope._io import atomic_write
        from napari_slidescope.analysis.geojson import polygon_feature, write_features

        polys, ids = self.outlines_of("nuclei")
        nucleus_of = {int(i): polys[j] for j, i in enumerate(ids)}
        cells = self.has_cells
        if cells:
            polys, ids = self.outlines_of("cells")
        rows = {int(i): k for k, i in enumerate(self.table["id"])}
        classes = self.table.get("class")

        def features() -> Any:
            for j, i in enumerate(ids):
                k = rows.get(int(i))
                if k is None:
                    continue
                name = "Nucleus" if classes is None else str(classes[k])
                color = self.classes.get(name, NUCLEUS_COLOR)
                yield polygon_feature(
                    polys[j],
                    name=name,
                    color=color,
                    object_type="cell" if cells else "detection",
                    measurements=self.measurements(k),
                    nucleus=nucleus_of.get(int(i)) if cells else None,
                )

        path = Path(path)
        if path.name.endswith(".gz"):
            with atomic_write(path, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8") as gz:
                write_features(gz, features())
        else:
            with atomic_write(path, "w", encoding="utf-8") as fh:
                write_features(fh, features())
        return path
