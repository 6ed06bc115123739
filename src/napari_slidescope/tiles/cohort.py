"""Tiles and embeddings of a cohort, one slide at a time, resumable: what a batch task runs.

:func:`embed_slide` cuts one slide into tiles, embeds them and writes, in `out`::

    <name>.tiles.parquet      the tile table (GeoParquet, as TileTable.to_geoparquet)
    <name>.embeddings.zarr    the AnnData of embed_tiles (zarr)
    <name>.tiles.json         what was asked (with the model file's SHA-256), its hash,
                              what came out and the runtime: written last

A slide whose ``.tiles.json`` holds the same parameter hash, with both outputs present, is
skipped (resume); changing the model file, a size, the normalisation or the slide file
(its size and modification time) changes the hash. Each file is written to a temporary name
and renamed. :func:`embed_slides` runs it over a list of slides, on a dask.distributed
client when given one (each task opens its slide itself: only the path travels).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["embed_slide", "embed_slides", "parameter_hash"]


def _stamp(path: str) -> dict[str, Any]:
    """Size and modification time of a local slide (a URL: its text only)."""
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path}
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def parameter_hash(path: str, params: dict[str, Any]) -> str:
    """Return the hash of a slide's request: the slide's stamp and every parameter."""
    from importlib import metadata

    try:
        version = metadata.version("napari-slidescope")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        version = "unknown"
    blob = json.dumps({"slide": _stamp(path), "params": params, "version": version},
                      sort_keys=True)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def embed_slide(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model: str | os.PathLike[str],
    tile_um: float,
    mpp: float,
    overlap_um: float = 0.0,
    min_tissue_fraction: float = 0.5,
    batch_size: int = 32,
    device: str = "auto",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    input_size: int | None = None,
    slide_mpp: float | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tile one slide, embed its tiles with a model file and write the results to `out`.

    Parameters
    ----------
    path : str or PathLike
        The slide (a local path or a URL).
    out : str or PathLike
        Output folder (created).
    model : str or PathLike
        An ONNX or TorchScript file (see :func:`~napari_slidescope.tiles.embed.load_model`);
        its SHA-256 is part of the parameters.
    tile_um, mpp, overlap_um, min_tissue_fraction, slide_mpp
        As :func:`~napari_slidescope.tiles.tiling.tile_slide`.
    batch_size, device, mean, std, input_size
        As :func:`~napari_slidescope.tiles.embed.embed_tiles` (mean and std default to
        ImageNet's).

    Returns
    -------
    dict
        The manifest written (``status`` ``"done"`` or ``"skipped"`` for a resumed slide).
    """
    from napari_slidescope.slide import open_slide
    from napari_slidescope.tiles.embed import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        _sha256,
        embed_tiles,
        load_model,
    )
    from napari_slidescope.tiles.tiling import tile_slide

    src = str(path)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(src.rstrip("/")).name
    files = {
        "tiles": folder / f"{name}.tiles.parquet",
        "embeddings": folder / f"{name}.embeddings.zarr",
        "manifest": folder / f"{name}.tiles.json",
    }
    model_path = Path(model)
    if not model_path.is_file():
        raise ValueError(f"{model_path}: no such model file")
    params: dict[str, Any] = {
        "model": model_path.name,
        "model_sha256": _sha256(model_path),
        "tile_um": float(tile_um),
        "mpp": float(mpp),
        "overlap_um": float(overlap_um),
        "min_tissue_fraction": float(min_tissue_fraction),
        "slide_mpp": slide_mpp,
        "mean": list(IMAGENET_MEAN if mean is None else mean),
        "std": list(IMAGENET_STD if std is None else std),
        "input_size": input_size,
    }
    digest = parameter_hash(src, params)
    if files["manifest"].is_file() and files["tiles"].is_file() and files["embeddings"].is_dir():
        try:
            done = json.loads(files["manifest"].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            done = {}
        if done.get("parameter_hash") == digest:
            return {**done, "status": "skipped"}
    runner = load_model(model_path, device=device)
    with open_slide(src, storage_options=storage_options) as slide:
        tiles = tile_slide(
            slide, tile_um=tile_um, mpp=mpp, overlap_um=overlap_um,
            min_tissue_fraction=min_tissue_fraction, slide_mpp=slide_mpp,
        )  # fmt: skip
        adata = embed_tiles(
            slide, tiles, runner, batch_size=batch_size, mean=params["mean"],
            std=params["std"], input_size=input_size,
        )  # fmt: skip
    tiles.to_geoparquet(files["tiles"])
    partial = files["embeddings"].with_name(files["embeddings"].name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    _write_zarr(adata, partial)
    if files["embeddings"].exists():
        shutil.rmtree(files["embeddings"])
    os.replace(partial, files["embeddings"])
    from napari_slidescope._io import atomic_write

    runtime = dict(adata.uns["slidescope_tiles"]["runtime"])
    manifest = {
        "slide": src,
        "parameter_hash": digest,
        "parameters": params,
        "tiles": len(tiles),
        "features": int(adata.n_vars),
        "runtime": runtime,
        "files": {k: v.name for k, v in files.items() if k != "manifest"},
        "status": "done",
    }
    with atomic_write(files["manifest"], "w") as fh:
        fh.write(json.dumps(manifest, indent=1, sort_keys=True, default=float))
    return manifest


def _write_zarr(adata: Any, path: Path) -> None:
    """Write an AnnData as zarr format 3 (what anndata will default to), unsharded."""
    import contextlib

    import anndata

    with warnings.catch_warnings():
        # anndata 0.13 deprecates these settings (format 3 unsharded being its default)
        warnings.filterwarnings("ignore", "This setting will be removed", DeprecationWarning)
        # anndata consolidates the metadata, a zarr-python extension of format 3
        warnings.filterwarnings("ignore", "Consolidated metadata is currently", UserWarning)
        settings: dict[str, Any] = {}
        for name, value in (("zarr_write_format", 3), ("auto_shard_zarr_v3", False)):
            with contextlib.suppress(AttributeError):
                if getattr(anndata.settings, name) != value:
                    settings[name] = value
        quiet = anndata.settings.override(**settings) if settings else contextlib.nullcontext()
        with quiet:
            adata.write_zarr(path)


def embed_slides(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    client: Any = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Run :func:`embed_slide` on every slide: on `client` (dask.distributed) or here.

    Returns the manifests in the order of `paths`. On a client each slide is one task that
    opens its slide itself (only the path and the parameters are sent).
    """
    if client is None:
        return [embed_slide(p, out, **kwargs) for p in paths]
    futures = [client.submit(embed_slide, str(p), str(out), pure=False, **kwargs) for p in paths]
    return list(client.gather(futures))
