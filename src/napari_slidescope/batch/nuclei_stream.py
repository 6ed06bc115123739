"""A slide's ``nuclei.parquet`` and ``nuclei.geojson.gz`` written while its tiles finish.

:func:`~napari_slidescope.batch.outputs.write_nuclei` joins a slide's tile parts once
all of them are in: on a slide of a million nuclei that is a pause of minutes (~220 µs
CPU per nucleus, RESULTS.md "Dense tissue") after the last tile. :class:`NucleiStream`
writes the same two files a tile at a time instead, as soon as the tiles before it in
plan order are in (ids are slide-unique in plan order), each tile one Parquet row group
and one run of GeoJSON features: what is left when the last tile arrives is that tile
and the files' footers. The bytes are those of ``write_nuclei``.

Both files are written to temporary files beside their names and renamed into place on
:meth:`NucleiStream.close` (as ``write_nuclei`` does): a run that fails or is killed
leaves the slide's earlier files as they were, and its parts, from which a resumed run
goes on. A run that classifies its nuclei (``--classify``) cannot stream: its class
thresholds need every nucleus of the slide, so it joins the parts at the end.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import uuid
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR
from napari_slidescope.batch import outputs
from napari_slidescope.batch.outputs.nuclei import _empty_part, _nuclei_table, features_text
from napari_slidescope.batch.tasks import wkb_ring
from napari_slidescope.pipeline import geoparquet

__all__ = ["NucleiStream"]


class NucleiStream:
    """Write a slide's nuclei outputs tile by tile, in plan order, as the tiles finish.

    Parameters
    ----------
    slide_dir : Path
        ``OUT/<slide>/``, holding ``parts/``.
    file_metadata, units, feature_ns
        As for :func:`~napari_slidescope.batch.outputs.write_nuclei`.
    """

    def __init__(
        self,
        slide_dir: Path,
        *,
        file_metadata: dict[str, Any],
        units: dict[str, str],
        feature_ns: str,
    ) -> None:
        import pyarrow.parquet as pq

        self._pq = pq
        self.slide_dir = slide_dir
        self.units = units
        self.summary = outputs.SlideSummary()
        self._ns = uuid.uuid5(uuid.NAMESPACE_URL, feature_ns)
        cells = file_metadata.get("parameters", {}).get("nuclei", {}).get("cell_expansion_um")
        self._meta = geoparquet.file_metadata(file_metadata, cells=cells is not None)
        #: Tiles written: the first ``written`` tiles of the plan.
        self.written = 0
        self._offset = 0
        self._features = 0
        self._writer: Any = None
        for name in ("nuclei.parquet", "nuclei.geojson.gz"):  # what a killed run left
            for stale in slide_dir.glob(f".{name}.*.tmp"):
                stale.unlink(missing_ok=True)
        self._stack = contextlib.ExitStack()
        try:
            self._pq_fh = self._stack.enter_context(
                atomic_write(slide_dir / "nuclei.parquet", "wb")
            )
            gj_fh = self._stack.enter_context(atomic_write(slide_dir / "nuclei.geojson.gz", "wb"))
            # no time and no (temporary) file name in the header: the same bytes every run
            gz = self._stack.enter_context(
                gzip.GzipFile(filename="", fileobj=gj_fh, mode="wb", compresslevel=6, mtime=0)
            )
            self._text = self._stack.enter_context(io.TextIOWrapper(gz, encoding="utf-8"))
            self._text.write('{"type": "FeatureCollection", "features": [')
        except BaseException:
            self.abort()
            raise

    def advance(self, tiles: Sequence[int], done: Container[int]) -> int:
        """Write every tile of `tiles` (plan order) now in `done` whose predecessors are.

        Returns the number of tiles written so far.
        """
        while self.written < len(tiles) and tiles[self.written] in done:
            self._add(tiles[self.written])
            self.written += 1
        return self.written

    def _add(self, index: int) -> None:
        part = self._pq.read_table(outputs.part_path(self.slide_dir, index))
        table, rings, measures = _nuclei_table(part, index, self._offset, self.units)
        cell_rings = None
        if "cell_geometry" in table.column_names:
            cell_rings = [wkb_ring(b) for b in table.column("cell_geometry").to_pylist()]
        if self._writer is None:
            self._writer = self._pq.ParquetWriter(
                self._pq_fh, table.schema.with_metadata(self._meta), compression="zstd"
            )
        self._writer.write_table(table.replace_schema_metadata(self._meta))
        n = table.num_rows
        self.summary.nuclei += n
        if "area_um2" in measures:
            self.summary.area_um2_sum += float(np.nansum(measures["area_um2"]))
        # write_features' framing, formatted in bulk: the same bytes as write_nuclei's
        self._text.write(
            features_text(
                table.column("id").to_numpy(),
                rings,
                measures,
                ns=self._ns,
                cell_rings=cell_rings,
                colors={"Nucleus": NUCLEUS_COLOR},
                first=self._features == 0,
            )
        )
        self._features += n
        self._offset += n

    def close(self) -> outputs.SlideSummary:
        """Write the footers and move both files into place; returns the slide's totals."""
        try:
            self._text.write("\n]}\n")
            if self._writer is None:  # a slide without nuclei: an empty table, every column
                empty = _nuclei_table(_empty_part(), 0, 0, self.units)[0]
                self._writer = self._pq.ParquetWriter(
                    self._pq_fh, empty.schema.with_metadata(self._meta)
                )
            self._writer.close()
        except BaseException:
            self.abort()
            raise
        self._stack.close()
        return self.summary

    def abort(self) -> None:
        """Drop both temporary files; the slide's earlier files stay as they were."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        error = RuntimeError("nuclei outputs not finished")
        with contextlib.suppress(Exception):
            self._stack.__exit__(RuntimeError, error, None)
