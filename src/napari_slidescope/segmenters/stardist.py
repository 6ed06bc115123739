"""StarDist 2D (``2D_versatile_he``) adapter: the model file must already be in Keras' cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.segmenters.base import Identity, ModelSegmenter

__all__ = ["StarDistSegmenter", "create", "identity", "missing_reason", "stardist_model_dir"]


def stardist_model_dir(model: str = "2D_versatile_he") -> Path:
    """Where StarDist's ``from_pretrained`` caches a model (Keras cache directory)."""
    home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    return home / "models" / "StarDist2D" / model


def missing_reason(model: str = "2D_versatile_he") -> str | None:
    """Say what is missing (package or model file), or return None."""
    return StarDistSegmenter.missing_reason(model)


class StarDistSegmenter(ModelSegmenter):
    """StarDist 2D (``2D_versatile_he``): network on the model stage, NMS on the CPU stage.

    Intensities are scaled with percentiles fixed once per slide in :meth:`prepare`,
    not per tile, so all tiles are treated alike.
    """

    name = "stardist"
    input = "brightfield"
    packages = ("stardist", "tensorflow")
    install_hint = "run StarDist2D.from_pretrained({model!r}) once while online"

    @classmethod
    def model_files(cls, model: str) -> tuple[Path, str]:
        """Return the Keras cache and the model's ``config.json`` in it (its folder: the model)."""
        return stardist_model_dir(model), "**/config.json"

    @classmethod
    def weights_files(cls, model_file: Path) -> list[Path]:
        """Return ``config.json``, ``thresholds.json`` and the weights beside it."""
        folder = model_file.parent
        return [model_file, *sorted(folder.glob("thresholds.json")), *sorted(folder.glob("*.h5"))]

    def __init__(
        self,
        model: str = "2D_versatile_he",
        *,
        target_mpp: float = 0.25,
        min_overlap_um: float = 20.0,
        prob_thresh: float | None = None,
        nms_thresh: float | None = None,
    ) -> None:
        super().__init__(model, target_mpp=target_mpp, min_overlap_um=min_overlap_um)
        from stardist.models import StarDist2D  # noqa: PLC0415

        folder = self.model_file.parent
        self._model = StarDist2D(None, name=folder.name, basedir=str(folder.parent))
        th = self._model.thresholds
        self.prob_thresh = prob_thresh if prob_thresh is not None else th.prob
        self.nms_thresh = nms_thresh if nms_thresh is not None else th.nms
        self._lo, self._hi = 0.0, 255.0

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Fix the intensity scaling (1st and 99.8th percentile) for the slide."""
        self._lo, self._hi = (float(v) for v in np.percentile(reference, [1.0, 99.8]))

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Probability and ray distances, (B, H', W', 1 + n_rays) at the model grid."""
        x = (tiles.astype(np.float32) - self._lo) / max(self._hi - self._lo, 1e-6)
        div = 2**self._model.config.unet_n_depth * max(self._model.config.grid)
        ph, pw = (-x.shape[1]) % div, (-x.shape[2]) % div
        x = np.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="reflect")
        prob, dist = self._model.keras_model.predict(x, verbose=0)[:2]
        return np.concatenate([prob, dist], axis=-1).astype(np.float32)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Non-maximum suppression and polygon rendering (labels may be padded)."""
        from stardist.geometry import polygons_to_label  # noqa: PLC0415
        from stardist.nms import non_maximum_suppression  # noqa: PLC0415

        grid = tuple(self._model.config.grid)
        points, probi, disti = non_maximum_suppression(
            raw[..., 1:],
            raw[..., 0],
            grid=grid,
            prob_thresh=self.prob_thresh,
            nms_thresh=self.nms_thresh,
        )
        shape = (raw.shape[0] * grid[0], raw.shape[1] * grid[1])
        labels: np.ndarray = polygons_to_label(disti, points, prob=probi, shape=shape)
        return labels.astype(np.int32)


def identity(model: str = "2D_versatile_he") -> Identity:
    """Model name and SHA-256 of its installed files (None when not installed)."""
    return StarDistSegmenter.describe(model)


def create(**kwargs: Any) -> StarDistSegmenter:
    """Create the segmenter (the registry's constructor)."""
    return StarDistSegmenter(**kwargs)
