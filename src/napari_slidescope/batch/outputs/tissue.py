"""``tissue.geojson``: the slide's tissue as QuPath annotations."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from napari_slidescope._io import atomic_write


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
