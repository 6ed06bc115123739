"""``summary.csv``: one row per slide (:class:`SummaryRow`), written and read back."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from napari_slidescope._io import atomic_write


@dataclass(frozen=True)
class SummaryRow:
    """One slide's row of ``summary.csv`` (and of what ``analyze_slides`` returns).

    Attributes
    ----------
    slide : str
        The slide's file name (its output folder's name).
    status : {"pending", "running", "done", "failed"}
        Where the slide stands.
    error : str or None
        Why it failed, one line.
    tissue_area_mm2, nuclei_per_mm2, mean_nucleus_area_um2 : float or None
        Tissue area, nuclei per mm² of tissue, mean nucleus area in µm².
    nuclei : int or None
        Nuclei found.
    seconds : float or None
        Worker seconds spent on the slide.
    classes : str or None
        Counts per class, ``"name: n; ..."`` (``--classify``).
    positive_percent, h_score, positive_per_mm2 : float or None
        The IHC figures of a classified slide.
    regions : mapping of str to number
        The per-region figures of a slide run with ``--regions``
        (:func:`~napari_slidescope.pipeline.region_cells.region_summary`:
        ``{R}_area_mm2``, ``{R}_percent``, ``{R}_cells``, ``{R}_cells_per_mm2``, cell
        classes and IHC figures per region, ``tumour_stroma_ratio``...): columns of
        ``summary.csv`` after :data:`SUMMARY_COLUMNS`, the same for every slide of a run
        (one classifier); empty otherwise, so a run without regions has the columns it had.
        A run with ``--tiles`` adds ``tiles``, ``tiles_per_s`` and ``model_wait_s`` here too
        (the tile count, tiles per second and the model's wait on reading).
    path : str
        The slide's absolute path, or its URL without credentials.
    """

    slide: str
    status: str
    error: str | None = None
    tissue_area_mm2: float | None = None
    nuclei: int | None = None
    nuclei_per_mm2: float | None = None
    mean_nucleus_area_um2: float | None = None
    seconds: float | None = None
    classes: str | None = None
    positive_percent: float | None = None
    h_score: float | None = None
    positive_per_mm2: float | None = None
    path: str = ""
    regions: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the row as a dict of :data:`SUMMARY_COLUMNS` and the region figures."""
        return {**{c: getattr(self, c) for c in SUMMARY_COLUMNS}, **self.regions}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryRow:
        """Build from :meth:`to_json`'s dict (keys of no column are region figures)."""
        values: dict[str, Any] = {c: data.get(c) for c in SUMMARY_COLUMNS}
        values["slide"] = str(values["slide"] or "")
        values["status"] = str(values["status"] or "")
        values["path"] = str(values["path"] or "")
        values["regions"] = {k: v for k, v in data.items() if k not in SUMMARY_COLUMNS}
        return cls(**values)

    def to_csv(self, extra: Sequence[str] = ()) -> list[str]:
        """Return the row's ``summary.csv`` fields: :data:`SUMMARY_COLUMNS`, then `extra`."""
        return [_fmt(getattr(self, c)) for c in SUMMARY_COLUMNS] + [
            _fmt(self.regions.get(c)) for c in extra
        ]

    @classmethod
    def from_csv(cls, fields: Mapping[str, str]) -> SummaryRow:
        """Build from a ``csv.DictReader`` row of ``summary.csv`` (numbers parsed)."""
        values: dict[str, Any] = {"regions": _numbers(fields)}
        for f in dataclasses.fields(cls):
            if f.name == "regions":
                continue
            text = fields.get(f.name, "")
            if text == "":
                values[f.name] = "" if f.name in ("slide", "status", "path") else None
            elif f.name == "nuclei":
                values[f.name] = int(text)
            elif f.type == "float | None":
                values[f.name] = float(text)
            else:
                values[f.name] = text
        return cls(**values)


#: Columns of ``summary.csv``: the fields of :class:`SummaryRow`, in order (the region
#: figures of a run with ``--regions`` follow them).
SUMMARY_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(SummaryRow) if f.name != "regions"
)


def _numbers(fields: Mapping[str, str]) -> dict[str, Any]:
    """Return the region figures of a ``summary.csv`` row (its other columns), as numbers."""
    out: dict[str, Any] = {}
    for k, text in fields.items():
        if k in SUMMARY_COLUMNS or k is None:
            continue
        try:
            out[k] = None if text == "" else float(text)
        except ValueError:
            out[k] = text
    return out


@dataclass
class SlideSummary:
    """Totals of one slide's nuclei, gathered while its output is written."""

    nuclei: int = 0
    area_um2_sum: float = 0.0

    @property
    def mean_area_um2(self) -> float | None:
        """Mean nucleus area in µm², None without nuclei."""
        return self.area_um2_sum / self.nuclei if self.nuclei else None


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    return str(value)


def write_summary(path: Path, rows: Sequence[SummaryRow]) -> None:
    """Write ``summary.csv`` (:data:`SUMMARY_COLUMNS`, one row per slide), atomically.

    The region figures of the rows (``--regions``) follow, each column once, in the order
    they first appear.
    """
    extra: list[str] = []
    for row in rows:
        extra += [k for k in row.regions if k not in extra]
    with atomic_write(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow([*SUMMARY_COLUMNS, *extra])
        for row in rows:
            w.writerow(row.to_csv(extra))


def read_summary(path: Path) -> list[SummaryRow]:
    """Read ``summary.csv`` back as :class:`SummaryRow` records."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [SummaryRow.from_csv(r) for r in csv.DictReader(fh)]
