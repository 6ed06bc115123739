"""The files of a batch run: tile parts, GeoParquet, QuPath GeoJSON, manifests, summary.

Layout of ``OUT``::

    OUT/summary.csv                  one row per slide
    OUT/<slide file name>/manifest.json
    OUT/<slide file name>/tissue.geojson
    OUT/<slide file name>/nuclei.parquet
    OUT/<slide file name>/nuclei.geojson.gz
    OUT/<slide file name>/labels.zarr/     OME-NGFF labels: nuclei (and cells) on level 0
    OUT/<slide file name>/cells.h5ad       (``--anndata``)
    OUT/<slide file name>/cells.zarr/      (``--spatialdata``: a SpatialData store)
    OUT/<slide file name>/parts/tile-<index>.parquet   (while the slide runs)

Every file is written to a temporary name in its folder, flushed and renamed; the
SpatialData store, a folder, is written whole into a temporary folder beside it and renamed.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR
from napari_slidescope.batch.tasks import TileOut, wkb_ring
from napari_slidescope.pipeline import geoparquet
from napari_slidescope.pipeline.geoparquet import NUCLEI_COLUMNS, nuclei_table

__all__ = [
    "NUCLEI_COLUMNS",
    "SUMMARY_COLUMNS",
    "Manifest",
    "SlideSummary",
    "SummaryRow",
    "TileRecord",
    "read_manifest",
    "read_summary",
    "write_manifest",
    "write_nuclei",
    "write_part",
    "write_summary",
]


@dataclass(frozen=True)
class SummaryRow:
    """One slide's row of ``summary.csv`` (and of what ``analyze_slides`` returns).

    Attributes
    ----------
    slide : str
        The slide's file name (its output folder's name).
    status : {"pending", "running", "done", "failed"}
        Where the slide stands.
    error : str or None
        Why it failed, one line.
    tissue_area_mm2, nuclei_per_mm2, mean_nucleus_area_um2 : float or None
        Tissue area, nuclei per mm² of tissue, mean nucleus area in µm².
    nuclei : int or None
        Nuclei found.
    seconds : float or None
        Worker seconds spent on the slide.
    classes : str or None
        Counts per class, ``"name: n; ..."`` (``--classify``).
    positive_percent, h_score, positive_per_mm2 : float or None
        The IHC figures of a classified slide.
    path : str
        The slide's absolute path, or its URL without credentials.
    """

    slide: str
    status: str
    error: str | None = None
    tissue_area_mm2: float | None = None
    nuclei: int | None = None
    nuclei_per_mm2: float | None = None
    mean_nucleus_area_um2: float | None = None
    seconds: float | None = None
    classes: str | None = None
    positive_percent: float | None = None
    h_score: float | None = None
    positive_per_mm2: float | None = None
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the row as a dict of :data:`SUMMARY_COLUMNS` (JSON-ready)."""
        return {c: getattr(self, c) for c in SUMMARY_COLUMNS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryRow:
        """Build from :meth:`to_json`'s dict (unknown keys are ignored, missing ones None)."""
        values: dict[str, Any] = {c: data.get(c) for c in SUMMARY_COLUMNS}
        values["slide"] = str(values["slide"] or "")
        values["status"] = str(values["status"] or "")
        values["path"] = str(values["path"] or "")
        return cls(**values)

    def to_csv(self) -> list[str]:
        """Return the row's ``summary.csv`` fields, in :data:`SUMMARY_COLUMNS` order."""
        return [_fmt(getattr(self, c)) for c in SUMMARY_COLUMNS]

    @classmethod
    def from_csv(cls, fields: Mapping[str, str]) -> SummaryRow:
        """Build from a ``csv.DictReader`` row of ``summary.csv`` (numbers parsed)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            text = fields.get(f.name, "")
            if text == "":
                values[f.name] = "" if f.name in ("slide", "status", "path") else None
            elif f.name == "nuclei":
                values[f.name] = int(text)
            elif f.type == "float | None":
                values[f.name] = float(text)
            else:
                values[f.name] = text
        return cls(**values)


#: Columns of ``summary.csv``: the fields of :class:`SummaryRow`, in order.
SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SummaryRow))


@dataclass(frozen=True)
class TileRecord:
    """A tile's line in a manifest: its status and, once done, its seconds."""

    status: str
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"status": ..., "seconds": ...}`` (seconds only once done)."""
        if self.seconds is None:
            return {"status": self.status}
        return {"status": self.status, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TileRecord:
        """Build from :meth:`to_json`'s dict."""
        seconds = data.get("seconds")
        return cls(str(data.get("status", "")), None if seconds is None else float(seconds))


@dataclass(frozen=True)
class Manifest:
    """A slide's ``manifest.json``: what was asked, what ran, where it stands.

    Attributes
    ----------
    slide, path : str
        The slide's file name, and its absolute path or URL without credentials.
    status : {"running", "done", "failed"}
        Where the slide stands.
    error, traceback : str or None
        Why it failed: one line, and the traceback.
    slide_stamp : dict or None
        Size, modification time and hash of the slide's first MiB (a URL: what its
        store says about the object's version), as resume compares them.
    parameters : dict or None
        :meth:`~napari_slidescope.batch.params.BatchParams.as_dict`.
    requested_sha256 : str or None
        Digest of `parameters`.
    resolved : dict or None
        What ran (the segmenter ``auto`` chose, its model and weights, the working
        resolution, the stain and tissue modes...), once the slide task has said.
    parameters_sha256 : str or None
        Digest of `parameters` and `resolved` (``run_digest``): parts and outputs carry it.
    segmentation_sha256 : str or None
        The same without the classification (``segmentation_digest``): equal when only
        the rules changed.
    slide_info : dict or None
        ``shape0``, ``mpp`` and ``format`` of the slide.
    tissue_area_mm2, slide_task_seconds : float or None
        The tissue area, and the seconds of the slide task.
    plan : dict or None
        The tile plan (working µm/px, tile size and overlap in px, grid, tiles).
    tiles : dict of int to TileRecord, or None
        Each tile with tissue: its status and seconds.
    summary : SummaryRow or None
        The slide's summary row once done.
    """

    slide: str
    path: str
    status: str
    error: str | None = None
    traceback: str | None = None
    slide_stamp: dict[str, Any] | None = None
    parameters: dict[str, Any] | None = None
    requested_sha256: str | None = None
    resolved: dict[str, Any] | None = None
    parameters_sha256: str | None = None
    segmentation_sha256: str | None = None
    slide_info: dict[str, Any] | None = None
    tissue_area_mm2: float | None = None
    slide_task_seconds: float | None = None
    plan: dict[str, Any] | None = None
    tiles: dict[int, TileRecord] | None = None
    summary: SummaryRow | None = None

    def replace(self, **changes: Any) -> Manifest:
        """Return a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """Return the manifest as JSON-ready values (tile keys as strings)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.tiles is not None:
            out["tiles"] = {str(i): t.to_json() for i, t in self.tiles.items()}
        if self.summary is not None:
            out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """Build from :meth:`to_json`'s dict; keys it does not know are ignored.

        Raises
        ------
        ValueError
            If `data` is not a JSON object.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"manifest: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values.setdefault("slide", "")
        values.setdefault("path", "")
        values.setdefault("status", "")
        tiles = values.get("tiles")
        if tiles is not None:
            values["tiles"] = {int(i): TileRecord.from_json(t) for i, t in tiles.items()}
        summary = values.get("summary")
        if summary is not None:
            values["summary"] = SummaryRow.from_json(summary)
        return cls(**values)


@dataclass
class SlideSummary:
    """Totals of one slide's nuclei, gathered while its output is written."""

    nuclei: int = 0
    area_um2_sum: float = 0.0

    @property
    def mean_area_um2(self) -> float | None:
        """Mean nucleus area in µm², None without nuclei."""
        return self.area_um2_sum / self.nuclei if self.nuclei else None


def parts_dir(slide_dir: Path) -> Path:
    """Folder of the tile parts of a slide."""
    return slide_dir / "parts"


def part_path(slide_dir: Path, index: int) -> Path:
    """Part file of one tile."""
    return parts_dir(slide_dir) / f"tile-{index:06d}.parquet"


def write_part(slide_dir: Path, tile: TileOut, digest: str) -> Path:
    """Write one tile's nuclei (local ids) as a Parquet part, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {k: pa.array(np.asarray(v)) for k, v in tile.table.items()}
    cols["geometry"] = pa.array(tile.wkb, type=pa.binary())
    if tile.cell_wkb is not None:
        cols["cell_geometry"] = pa.array(tile.cell_wkb, type=pa.binary())
    meta = {"tile": str(tile.index), "seconds": repr(tile.seconds), "params_sha256": digest}
    table = pa.table(cols).replace_schema_metadata({f"slidescope.{k}": v for k, v in meta.items()})
    path = part_path(slide_dir, tile.index)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:
        pq.write_table(table, fh, compression="zstd")
    return path


def finished_parts(slide_dir: Path, digest: str) -> dict[int, float]:
    """Tiles with a part written with these parameters: ``{index: seconds}``."""
    import pyarrow.parquet as pq

    done: dict[int, float] = {}
    folder = parts_dir(slide_dir)
    if not folder.is_dir():
        return done
    for p in sorted(folder.glob("tile-*.parquet")):
        try:
            meta = pq.read_schema(p).metadata or {}
        except Exception:  # noqa: BLE001 - a part that cannot be read is redone
            continue
        if meta.get(b"slidescope.params_sha256", b"").decode() != digest:
            continue
        done[int(meta[b"slidescope.tile"])] = float(meta[b"slidescope.seconds"])
    return done


def clear_slide(slide_dir: Path) -> None:
    """Remove a slide's parts and outputs (before it is redone from scratch)."""
    shutil.rmtree(parts_dir(slide_dir), ignore_errors=True)
    for name in ("nuclei.parquet", "nuclei.geojson.gz", "tissue.geojson", "manifest.json"):
        (slide_dir / name).unlink(missing_ok=True)
    shutil.rmtree(slide_dir / "labels.zarr", ignore_errors=True)  # batch.label_image
    remove_spatialdata(slide_dir)


def _read_parts(slide_dir: Path, tiles: Sequence[int]) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    for index in tiles:
        yield index, pq.read_table(part_path(slide_dir, index))


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

    table = _part_measurements(slide_dir, tiles)
    res = classify_table(table, classification_from(descriptor))
    extra = {k: np.asarray(v) for k, v in res.columns.items() if k not in table}
    return SlideClasses(extra, dict(res.classes), class_summary(res, area_mm2=area_mm2))


def write_anndata(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    slide: str,
    mpp: Any,
    classes: SlideClasses | None = None,
) -> Path:
    """Write ``cells.h5ad``: the slide's cells x markers (``to_anndata``), atomically.

    Read from the parts (measurements only), ids as in ``nuclei.parquet``, with the class
    and positivity columns when the slide was classified.
    """
    from napari_slidescope.pipeline.nuclei_result import NucleiResult
    from napari_slidescope.pipeline.scverse import to_anndata

    table = _part_measurements(slide_dir, tiles)
    colors: dict[str, tuple[int, int, int]] = {}
    if classes is not None:
        table.update(classes.columns)
        colors = classes.colors
    n = int(np.asarray(table["id"]).size)
    res = NucleiResult(None, mpp, (0, 0), (1.0, 1.0), n, table, (0, 0, 0, 0), classes=colors)
    adata = to_anndata(res, slide=slide)
    path = slide_dir / "cells.h5ad"
    tmp = slide_dir / f".cells.h5ad.{os.getpid()}.tmp"
    try:
        adata.write_h5ad(tmp)  # h5py writes a path; renamed into place when complete
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: The SpatialData store of a slide (``--spatialdata``), beside ``cells.h5ad``.
SPATIALDATA_STORE = "cells.zarr"


def write_spatialdata(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    slide_path: str,
    shape0: tuple[int, int],
    mpp: Any,
    segmenter: str = "",
    classes: SlideClasses | None = None,
) -> Path | None:
    """Write ``cells.zarr``: the slide's SpatialData store, whole or not at all.

    Built from the parts as :func:`write_anndata` builds its table (ids as in
    ``nuclei.parquet``, the class columns when classified), with the nucleus and cell
    outlines the parts hold, by :meth:`NucleiResult.to_spatialdata` with
    ``image="reference"``: the store names the slide (`slide_path`, as the manifest shows
    it) and its level-0 frame rather than copying its pixels, which would double the
    output by the size of every slide. The store is written into a temporary folder in
    `slide_dir` and renamed into place once complete; an old store is moved aside first and
    removed only after the new one is in place, so an interrupted write leaves the old
    store (or none) and no temporary folder.

    A slide without nuclei gets no store (and loses an old one; None is returned):
    spatialdata rejects a store whose shapes are empty (``read_zarr``, 0.7.3).
    """
    from napari_slidescope.pipeline.nuclei_result import NucleiResult
    from napari_slidescope.pipeline.sdata import to_spatialdata

    table = _part_measurements(slide_dir, tiles)
    colors: dict[str, tuple[int, int, int]] = {}
    if classes is not None:
        table.update(classes.columns)
        colors = classes.colors
    ids = np.asarray(table["id"], dtype=np.int64).reshape(-1)
    if ids.size == 0:
        remove_spatialdata(slide_dir)
        return None
    nuclei, cells = _part_outlines(slide_dir, tiles)
    # a URL stays a string (a Path would fold its "//"); to_spatialdata records str(source)
    source: Any = slide_path if "://" in slide_path else Path(slide_path)
    res = NucleiResult(
        None,
        mpp,
        (0, 0),
        (1.0, 1.0),
        int(ids.size),
        table,
        (0, 0, int(shape0[0]), int(shape0[1])),
        segmenter=segmenter,
        source=source,
        outlines=(nuclei, ids),
        cell_outlines=None if cells is None else (cells, ids),
        classes=colors,
    )
    path = slide_dir / SPATIALDATA_STORE
    tmp = slide_dir / f".{SPATIALDATA_STORE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    old = tmp.with_suffix(".old")
    try:
        to_spatialdata(res, tmp / SPATIALDATA_STORE, image="reference")
        if path.exists():
            os.replace(path, old)  # aside: the new store is complete, the old one still whole
        os.replace(tmp / SPATIALDATA_STORE, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return path


def remove_spatialdata(slide_dir: Path) -> None:
    """Remove a slide's SpatialData store and any temporary folder a killed write left."""
    shutil.rmtree(slide_dir / SPATIALDATA_STORE, ignore_errors=True)
    for stale in slide_dir.glob(f".{SPATIALDATA_STORE}.*"):
        shutil.rmtree(stale, ignore_errors=True)


def _part_outlines(
    slide_dir: Path, tiles: Sequence[int]
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Level-0 ``(row, col)`` outlines of a slide's nuclei and cells (None without), in id order."""
    import pyarrow.parquet as pq

    nuclei: list[np.ndarray] = []
    cells: list[np.ndarray] | None = None
    for index in tiles:
        part = pq.read_table(part_path(slide_dir, index))
        nuclei += [wkb_ring(b)[:, ::-1] for b in part.column("geometry").to_pylist()]
        if "cell_geometry" in part.column_names:
            cells = [] if cells is None else cells
            cells += [wkb_ring(b)[:, ::-1] for b in part.column("cell_geometry").to_pylist()]
    if cells is not None and len(cells) != len(nuclei):  # a part without cells among others
        raise ValueError(f"{slide_dir}: some tile parts have cell outlines, others have none")
    return nuclei, cells


def write_nuclei(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    file_metadata: dict[str, Any],
    units: dict[str, str],
    feature_ns: str,
    classes: SlideClasses | None = None,
) -> SlideSummary:
    """Join a slide's parts into ``nuclei.parquet`` and ``nuclei.geojson.gz``.

    Ids are made slide-unique as :func:`~napari_slidescope.segment_nuclei` numbers them:
    tile by tile in plan order, each tile's local ids shifted by the nuclei of the tiles
    before it. Parts are read one at a time and each becomes a row group and a run of
    GeoJSON features, so memory holds one tile's nuclei whatever the slide.

    Parameters
    ----------
    slide_dir : Path
        ``OUT/<slide>/`` holding ``parts/``.
    tiles : sequence of int
        The tiles of the slide, in plan order; each must have a part.
    file_metadata : dict
        Stored as JSON under the ``slidescope`` key of the Parquet file metadata.
    units : dict of str to str
        Unit of each measurement column (Parquet field metadata ``unit``).
    feature_ns : str
        Seed of the GeoJSON feature ids (a UUID-5 per nucleus, the same on every run).
    classes : SlideClasses, optional
        Adds the ``class`` and positivity columns to the Parquet rows and each class and
        its colour to the GeoJSON features' classification.

    Returns
    -------
    SlideSummary
    """
    import pyarrow.parquet as pq

    from napari_slidescope.analysis.geojson import polygon_feature, write_features

    summary = SlideSummary()
    ns = uuid.uuid5(uuid.NAMESPACE_URL, feature_ns)
    cells = file_metadata.get("parameters", {}).get("nuclei", {}).get("cell_expansion_um")
    file_meta = geoparquet.file_metadata(file_metadata, cells=cells is not None)
    pq_path, gj_path = slide_dir / "nuclei.parquet", slide_dir / "nuclei.geojson.gz"
    with atomic_write(pq_path, "wb") as pq_fh, atomic_write(gj_path, "wb") as gj_fh:
        writer: Any = None

        def features() -> Iterator[dict[str, Any]]:
            nonlocal writer
            offset = 0
            for index in tiles:
                part = pq.read_table(part_path(slide_dir, index))
                table, rings, measures = _nuclei_table(part, index, offset, units)
                cell_rings = None
                if "cell_geometry" in table.column_names:
                    cell_rings = [wkb_ring(b) for b in table.column("cell_geometry").to_pylist()]
                names = None
                if classes is not None:
                    n = table.num_rows
                    table = _with_classes(table, classes, offset, n)
                    names = classes.columns["class"][offset : offset + n]
                if writer is None:
                    writer = pq.ParquetWriter(
                        pq_fh, table.schema.with_metadata(file_meta), compression="zstd"
                    )
                writer.write_table(table.replace_schema_metadata(file_meta))
                n = table.num_rows
                summary.nuclei += n
                if "area_um2" in measures:
                    summary.area_um2_sum += float(np.nansum(measures["area_um2"]))
                ids = table.column("id").to_numpy()
                for k in range(n):
                    meas = {c: float(v[k]) for c, v in measures.items()}
                    meas["id"] = float(ids[k])
                    name = "Nucleus" if names is None else str(names[k])
                    nucleus = rings[k][:-1, ::-1]
                    yield polygon_feature(
                        nucleus if cell_rings is None else cell_rings[k][:-1, ::-1],
                        name=name,
                        color=NUCLEUS_COLOR if classes is None else classes.colors[name],
                        object_type="detection" if cell_rings is None else "cell",
                        nucleus=None if cell_rings is None else nucleus,
                        measurements=meas,
                        feature_id=str(uuid.uuid5(ns, str(int(ids[k])))),
                    )
                offset += n

        with (
            # no time and no (temporary) file name in the header: the same bytes every run
            gzip.GzipFile(filename="", fileobj=gj_fh, mode="wb", compresslevel=6, mtime=0) as gz,
            io.TextIOWrapper(gz, encoding="utf-8") as text,
        ):
            write_features(text, features())
        if writer is None:  # a slide without nuclei: an empty table with every column
            empty = _nuclei_table(_empty_part(), 0, 0, units)[0]
            if classes is not None:
                empty = _with_classes(empty, classes, 0, 0)
            writer = pq.ParquetWriter(pq_fh, empty.schema.with_metadata(file_meta))
        writer.close()
    return summary


def _nuclei_table(
    part: Any, index: int, offset: int, units: dict[str, str]
) -> tuple[Any, list[np.ndarray], dict[str, np.ndarray]]:
    """One tile's rows of ``nuclei.parquet``, its outlines ``(x, y)`` and measurements."""
    n = part.num_rows
    wkb = part.column("geometry")
    rings = [wkb_ring(b) for b in wkb.to_pylist()]
    box = np.array(
        [[r[:, 1].min(), r[:, 0].min(), r[:, 1].max(), r[:, 0].max()] for r in rings], np.float64
    ).reshape(n, 4)
    measures = {
        c: part.column(c).to_numpy()
        for c in part.column_names
        if c not in ("id", "geometry", "cell_geometry")
    }
    table = nuclei_table(
        part.column("id").to_numpy().astype(np.int64) + offset,
        np.full(n, index, np.int32),
        measures,
        wkb,
        box,
        units=units,
        cell_geometry=(
            part.column("cell_geometry") if "cell_geometry" in part.column_names else None
        ),
    )
    return table, rings, measures


def _with_classes(table: Any, classes: SlideClasses, offset: int, n: int) -> Any:
    """Rows ``offset .. offset + n`` of the class columns added before ``geometry``."""
    import pyarrow as pa

    at = table.column_names.index("geometry")
    for name, col in classes.columns.items():
        values = np.asarray(col)[offset : offset + n]
        array = (
            pa.array(values.tolist(), pa.string()) if values.dtype.kind == "U" else pa.array(values)
        )
        table = table.add_column(at, name, array)
        at += 1
    return table


def _empty_part() -> Any:
    import pyarrow as pa

    from napari_slidescope.analysis.measure import empty_table

    cols = {c: pa.array(v) for c, v in empty_table().items()}
    cols["geometry"] = pa.array([], pa.binary())
    return pa.table(cols)


def write_tissue(
    slide_dir: Path, polygons: list[np.ndarray], holes: list[list[np.ndarray]]
) -> Path:
    """``tissue.geojson``: one QuPath annotation per tissue piece, atomically."""
    from napari_slidescope.analysis.geojson import polygon_feature, write_features

    path = slide_dir / "tissue.geojson"
    with atomic_write(path, "w") as fh:
        write_features(
            fh,
            (
                polygon_feature(p, h, name="Tissue", object_type="annotation", feature_id=str(i))
                for i, (p, h) in enumerate(zip(polygons, holes, strict=True))
                if len(p) >= 3
            ),
        )
    return path


def read_manifest(slide_dir: Path) -> Manifest | None:
    """Read the slide's ``manifest.json``; None when missing or unreadable."""
    try:
        data = json.loads((slide_dir / "manifest.json").read_text(encoding="utf-8"))
        return Manifest.from_json(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def write_manifest(slide_dir: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically."""
    with atomic_write(slide_dir / "manifest.json", "w") as fh:
        json.dump(manifest.to_json(), fh, indent=1, sort_keys=True)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    return str(value)


def write_summary(path: Path, rows: Sequence[SummaryRow]) -> None:
    """Write ``summary.csv`` (:data:`SUMMARY_COLUMNS`, one row per slide), atomically."""
    with atomic_write(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(SUMMARY_COLUMNS)
        for row in rows:
            w.writerow(row.to_csv())


def read_summary(path: Path) -> list[SummaryRow]:
    """Read ``summary.csv`` back as :class:`SummaryRow` records."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [SummaryRow.from_csv(r) for r in csv.DictReader(fh)]


def parts_from_nuclei(slide_dir: Path, tiles: Sequence[int]) -> list[int]:
    """Write a finished slide's tile parts back from its ``nuclei.parquet``.

    What a slide's classification is computed from again when only the classification
    changed (``resume``): each tile's rows with its local ids, measurements and outlines,
    exactly the parts the tile tasks wrote, so :func:`classify_parts` and
    :func:`write_nuclei` give what a run from scratch would. ``nuclei.parquet`` is
    ``id, tile, <measurements>, bbox_*, <class columns>, geometry[, cell_geometry]``.

    Parameters
    ----------
    slide_dir : Path
        ``OUT/<slide>/``.
    tiles : sequence of int
        The slide's tiles with tissue (its manifest's).

    Returns
    -------
    list of int
        The tiles in plan order (as ``nuclei.parquet`` holds them; tiles without nuclei
        after them).

    Raises
    ------
    ValueError
        If ``nuclei.parquet`` holds a tile that is not in `tiles`, or lacks a column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(slide_dir / "nuclei.parquet")
    names = pf.schema_arrow.names
    for c in ("id", "tile", "bbox_row0", "bbox_col1", "geometry"):
        if c not in names:
            raise ValueError(f"{slide_dir / 'nuclei.parquet'}: no {c!r} column")
    keep = ["id", *names[names.index("tile") + 1 : names.index("bbox_row0")], "geometry"]
    if "cell_geometry" in names:
        keep.append("cell_geometry")
    known = set(tiles)
    order: list[int] = []
    offset = 0

    def flush(index: int, rows: Any) -> None:
        nonlocal offset
        if index not in known:
            raise ValueError(f"{slide_dir / 'nuclei.parquet'}: tile {index} is not in the plan")
        part = rows.select(keep)
        ids = pa.array(part.column("id").to_numpy().astype(np.int64) - offset)
        part = part.set_column(0, "id", ids)
        _write_part_table(slide_dir, index, part)
        order.append(index)
        offset += rows.num_rows

    current: int | None = None
    pending: list[Any] = []
    for g in range(pf.num_row_groups):
        group = pf.read_row_group(g)
        column = group.column("tile").to_numpy()
        cuts = [0, *(np.flatnonzero(np.diff(column)) + 1).tolist(), len(column)]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if a == b:
                continue
            index = int(column[a])
            if current is not None and index != current:
                flush(current, pa.concat_tables(pending))
                pending = []
            current = index
            pending.append(group.slice(a, b - a))
    if current is not None:
        flush(current, pa.concat_tables(pending))
    empty = pf.schema_arrow.empty_table()
    for index in tiles:
        if index not in order:
            flush(index, empty)
    return order


def _write_part_table(slide_dir: Path, index: int, table: Any) -> None:
    """Write a rebuilt tile part (its seconds and digest are in the manifest, not here)."""
    import pyarrow.parquet as pq

    path = part_path(slide_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:
        pq.write_table(table.replace_schema_metadata(None), fh, compression="zstd")


def remove_parts(slide_dir: Path) -> None:
    """Remove a finished slide's parts (``nuclei.parquet`` holds them all now)."""
    shutil.rmtree(parts_dir(slide_dir), ignore_errors=True)


def _part_measurements(slide_dir: Path, tiles: Sequence[int]) -> dict[str, np.ndarray]:
    """Return the measurement columns of a slide's parts, ids numbered as in ``nuclei.parquet``."""
    import pyarrow.parquet as pq

    from napari_slidescope.analysis.measure import concat_tables

    tables = []
    offset = 0
    for index in tiles:
        part = pq.read_table(part_path(slide_dir, index))
        cols = [c for c in part.column_names if c not in ("geometry", "cell_geometry")]
        t = {c: part.column(c).to_numpy() for c in cols}
        t["id"] = t["id"].astype(np.int64) + offset
        offset += part.num_rows
        tables.append(t)
    return concat_tables(tables)
