"""``nuclei.parquet`` (GeoParquet) and ``nuclei.geojson.gz`` (QuPath), joined from the parts."""

from __future__ import annotations

import gzip
import io
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR
from napari_slidescope.batch.outputs.classes import SlideClasses
from napari_slidescope.batch.outputs.parts import part_path
from napari_slidescope.batch.outputs.regions import RegionColumns
from napari_slidescope.batch.outputs.summary import SlideSummary
from napari_slidescope.batch.tasks import wkb_ring
from napari_slidescope.pipeline import geoparquet
from napari_slidescope.pipeline.geoparquet import nuclei_table


def write_nuclei(
    slide_dir: Path,
    tiles: Sequence[int],
    *,
    file_metadata: dict[str, Any],
    units: dict[str, str],
    feature_ns: str,
    classes: SlideClasses | None = None,
    regions: RegionColumns | None = None,
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
    regions : RegionColumns, optional
        Adds the ``region`` and ``region_id`` columns to the Parquet rows (after the class
        columns) and ``region_id`` to the GeoJSON features' measurements (QuPath
        measurements are numbers; ``regions.geojson`` names the classes).

    Returns
    -------
    SlideSummary
    """
    import pyarrow.parquet as pq

    summary = SlideSummary()
    ns = uuid.uuid5(uuid.NAMESPACE_URL, feature_ns)
    cells = file_metadata.get("parameters", {}).get("nuclei", {}).get("cell_expansion_um")
    file_meta = geoparquet.file_metadata(file_metadata, cells=cells is not None)
    pq_path, gj_path = slide_dir / "nuclei.parquet", slide_dir / "nuclei.geojson.gz"
    with atomic_write(pq_path, "wb") as pq_fh, atomic_write(gj_path, "wb") as gj_fh:
        writer: Any = None

        def features() -> Iterator[str]:
            nonlocal writer
            offset = 0
            for index in tiles:
                part = pq.read_table(part_path(slide_dir, index))
                table, rings, measures = _nuclei_table(part, index, offset, units)
                cell_rings = None
                if "cell_geometry" in table.column_names:
                    cell_rings = [wkb_ring(b) for b in table.column("cell_geometry").to_pylist()]
                names = None
                n = table.num_rows
                if classes is not None:
                    table = _with_columns(table, classes.columns, offset, n)
                    names = classes.columns["class"][offset : offset + n]
                if regions is not None:
                    table = _with_columns(table, regions.columns(), offset, n)
                if writer is None:
                    writer = pq.ParquetWriter(
                        pq_fh, table.schema.with_metadata(file_meta), compression="zstd"
                    )
                writer.write_table(table.replace_schema_metadata(file_meta))
                n = table.num_rows
                summary.nuclei += n
                if "area_um2" in measures:
                    summary.area_um2_sum += float(np.nansum(measures["area_um2"]))
                extra = {} if regions is None else {"region_id": regions.region_id[offset:]}
                yield features_text(
                    table.column("id").to_numpy(),
                    rings,
                    measures,
                    ns=ns,
                    cell_rings=cell_rings,
                    names=None if names is None else [str(name) for name in names],
                    colors={"Nucleus": NUCLEUS_COLOR} if classes is None else classes.colors,
                    extra={k: np.asarray(v)[:n] for k, v in extra.items()},
                    first=offset == 0,
                )
                offset += n

        with (
            # no time and no (temporary) file name in the header: the same bytes every run
            gzip.GzipFile(filename="", fileobj=gj_fh, mode="wb", compresslevel=6, mtime=0) as gz,
            io.TextIOWrapper(gz, encoding="utf-8") as text,
        ):
            # write_features' framing, the features formatted a tile at a time in bulk
            text.write('{"type": "FeatureCollection", "features": [')
            for run in features():
                text.write(run)
            text.write("\n]}\n")
        if writer is None:  # a slide without nuclei: an empty table with every column
            empty = _nuclei_table(_empty_part(), 0, 0, units)[0]
            if classes is not None:
                empty = _with_columns(empty, classes.columns, 0, 0)
            if regions is not None:
                empty = _with_columns(empty, regions.columns(), 0, 0)
            writer = pq.ParquetWriter(pq_fh, empty.schema.with_metadata(file_meta))
        writer.close()
    return summary


def features_text(
    ids: np.ndarray,
    rings: Sequence[np.ndarray],
    measures: Mapping[str, np.ndarray],
    *,
    ns: uuid.UUID,
    cell_rings: Sequence[np.ndarray] | None = None,
    names: Sequence[str] | None = None,
    colors: Mapping[str, Sequence[int]],
    extra: Mapping[str, np.ndarray] | None = None,
    first: bool,
) -> str:
    """One tile's nuclei as a run of ``nuclei.geojson.gz`` features (text), in bulk.

    The text of the per-feature writer (``polygon_feature`` + ``write_features``) for
    the same nuclei, formatted at once by
    :func:`~napari_slidescope.analysis.geojson.polygon_features_text` (~220 µs CPU per
    nucleus for ``json.dumps`` of a dict per feature, RESULTS.md "Dense tissue"): ids
    UUID-5 of the slide-unique nucleus id under `ns`; measurements the tile's numeric
    columns, then ``id`` and the `extra` columns (``region_id``), each written as
    ``json.dumps`` writes a float.

    Parameters
    ----------
    ids : (K,) ndarray of int
        Slide-unique nucleus ids.
    rings : sequence of (N, 2) ndarray
        Closed ``(x, y)`` outlines (as WKB holds them).
    measures : mapping of str to (K,) ndarray
        Numeric measurement columns.
    ns : uuid.UUID
        Namespace of the feature ids.
    cell_rings : sequence of (N, 2) ndarray, optional
        Closed ``(x, y)`` cell outlines: features become ``cell`` objects with the nucleus
        as ``nucleusGeometry``.
    names : sequence of str, optional
        Each nucleus's class (default ``"Nucleus"``), coloured by `colors`.
    colors : mapping of str to (int, int, int)
        Colour of each class.
    extra : mapping of str to (K,) ndarray, optional
        Measurement columns after ``id``.
    first : bool
        Whether these are the slide's first features.

    Returns
    -------
    str
    """
    from napari_slidescope.analysis.geojson import polygon_features_text

    n = len(ids)
    measurements = {c: np.asarray(v, dtype=float) for c, v in measures.items()}
    measurements["id"] = np.asarray(ids, dtype=float)
    measurements.update({c: np.asarray(v, dtype=float) for c, v in (extra or {}).items()})
    nuclei = [r[:-1, ::-1] for r in rings]
    return polygon_features_text(
        nuclei if cell_rings is None else [r[:-1, ::-1] for r in cell_rings],
        names=["Nucleus"] * n if names is None else names,
        colors=dict(colors),
        object_type="detection" if cell_rings is None else "cell",
        measurements=measurements,
        nuclei=None if cell_rings is None else nuclei,
        ids=[str(uuid.uuid5(ns, str(int(i)))) for i in np.asarray(ids).tolist()],
        first=first,
    )


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


def _with_columns(table: Any, columns: Mapping[str, np.ndarray], offset: int, n: int) -> Any:
    """Rows ``offset .. offset + n`` of `columns` (class, region...) added before ``geometry``."""
    import pyarrow as pa

    at = table.column_names.index("geometry")
    for name, col in columns.items():
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
