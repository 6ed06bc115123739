"""The measurements of a nuclei run's tiles: geometry, stain densities, channel means.

:func:`_measure` builds the per-tile measurement function that fits the image (stain
optical densities for H&E and H-DAB, channel means for fluorescence, and with cells the
means per compartment), called by the runner's post-process stage on every tile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from napari_slidescope.analysis.cells import compartment_means
from napari_slidescope.analysis.measure import measure_nuclei
from napari_slidescope.pipeline.tiling import Tile, TilePlan
from napari_slidescope.segmenters import ImageKind

#: Pixels per stain-unmixing call. A (n, 3) @ (3, 3) product of a million rows makes
#: OpenBLAS start its threads: 8x slower than in chunks on one thread, and those threads
#: compete with the pipeline's workers.
_UNMIX_ROWS = 32_768


def _measure(
    plan: TilePlan, kind: ImageKind, stains: Any, cell_expansion_um: float | None = None
) -> Callable[..., dict[str, np.ndarray]]:
    """Measurements that fit the image: stain ODs (H&E, H-DAB), channel means (fluorescence).

    With cells (``cell_expansion_um``) the table also has every channel's (or stain's)
    mean per compartment, ``{name}_{nucleus|cytoplasm|cell}_mean``, and the cell and
    cytoplasm areas.
    """
    columns = kind.mean_columns() if kind.input == "fluorescence" else {}
    second = getattr(stains, "second", "eosin")

    def measure(
        owned_labels: np.ndarray,
        pixels: np.ndarray,
        tile: Tile,
        cells: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        dy, dx = plan.downsample
        origin = (plan.origin[0] + tile.box[0] * dy, plan.origin[1] + tile.box[1] * dx)
        mask = owned_labels > 0 if cells is None else cells > 0
        od = None
        if stains is not None and mask.any():  # unmix only the nuclei's pixels
            rgb = pixels[mask][:, :3]
            unmixed = [
                stains.separate(rgb[i : i + _UNMIX_ROWS]) for i in range(0, len(rgb), _UNMIX_ROWS)
            ]
            od = np.zeros((*mask.shape, unmixed[0].shape[-1]), np.float32)
            od[mask] = np.concatenate(unmixed)
        table = measure_nuclei(
            owned_labels,
            mpp=plan.mpp,
            od=od,
            origin=origin,
            downsample=plan.downsample,
            channels=pixels[..., list(columns)] if columns else None,
            channel_columns=tuple(columns.values()),
        )
        if second == "dab" and "eosin_od_mean" in table:
            table = {("dab_od_mean" if k == "eosin_od_mean" else k): v for k, v in table.items()}
        if cells is not None:
            table.update(_compartments(owned_labels, cells, table["id"], pixels, od))
        return table

    def _compartments(
        nuclei: np.ndarray, cells: np.ndarray, ids: np.ndarray, pixels: np.ndarray, od: Any
    ) -> dict[str, np.ndarray]:
        if columns:
            names = [c.removesuffix("_mean") for c in columns.values()]
            values = pixels[..., list(columns)]
        elif stains is not None:
            names = ["hematoxylin_od", f"{second}_od"]
            values = od[..., :2] if od is not None else np.zeros((*nuclei.shape, 2), np.float32)
        else:
            names, values = [], np.zeros((*nuclei.shape, 0), np.float32)
        out = compartment_means(nuclei, cells, ids, values, names)
        px_area = plan.mpp * plan.mpp
        out["cell_area_um2"] = out.pop("cell_area_px") * px_area
        out["cytoplasm_area_um2"] = out.pop("cytoplasm_area_px") * px_area
        return out

    if cell_expansion_um:
        measure.cell_distance_px = cell_expansion_um / plan.mpp  # type: ignore[attr-defined]
    return measure
