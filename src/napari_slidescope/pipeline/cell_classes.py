"""Cell classes: :func:`classify_cells` on a :class:`NucleiResult`, and its rules as JSON.

How a result carries classes (the one representation every consumer reads):

- ``result.columns["class"]``: (count,) ndarray of str, the class of each row (a phenotype,
  ``"Other"``, or ``"Negative"``/``"1+"``/``"2+"``/``"3+"`` for IHC);
- ``result.classes``: dict class name -> ``(r, g, b)`` 0-255, every class that can occur,
  in legend order;
- ``result.classification``: dict saying how the classes were made (``kind``: ``"rules"``
  or ``"classifier"``, the resolved thresholds, the rules), or None.

A learned classifier plugs in through :class:`CellClassifier` (duck-typed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from napari_slidescope.analysis.class_colors import class_colors
from napari_slidescope.analysis.phenotypes import (
    DAB_THRESHOLDS,
    IHC_CLASSES,
    OTHER,
    apply_phenotypes,
    auto_threshold,
    check_dab_thresholds,
    dab_scores,
    ihc_summary,
    parse_rule,
)
from napari_slidescope.pipeline.cell_forest import load_classifier
from napari_slidescope.pipeline.nuclei_result import NucleiResult

__all__ = [
    "COMPARTMENTS",
    "RULES_KIND",
    "CellClassifier",
    "PhenotypeRules",
    "annotation_summary",
    "check_rules",
    "class_summary",
    "default_classes",
    "classification_from",
    "classify_cells",
    "classify_table",
    "cell_kind",
    "load_classification",
    "load_rules",
    "marker_column",
    "markers_of",
]

#: Value of the top-level ``"kind"`` of a rules JSON file (``slidescope batch --classify``
#: dispatches on it).
RULES_KIND = "slidescope-phenotype-rules"
#: Compartments a marker can be measured on.
COMPARTMENTS = ("nucleus", "cytoplasm", "cell")
_COMPARTMENT_ARG = (*COMPARTMENTS, "auto")
#: Marker name of the DAB stain in phenotype rules (``"DAB+"``) and column prefix.
DAB = "DAB"
_OD_PREFIXES = ("hematoxylin_od", "eosin_od", "dab_od")
_MEAN = re.compile(r"^(?P<name>.+?)(?:_(?P<comp>nucleus|cytoplasm|cell))?_mean$")


@runtime_checkable
class CellClassifier(Protocol):
    """A learned cell classifier :func:`classify_cells` can apply (``classifier=``).

    Any object with this method qualifies (duck typing); nothing needs to subclass it.
    """

    def predict_classes(
        self, result: NucleiResult
    ) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, int, int]]]:
        """Classify every row of ``result.table``.

        Returns
        -------
        class_names : (count,) ndarray of str
            The class of each table row, in table order.
        probability : (count,) ndarray of float
            The classifier's probability of that class (0-1).
        colors : dict of str to (int, int, int)
            Colour of every class the classifier knows, RGB 0-255, in legend order.
        """
        ...  # pragma: no cover


@dataclass(frozen=True)
class PhenotypeRules:
    """Classification rules: marker thresholds, IHC scoring and phenotypes, as one value.

    The arguments of :func:`classify_cells` (see there), checked and normalised; saved
    and loaded as JSON (:meth:`save`, :func:`load_rules`) with a top-level
    ``"kind": "slidescope-phenotype-rules"``.

    Attributes
    ----------
    markers : dict of str to dict
        Marker -> ``{"threshold": float or "auto", "compartment": str or None}``.
    dab : dict or None
        ``{"thresholds": (t1, t2, t3), "compartment": str}`` for IHC scoring.
    phenotypes : dict of str to str
        Phenotype -> rule (``"CD3+ CD8-"``), in priority order.
    compartment : str
        Default compartment of the markers: ``"nucleus"``, ``"cytoplasm"``, ``"cell"``
        or ``"auto"`` (cell when the table has cells, else nucleus).
    """

    markers: dict[str, dict[str, Any]] = field(default_factory=dict)
    dab: dict[str, Any] | None = None
    phenotypes: dict[str, str] = field(default_factory=dict)
    compartment: str = "auto"

    @classmethod
    def of(
        cls,
        *,
        markers: Any = None,
        dab: Any = None,
        phenotypes: Any = None,
        compartment: str = "auto",
        where: str = "classify_cells",
    ) -> PhenotypeRules:
        """Check and normalise :func:`classify_cells`' arguments (no table needed).

        Raises
        ------
        ValueError
            Naming the argument and the problem (a threshold of the wrong type, IHC
            thresholds out of order, a malformed rule, no marker at all...).
        """
        comp = _check_compartment(compartment, f"{where}: compartment")
        norm_markers: dict[str, dict[str, Any]] = {}
        if markers is None:
            markers = {}
        elif isinstance(markers, list | tuple):
            markers = dict.fromkeys(markers, "auto")
        if not isinstance(markers, Mapping):
            raise ValueError(
                f"{where}: markers must be a dict of marker -> threshold (a number or 'auto') "
                f"or a list of marker names, got {type(markers).__name__}"
            )
        for name, spec in markers.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}: marker names must be non-empty strings, got {name!r}")
            m_comp = None
            if isinstance(spec, Mapping):
                unknown = set(spec) - {"threshold", "compartment"}
                if unknown:
                    raise ValueError(
                        f"{where}: markers[{name!r}] has unknown keys {sorted(unknown)}; "
                        "expected 'threshold' and 'compartment'"
                    )
                if spec.get("compartment") is not None:
                    m_comp = _check_compartment(
                        spec["compartment"], f"{where}: markers[{name!r}].compartment"
                    )
                spec = spec.get("threshold", "auto")
            norm_markers[name] = {
                "threshold": _check_threshold(spec, f"{where}: markers[{name!r}]"),
                "compartment": m_comp,
            }
        norm_dab = _check_dab(dab, where)
        norm_pheno: dict[str, str] = {}
        if phenotypes is not None:
            if not isinstance(phenotypes, Mapping):
                raise ValueError(
                    f"{where}: phenotypes must be a dict of name -> rule such as "
                    f"{{'Cytotoxic T': 'CD3+ CD8+'}}, got {type(phenotypes).__name__}"
                )
            for pheno, rule in phenotypes.items():
                if not isinstance(pheno, str) or not pheno:
                    raise ValueError(f"{where}: phenotype names must be non-empty strings")
                for marker, _ in parse_rule(rule, name=f"{where}: phenotypes[{pheno!r}]"):
                    if marker == DAB and norm_dab is None:
                        norm_dab = _check_dab(True, where)
                    elif marker != DAB and marker not in norm_markers:
                        norm_markers[marker] = {"threshold": "auto", "compartment": None}
                norm_pheno[pheno] = rule
        if not norm_markers and norm_dab is None:
            raise ValueError(
                f"{where}: no marker to classify on; give markers (e.g. {{'CD8': 'auto'}}), "
                "dab=True for IHC, or phenotypes naming markers"
            )
        return cls(norm_markers, norm_dab, norm_pheno, comp)

    def to_dict(self) -> dict[str, Any]:
        """Return the rules as the JSON object :meth:`save` writes."""
        out: dict[str, Any] = {"kind": RULES_KIND, "version": 1, "compartment": self.compartment}
        out["markers"] = {
            m: (s["threshold"] if s["compartment"] is None else dict(s))
            for m, s in self.markers.items()
        }
        if self.dab is not None:
            out["dab"] = {
                "thresholds": list(self.dab["thresholds"]),
                "compartment": self.dab["compartment"],
            }
        if self.phenotypes:
            out["phenotypes"] = dict(self.phenotypes)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "rules") -> PhenotypeRules:
        """Rules from the JSON object of :meth:`to_dict` (checked as :meth:`of` does)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("kind") != RULES_KIND:
            raise ValueError(
                f'{where}: not slidescope phenotype rules (expected "kind": '
                f'"{RULES_KIND}", got {data.get("kind")!r})'
            )
        unknown = set(data) - {"kind", "version", "compartment", "markers", "dab", "phenotypes"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        return cls.of(
            markers=data.get("markers"),
            dab=data.get("dab"),
            phenotypes=data.get("phenotypes"),
            compartment=data.get("compartment", "auto"),
            where=where,
        )

    def to_json(self) -> str:
        """Return rules as canonical JSON text (sorted keys except rule order, 2-space indent)."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (what ``slidescope batch`` hashes into the parameters)."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the rules as JSON (atomically); return the path."""
        from napari_slidescope._io import atomic_write

        path = Path(path)
        with atomic_write(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json() + "\n")
        return path

    def markers_needed(self) -> list[str]:
        """Channel names the rules need in the slide (markers, and DAB for IHC)."""
        return [*self.markers, *([DAB] if self.dab is not None else [])]


def load_rules(path: str | os.PathLike[str]) -> PhenotypeRules:
    """Read phenotype rules from a JSON file written by :meth:`PhenotypeRules.save`.

    Raises
    ------
    ValueError
        The file is missing, not JSON, not rules, or the rules are not valid; the message
        names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the rules file ({e.strerror or e})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from e
    return PhenotypeRules.from_dict(data, where=str(path))


def _check_compartment(value: Any, name: str) -> str:
    if value not in _COMPARTMENT_ARG:
        raise ValueError(f"{name}: expected one of {', '.join(_COMPARTMENT_ARG)}, got {value!r}")
    return str(value)


def _check_threshold(value: Any, name: str) -> float | str:
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name}: threshold must be a number or 'auto', got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}: threshold must be finite, got {value!r}")
    return float(value)


def _check_dab(dab: Any, where: str) -> dict[str, Any] | None:
    if dab is None or dab is False:
        return None
    comp = "nucleus"
    thresholds: Any = DAB_THRESHOLDS
    if dab is True:
        pass
    elif isinstance(dab, Mapping):
        unknown = set(dab) - {"thresholds", "compartment"}
        if unknown:
            raise ValueError(
                f"{where}: dab has unknown keys {sorted(unknown)}; "
                "expected 'thresholds' and 'compartment'"
            )
        thresholds = dab.get("thresholds", DAB_THRESHOLDS)
        comp = dab.get("compartment") or "nucleus"
    elif isinstance(dab, list | tuple):
        thresholds = dab
    else:
        raise ValueError(
            f"{where}: dab must be True, three thresholds (1+, 2+, 3+) or a dict with "
            f"'thresholds' and 'compartment', got {dab!r}"
        )
    comp = _check_compartment(comp, f"{where}: dab compartment")
    if comp == "auto":
        comp = "nucleus"
    return {
        "thresholds": check_dab_thresholds(thresholds, f"{where}: dab thresholds"),
        "compartment": comp,
    }


def markers_of(table: Mapping[str, np.ndarray]) -> dict[str, set[str]]:
    """Markers (channels, and ``DAB``) a table has means of, with their compartments.

    ``X_mean`` (the nucleus-only name of segment_nuclei without cells) counts as the
    nucleus; ``X_nucleus_mean``, ``X_cytoplasm_mean``, ``X_cell_mean`` as named.
    ``dab_od_*`` columns give the marker ``DAB``; hematoxylin and eosin are stains, not
    markers.
    """
    out: dict[str, set[str]] = {}
    for col in table:
        m = _MEAN.match(col)
        if m is None:
            continue
        name, comp = m["name"], m["comp"] or "nucleus"
        if name in ("hematoxylin_od", "eosin_od"):
            continue
        if name == "dab_od":
            name = DAB
        out.setdefault(name, set()).add(comp)
    return out


#: Classes the "Cell classifier" dock starts with on a brightfield slide (H&E or H-DAB).
BRIGHTFIELD_CLASSES: tuple[str, ...] = ("Tumor", "Lymphocyte", "Stroma")
#: Channel names taken for the nuclear stain of a fluorescence slide (not a marker).
_NUCLEAR_STAINS = re.compile(r"dapi|hoechst|draq|nuclear|nucleus|sytox", re.IGNORECASE)


def cell_kind(table: Mapping[str, np.ndarray]) -> str:
    """Say what a nuclei table was measured on: "H-DAB", "brightfield" or "fluorescence".

    From its columns: ``dab_od_*`` means an H-DAB (IHC) slide, ``hematoxylin_od_*`` one
    of H&E, marker means without either a fluorescence slide. The docks take their
    defaults from it (IHC scoring only where there is DAB, marker classes where there are
    markers).
    """
    markers = markers_of(table)
    if DAB in markers:
        return "H-DAB"
    if any(str(c).startswith("hematoxylin_od") for c in table) or not markers:
        return "brightfield"
    return "fluorescence"


def default_classes(
    table: Mapping[str, np.ndarray], last: Mapping[str, Any] | None = None
) -> dict[str, tuple[int, int, int]]:
    """Return the classes (and colours) a classification of `table` starts from.

    Parameters
    ----------
    table : mapping of str to ndarray
        The nuclei table.
    last : mapping of str to (r, g, b), optional
        The classes of the slide's last classification (``result.classes``); when given
        (and not the IHC scores, which are no cell types) they are the answer.

    Returns
    -------
    dict of str to (int, int, int)
        The last classification's classes; else on a fluorescence slide one class per
        marker that is not the nuclear stain (``"CD8+"``...) and ``"Other"``; else
        :data:`BRIGHTFIELD_CLASSES`. Colours from
        :func:`~napari_slidescope.analysis.class_colors.class_colors`.

    Examples
    --------
    >>> import numpy as np
    >>> t = {"id": np.arange(3), "DAPI_mean": np.ones(3), "CD8_mean": np.ones(3)}
    >>> list(default_classes(t))
    ['CD8+', 'Other']
    """
    if last:
        names = [str(n) for n in last]
        if not set(names) <= set(IHC_CLASSES):
            return class_colors(names, given=last)
    if cell_kind(table) == "fluorescence":
        markers = [m for m in sorted(markers_of(table)) if not _NUCLEAR_STAINS.search(m)]
        if markers:
            return class_colors([f"{m}+" for m in markers] + [OTHER])
    return class_colors(BRIGHTFIELD_CLASSES)


def marker_column(table: Mapping[str, np.ndarray], marker: str, compartment: str) -> str:
    """Return the table column of a marker's mean on a compartment.

    Raises
    ------
    ValueError
        The marker is not in the table (the message lists those that are), or not
        measured on that compartment (cells need ``segment_nuclei(cell_expansion_um=...)``).
    """
    prefix = "dab_od" if marker == DAB else marker
    for col in (f"{prefix}_{compartment}_mean",) + (
        (f"{prefix}_mean",) if compartment == "nucleus" else ()
    ):
        if col in table:
            return col
    known = markers_of(table)
    if marker not in known:
        if marker == DAB:
            raise ValueError(
                "DAB: this result has no DAB measurements (an H&E slide, or a fluorescence "
                "one); segment an H-DAB slide (stain='auto' or 'H-DAB') to score IHC"
            )
        names = ", ".join(sorted(known)) or "none"
        raise ValueError(f"unknown marker {marker!r}; the table has means of: {names}")
    raise ValueError(
        f"marker {marker!r} has no {compartment} measurement (it has "
        f"{', '.join(sorted(known[marker]))}); cells and their cytoplasm need "
        "segment_nuclei(..., cell_expansion_um=...)"
    )


def _resolve_compartment(table: Mapping[str, np.ndarray], compartment: str) -> str:
    if compartment != "auto":
        return compartment
    has_cells = any(c.endswith("_cell_mean") for c in table)
    return "cell" if has_cells else "nucleus"


def check_rules(rules: PhenotypeRules, table: Mapping[str, np.ndarray]) -> None:
    """Raise before any work when the rules name a marker or compartment the table lacks."""
    comp = _resolve_compartment(table, rules.compartment)
    for marker, spec in rules.markers.items():
        marker_column(table, marker, spec["compartment"] or comp)
    if rules.dab is not None:
        marker_column(table, DAB, rules.dab["compartment"])


def classify_cells(
    result: NucleiResult,
    *,
    markers: Any = None,
    dab: Any = None,
    phenotypes: Mapping[str, str] | None = None,
    compartment: str = "auto",
    classifier: CellClassifier | None = None,
    rules: PhenotypeRules | str | os.PathLike[str] | None = None,
) -> NucleiResult:
    """Give every cell (table row) a class: IHC score, marker positivity or a phenotype.

    Parameters
    ----------
    result : NucleiResult
        From :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` (with
        ``cell_expansion_um`` for cytoplasm and cell compartments).
    markers : dict or list of str, optional
        Marker (channel name) -> positivity threshold on its mean: a number (a cell is
        positive above it) or ``"auto"``
        (:func:`~napari_slidescope.analysis.phenotypes.auto_threshold`: Otsu on ``log1p``
        of the result's per-cell means); or
        ``{"threshold": ..., "compartment": ...}`` to measure that marker on another
        compartment. A list of names means ``"auto"`` for each.
    dab : bool, (float, float, float) or dict, optional
        Score brightfield IHC: ``True`` for QuPath's thresholds (0.2, 0.4, 0.6) on the
        mean DAB optical density of the nucleus, three thresholds, or
        ``{"thresholds": ..., "compartment": "cell"}`` (membrane markers such as HER2).
    phenotypes : dict of str to str, optional
        Phenotype -> rule such as ``"CD3+ CD8-"``, in priority order: each cell gets the
        first phenotype it matches, else ``"Other"``. ``DAB+``/``DAB-`` use IHC
        positivity. Markers a rule names but `markers` does not get ``"auto"``.
    compartment : {"auto", "nucleus", "cytoplasm", "cell"}
        Where the markers are measured by default; ``"auto"``: the cell when the result
        has cells, else the nucleus.
    classifier : CellClassifier, optional
        A learned classifier (an object with ``predict_classes(result)``) instead of rules.
    rules : PhenotypeRules, str or PathLike, optional
        Rules (or a rules JSON file) instead of the three rule arguments.

    Returns
    -------
    NucleiResult
        A copy whose table adds ``class`` (str), ``{marker}_positive`` (bool) per marker,
        and for IHC ``dab_score`` (0-3) and ``dab_positive``; for a classifier
        ``class_probability``. ``classes`` maps each class to its colour and
        ``classification`` records the resolved thresholds and the rules.

    Raises
    ------
    ValueError
        Before any work: an unknown marker, a compartment the result lacks, a threshold
        of the wrong type, IHC thresholds out of order, a malformed rule, no marker.

    Examples
    --------
    >>> res = segment_nuclei(slide, cell_expansion_um=5)  # doctest: +SKIP
    >>> res = classify_cells(res, phenotypes={"Cytotoxic T": "CD3+ CD8+"})  # doctest: +SKIP
    >>> res.table["class"], res.classes  # doctest: +SKIP
    """
    if classifier is not None:
        if any(a is not None for a in (markers, dab, phenotypes, rules)):
            raise ValueError("classify_cells: give either classifier= or rules, not both")
        return _apply_classifier(result, classifier)
    if rules is not None:
        if any(a is not None for a in (markers, dab, phenotypes)):
            raise ValueError("classify_cells: give either rules= or markers/dab/phenotypes")
        if not isinstance(rules, PhenotypeRules):
            rules = load_rules(rules)
    else:
        rules = PhenotypeRules.of(
            markers=markers, dab=dab, phenotypes=phenotypes, compartment=compartment
        )
    return apply_rules(result, rules)


def apply_rules(result: NucleiResult, rules: PhenotypeRules) -> NucleiResult:
    """Apply checked rules to a result (:func:`classify_cells` with ``rules=``)."""
    table = result.columns
    check_rules(rules, table)
    comp = _resolve_compartment(table, rules.compartment)
    out = {k: v for k, v in table.items() if k not in ("class", "class_probability")}
    positive: dict[str, np.ndarray] = {}
    thresholds: dict[str, float] = {}
    for marker, spec in rules.markers.items():
        col = marker_column(table, marker, spec["compartment"] or comp)
        values = np.asarray(table[col], np.float64)
        t = spec["threshold"]
        if t == "auto":
            t = auto_threshold(values) if values.size >= 2 else math.inf
        thresholds[marker] = float(t)
        positive[marker] = np.nan_to_num(values, nan=-np.inf) > t
        out[f"{marker}_positive"] = positive[marker]
    info: dict[str, Any] = {
        "kind": "rules",
        "compartment": comp,
        "thresholds": thresholds,
        "rules": rules.to_dict(),
    }
    scores = None
    if rules.dab is not None:
        col = marker_column(table, DAB, rules.dab["compartment"])
        scores = dab_scores(np.asarray(table[col]), rules.dab["thresholds"])
        out["dab_score"] = scores
        out["dab_positive"] = scores >= 1
        positive[DAB] = scores >= 1
        info["dab_thresholds"] = list(rules.dab["thresholds"])
    n = int(np.asarray(table["id"]).size)
    if rules.phenotypes:
        classes = apply_phenotypes(positive, rules.phenotypes)
        names = [*rules.phenotypes, OTHER]
    elif scores is not None:
        classes = np.asarray(IHC_CLASSES)[scores] if n else np.zeros(0, "<U8")
        names = list(IHC_CLASSES)
    else:  # markers only: the combination of positive markers, as QuPath names it
        combos = [
            ": ".join(m for m in rules.markers if positive[m][i]) or "Negative" for i in range(n)
        ]
        width = max([8, *(len(c) for c in combos)])
        classes = np.array(combos, dtype=f"<U{width}")
        names = sorted(set(combos), key=lambda c: (c == "Negative", c.count(":"), c))
        if "Negative" not in names:
            names.append("Negative")
    out["class"] = classes
    colors = class_colors(names)
    return dataclasses.replace(result, columns=out, classes=colors, classification=info)


def _apply_classifier(result: NucleiResult, classifier: Any) -> NucleiResult:
    predict = getattr(classifier, "predict_classes", None)
    if not callable(predict):
        raise ValueError(
            f"classifier: {type(classifier).__name__} has no predict_classes(result) method"
        )
    names, prob, colors = predict(result)
    n = int(np.asarray(result.columns["id"]).size)
    names, prob = np.asarray(names).astype(str), np.asarray(prob, np.float64)
    if names.shape != (n,) or prob.shape != (n,):
        raise ValueError(
            f"classifier: predict_classes returned {names.shape} classes and {prob.shape} "
            f"probabilities for {n} cells"
        )
    given = {str(k): tuple(int(c) for c in v[:3]) for k, v in dict(colors).items()}
    extra = sorted(set(names.tolist()) - set(given))  # predicted, yet without a colour
    colors = class_colors([*given, *extra], given=given)
    table = {**result.columns, "class": names, "class_probability": prob}
    info = {"kind": "classifier", "classifier": type(classifier).__name__}
    return dataclasses.replace(result, columns=table, classes=colors, classification=info)


def class_summary(result: NucleiResult, *, area_mm2: float | None = None) -> dict[str, Any]:
    """Return counts (and densities) per class, and the IHC figures when the result was scored.

    Parameters
    ----------
    result : NucleiResult
        A classified result (:func:`classify_cells`).
    area_mm2 : float, optional
        Tissue (or annotation) area the cells come from: adds ``{class}_per_mm2``.

    Returns
    -------
    dict
        ``{class}_count`` per class of ``result.classes``; with ``area_mm2``
        ``{class}_per_mm2``; with IHC scores the figures of
        :func:`~napari_slidescope.analysis.phenotypes.ihc_summary` (``positive_percent``,
        ``h_score``...).
    """
    if "class" not in result.columns:
        raise ValueError("class_summary: the result has no classes; run classify_cells first")
    classes = np.asarray(result.columns["class"])
    out: dict[str, Any] = {}
    for name in result.classes:
        k = int(np.count_nonzero(classes == name))
        out[f"{name}_count"] = k
        if area_mm2 is not None:
            out[f"{name}_per_mm2"] = k / area_mm2 if area_mm2 > 0 else float("nan")
    if "dab_score" in result.columns:
        out.update(ihc_summary(np.asarray(result.columns["dab_score"]), area_mm2=area_mm2))
    return out


def annotation_summary(result: NucleiResult, polygon: Any, *, holes: Any = ()) -> dict[str, Any]:
    """Return counts and densities per class of the cells inside an annotation (a polygon).

    "CD8+ per mm² of the tumour annotation": a cell counts when its nucleus's centroid lies
    inside `polygon` and outside its `holes`; the area is the polygon's less the holes'.

    Parameters
    ----------
    result : NucleiResult
        A classified result (:func:`classify_cells`).
    polygon : (N, 2) array_like
        Level-0 ``(row, col)`` ring (the slide's pixels, as QuPath annotations and the
        napari plugin's shapes give them).
    holes : sequence of (K, 2) array_like
        Rings cut out of it.

    Returns
    -------
    dict
        ``area_mm2``, ``cells`` (how many inside) and :func:`class_summary` of those cells
        on that area (``{class}_count``, ``{class}_per_mm2``, IHC figures).

    Raises
    ------
    ValueError
        Unclassified result, or a ring of fewer than three points.
    """
    from skimage.measure import points_in_poly

    rings = [np.asarray(polygon, float), *(np.asarray(h, float) for h in holes)]
    for r in rings:
        if r.ndim != 2 or r.shape[1] != 2 or len(r) < 3:
            raise ValueError(
                f"annotation: expected (row, col) rings of 3 or more points, got shape {r.shape}"
            )
    table = result.columns
    if "class" not in table:
        raise ValueError("annotation_summary: the result has no classes; run classify_cells first")
    points = np.column_stack(
        [np.asarray(table["centroid_row"], float), np.asarray(table["centroid_col"], float)]
    ).reshape(-1, 2)
    inside = points_in_poly(points, rings[0]) if len(points) else np.zeros(0, bool)
    for hole in rings[1:]:
        inside &= ~points_in_poly(points, hole)

    def area(r: np.ndarray) -> float:
        y, x = r[:, 0], r[:, 1]
        return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)

    mpp = result.mpp
    my, mx = (float(mpp), float(mpp)) if isinstance(mpp, int | float) else map(float, mpp)
    dy, dx = (float(v) for v in result.downsample)
    px_um2 = (my / dy) * (mx / dx)  # one level-0 pixel
    area_mm2 = max(area(rings[0]) - sum(area(h) for h in rings[1:]), 0.0) * px_um2 / 1e6
    kept = {k: np.asarray(v)[inside] for k, v in table.items()}
    subset = dataclasses.replace(result, columns=kept)
    return {
        "area_mm2": area_mm2,
        "cells": int(inside.sum()),
        **class_summary(subset, area_mm2=area_mm2),
    }


def load_classification(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """Return what ``slidescope batch --classify FILE`` applies: rules, or a learned classifier.

    A JSON file whose top-level ``"kind"`` is :data:`RULES_KIND` is phenotype rules;
    a zip file is handed to
    :func:`~napari_slidescope.pipeline.cell_forest.load_classifier` (a learned
    classifier).

    Returns
    -------
    spec : PhenotypeRules or CellClassifier
        What :func:`classify_cells` applies (``rules=`` or ``classifier=``).
    descriptor : dict
        JSON-ready and content-addressed, for batch parameters: ``{"kind": "rules",
        "rules": {...}, "sha256": ...}`` or ``{"kind": "classifier", "path": ...,
        "sha256": ...}`` (the file's bytes, or the classifier's own ``digest()``).

    Raises
    ------
    ValueError
        Unreadable file, invalid rules, or a file that is neither rules nor a classifier
        this installation can load (the message names the file and says what it is: a zip
        without a classifier's description, GeoJSON, a QuPath classifier...).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the classification file ({e.strerror or e})") from e
    data: Any = None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if isinstance(data, Mapping) and data.get("kind") == RULES_KIND:
        rules = PhenotypeRules.from_dict(data, where=str(path))
        return rules, {"kind": "rules", "rules": rules.to_dict(), "sha256": rules.digest()}
    what = "JSON without" if data is not None else "not JSON, and has no"
    if not raw.startswith(b"PK"):  # a classifier file is a zip (.npz); this is text or junk
        raise ValueError(
            f'{path}: not phenotype rules ({what} "kind": "{RULES_KIND}") and not a '
            f"classifier file either{_looks_like(data)}"
        )
    _check_classifier_zip(path, raw)
    classifier = load_classifier(path)
    if not callable(getattr(classifier, "predict_classes", None)):
        raise ValueError(f"{path}: the loaded classifier has no predict_classes(result)")
    digest = getattr(classifier, "digest", None)
    sha = digest() if callable(digest) else hashlib.sha256(raw).hexdigest()
    return classifier, {"kind": "classifier", "path": str(path.resolve()), "sha256": str(sha)}


#: The member every classifier file (``.npz``) holds: its JSON description.
_CLASSIFIER_MEMBER = "meta.npy"


def _looks_like(data: Any) -> str:
    """Say what a JSON document that is not rules looks like (for the error), or ``""``."""
    if not isinstance(data, Mapping):
        return ""
    if data.get("type") in ("FeatureCollection", "Feature"):
        return " (it is GeoJSON: open it in napari, or pass it as annotations)"
    if "object_classifier_type" in data or "pixel_classifier_type" in data:
        return (
            " (it is a QuPath classifier, which napari-slidescope cannot apply: train one in "
            'the "Cell classifier" dock or with train_classifier)'
        )
    return ""


def _check_classifier_zip(path: Path, raw: bytes) -> None:
    """Raise a clear ValueError unless `raw` is a zip that holds a classifier's description.

    A classifier file is a ``.npz`` (a zip of ``.npy`` arrays, one of them
    :data:`_CLASSIFIER_MEMBER`); any other zip (a QuPath project, a zipped zarr store, a
    folder of images) is recognised here, from its table of contents, before any member
    is read.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as e:
        raise ValueError(
            f"{path}: not phenotype rules and not a classifier file: a damaged zip archive ({e})"
        ) from e
    if _CLASSIFIER_MEMBER in names:
        return
    kind = "a zip archive"
    if any(n.endswith((".zarray", "zarr.json", ".zgroup")) for n in names):
        kind = "a zipped zarr store"
    elif any(n.endswith(".qpproj") for n in names):
        kind = "a zipped QuPath project"
    elif names and all(n.endswith(".npy") for n in names):
        kind = "a numpy .npz archive"
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    raise ValueError(
        f"{path}: not phenotype rules and not a napari-slidescope classifier file: {kind} "
        f"of {len(names)} member(s) ({shown or 'empty'}) without the classifier's "
        f"{_CLASSIFIER_MEMBER}; save a classifier with ObjectClassifier.save or the "
        '"Cell classifier" dock, or rules with PhenotypeRules.save'
    )


def classification_from(descriptor: Mapping[str, Any]) -> Any:
    """Return the rules or classifier of a :func:`load_classification` descriptor (on a worker)."""
    if descriptor.get("kind") == "rules":
        return PhenotypeRules.from_dict(descriptor["rules"], where="batch parameters")
    spec, _ = load_classification(descriptor["path"])
    return spec


def classify_table(table: Mapping[str, np.ndarray], spec: Any) -> NucleiResult:
    """Classify a bare table (no labels, no outlines): what batch does per slide."""
    n = int(np.asarray(table["id"]).size)
    res = NucleiResult(None, 1.0, (0, 0), (1.0, 1.0), n, dict(table), (0, 0, 0, 0))
    if isinstance(spec, PhenotypeRules):
        return classify_cells(res, rules=spec)
    return classify_cells(res, classifier=spec)
