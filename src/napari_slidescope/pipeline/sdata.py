"""Results as a SpatialData zarr store, written with zarr, anndata and pyarrow.

:func:`to_spatialdata` writes what ``spatialdata.read_zarr`` reads (the store layout of
SpatialData's container format 0.2: zarr format 3, checked against spatialdata 0.7.3)
without importing spatialdata itself: every spatialdata release on PyPI pins dask and
distributed below the versions this project runs on, so it cannot share an environment with
it (``pip install --dry-run spatialdata``). The tests read the store back with spatialdata's
own reader in a separate environment (``SLIDESCOPE_SPATIALDATA_PYTHON``).

The store::

    cells.zarr/
        zarr.json                 spatialdata_attrs {version: "0.2"}; slidescope {...}
        images/slide/s0, s1, ...  the slide's pyramid over the region (OME-NGFF 0.5 flavour)
        shapes/cells/             cell polygons: shapes.parquet (GeoParquet, WKB)
        shapes/nuclei/            nucleus polygons, same ids
        tables/table/             AnnData (cells x markers), annotating "cells"

Coordinates: two coordinate systems. ``"global"`` is the slide's level-0 pixel grid
(``x`` = column, ``y`` = row; the frame of the QuPath GeoJSON export), in which the shapes
are stored as they are (identity) and the image is placed by a translation (the region's
corner) after the levels' own scales (their downsamples). ``"micrometers"`` is the same
times the slide's level-0 pixel size in µm, so a shape's centroid there equals the table's
``centroid_x_um``, ``centroid_y_um`` (and ``obsm["spatial"]``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["IMAGE_CHOICES", "SPATIALDATA_FORMAT", "to_spatialdata"]

#: SpatialData container format written (zarr format 3).
SPATIALDATA_FORMAT = "0.2"
#: What ``image=`` may be.
IMAGE_CHOICES = ("copy", "reference", "none")
_RASTER_VERSION = "0.3"  # spatialdata_attrs version of images and shapes (NGFF 0.5 flavour)
_NGFF_VERSION = "0.5-dev-spatialdata"
_TABLE_VERSION = "0.2"
_MIN_LEVEL_SIDE = 64  # pyramid levels whose crop is smaller than this are left out
_CHUNK = 1024


def to_spatialdata(
    result: Any,
    path: str | os.PathLike[str],
    *,
    image: str = "copy",
    compartment: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Write a result as a SpatialData zarr store: shapes, a linked table and the image.

    Parameters
    ----------
    result : NucleiResult
        Segmented (and perhaps classified) nuclei or cells.
    path : str or PathLike
        The store to write (a folder, conventionally ``*.zarr``).
    image : {"copy", "reference", "none"}
        ``"copy"``: the slide's pyramid levels over the result's region become the image
        element ``"slide"``, read and written chunk by chunk (never whole in memory; a
        whole-slide result copies the whole slide, which can take many GB, hence the other
        choices). ``"reference"``: no pixels; the store's attributes name the slide file and
        region (``sdata.attrs["slidescope"]``) for a reader to open it. ``"none"``: neither.
        ``"copy"`` needs a result of a slide file, not of an in-memory array.
    compartment : {"auto", "nucleus", "cytoplasm", "cell"}
        Whose means fill the table's ``X`` (see :func:`~.scverse.to_anndata`).
    overwrite : bool
        Replace an existing store at `path`; otherwise an existing path is an error.

    Returns
    -------
    Path
        The store. Elements: shapes ``"cells"`` (with cells) and ``"nuclei"``, indexed by
        the nucleus id; table ``"table"`` (AnnData as :meth:`NucleiResult.to_anndata` makes,
        plus ``obs["region"]`` and ``obs["instance_id"]``) annotating ``"cells"`` (else
        ``"nuclei"``) through ``region_key="region"``, ``instance_key="instance_id"``; image
        ``"slide"`` (``image="copy"``). Coordinate systems ``"global"`` (level-0 pixels)
        and ``"micrometers"``, see the module's documentation.

    Raises
    ------
    ValueError
        A bad `image` choice, ``image="copy"`` without a slide file, an existing `path`
        without `overwrite`, or a result without outlines.
    ImportError
        anndata, pyarrow or zarr >= 3 is missing (naming the extra).
    """
    if image not in IMAGE_CHOICES:
        raise ValueError(f"image: expected one of {IMAGE_CHOICES}, got {image!r}")
    zarr, pa, pq = _requirements()
    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path}: already exists; pass overwrite=True to replace it")
    source = getattr(result, "source", None)
    if image == "copy" and source is None:
        raise ValueError(
            "image='copy': this result was segmented from an array, not a slide file, so "
            "there is no slide to copy; pass image='none'"
        )
    mpp0 = _level0_mpp(result)
    adata = _table(result, compartment)
    region_name = "cells" if result.has_cells else "nuclei"
    shapes = {"nuclei": result.outlines_of("nuclei")}
    if result.has_cells:
        shapes["cells"] = result.outlines_of("cells")

    partial = path.with_name(path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    root = zarr.open_group(str(partial), mode="w", zarr_format=3)
    attrs: dict[str, Any] = {
        "slide": None if source is None else str(source),
        "region": [int(v) for v in result.region],
        "level0_mpp_yx": list(mpp0),
        "image": image,
        "coordinate_systems": {
            "global": "level-0 pixels of the slide, (x, y) = (column, row)",
            "micrometers": "global times the level-0 pixel size (µm)",
        },
        "segmenter": result.segmenter,
    }
    root.attrs.update({"spatialdata_attrs": {"version": SPATIALDATA_FORMAT}, "slidescope": attrs})
    shapes_group = root.create_group("shapes")
    for name, (polys, ids) in shapes.items():
        _write_shapes(shapes_group, partial / "shapes" / name, name, polys, ids, mpp0, pa, pq)
    _write_table(root.create_group("tables"), adata, region_name)
    images_group = root.create_group("images")
    if image == "copy":
        from napari_slidescope.slide import open_slide

        assert source is not None  # checked above
        with open_slide(source) as slide:
            attrs["image_levels"] = _write_image(images_group, slide, result.region, mpp0)
        root.attrs.update({"slidescope": attrs})
    with warnings.catch_warnings():
        # the GeoParquet files are not zarr nodes, which consolidation notes, rightly
        warnings.filterwarnings("ignore", "Object at .* is not recognized", UserWarning)
        # spatialdata reads (and writes) consolidated metadata, zarr-python's extension
        warnings.filterwarnings("ignore", "Consolidated metadata is currently", UserWarning)
        zarr.consolidate_metadata(str(partial))
    if path.exists():
        shutil.rmtree(path)
    os.replace(partial, path)
    return path


def _requirements() -> tuple[Any, Any, Any]:
    try:
        import anndata  # noqa: F401
        import pyarrow as pa
        import pyarrow.parquet as pq
        import zarr
    except ImportError as e:
        raise ImportError(
            f"to_spatialdata needs anndata, pyarrow and zarr >= 3 ({e.name} is missing): "
            'pip install "napari-slidescope[scverse]"'
        ) from e
    if int(zarr.__version__.split(".")[0]) < 3:
        raise ImportError(
            f"to_spatialdata writes zarr format 3, which needs zarr >= 3 (this is "
            f'{zarr.__version__}): pip install "napari-slidescope[scverse]"'
        )
    return zarr, pa, pq


def _level0_mpp(result: Any) -> tuple[float, float]:
    """µm per level-0 pixel ``(y, x)``: the result's working mpp over its downsample."""
    mpp = result.mpp
    my, mx = (float(mpp), float(mpp)) if isinstance(mpp, int | float) else map(float, mpp)
    dy, dx = (float(v) for v in result.downsample)
    return my / dy, mx / dx


def _table(result: Any, compartment: str) -> Any:
    import pandas as pd

    from napari_slidescope.pipeline.scverse import _plain_strings, to_anndata

    adata = to_anndata(result, compartment=compartment)
    region = "cells" if result.has_cells else "nuclei"
    with warnings.catch_warnings():
        # anndata < 0.12.7 cannot write pandas 3's Arrow strings: plain objects
        warnings.simplefilter("ignore", getattr(pd.errors, "Pandas4Warning", FutureWarning))
        with _plain_strings(pd):
            adata.obs["region"] = pd.Categorical(
                np.full(adata.n_obs, region, dtype=object),
                categories=pd.Index([region], dtype=object),
            )
    adata.obs["instance_id"] = np.asarray(result.columns["id"], dtype=np.int64)
    adata.uns["spatialdata_attrs"] = {
        "region": region,
        "region_key": "region",
        "instance_key": "instance_id",
    }
    return adata


def _write_table(group: Any, adata: Any, region: str) -> None:
    import contextlib

    import anndata

    # anndata 0.12 warns, once per array (35 times for a table), that zarr v3 sharding
    # becomes its default unless told: the table is small, so no shards (as before)
    quiet: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    with contextlib.suppress(AttributeError):  # an anndata without the setting
        getattr(anndata.settings, "auto_shard_zarr_v3")  # noqa: B009 - may be missing
        quiet = anndata.settings.override(auto_shard_zarr_v3=False)
    with quiet:
        anndata.io.write_elem(group, "table", adata)
    group["table"].attrs.update(
        {
            "spatialdata-encoding-type": "ngff:regions_table",
            "region": region,
            "region_key": "region",
            "instance_key": "instance_id",
            "version": _TABLE_VERSION,
        }
    )


def _wkb_polygon(ring: np.ndarray) -> bytes:
    """Little-endian WKB of one level-0 ``(row, col)`` ring, as a closed ``(x, y)`` polygon."""
    xy = np.asarray(ring, dtype="<f8")[:, ::-1]
    if len(xy) and not np.array_equal(xy[0], xy[-1]):
        xy = np.vstack([xy, xy[:1]])
    return struct.pack("<BIII", 1, 3, 1, len(xy)) + np.ascontiguousarray(xy).tobytes()


def _axis(name: str, unit: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "type": "channel" if name == "c" else "space"}
    if unit and name != "c":
        d["unit"] = "unit"
    return d


def _system(name: str, axes: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "axes": [_axis(a) for a in axes]}


def _transforms(
    axes: Sequence[str], offset: dict[str, float], mpp: dict[str, float]
) -> list[dict[str, Any]]:
    """``global`` (translation by `offset`, or identity) and ``micrometers`` (then a scale)."""
    src = _system("".join(axes), axes)
    translation = [float(offset.get(a, 0.0)) for a in axes]
    scale = [float(mpp.get(a, 1.0)) for a in axes]

    def step(kind: str, values: list[float], out: str) -> dict[str, Any]:
        return {"type": kind, kind: values, "input": src, "output": _system(out, axes)}

    if any(translation):
        to_global = step("translation", translation, "global")
    else:
        to_global = {"type": "identity", "input": src, "output": _system("global", axes)}
    scale_step = step("scale", scale, "global")
    to_um: dict[str, Any] = (
        {
            "type": "sequence",
            "transformations": [to_global, scale_step],
            "input": src,
            "output": _system("micrometers", axes),
        }
        if any(translation)
        else {**scale_step, "output": _system("micrometers", axes)}
    )
    return [to_global, to_um]


def _write_shapes(
    group: Any,
    folder: Path,
    name: str,
    polys: list[np.ndarray],
    ids: np.ndarray,
    mpp0: tuple[float, float],
    pa: Any,
    pq: Any,
) -> None:
    """One shapes element: a zarr group with its transformations and a GeoParquet file."""
    seen: set[int] = set()
    wkb: list[bytes] = []
    index: list[int] = []
    x0 = y0 = math.inf
    x1 = y1 = -math.inf
    for ring, i in zip(polys, np.asarray(ids).tolist(), strict=True):
        if int(i) in seen or len(ring) < 3:
            continue
        seen.add(int(i))
        index.append(int(i))
        wkb.append(_wkb_polygon(ring))
        r = np.asarray(ring, float)
        y0, x0 = min(y0, float(r[:, 0].min())), min(x0, float(r[:, 1].min()))
        y1, x1 = max(y1, float(r[:, 0].max())), max(x1, float(r[:, 1].max()))
    group.create_group(name).attrs.update(
        {
            "encoding-type": "ngff:shapes",
            "axes": ["x", "y"],
            "coordinateTransformations": _transforms(("x", "y"), {}, {"x": mpp0[1], "y": mpp0[0]}),
            "spatialdata_attrs": {"version": _RASTER_VERSION},
        }
    )
    geo = {
        "primary_column": "geometry",
        "columns": {
            "geometry": {
                "encoding": "WKB",
                "crs": None,
                "geometry_types": ["Polygon"],
                **({"bbox": [x0, y0, x1, y1]} if index else {}),
            }
        },
        "version": "1.1.0",
        "creator": {"library": "napari-slidescope"},
    }
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [],
        "columns": [
            {
                "name": "geometry",
                "field_name": "geometry",
                "pandas_type": "bytes",
                "numpy_type": "object",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.0.0",
    }
    table = pa.table(
        {
            "geometry": pa.array(wkb, type=pa.binary()),
            "__index_level_0__": pa.array(index, type=pa.int64()),
        }
    ).replace_schema_metadata({"geo": json.dumps(geo), "pandas": json.dumps(pandas_meta)})
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "shapes.parquet")


def _write_image(
    group: Any, slide: Any, region: Sequence[int], mpp0: tuple[float, float]
) -> list[int]:
    """Write the slide's levels over `region` as a multiscale image; return the levels.

    The region is widened to a multiple of the coarsest level's downsample so that every
    level's crop starts at the same level-0 corner (one translation for all of them).
    """
    import dask.array as da

    h0, w0 = slide.shape0
    y0, x0, y1, x1 = (int(v) for v in region)
    y0, x0, y1, x1 = max(y0, 0), max(x0, 0), min(y1, h0), min(x1, w0)
    levels = [0]
    for k in range(1, len(slide.levels)):
        dy, dx = slide.downsamples[k]
        if min((y1 - y0) / dy, (x1 - x0) / dx) < _MIN_LEVEL_SIDE:
            break
        levels.append(k)
    step = max(1, round(max(slide.downsamples[levels[-1]])))
    y0, x0 = y0 // step * step, x0 // step * step
    y1, x1 = min(-(-y1 // step) * step, h0), min(-(-x1 // step) * step, w0)
    if slide.axes == "YXS":
        channels = ["r", "g", "b", "a"][: int(slide.levels[0].shape[-1])]
    elif slide.axes == "CYX":
        channels = list(slide.channel_names) or [
            f"channel {c}" for c in range(int(slide.levels[0].shape[0]))
        ]
    else:
        channels = ["intensity"]
    element = group.create_group("slide")
    datasets = []
    for n, k in enumerate(levels):
        ly0, lx0, ly1, lx1 = slide.level_box((y0, x0, y1, x1), k)
        lv = slide.levels[k]
        if slide.axes == "YXS":
            arr = lv[ly0:ly1, lx0:lx1].transpose(2, 0, 1)
        elif slide.axes == "CYX":
            arr = lv[:, ly0:ly1, lx0:lx1]
        else:
            arr = lv[ly0:ly1, lx0:lx1][None]
        arr = arr.rechunk((arr.shape[0], _CHUNK, _CHUNK))
        out = element.create_array(
            f"s{n}",
            shape=arr.shape,
            dtype=arr.dtype,
            chunks=(arr.shape[0], _CHUNK, _CHUNK),
            dimension_names=["c", "y", "x"],
        )
        da.store(arr, out, lock=False, compute=True)
        dy, dx = slide.downsamples[k]
        datasets.append(
            {
                "path": f"s{n}",
                "coordinateTransformations": [
                    {"type": "scale", "scale": [1.0, float(dy), float(dx)]}
                ],
            }
        )
    axes = ("c", "y", "x")
    element.attrs.update(
        {
            "ome": {
                "omero": {"channels": [{"label": str(c)} for c in channels]},
                "version": _NGFF_VERSION,
                "multiscales": [
                    {
                        "datasets": datasets,
                        "name": "/images/slide",
                        "axes": [_axis(a, unit=False) for a in axes],
                        "coordinateTransformations": _transforms(
                            axes, {"y": y0, "x": x0}, {"y": mpp0[0], "x": mpp0[1]}
                        ),
                    }
                ],
            },
            "spatialdata_attrs": {"version": _RASTER_VERSION},
        }
    )
    return levels
