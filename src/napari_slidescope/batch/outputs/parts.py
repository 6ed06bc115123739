"""Tile parts: one Parquet file per finished tile while a slide runs, and reading them back.

A part holds a tile's nuclei with local ids (``1 .. n``), their measurements and outlines
(WKB); the slide's outputs are joined from the parts once its last tile is in, and
``resume`` keeps the parts written with the same parameters digest.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.batch.tasks import TileOut, wkb_ring


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


def _read_parts(slide_dir: Path, tiles: Sequence[int]) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    for index in tiles:
        yield index, pq.read_table(part_path(slide_dir, index))


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


def part_measurements(slide_dir: Path, tiles: Sequence[int]) -> dict[str, np.ndarray]:
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


def part_outlines(
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
