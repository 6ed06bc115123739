"""napari glue that imports napari alone, never Qt: what the viewer needs besides widgets.

The npe2 reader (:mod:`.reader`, with :mod:`.batch_results`, :mod:`.qupath` and
:mod:`.parquet` for result files) and writer, the bookkeeping of the slides the reader
opened (:mod:`.open_slides`), sample data, the jobs a run performs on a worker
(:mod:`.jobs`), the result layers (:mod:`.layers`, :mod:`.shapes`, :mod:`.class_layers`,
:mod:`.canvases`), damaged-tile outlines and the visible-region math (:mod:`.viewport`).
The dock widgets, the analysis session and the launcher are in :mod:`napari_slidescope._qt`.
"""
