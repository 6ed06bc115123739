"""The files of a batch run: tile parts, GeoParquet, QuPath GeoJSON, manifests, summary.

One module per kind of file: :mod:`.summary` (``summary.csv``), :mod:`.manifest`
(``manifest.json``), :mod:`.parts` (tile parts), :mod:`.nuclei` (the joined nuclei),
:mod:`.classes` (``--classify``), :mod:`.regions` (``--regions``), :mod:`.tiles`
(``--tiles``), :mod:`.scverse`
(AnnData, SpatialData), :mod:`.tissue` and :mod:`.folder` (clearing a slide's folder).
Their names are importable from here.

Layout of ``OUT``::

    OUT/summary.csv                  one row per slide
    OUT/<slide file name>/manifest.json
    OUT/<slide file name>/tissue.geojson
    OUT/<slide file name>/nuclei.parquet
    OUT/<slide file name>/nuclei.geojson.gz
    OUT/<slide file name>/labels.zarr/     OME-NGFF labels: nuclei (and cells) on level 0
    OUT/<slide file name>/cells.h5ad       (``--anndata``)
    OUT/<slide file name>/cells.zarr/      (``--spatialdata``: a SpatialData store)
    OUT/<slide file name>/tiles.parquet    (``--tiles``: the tissue tiles, GeoParquet)
    OUT/<slide file name>/tile_embeddings.zarr/  (``--embed``: tiles x features, AnnData)
    OUT/<slide file name>/parts/tile-<index>.parquet   (while the slide runs)

Every file is written to a temporary name in its folder, flushed and renamed; the
SpatialData store, a folder, is written whole into a temporary folder beside it and renamed.
"""

from __future__ import annotations

from napari_slidescope.batch.outputs.classes import SlideClasses, classify_parts
from napari_slidescope.batch.outputs.folder import clear_slide
from napari_slidescope.batch.outputs.manifest import (
    Manifest,
    TileRecord,
    read_manifest,
    write_manifest,
)
from napari_slidescope.batch.outputs.nuclei import write_nuclei
from napari_slidescope.batch.outputs.parts import (
    finished_parts,
    part_path,
    parts_dir,
    parts_from_nuclei,
    remove_parts,
    write_part,
)
from napari_slidescope.batch.outputs.regions import (
    REGIONS_STORE,
    RegionColumns,
    region_columns,
    region_figures,
    region_rows,
    remove_regions,
    write_regions,
    write_regions_csv,
)
from napari_slidescope.batch.outputs.scverse import (
    SPATIALDATA_STORE,
    remove_spatialdata,
    write_anndata,
    write_spatialdata,
)
from napari_slidescope.batch.outputs.summary import (
    SUMMARY_COLUMNS,
    SlideSummary,
    SummaryRow,
    read_summary,
    write_summary,
)
from napari_slidescope.batch.outputs.tiles import (
    TILE_EMBEDDINGS_STORE,
    TILES_FILE,
    remove_tiles,
    write_tiles,
)
from napari_slidescope.batch.outputs.tissue import write_tissue
from napari_slidescope.pipeline.geoparquet import NUCLEI_COLUMNS

__all__ = [
    "NUCLEI_COLUMNS",
    "REGIONS_STORE",
    "SPATIALDATA_STORE",
    "SUMMARY_COLUMNS",
    "TILES_FILE",
    "TILE_EMBEDDINGS_STORE",
    "Manifest",
    "RegionColumns",
    "SlideClasses",
    "SlideSummary",
    "SummaryRow",
    "TileRecord",
    "classify_parts",
    "clear_slide",
    "finished_parts",
    "part_path",
    "parts_dir",
    "parts_from_nuclei",
    "read_manifest",
    "read_summary",
    "region_columns",
    "region_figures",
    "region_rows",
    "remove_parts",
    "remove_regions",
    "remove_spatialdata",
    "remove_tiles",
    "write_anndata",
    "write_manifest",
    "write_nuclei",
    "write_part",
    "write_regions",
    "write_regions_csv",
    "write_spatialdata",
    "write_summary",
    "write_tiles",
    "write_tissue",
]
