"""Batch analysis of many slides, or one huge slide, on dask.distributed.

``analyze_slides(paths, out)`` (and the ``slidescope batch`` command) finds the tissue
of every slide, segments the nuclei of the tiles with tissue on a cluster's workers
and writes GeoParquet, QuPath GeoJSON, a manifest per slide and a summary table,
atomically and resumably. GUI-free: imports neither napari nor Qt.
"""

from napari_slidescope.batch.engine import BatchProgress, analyze_slides

__all__ = ["BatchProgress", "analyze_slides"]
