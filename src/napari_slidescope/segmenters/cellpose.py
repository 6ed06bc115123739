"""Cellpose adapter (``nuclei`` model): the model file must already be in Cellpose's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.segmenters.base import Identity, ModelSegmenter

__all__ = ["CellposeSegmenter", "cellpose_model_dir", "create", "identity", "missing_reason"]


def cellpose_model_dir() -> Path:
    """Cellpose's local model directory (``CELLPOSE_LOCAL_MODELS_PATH`` or ``~/.cellpose``)."""
    env = os.environ.get("CELLPOSE_LOCAL_MODELS_PATH")
    return Path(env) if env else Path.home() / ".cellpose" / "models"


def missing_reason(model: str = "nuclei") -> str | None:
    """Say what is missing (package or model file), or return None."""
    return CellposeSegmenter.missing_reason(model)


class CellposeSegmenter(ModelSegmenter):
    """Cellpose: network (flows, cell probability) on the model stage, dynamics on the CPU."""

    name = "cellpose"
    input = "brightfield"
    packages = ("cellpose", "torch")
    install_hint = "download it once while online"

    @classmethod
    def model_files(cls, model: str) -> tuple[Path, str]:
        """Return :func:`cellpose_model_dir` and ``model*`` (the first such file is the model)."""
        return cellpose_model_dir(), f"{model}*"

    def __init__(
        self,
        model: str = "nuclei",
        *,
        target_mpp: float = 0.5,
        min_overlap_um: float = 20.0,
        diameter_px: float = 17.0,
        cellprob_threshold: float = 0.0,
        flow_threshold: float = 0.4,
    ) -> None:
        super().__init__(model, target_mpp=target_mpp, min_overlap_um=min_overlap_um)
        from cellpose import core, models  # noqa: PLC0415

        self._model = models.CellposeModel(
            gpu=core.use_gpu(), pretrained_model=str(self.model_file)
        )
        self.diameter_px = diameter_px
        self.cellprob_threshold, self.flow_threshold = cellprob_threshold, flow_threshold

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Flows and cell probability, (B, H, W, 3): dy, dx, cellprob."""
        # hematoxylin-dark nuclei: use the inverted mean intensity as the nuclear channel
        gray = [255 - t.mean(axis=-1).astype(np.float32) for t in tiles]
        _, flows, _ = self._model.eval(gray, diameter=self.diameter_px, compute_masks=False)[:3]
        return np.stack(
            [np.concatenate([np.moveaxis(f[1], 0, -1), f[2][..., None]], axis=-1) for f in flows]
        ).astype(np.float32)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Follow the flows to masks (Cellpose dynamics)."""
        from cellpose.dynamics import compute_masks  # noqa: PLC0415

        out = compute_masks(
            np.moveaxis(raw[..., :2], -1, 0),
            raw[..., 2],
            cellprob_threshold=self.cellprob_threshold,
            flow_threshold=self.flow_threshold,
        )
        masks = out[0] if isinstance(out, tuple) else out
        return np.asarray(masks, np.int32)


def identity(model: str = "nuclei") -> Identity:
    """Model name and SHA-256 of its installed file (None when not installed)."""
    return CellposeSegmenter.describe(model)


def create(**kwargs: Any) -> CellposeSegmenter:
    """Create the segmenter (the registry's constructor)."""
    return CellposeSegmenter(**kwargs)
