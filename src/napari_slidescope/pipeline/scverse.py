"""Results as scverse objects: :func:`to_anndata` (cells x markers) for scanpy and squidpy.

anndata is optional (``pip install "napari-slidescope[scverse]"``). SpatialData stores are
written by :mod:`~napari_slidescope.pipeline.sdata` (without spatialdata itself).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["marker_means", "to_anndata"]

_MEAN = re.compile(r"^(?P<name>.+?)(?:_(?P<comp>nucleus|cytoplasm|cell))?_mean$")


def marker_means(
    table: Mapping[str, np.ndarray], compartment: str = "auto"
) -> tuple[list[str], list[str]]:
    """Return the marker (channel or stain) names and their mean columns on one compartment.

    ``compartment="auto"``: the cell when the table has cells, else the nucleus (whose
    columns are the nucleus-only names, ``DAPI_mean``, when there are no cells).

    Returns
    -------
    names, columns : list of str
        ``var_names`` and the table columns that fill ``X``.
    """
    if compartment == "auto":
        compartment = "cell" if any(c.endswith("_cell_mean") for c in table) else "nucleus"
    if compartment not in ("nucleus", "cytoplasm", "cell"):
        raise ValueError(
            f"compartment: expected 'auto', 'nucleus', 'cytoplasm' or 'cell', got {compartment!r}"
        )
    names: list[str] = []
    columns: list[str] = []
    for col in table:
        m = _MEAN.match(col)
        if m is None:
            continue
        comp = m["comp"]
        if comp == compartment or (comp is None and compartment == "nucleus"):
            name = m["name"]
            if name in names:  # "X_mean" and "X_nucleus_mean": the same values
                continue
            names.append(name)
            columns.append(col)
    if not names:
        raise ValueError(
            f"this result has no {compartment} measurements; cells and their cytoplasm need "
            "segment_nuclei(..., cell_expansion_um=...)"
        )
    return names, columns


def to_anndata(result: Any, *, compartment: str = "auto", slide: str | None = None) -> Any:
    """Cells x markers as an ``anndata.AnnData``.

    Parameters
    ----------
    result : NucleiResult
        Segmented (and perhaps classified) nuclei or cells.
    compartment : {"auto", "nucleus", "cytoplasm", "cell"}
        Whose means fill ``X``.
    slide : str, optional
        Value of ``obs["slide"]``; default the result's slide file name.

    Returns
    -------
    anndata.AnnData
        ``X`` (cells x markers, float32): the compartment's means; ``var_names``: the
        channel (or stain) names; ``obs`` (index: the nucleus id): every other column
        (class as a categorical, positivity as bool), and ``slide``; ``obsm["spatial"]``:
        centroids ``(x, y)`` in µm; ``uns["slidescope"]``: mpp, region, segmenter,
        classification, and ``uns["class_colors"]`` as hex.

    Raises
    ------
    ImportError
        anndata is not installed (naming the extra).
    """
    try:
        import anndata
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            'to_anndata needs anndata: pip install "napari-slidescope[scverse]"'
        ) from e
    table = result.columns
    names, columns = marker_means(table, compartment)
    n = int(np.asarray(table["id"]).size)
    x = np.zeros((n, len(columns)), np.float32)  # (0, k) when no nucleus was found
    for k, c in enumerate(columns):
        x[:, k] = np.asarray(table[c], np.float32)
    if slide is None:
        slide = "" if result.source is None else result.source.name
    with warnings.catch_warnings():
        # pandas 3 infers Arrow strings, which anndata < 0.12.7 cannot write: plain objects
        warnings.simplefilter("ignore", getattr(pd.errors, "Pandas4Warning", FutureWarning))
        with _plain_strings(pd):
            obs: dict[str, Any] = {}
            for c, v in table.items():
                if c in columns:
                    continue
                v = np.asarray(v)
                if v.dtype.kind == "U":
                    cats = list(result.classes) if c == "class" and result.classes else None
                    obs[c] = pd.Categorical(v.astype(object), categories=cats)
                else:
                    obs[c] = v
            obs["slide"] = pd.Categorical(np.full(n, slide, dtype=object))
            index = pd.Index(np.asarray(table["id"]).astype(str).astype(object), dtype=object)
            frame = pd.DataFrame(obs, index=index)
            var = pd.DataFrame(index=pd.Index(np.array(names, dtype=object), dtype=object))
            adata = anndata.AnnData(X=x, obs=frame, var=var)
    adata.obsm["spatial"] = np.column_stack(
        [np.asarray(table["centroid_x_um"], float), np.asarray(table["centroid_y_um"], float)]
    ).reshape(n, 2)
    mpp = result.mpp if isinstance(result.mpp, int | float) else list(result.mpp)
    adata.uns["slidescope"] = {
        "mpp": mpp,
        "region": list(result.region),
        "segmenter": result.segmenter,
        "compartment": compartment,
    }
    if result.classes:
        adata.uns["class_colors"] = {
            k: "#{:02x}{:02x}{:02x}".format(*v) for k, v in result.classes.items()
        }
    return adata


class _plain_strings:
    """Context: pandas infers object (not Arrow) strings, where the option exists."""

    def __init__(self, pd: Any) -> None:
        self._pd = pd
        self._ctx: Any = None

    def __enter__(self) -> None:
        try:
            self._ctx = self._pd.option_context("future.infer_string", False)
            self._ctx.__enter__()
        except (KeyError, ValueError, AttributeError):  # pragma: no cover - older pandas
            self._ctx = None

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
