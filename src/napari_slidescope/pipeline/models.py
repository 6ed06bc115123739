"""The segmenter registry: the built-in segmenter and optional deep-learning adapters.

Every segmenter splits its work in two for the staged runner: ``predict`` (the
model, on batches of tiles; a GPU when the package supports one) and
``postprocess`` (CPU, one tile). Optionally it has ``prepare(reference_rgb, *, mpp)``
(``mpp`` may be left out of the signature), called once per run with square crops of the
region's tiles at the working resolution, stacked (stains, thresholds, intensity scaling
are fixed there, so all tiles are treated alike), and ``target_mpp`` / ``min_overlap_um``
attributes. StarDist, Cellpose and InstanSeg adapters are
listed by :func:`available_segmenters` only when their package is installed *and*
their model files are already on disk: nothing is ever downloaded.
:func:`get_segmenter` names what is missing otherwise.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SegmenterUnavailableError",
    "available_segmenters",
    "get_segmenter",
    "missing_reason",
    "register_segmenter",
    "segmenter_target_mpp",
]


class SegmenterUnavailableError(RuntimeError):
    """A registered segmenter cannot be used here (package or model file missing)."""


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Any]
    check: Callable[[], str | None]
    target_mpp: float | None


_REGISTRY: dict[str, _Entry] = {}


def register_segmenter(
    name: str,
    factory: Callable[..., Any],
    *,
    check: Callable[[], str | None] | None = None,
    target_mpp: float | None = None,
) -> None:
    """Register a segmenter factory under a name.

    Parameters
    ----------
    name : str
        Registry key (e.g. ``"builtin"``).
    factory : callable
        ``factory(**kwargs)`` returns an object with ``predict`` and ``postprocess``.
    check : callable, optional
        Returns None when usable, otherwise a sentence saying what is missing.
        Must be cheap and must not import heavy packages.
    target_mpp : float, optional
        The segmenter's default working resolution in µm/px (the widget shows it when the
        segmenter is chosen), known without creating the segmenter.
    """
    _REGISTRY[name] = _Entry(factory, check or (lambda: None), target_mpp)


def segmenter_target_mpp(name: str) -> float | None:
    """Default working resolution (µm/px) of a registered segmenter, if it declared one.

    Raises
    ------
    KeyError
        If no segmenter has this name.
    """
    missing_reason(name)  # the KeyError with the registered names
    return _REGISTRY[name].target_mpp


def missing_reason(name: str) -> str | None:
    """Why a registered segmenter cannot be used, or None when it can.

    Raises
    ------
    KeyError
        If no segmenter has this name.
    """
    try:
        entry = _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"segmenter: unknown name {name!r}; registered: {sorted(_REGISTRY)}"
        ) from None
    return entry.check()


def available_segmenters() -> list[str]:
    """Names of the segmenters usable here (package and model files present)."""
    return [name for name in _REGISTRY if missing_reason(name) is None]


def get_segmenter(name: str, **kwargs: Any) -> Any:
    """Create a segmenter by name.

    Parameters
    ----------
    name : str
        One of :func:`available_segmenters`.
    **kwargs
        Passed to the segmenter's constructor.

    Returns
    -------
    segmenter : object
        Has ``predict``, ``postprocess``, ``target_mpp`` and ``min_overlap_um``.

    Raises
    ------
    SegmenterUnavailableError
        If the segmenter's package or model file is missing (the message says which).
    KeyError
        If no segmenter has this name.
    """
    reason = missing_reason(name)
    if reason is not None:
        raise SegmenterUnavailableError(f"segmenter {name!r} is not available: {reason}")
    return _REGISTRY[name].factory(**kwargs)


def _need_packages(*packages: str) -> str | None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        return f"package(s) {', '.join(missing)} not installed (pip install {' '.join(missing)})"
    return None


# -- builtin -----------------------------------------------------------------------------------


def _builtin(**kwargs: Any) -> Any:
    from napari_slidescope.analysis.nuclei import BuiltinSegmenter

    return BuiltinSegmenter(**kwargs)


def _builtin_check() -> str | None:
    if importlib.util.find_spec("napari_slidescope.analysis.nuclei") is None:
        return "module napari_slidescope.analysis.nuclei is missing"
    return None


register_segmenter("builtin", _builtin, check=_builtin_check, target_mpp=0.25)


# -- StarDist ----------------------------------------------------------------------------------


def stardist_model_dir(model: str = "2D_versatile_he") -> Path:
    """Where StarDist's ``from_pretrained`` caches a model (Keras cache directory)."""
    home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    return home / "models" / "StarDist2D" / model


def _stardist_files(model: str) -> Path | None:
    root = stardist_model_dir(model)
    found = sorted(root.rglob("config.json")) if root.is_dir() else []
    return found[0].parent if found else None


def _stardist_check(model: str = "2D_versatile_he") -> str | None:
    reason = _need_packages("stardist", "tensorflow")
    if reason is None and _stardist_files(model) is None:
        reason = (
            f"model file {stardist_model_dir(model)}/**/config.json not found "
            f"(run StarDist2D.from_pretrained({model!r}) once while online)"
        )
    return reason


class StarDistSegmenter:
    """StarDist 2D (``2D_versatile_he``): network on the model stage, NMS on the CPU stage.

    Intensities are scaled with percentiles fixed once per slide in :meth:`prepare`,
    not per tile, so all tiles are treated alike.
    """

    name = "stardist"

    def __init__(
        self,
        model: str = "2D_versatile_he",
        *,
        target_mpp: float = 0.25,
        min_overlap_um: float = 20.0,
        prob_thresh: float | None = None,
        nms_thresh: float | None = None,
    ) -> None:
        from stardist.models import StarDist2D  # noqa: PLC0415

        folder = _stardist_files(model)
        if folder is None:
            raise SegmenterUnavailableError(_stardist_check(model) or "model files missing")
        self._model = StarDist2D(None, name=folder.name, basedir=str(folder.parent))
        self.target_mpp, self.min_overlap_um = target_mpp, min_overlap_um
        th = self._model.thresholds
        self.prob_thresh = prob_thresh if prob_thresh is not None else th.prob
        self.nms_thresh = nms_thresh if nms_thresh is not None else th.nms
        self._lo, self._hi = 0.0, 255.0

    def prepare(self, reference_rgb: np.ndarray) -> None:
        """Fix the intensity scaling (1st and 99.8th percentile) for the slide."""
        self._lo, self._hi = (float(v) for v in np.percentile(reference_rgb, [1.0, 99.8]))

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
        return polygons_to_label(disti, points, prob=probi, shape=shape).astype(np.int32)


register_segmenter("stardist", StarDistSegmenter, check=_stardist_check, target_mpp=0.25)


# -- Cellpose ----------------------------------------------------------------------------------


def cellpose_model_dir() -> Path:
    """Cellpose's local model directory (``CELLPOSE_LOCAL_MODELS_PATH`` or ``~/.cellpose``)."""
    env = os.environ.get("CELLPOSE_LOCAL_MODELS_PATH")
    return Path(env) if env else Path.home() / ".cellpose" / "models"


def _cellpose_file(model: str) -> Path | None:
    root = cellpose_model_dir()
    found = sorted(p for p in root.glob(f"{model}*") if p.is_file()) if root.is_dir() else []
    return found[0] if found else None


def _cellpose_check(model: str = "nuclei") -> str | None:
    reason = _need_packages("cellpose", "torch")
    if reason is None and _cellpose_file(model) is None:
        reason = f"model file {cellpose_model_dir()}/{model}* not found (download it once online)"
    return reason


class CellposeSegmenter:
    """Cellpose: network (flows, cell probability) on the model stage, dynamics on the CPU."""

    name = "cellpose"

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
        from cellpose import core, models  # noqa: PLC0415

        path = _cellpose_file(model)
        if path is None:
            raise SegmenterUnavailableError(_cellpose_check(model) or "model file missing")
        self._model = models.CellposeModel(gpu=core.use_gpu(), pretrained_model=str(path))
        self.target_mpp, self.min_overlap_um = target_mpp, min_overlap_um
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


register_segmenter("cellpose", CellposeSegmenter, check=_cellpose_check, target_mpp=0.5)


# -- InstanSeg ---------------------------------------------------------------------------------


def _instanseg(**kwargs: Any) -> Any:
    from napari_slidescope.pipeline.instanseg import InstanSegSegmenter

    return InstanSegSegmenter(**kwargs)


def _instanseg_check() -> str | None:
    from napari_slidescope.pipeline.instanseg import missing_reason as instanseg_missing

    return instanseg_missing()


register_segmenter("instanseg", _instanseg, check=_instanseg_check, target_mpp=0.5)
