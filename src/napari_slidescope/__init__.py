"""napari-slidescope: whole-slide images in napari.

The public API is GUI-free and imports neither napari nor Qt::

    from napari_slidescope import open_slide, detect_tissue, segment_nuclei

    with open_slide("slide.svs") as slide:
        tissue = detect_tissue(slide)
        nuclei = segment_nuclei(slide, region=(10_000, 12_000, 12_000, 14_000))

Heavy modules are imported on first use, so ``import napari_slidescope`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from napari_slidescope._version import __version__
from napari_slidescope.errors import (
    Cancelled,
    ClassifierFileError,
    InstallError,
    SegmenterInfoWarning,
    SegmenterMismatchWarning,
    SegmenterUnavailableError,
    SlideError,
    SlidescopeWarning,
    UncalibratedWarning,
)

_LAZY = {
    "open_slide": "napari_slidescope.slide",
    "Slide": "napari_slidescope.slide",
    "ArraySlide": "napari_slidescope.slide",
    "detect_tissue": "napari_slidescope.pipeline.tissue",
    "TissueResult": "napari_slidescope.pipeline.tissue",
    "segment_nuclei": "napari_slidescope.pipeline.nuclei",
    "NucleiResult": "napari_slidescope.pipeline.nuclei",
    "analyze_slides": "napari_slidescope.batch",
    "classify_cells": "napari_slidescope.pipeline.cell_classes",
    "CellClassifier": "napari_slidescope.pipeline.cell_classes",
    "PhenotypeRules": "napari_slidescope.pipeline.cell_classes",
    "load_rules": "napari_slidescope.pipeline.cell_classes",
    "class_summary": "napari_slidescope.pipeline.cell_classes",
    "train_classifier": "napari_slidescope.pipeline.cell_forest",
    "load_classifier": "napari_slidescope.pipeline.cell_forest",
    "write_sample_slide": "napari_slidescope.sample_data",
    "tile_slide": "napari_slidescope.tiles",
    "TileTable": "napari_slidescope.tiles",
    "iter_tiles": "napari_slidescope.tiles",
    "TileDataset": "napari_slidescope.tiles",
    "embed_tiles": "napari_slidescope.tiles",
    "write_tile_embeddings": "napari_slidescope.tiles",
    "write_ki67_sample": "napari_slidescope.sample_cells",
    "write_multiplex_sample": "napari_slidescope.sample_cells",
    "install_instanseg": "napari_slidescope.segmenters.catalogue",
    "installed_models": "napari_slidescope.segmenters.catalogue",
    "train_region_classifier": "napari_slidescope.pipeline.region_classifier",
    "load_region_classifier": "napari_slidescope.pipeline.region_classifier",
    "RegionClassifier": "napari_slidescope.pipeline.region_classifier",
    "Stroke": "napari_slidescope.pipeline.region_classifier",
    "classify_regions": "napari_slidescope.pipeline.region_map",
    "RegionMap": "napari_slidescope.pipeline.region_map",
    "regions_tissue": "napari_slidescope.pipeline.region_map",
    "assign_regions": "napari_slidescope.pipeline.region_cells",
    "region_summary": "napari_slidescope.pipeline.region_cells",
    "write_region_slide": "napari_slidescope.sample_regions",
}

#: The errors and warnings, also importable from :mod:`napari_slidescope.errors`.
_ERRORS = [
    "Cancelled",
    "ClassifierFileError",
    "InstallError",
    "SegmenterInfoWarning",
    "SegmenterMismatchWarning",
    "SegmenterUnavailableError",
    "SlideError",
    "SlidescopeWarning",
    "UncalibratedWarning",
]

__all__ = ["__version__", *_ERRORS, *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from napari_slidescope.batch import analyze_slides
    from napari_slidescope.pipeline.cell_classes import (
        CellClassifier,
        PhenotypeRules,
        class_summary,
        classify_cells,
        load_rules,
    )
    from napari_slidescope.pipeline.cell_forest import load_classifier, train_classifier
    from napari_slidescope.pipeline.nuclei import NucleiResult, segment_nuclei
    from napari_slidescope.pipeline.region_cells import assign_regions, region_summary
    from napari_slidescope.pipeline.region_classifier import (
        RegionClassifier,
        Stroke,
        load_region_classifier,
        train_region_classifier,
    )
    from napari_slidescope.pipeline.region_map import RegionMap, classify_regions, regions_tissue
    from napari_slidescope.pipeline.tissue import TissueResult, detect_tissue
    from napari_slidescope.sample_cells import write_ki67_sample, write_multiplex_sample
    from napari_slidescope.sample_data import write_sample_slide
    from napari_slidescope.sample_regions import write_region_slide
    from napari_slidescope.segmenters.catalogue import install_instanseg, installed_models
    from napari_slidescope.slide import ArraySlide, Slide, open_slide
    from napari_slidescope.tiles import (
        TileDataset,
        TileTable,
        embed_tiles,
        iter_tiles,
        tile_slide,
        write_tile_embeddings,
    )


def __getattr__(name: str) -> Any:
    """Import public names lazily (PEP 562)."""
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'napari_slidescope' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
