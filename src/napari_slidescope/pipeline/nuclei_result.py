"""The result of :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` and its exports."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._types import Box
from napari_slidescope._version import __version__
from napari_slidescope.analysis.measure import write_csv
from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR
from napari_slidescope.pipeline.progress import ProgressCallback, progress_caller

__all__ = ["NucleiResult"]


@dataclass(frozen=True, eq=False)
class NucleiResult:
    """Nuclei of a region: labels, geometry and one table row per nucleus.

    A frozen value, as :class:`~napari_slidescope.pipeline.tissue.TissueResult`: its
    attributes cannot be rebound, so a result handed to a viewer layer, an export or
    another thread stays what it was; steps that add to it return a copy
    (:func:`~napari_slidescope.pipeline.cell_classes.classify_cells` uses
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
    table : pandas.DataFrame
        One row per nucleus, the columns of
        :data:`~napari_slidescope.analysis.measure.COLUMNS`; ``id`` is the label value.
        Centroids in level-0 px ``(row, col)`` and in µm, area µm², perimeter µm,
        eccentricity, solidity, mean H and E optical density.
    region : (int, int, int, int)
        The level-0 box segmented.
    segmenter : str
        Name of the segmenter used.
    columns : dict of str to (count,) ndarray
        The same table as numpy arrays (what exports and the package's own code read).
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
        After :func:`~napari_slidescope.pipeline.cell_classes.classify_cells`: every class
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
    columns: dict[str, np.ndarray] = field(repr=False)
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

    @property
    def table(self) -> Any:
        """The nuclei table as a ``pandas.DataFrame``: one row per nucleus, ``id`` first.

        Built from :attr:`columns` on first use and kept (pandas comes with napari). The
        package itself reads :attr:`columns`, the same data as numpy arrays.
        """
        cached = self.__dict__.get("_table")
        if cached is None:
            import pandas as pd

            cached = pd.DataFrame(self.columns, copy=False)
            object.__setattr__(self, "_table", cached)
        return cached

    def to_pandas(self) -> Any:
        """Return the table as a ``pandas.DataFrame`` (the same as :attr:`table`)."""
        return self.table

    def to_csv(
        self, path: str | os.PathLike[str], *, progress: ProgressCallback | None = None
    ) -> Path:
        """Write the table as CSV (header row of column names); return the path.

        `progress` is called with a :class:`~napari_slidescope.pipeline.progress.Progress`
        of rows written (or ``(done, total)``, see
        :func:`~napari_slidescope.pipeline.progress.progress_caller`).
        """
        call = None if progress is None else progress_caller(progress)
        return write_csv(self.columns, path, progress=call)

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
        for c, col in self.columns.items():
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

    def to_geojson(
        self, path: str | os.PathLike[str], *, progress: ProgressCallback | None = None
    ) -> Path:
        """Write the nuclei (or cells) as a GeoJSON FeatureCollection QuPath imports.

        Parameters
        ----------
        path : str or PathLike
            Output ``.geojson`` file (``.geojson.gz``: gzip-compressed, which QuPath
            opens too). Features are formatted in bulk and written in chunks
            (:func:`~napari_slidescope.analysis.geojson.write_polygon_features`): a
            million nuclei in seconds.
        progress : callable, optional
            Called with a :class:`~napari_slidescope.pipeline.progress.Progress` of
            features written (or ``(done, total)``).

        Returns
        -------
        path : Path
            One ``Polygon`` feature per nucleus in level-0 pixel ``(x, y)``,
            ``objectType: "detection"``, the table row's numbers as ``measurements``.
            With cells (``cell_expansion_um``): ``objectType: "cell"``, the cell as
            ``geometry`` and the nucleus as ``nucleusGeometry``. The classification is the
            row's class and colour after
            :func:`~napari_slidescope.pipeline.cell_classes.classify_cells`, else ``"Nucleus"``.
        """
        import gzip

        from napari_slidescope._io import atomic_write
        from napari_slidescope.analysis.geojson import write_polygon_features
        from napari_slidescope.pipeline.geoparquet import json_rows_if_available

        polys, ids = self.outlines_of("nuclei")
        nuclei: list[np.ndarray | None] | None = None
        if self.has_cells:
            nucleus_of = dict(zip(np.asarray(ids).tolist(), polys, strict=True))
            polys, ids = self.outlines_of("cells")
        found, rows = _rows_of(self.columns, ids)
        rings = [polys[j] for j in found.tolist()]
        if self.has_cells:
            nuclei = [nucleus_of.get(i) for i in np.asarray(ids)[found].tolist()]
        classes = self.columns.get("class")
        if classes is None:
            names = ["Nucleus"] * len(rows)
        else:
            names = np.asarray(classes)[rows].astype(str).tolist()
        colors = {n: self.classes.get(n, NUCLEUS_COLOR) for n in set(names)}
        numeric = {
            c: np.asarray(col)[rows]
            for c, col in self.columns.items()
            if np.asarray(col).dtype.kind in "biuf"
        }
        call = None if progress is None else progress_caller(progress)
        kw: dict[str, Any] = {
            "names": names,
            "colors": colors,
            "object_type": "cell" if self.has_cells else "detection",
            "measurements": numeric,
            "nuclei": nuclei,
            "progress": call,
            "format_rows": json_rows_if_available(),
        }
        path = Path(path)
        if path.name.endswith(".gz"):
            with (
                atomic_write(path, "wb") as raw,
                gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6) as gz,
            ):
                write_polygon_features(gz, rings, **kw)
        else:
            with atomic_write(path, "wb") as fh:
                write_polygon_features(fh, rings, **kw)
        return path

    def to_geoparquet(
        self,
        path: str | os.PathLike[str],
        *,
        progress: ProgressCallback | None = None,
        row_group: int = 65536,
    ) -> Path:
        """Write the nuclei as GeoParquet, the ``nuclei.parquet`` ``slidescope batch`` writes.

        Needs pyarrow (the ``batch`` extra). The rows, columns and metadata are those of
        batch's (:mod:`~napari_slidescope.pipeline.geoparquet`): ``id``, ``tile`` (-1: a
        result does not record its tiles), the table's numeric columns, the outline's
        ``bbox_*``, the text columns (``class``), ``geometry`` (WKB polygon, level-0
        pixel ``(x, y)``) and, with cells, ``cell_geometry``; the file metadata ``geo``
        (GeoParquet 1.1) and ``slidescope`` (source, region, mpp, segmenter,
        parameters, column descriptions). One row per nucleus with an outline, in table
        order.

        Parameters
        ----------
        path : str or PathLike
            Output ``.parquet`` file (written atomically).
        progress : callable, optional
            Called with a :class:`~napari_slidescope.pipeline.progress.Progress` of rows
            written (or ``(done, total)``).
        row_group : int
            Rows per Parquet row group.

        Returns
        -------
        path : Path

        Raises
        ------
        ImportError
            If pyarrow is not installed (naming the extra that installs it).
        """
        from napari_slidescope._io import atomic_write
        from napari_slidescope.analysis.measure import COLUMNS
        from napari_slidescope.pipeline import geoparquet

        geoparquet.require_pyarrow("NucleiResult.to_geoparquet")
        import pyarrow.parquet as pq

        polys, ids = self.outlines_of("nuclei")
        by_id = dict(zip(np.asarray(ids).tolist(), polys, strict=True))
        table_ids = np.asarray(self.columns["id"])
        keep = np.flatnonzero([i in by_id for i in table_ids.tolist()])
        nuclei = [by_id[i] for i in table_ids[keep].tolist()]
        cells = None
        if self.has_cells:  # a nucleus without a cell outline is its own cell
            cpolys, cids = self.outlines_of("cells")
            cell_of = dict(zip(np.asarray(cids).tolist(), cpolys, strict=True))
            kept = table_ids[keep].tolist()
            cells = [cell_of.get(i, n) for i, n in zip(kept, nuclei, strict=True)]
        numeric = [
            c for c, v in self.columns.items() if c != "id" and np.asarray(v).dtype.kind in "biuf"
        ]
        text = [c for c, v in self.columns.items() if np.asarray(v).dtype.kind not in "biuf"]
        meta = geoparquet.file_metadata(
            {
                "slide": None if self.source is None else self.source.name,
                "path": None if self.source is None else str(self.source),
                "region": [int(v) for v in self.region],
                "mpp": self.mpp if isinstance(self.mpp, float) else list(self.mpp),
                "segmenter": self.segmenter,
                "software": f"napari-slidescope {__version__}",
                "parameters": json.loads(json.dumps(self.parameters, default=str)),
                "columns": {**geoparquet.NUCLEI_COLUMNS, **COLUMNS},
            },
            cells=cells is not None,
        )
        units = {k: v for k, v in COLUMNS.items() if k != "id"}
        total = len(keep)
        call = None if progress is None else progress_caller(progress)
        path = Path(path)
        with atomic_write(path, "wb") as fh:
            writer: Any = None
            for start in range(0, max(total, 1), row_group):
                rows = keep[start : start + row_group]
                wkb, box = geoparquet.wkb_polygons(nuclei[start : start + row_group])
                cell_wkb = None
                if cells is not None:
                    cell_wkb = geoparquet.wkb_polygons(cells[start : start + row_group])[0]
                part = geoparquet.nuclei_table(
                    table_ids[rows],
                    np.full(len(rows), -1, np.int32),
                    {c: np.asarray(self.columns[c])[rows] for c in numeric},
                    wkb,
                    box,
                    units=units,
                    cell_geometry=cell_wkb,
                    extra={c: np.asarray(self.columns[c])[rows] for c in text},
                )
                if writer is None:
                    schema = part.schema.with_metadata(meta)
                    writer = pq.ParquetWriter(fh, schema, compression="zstd")
                writer.write_table(part.replace_schema_metadata(meta))
                if call is not None:
                    call(min(total, start + row_group), total)
            writer.close()
        return path


def _rows_of(table: dict[str, np.ndarray], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in `ids` that have a table row, and those rows (ids looked up in ``id``)."""
    table_ids = np.asarray(table["id"])
    ids = np.asarray(ids)
    if table_ids.size == 0 or ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # the last row of an id, as a dict built row by row would keep it
    order = np.argsort(table_ids, kind="stable")
    sorted_ids = table_ids[order]
    pos = np.searchsorted(sorted_ids, ids, side="right") - 1
    pos = np.clip(pos, 0, len(sorted_ids) - 1)
    found = sorted_ids[pos] == ids
    return np.flatnonzero(found), order[pos[found]]
