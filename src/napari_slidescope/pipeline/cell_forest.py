"""Cell types from a few examples: a random-forest object classifier on nucleus features.

The workflow QuPath's object classifier made familiar: mark a few nuclei of each class, train
a random forest (scikit-learn) on their features
(:func:`~napari_slidescope.analysis.cell_features.cell_features`: morphology, stain, hematoxylin
texture, smoothed neighbourhood and density, all in physical units), apply it to every nucleus.

Saved file: a ``.npz`` (numpy's zip of ``.npy`` arrays) opened with ``allow_pickle=False``, so
opening a file can never run code, unlike a pickle. It holds the trees as plain arrays (the
nodes' children, split features, thresholds and leaf class fractions) and one JSON document
(format and feature-definition versions, software version, feature names, class names,
colours, examples per class and a SHA-256 of the content). Loading rebuilds scikit-learn
trees from those arrays, so prediction runs in scikit-learn's compiled code. skops would also
be safe but adds a dependency whose format is still scikit-learn's object graph; the arrays
are readable by any numpy, and the checksum catches a damaged file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.analysis.cell_features import (
    DEFAULT_RADIUS_UM,
    FEATURES_VERSION,
    as_columns,
    cell_features,
    default_features,
)
from napari_slidescope.analysis.class_colors import class_colors
from napari_slidescope.errors import ClassifierFileError
from napari_slidescope.pipeline import forest_file

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ClassifierFileError",
    "ObjectClassifier",
    "load_classifier",
    "train_classifier",
]

#: The ``format`` field of a saved classifier.
FORMAT = "napari-slidescope object classifier"
#: Bumped when the file layout changes.
FORMAT_VERSION = 1


def _sklearn(what: str) -> Any:
    return forest_file.sklearn_or_error(what)


@dataclass(eq=False)
class ObjectClassifier:
    """A trained cell classifier: feature names, classes and a random forest.

    Attributes
    ----------
    features : tuple of str
        Feature names (:func:`~napari_slidescope.analysis.cell_features.cell_features`).
    class_names : tuple of str
        Classes, in the forest's output order.
    colors : dict of str to (int, int, int)
        RGB colour (0-255) of each class.
    examples : dict of str to int
        Training examples per class.
    software_version : str
        napari-slidescope version that trained it.
    """

    features: tuple[str, ...]
    class_names: tuple[str, ...]
    colors: dict[str, tuple[int, int, int]]
    examples: dict[str, int]
    software_version: str
    _arrays: dict[str, np.ndarray] = field(repr=False)
    _trees: list[Any] | None = field(default=None, repr=False)

    # -- prediction ---------------------------------------------------------------------
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(K, n_classes)`` of a feature matrix in :attr:`features` order."""
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(
                f"features: expected (K, {len(self.features)}) in the classifier's order, "
                f"got {x.shape}"
            )
        return forest_file.forest_votes(self._forest(), x, len(self.class_names))

    def predict_classes(
        self, result: Any, *, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, int, int]]]:
        """Classify the nuclei of a result or table.

        Parameters
        ----------
        result : NucleiResult or dict of str to (K,) ndarray
            Nuclei with the measurements the classifier's features need.
        rows : (R,) ndarray of int, optional
            Classify only these table rows (the visible nuclei of a live preview); their
            neighbourhood features still see every nucleus.

        Returns
        -------
        names : (K,) or (R,) ndarray of str
            The most probable class of each nucleus.
        probability : (K,) ndarray of float
            Its probability (fraction of trees' votes).
        colors : dict of str to (int, int, int)
            The classes' colours.

        Raises
        ------
        ValueError
            If the nuclei lack a measurement the classifier needs.
        """
        try:
            _, x = cell_features(result, self.features, rows=rows)
        except ValueError as exc:
            raise ValueError(f"classifier: {exc}") from exc
        proba = self.predict_proba(x)
        best = np.argmax(proba, axis=1) if len(x) else np.zeros(0, np.intp)
        names = np.asarray(self.class_names, dtype=str)[best]
        prob = proba[np.arange(len(best)), best] if len(x) else np.zeros(0)
        return names, prob, dict(self.colors)

    # -- identity and files ------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "features_version": FEATURES_VERSION,
            "software_version": self.software_version,
            "features": list(self.features),
            "class_names": list(self.class_names),
            "colors": {k: list(map(int, v)) for k, v in self.colors.items()},
            "examples": {k: int(v) for k, v in self.examples.items()},
        }

    @property
    def sha256(self) -> str:
        """SHA-256 of the classifier's content (trees, features, classes, colours)."""
        return _digest(self._meta(), self._arrays)

    def digest(self) -> str:
        """Return :attr:`sha256` (the batch parameters hash it: a changed classifier reruns)."""
        return self.sha256

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the classifier to `path` (``.npz``), atomically; return the path.

        The file appears complete or not at all: it is written beside `path` and renamed.
        """
        return forest_file.write_npz(path, self._meta(), self._arrays)

    def _forest(self) -> list[Any]:
        if self._trees is None:
            self._trees = _rebuild(self._arrays, len(self.features), len(self.class_names))
        return self._trees


def _digest(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> str:
    return forest_file.digest(meta, arrays)


def _to_arrays(forest: Any) -> dict[str, np.ndarray]:
    return forest_file.forest_arrays(forest)


def _rebuild(arrays: Mapping[str, np.ndarray], n_features: int, n_classes: int) -> list[Any]:
    return forest_file.rebuild_trees(
        arrays, n_features, n_classes, what="Applying a cell classifier"
    )


#: Examples per class below which a trained classifier is said to mean little: a forest
#: fitted to a handful of points separates them, not the classes (QuPath's guidance is
#: likewise "tens of examples per class, from several regions").
MIN_EXAMPLES_PER_CLASS = 10


def too_few_examples(counts: Mapping[str, int]) -> str | None:
    """Say which classes have fewer than :data:`MIN_EXAMPLES_PER_CLASS` examples, or None.

    Examples
    --------
    >>> too_few_examples({"Tumor": 2, "Lymphocyte": 30})  # doctest: +ELLIPSIS
    'too few examples to trust the classes: Tumor 2, Lymphocyte 30 (mark at least 10 ...)'
    >>> too_few_examples({"Tumor": 12, "Lymphocyte": 30}) is None
    True
    """
    if all(n >= MIN_EXAMPLES_PER_CLASS for n in counts.values()):
        return None
    shown = ", ".join(f"{c} {n}" for c, n in counts.items())
    return (
        f"too few examples to trust the classes: {shown} (mark at least "
        f"{MIN_EXAMPLES_PER_CLASS} per class, from several regions)"
    )


def train_classifier(
    result: Any,
    labels: Mapping[int, str],
    *,
    features: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
    colors: Mapping[str, Sequence[int]] | None = None,
    radius_um: float | None = DEFAULT_RADIUS_UM,
    n_estimators: int = 100,
    random_state: int = 0,
) -> ObjectClassifier:
    """Train a random-forest cell classifier from example nuclei.

    Parameters
    ----------
    result : NucleiResult or dict of str to (K,) ndarray
        The nuclei (their table) the examples come from.
    labels : mapping of int to str
        Nucleus id (the table's ``id``) -> class name, one entry per example.
    features : sequence of str, optional
        Feature names; default
        :func:`~napari_slidescope.analysis.cell_features.default_features` of the table.
    classes : sequence of str, optional
        The classes, in order (default: those of `labels`, sorted); each needs an example.
    colors : mapping of str to (r, g, b), optional
        Class colours 0-255; default each name's colour in the one registry
        (:func:`~napari_slidescope.analysis.class_colors.class_colors`: QuPath's colours for
        the names QuPath knows, the same colour for a name in every dock and export).
    radius_um : float or None
        Neighbourhood radius of the default features (None: no neighbourhood features).
    n_estimators : int
        Trees in the forest.
    random_state : int
        Seed: the same examples give the same classifier.

    Returns
    -------
    ObjectClassifier

    Raises
    ------
    ValueError
        Fewer than two classes, a class without examples, ids not in the table, or
        features the table lacks.

    Warns
    -----
    SlidescopeWarning
        A class has fewer than :data:`MIN_EXAMPLES_PER_CLASS` examples (the warning
        counts each class's examples): such a forest separates the examples, not the
        classes.
    ImportError
        Without scikit-learn (the ``classify`` extra).

    Examples
    --------
    >>> clf = train_classifier(res, {12: "Tumor", 40: "Lymphocyte"})  # doctest: +SKIP
    >>> clf.save("tils.npz")  # doctest: +SKIP
    """
    # the parent package is imported whenever this module is (no import: layers)
    version = str(sys.modules["napari_slidescope"].__version__)
    table = as_columns(result)
    ids = np.asarray(table["id"])
    given = {int(k): str(v) for k, v in dict(labels).items()}
    names = tuple(classes) if classes is not None else tuple(sorted(set(given.values())))
    if len(set(names)) < 2:
        raise ValueError(f"labels: need examples of at least two classes, got {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"classes: names repeat in {list(names)}")
    counts = {c: 0 for c in names}
    for v in given.values():
        if v not in counts:
            raise ValueError(f"labels: class {v!r} is not one of classes {list(names)}")
        counts[v] += 1
    empty = [c for c, n in counts.items() if n == 0]
    if empty:
        raise ValueError(f"labels: no example of class(es) {', '.join(map(repr, empty))}")
    row_of = {int(i): r for r, i in enumerate(ids)}
    unknown = [i for i in given if i not in row_of]
    if unknown:
        shown = ", ".join(map(str, sorted(unknown)[:5])) + (" ..." if len(unknown) > 5 else "")
        raise ValueError(f"labels: {len(unknown)} nucleus id(s) not in the table: {shown}")
    colours = _colours(names, colors)
    feats = (
        tuple(features) if features is not None else default_features(table, radius_um=radius_um)
    )
    sk = _sklearn("train_classifier")
    rows = np.fromiter((row_of[i] for i in given), np.intp, len(given))
    _, x = cell_features(table, feats, rows=rows)
    y = np.fromiter((names.index(v) for v in given.values()), np.intp, len(given))
    forest = sk.ensemble.RandomForestClassifier(
        n_estimators=n_estimators, random_state=random_state, n_jobs=1
    )
    forest.fit(x, y)
    if len(forest.classes_) != len(names):  # cannot happen: every class has an example
        raise RuntimeError("random forest lost a class")
    few = too_few_examples(counts)
    if few:
        import warnings

        from napari_slidescope.errors import SlidescopeWarning

        warnings.warn(few, SlidescopeWarning, stacklevel=2)
    return ObjectClassifier(
        features=feats,
        class_names=names,
        colors=colours,
        examples=counts,
        software_version=version,
        _arrays=_to_arrays(forest),
        _trees=[est.tree_ for est in forest.estimators_],
    )


def _colours(
    names: Sequence[str], colors: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, int, int]]:
    """Colours of the classes: those given, else the registry's (the same in every dock)."""
    try:
        return class_colors(names, given=colors)
    except ValueError as e:
        raise ValueError(f"colors: {e}") from e


def load_classifier(path: str | os.PathLike[str]) -> ObjectClassifier:
    """Read a classifier written by :meth:`ObjectClassifier.save`.

    Parameters
    ----------
    path : str or PathLike
        A ``.npz`` classifier file.

    Returns
    -------
    ObjectClassifier

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ClassifierFileError
        If the file is not a napari-slidescope classifier, is damaged (checksum), or was
        written with another file format or feature definitions.
    """
    path = Path(path)
    meta, arrays = forest_file.read_npz(path, FORMAT)
    here = f"this napari-slidescope reads format {FORMAT_VERSION}"
    if meta.get("format_version") != FORMAT_VERSION:
        raise ClassifierFileError(
            f"{path}: classifier file format {meta.get('format_version')} (written by "
            f"napari-slidescope {meta.get('software_version')}); {here}: retrain it"
        )
    if meta.get("features_version") != FEATURES_VERSION:
        raise ClassifierFileError(
            f"{path}: trained on feature definitions {meta.get('features_version')} "
            f"(napari-slidescope {meta.get('software_version')}); this version computes "
            f"features version {FEATURES_VERSION}: retrain it"
        )
    forest_file.check_digest(path, meta, arrays)
    try:
        clf = ObjectClassifier(
            features=tuple(meta["features"]),
            class_names=tuple(meta["class_names"]),
            colors={k: (int(v[0]), int(v[1]), int(v[2])) for k, v in meta["colors"].items()},
            examples={k: int(v) for k, v in meta["examples"].items()},
            software_version=str(meta["software_version"]),
            _arrays=arrays,
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ClassifierFileError(f"{path}: incomplete classifier file ({exc})") from exc
    return clf
