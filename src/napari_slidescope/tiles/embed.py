"""Features from the user's own model: ONNX, TorchScript or a Python callable, offline.

:func:`embed_tiles` reads tiles on a pool of threads (:func:`~.reading.iter_tiles`), forms
normalised ``(N, C, H, W)`` float32 batches on a producer thread and hands them to the
model through a bounded queue, so reading batch n + 1 overlaps inference on batch n and
memory holds a few batches at most. The time the model spends waiting for the next batch
is measured and recorded (``uns["slidescope_tiles"]["runtime"]["model_wait_s"]``): near 0
means reading keeps up with the model. Nothing is downloaded: a model is a local file or
a function.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.tiles.reading import TORCH_EXTRA, area_resize, iter_tiles
from napari_slidescope.tiles.tiling import TileTable

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "embed_tiles", "load_model", "write_tile_embeddings"]

#: The normalisation most pathology foundation models expect (ImageNet's).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ONNX_EXTRA = 'pip install "napari-slidescope[onnx]"'
_TORCH_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript", ".jit")


@dataclass
class Model:
    """A loaded model: ``run(batch)`` maps ``(N, C, H, W)`` float32 to ``(N, D)`` features.

    Attributes
    ----------
    run : callable
        The forward pass on numpy arrays.
    kind : {"onnx", "torchscript", "callable"}
        What it is.
    name : str
        File name, or the callable's qualified name.
    sha256 : str
        SHA-256 of the model file ("" for a callable).
    input_size : int or None
        Input side the model declares (None when dynamic).
    device : str
        Where it runs (``"cpu"``, ``"cuda"``, ONNX Runtime's provider list...).
    """

    run: Callable[[np.ndarray], np.ndarray]
    kind: str
    name: str
    sha256: str
    input_size: int | None
    device: str


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _onnx(path: Path, device: str) -> Model:
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ImportError(
            f"{path.name}: running an ONNX model needs onnxruntime: {ONNX_EXTRA}"
        ) from e
    available = ort.get_available_providers()
    if device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif device == "cuda":
        raise ValueError(f"{path.name}: device='cuda' but ONNX Runtime has no CUDA provider here")
    else:
        providers = ["CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(path), providers=providers)
    except Exception as e:
        raise ValueError(f"{path}: not an ONNX model ONNX Runtime can load ({e})") from e
    inp = session.get_inputs()[0]
    shape = list(inp.shape)
    side = shape[-1] if len(shape) == 4 and isinstance(shape[-1], int) else None
    out_name = session.get_outputs()[0].name

    def run(batch: np.ndarray) -> np.ndarray:
        (features,) = session.run([out_name], {inp.name: batch})
        return np.asarray(features)

    return Model(run, "onnx", path.name, _sha256(path), side, ",".join(session.get_providers()))


def _torchscript(path: Path, device: str) -> Model:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"{path.name}: running a TorchScript model needs PyTorch: {TORCH_EXTRA}"
        ) from e
    where = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    try:
        with warnings.catch_warnings():
            # torch 2.9+ deprecates TorchScript loading; the files users have are TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location=where)
    except Exception as e:
        raise ValueError(f"{path}: not a TorchScript model torch.jit.load can read ({e})") from e
    module.eval()

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(torch.from_numpy(batch).to(where, non_blocking=True))
        return np.asarray(out.float().cpu().numpy())

    return Model(run, "torchscript", path.name, _sha256(path), None, where)


def load_model(model: Any, *, device: str = "auto") -> Model:
    """Load `model`: a ``.onnx`` file, a TorchScript file, a callable or a :class:`Model`.

    Parameters
    ----------
    model : str, PathLike, callable or Model
        ``*.onnx`` runs on ONNX Runtime (``[onnx]`` extra); ``*.pt``, ``*.pth``, ``*.ts``,
        ``*.torchscript`` or ``*.jit`` on PyTorch (``[torch]`` extra) as TorchScript; a
        callable maps a float32 ``(N, C, H, W)`` batch to ``(N, D)`` features.
    device : {"auto", "cpu", "cuda"}
        ``"auto"``: the GPU when the runtime has one.

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        A missing file, an unknown suffix, a file the runtime cannot load.
    ImportError
        The runtime is not installed (naming the extra).
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda', got {device!r}")
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ValueError(f"{path}: no such model file")
        if path.suffix.lower() == ".onnx":
            return _onnx(path, device)
        if path.suffix.lower() in _TORCH_SUFFIXES:
            return _torchscript(path, device)
        raise ValueError(
            f"{path}: unknown model file suffix {path.suffix!r} (expected .onnx, or "
            f"TorchScript as {', '.join(_TORCH_SUFFIXES)})"
        )
    if callable(model):
        name = getattr(model, "__qualname__", type(model).__name__)
        return Model(lambda b: np.asarray(model(b)), "callable", name, "", None, "python")
    raise TypeError(f"model: expected a model file or a callable, got {type(model).__name__}")


def _prepare(
    images: Sequence[np.ndarray], size: int, mean: np.ndarray | None, std: np.ndarray | None
) -> np.ndarray:
    """Stack uint8 HWC tiles into a normalised float32 NCHW batch of side `size`."""
    out = np.empty((len(images), images[0].shape[-1], size, size), np.float32)
    for k, image in enumerate(images):
        h = image.shape[0]
        if h != size:
            step = h / size
            image = area_resize(image, (0.0, 0.0), (step, step), size)
        out[k] = np.moveaxis(image, -1, 0)
    out *= 1.0 / 255.0
    if mean is not None:
        out -= mean[None, :, None, None]
    if std is not None:
        out /= std[None, :, None, None]
    return out


_END = object()


def embed_tiles(
    slide: Any,
    tiles: TileTable,
    model: Any,
    *,
    batch_size: int = 32,
    device: str = "auto",
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    input_size: int | None = None,
    read_threads: int | None = None,
    prefetch_batches: int = 3,
) -> Any:
    """Run `model` on every tile of `tiles`; return tiles x features as an AnnData.

    Parameters
    ----------
    slide : Slide
        The slide `tiles` was cut from (any source).
    tiles : TileTable
        From :func:`~napari_slidescope.tiles.tiling.tile_slide`.
    model : str, PathLike, callable or Model
        See :func:`load_model`. The model sees float32 ``(N, C, H, W)`` batches: pixel
        values / 255, minus `mean`, over `std`.
    batch_size : int
        Tiles per forward pass.
    device : {"auto", "cpu", "cuda"}
        Where the model runs (``"auto"``: the GPU when there is one).
    mean, std : sequence of float or None
        Per-channel normalisation (default ImageNet's); None skips it.
    input_size : int, optional
        Side the model takes; tiles of another size are resized by pixel area. Default:
        what an ONNX model declares, else the tile size.
    read_threads : int, optional
        Threads reading tiles (default: the CPU count, at most 8).
    prefetch_batches : int
        Batches ready and waiting for the model, at most (memory bound).

    Returns
    -------
    anndata.AnnData
        ``X``: float32 features; ``obs``: the tile table's columns (index: tile id as
        text); ``obsm["spatial"]``: tile centres ``(x, y)`` in µm; ``uns["slidescope_tiles"]``:
        model name, kind and file SHA-256, input size, normalisation, mpp, tile size, grid,
        a parameter hash and the runtime (seconds, tiles per second, device, and
        ``model_wait_s``: time the model waited on reading).

    Raises
    ------
    ValueError
        Bad arguments; a model output that is not one feature row per tile.
    ImportError
        anndata, or the model's runtime, is missing (naming the extra).

    Examples
    --------
    >>> adata = embed_tiles(slide, tiles, "uni.onnx", batch_size=64)  # doctest: +SKIP
    >>> adata.write_zarr("features.zarr")  # doctest: +SKIP
    """
    try:
        import anndata
    except ImportError as e:
        raise ImportError(
            'embed_tiles returns an AnnData: pip install "napari-slidescope[scverse]"'
        ) from e
    import pandas as pd  # anndata's own dependency

    if batch_size < 1 or prefetch_batches < 1:
        raise ValueError("batch_size and prefetch_batches must be at least 1")
    runner = load_model(model, device=device)
    size = int(input_size or runner.input_size or tiles.tile_px)
    mean_a = None if mean is None else np.asarray(mean, np.float32)
    std_a = None if std is None else np.asarray(std, np.float32)
    if std_a is not None and np.any(std_a <= 0):
        raise ValueError(f"std must be positive, got {std!r}")

    ready: queue.Queue[Any] = queue.Queue(maxsize=prefetch_batches)
    stop = threading.Event()

    def produce() -> None:
        try:
            images: list[np.ndarray] = []
            for _, image in iter_tiles(
                slide, tiles, read_ahead=2 * batch_size, threads=read_threads
            ):
                if stop.is_set():
                    return
                images.append(image)
                if len(images) == batch_size:
                    ready.put(_prepare(images, size, mean_a, std_a))
                    images = []
            if images:
                ready.put(_prepare(images, size, mean_a, std_a))
            ready.put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            ready.put(exc)

    start = time.perf_counter()
    producer = threading.Thread(target=produce, name="slidescope-embed-read", daemon=True)
    producer.start()
    parts: list[np.ndarray] = []
    wait = model_s = 0.0
    first_wait = None
    try:
        while True:
            t0 = time.perf_counter()
            item = ready.get()
            waited = time.perf_counter() - t0
            if first_wait is None:
                first_wait = waited
            wait += waited
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            t1 = time.perf_counter()
            features = np.asarray(runner.run(item))
            model_s += time.perf_counter() - t1
            if features.ndim != 2 or len(features) != len(item):
                features = (
                    features.reshape(len(item), -1) if len(features) == len(item) else features
                )
            if features.ndim != 2 or len(features) != len(item):
                raise ValueError(
                    f"{runner.name}: expected one feature row per tile, got an output of "
                    f"shape {features.shape} for a batch of {len(item)}"
                )
            parts.append(features.astype(np.float32, copy=False))
    finally:
        stop.set()
        while producer.is_alive():  # unblock a producer waiting on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                producer.join(0.05)
    seconds = time.perf_counter() - start
    n = len(tiles)
    dim = parts[0].shape[1] if parts else 0
    X = np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)

    obs = tiles.to_pandas()
    # pandas 3 infers Arrow-backed strings, which anndata < 0.12.7 (the last one that
    # accepts pandas 3) cannot write: the index and the text columns as plain objects
    obs.index = pd.Index(obs["id"].astype(str).to_numpy(dtype=object), dtype=object)
    for c in obs.columns:
        if obs[c].dtype != object and pd.api.types.is_string_dtype(obs[c].dtype):
            obs[c] = obs[c].to_numpy(dtype=object)
    params = {
        "model": runner.name,
        "model_kind": runner.kind,
        "model_sha256": runner.sha256,
        "input_size": size,
        "mean": [] if mean_a is None else mean_a.tolist(),
        "std": [] if std_a is None else std_a.tolist(),
        "tiles": tiles.metadata(),
    }
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    uns = {
        **{k: v for k, v in params.items() if k != "tiles"},
        "normalisation": "(x / 255 - mean) / std" if mean_a is not None else "x / 255",
        "mpp": tiles.mpp,
        "tile_px": tiles.tile_px,
        "tile_um": tiles.tile_um,
        "slide": tiles.slide,
        "tiles": json.dumps(tiles.metadata(), sort_keys=True),
        "parameter_hash": digest,
        "runtime": {
            "seconds": seconds,
            "tiles": n,
            "tiles_per_s": n / seconds if seconds > 0 else math.inf,
            "model_s": model_s,
            "model_wait_s": wait,
            "first_batch_wait_s": first_wait or 0.0,
            "batch_size": batch_size,
            "device": runner.device,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # anndata: index of int-like strings
        adata = anndata.AnnData(X=X, obs=obs)
    adata.var_names = pd.Index([f"feature_{j}" for j in range(dim)], dtype=object)
    adata.obsm["spatial"] = tiles.centres_um()
    adata.uns["slidescope_tiles"] = uns
    return adata


def _write_table(group: Any, name: str, adata: Any, region: str) -> None:
    """Write `adata` as the table `name` annotating `region` (as ``pipeline.sdata`` does)."""
    import contextlib

    import anndata

    quiet: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    with contextlib.suppress(AttributeError):  # an anndata without the setting
        getattr(anndata.settings, "auto_shard_zarr_v3")  # noqa: B009 - may be missing
        quiet = anndata.settings.override(auto_shard_zarr_v3=False)
    with quiet:
        anndata.io.write_elem(group, name, adata)
    group[name].attrs.update(
        {
            "spatialdata-encoding-type": "ngff:regions_table",
            "region": region,
            "region_key": "region",
            "instance_key": "instance_id",
            "version": _sdata_table_version(),
        }
    )


def _sdata_table_version() -> str:
    """Return the table version ``pipeline.sdata`` writes (one place to change)."""
    from napari_slidescope.pipeline import sdata

    return str(sdata._TABLE_VERSION)


def write_tile_embeddings(
    adata: Any,
    tiles: TileTable,
    store: str | os.PathLike[str],
    *,
    name: str = "tile_embeddings",
    shapes: str = "tiles",
    overwrite: bool = False,
) -> Path:
    """Write tile features into a SpatialData zarr store, beside what it holds.

    The tiles' footprints become the shapes element `shapes` and `adata` the table
    `name` annotating it (``region_key="region"``, ``instance_key="instance_id"`` = tile
    id), in the coordinate systems ``"global"`` (level-0 pixels) and ``"micrometers"`` as
    :func:`~napari_slidescope.pipeline.sdata.to_spatialdata` writes cells: a store that
    function wrote for the slide keeps its cells, nuclei, table and image. A missing
    store is created.

    Parameters
    ----------
    adata : anndata.AnnData
        From :func:`embed_tiles` (one row per tile of `tiles`, in order).
    tiles : TileTable
        The tiles.
    store : str or PathLike
        The ``*.zarr`` folder.
    name, shapes : str
        Element names of the table and the shapes.
    overwrite : bool
        Replace elements of those names; otherwise they are an error.

    Returns
    -------
    Path
        The store.
    """
    from napari_slidescope.pipeline import sdata

    zarr, pa, pq = sdata._requirements()
    import pandas as pd

    if adata.n_obs != len(tiles):
        raise ValueError(f"adata has {adata.n_obs} rows for {len(tiles)} tiles")
    path = Path(store)
    if path.exists() and not (path / "zarr.json").is_file():
        raise ValueError(f"{path}: exists and is not a zarr format 3 store")
    root = zarr.open_group(str(path), mode="a", zarr_format=3, use_consolidated=False)
    if "spatialdata_attrs" not in root.attrs:
        root.attrs.update({"spatialdata_attrs": {"version": sdata.SPATIALDATA_FORMAT}})
    for group, element in (("shapes", shapes), ("tables", name)):
        parent = root.require_group(group)
        if element in parent:
            if not overwrite:
                raise ValueError(f"{path}: {group}/{element} exists; pass overwrite=True")
            del parent[element]
        folder = path / group / element
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
    table = adata.copy()
    table.obs["region"] = pd.Categorical(
        np.full(table.n_obs, shapes, dtype=object), categories=pd.Index([shapes], dtype=object)
    )
    table.obs["instance_id"] = np.asarray(tiles["id"], dtype=np.int64)
    table.uns["spatialdata_attrs"] = {
        "region": shapes,
        "region_key": "region",
        "instance_key": "instance_id",
    }
    parts = tiles.to_spatialdata_shapes()
    sdata._write_shapes(
        root["shapes"], path / "shapes" / shapes, shapes, parts["polygons"], parts["ids"],
        tiles.slide_mpp, pa, pq,
    )  # fmt: skip
    _write_table(root["tables"], name, table, shapes)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Object at .* is not recognized", UserWarning)
        warnings.filterwarnings("ignore", "Consolidated metadata is currently", UserWarning)
        zarr.consolidate_metadata(str(path))
    return path
