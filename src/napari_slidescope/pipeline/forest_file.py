"""Random forests as plain arrays: a classifier file that cannot run code when opened.

Shared by the cell classifier (:mod:`~napari_slidescope.pipeline.cell_forest`) and the
tissue-region classifier (:mod:`~napari_slidescope.pipeline.region_classifier`). A trained
scikit-learn forest is stored as its trees' node arrays (children, split features,
thresholds, leaf class fractions) plus one JSON document, in a ``.npz`` that is read with
``allow_pickle=False``: unlike a pickle, opening it never runs code. A SHA-256 of the
content catches a damaged file. Loading rebuilds scikit-learn ``Tree`` objects from the
arrays, so prediction runs in scikit-learn's compiled code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope.errors import ClassifierFileError

__all__ = [
    "MISSING_SKLEARN",
    "NODE_ARRAYS",
    "check_digest",
    "digest",
    "forest_arrays",
    "forest_votes",
    "read_npz",
    "row_votes",
    "rebuild_trees",
    "sklearn_or_error",
    "write_npz",
]

NODE_FIELDS = (
    ("left_child", "<i8"),
    ("right_child", "<i8"),
    ("feature", "<i8"),
    ("threshold", "<f8"),
    ("impurity", "<f8"),
    ("n_node_samples", "<i8"),
    ("weighted_n_node_samples", "<f8"),
    ("missing_go_to_left", "u1"),
)
#: The arrays every forest file holds.
NODE_ARRAYS = frozenset(
    {f"node_{n}" for n, _ in NODE_FIELDS} | {"node_value", "tree_nodes", "tree_depth"}
)
#: Threads that predict (each sums the votes of a share of the trees).
THREADS = min(4, os.cpu_count() or 1)
#: The end of the message when scikit-learn is missing.
MISSING_SKLEARN = "needs scikit-learn: pip install 'napari-slidescope[classify]'"


def sklearn_or_error(what: str) -> Any:
    """Import scikit-learn's forests, or raise an ImportError naming the ``classify`` extra."""
    try:
        import sklearn.ensemble
        import sklearn.tree
    except ImportError as exc:
        raise ImportError(f"{what} {MISSING_SKLEARN}") from exc
    return sklearn


def digest(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of a JSON document and named arrays (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256(json.dumps(dict(meta), sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def forest_arrays(forest: Any) -> dict[str, np.ndarray]:
    """Return a fitted forest's trees as flat arrays (nodes of all trees end to end)."""
    states = [est.tree_.__getstate__() for est in forest.estimators_]
    nodes = [s["nodes"] for s in states]
    out: dict[str, np.ndarray] = {
        f"node_{name}": np.concatenate([n[name] for n in nodes]).astype(dtype)
        for name, dtype in NODE_FIELDS
    }
    out["node_value"] = np.concatenate([s["values"][:, 0, :] for s in states]).astype("<f8")
    out["tree_nodes"] = np.array([len(n) for n in nodes], "<i8")
    out["tree_depth"] = np.array([s["max_depth"] for s in states], "<i8")
    return out


def rebuild_trees(
    arrays: Mapping[str, np.ndarray], n_features: int, n_classes: int, *, what: str
) -> list[Any]:
    """Rebuild scikit-learn ``Tree`` objects from the flat arrays of :func:`forest_arrays`."""
    sklearn_or_error(what)
    from sklearn.tree._tree import NODE_DTYPE, Tree

    trees = []
    stops = np.cumsum(arrays["tree_nodes"])
    starts = stops - arrays["tree_nodes"]
    for t, (a, b) in enumerate(zip(starts, stops, strict=True)):
        nodes = np.zeros(b - a, NODE_DTYPE)
        for name, _ in NODE_FIELDS:
            if name in nodes.dtype.names:
                nodes[name] = arrays[f"node_{name}"][a:b]
        tree = Tree(n_features, np.array([n_classes], np.intp), 1)
        tree.__setstate__(
            {
                "max_depth": int(arrays["tree_depth"][t]),
                "node_count": int(b - a),
                "nodes": nodes,
                "values": np.ascontiguousarray(arrays["node_value"][a:b, None, :]),
            }
        )
        trees.append(tree)
    return trees


def forest_votes(trees: list[Any], x: np.ndarray, n_classes: int) -> np.ndarray:
    """Mean leaf class fractions ``(K, n_classes)`` of the trees for the rows of `x`.

    Large inputs are split among :data:`THREADS` threads by trees (the trees' descent
    releases the GIL).
    """
    shape = (x.shape[0], n_classes)
    groups = [trees[k::THREADS] for k in range(min(THREADS, len(trees)))]

    def votes(group: list[Any]) -> np.ndarray:
        out = np.zeros(shape)
        for tree in group:
            out += tree.predict(x).reshape(shape)  # leaf class fractions
        return out

    if len(x) < 10_000 or len(groups) == 1:
        return votes(trees) / len(trees)
    with ThreadPoolExecutor(len(groups)) as pool:
        total = np.sum(list(pool.map(votes, groups)), axis=0)
    return np.asarray(total) / len(trees)


def row_votes(trees: list[Any], x: np.ndarray, n_classes: int, *, threads: int = 1) -> np.ndarray:
    """Mean leaf class fractions ``(K, n_classes)``, each row's trees summed in tree order.

    Unlike :func:`forest_votes` (threads share the trees), threads share the rows here,
    so a row's probabilities never depend on how many rows came with it: a pixel gets
    the same class in a tile and in a whole image, even where two classes tie.
    """
    shape = (x.shape[0], n_classes)
    chunk = 32_768

    def votes(a: int) -> np.ndarray:
        part = x[a : a + chunk]
        out = np.zeros((len(part), n_classes))
        for tree in trees:
            out += tree.predict(part).reshape(len(part), n_classes)
        return out

    starts = range(0, shape[0], chunk)
    if threads <= 1 or len(starts) <= 1:
        parts = [votes(a) for a in starts]
    else:
        with ThreadPoolExecutor(min(threads, len(starts))) as pool:
            parts = list(pool.map(votes, starts))
    total = np.concatenate(parts) if parts else np.zeros(shape)
    return total / len(trees)


def write_npz(
    path: str | os.PathLike[str], meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> Path:
    """Write `meta` (JSON, with its :func:`digest` as ``sha256``) and `arrays`, atomically."""
    path = Path(path)
    doc = dict(meta) | {"sha256": digest(meta, arrays)}
    buf = io.BytesIO()
    blob = {"meta": np.frombuffer(json.dumps(doc, sort_keys=True).encode(), np.uint8)}
    savez: Any = np.savez_compressed  # (its stubs type **kwds as its own keywords)
    savez(buf, **blob, **arrays)
    with atomic_write(path, "wb") as fh:
        fh.write(buf.getbuffer())
    return path


def read_npz(
    path: str | os.PathLike[str], fmt: str, *, what: str = "classifier"
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file of :func:`write_npz` whose ``format`` is `fmt`; check its checksum.

    Returns
    -------
    meta : dict
        The JSON document (without ``sha256``).
    arrays : dict of str to ndarray

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ClassifierFileError
        Not a ``.npz``, another format, or a checksum that does not match (the message
        names the file). A caller checks the format version before trusting the rest.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such {what} file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ClassifierFileError(
            f"{path}: not a napari-slidescope {what} file (cannot read it as .npz: {exc})"
        ) from exc
    meta_raw = arrays.pop("meta", None)
    try:
        meta = json.loads(bytes(meta_raw).decode()) if meta_raw is not None else None
    except (UnicodeDecodeError, ValueError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ClassifierFileError(f"{path}: not a napari-slidescope {what} file")
    return meta, arrays


def check_digest(
    path: str | os.PathLike[str],
    meta: dict[str, Any],
    arrays: Mapping[str, np.ndarray],
    *,
    what: str = "classifier",
) -> None:
    """Raise ClassifierFileError unless the forest arrays are there and the checksum matches.

    `meta` loses its ``sha256`` entry.
    """
    stored = meta.pop("sha256", None)
    if not NODE_ARRAYS <= set(arrays) or stored != digest(meta, arrays):
        raise ClassifierFileError(f"{path}: damaged {what} file (its checksum does not match)")
