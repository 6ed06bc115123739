"""``summary.csv``: one row per slide (:class:`SummaryRow`), written and read back."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    regions : str or None
        Per tissue region (``--regions``): its area and share, cells, cells per mm² and
        positive percentage, ``"name: ...; ..."`` (``regions.csv`` has them as numbers).
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
    regions: str | None = None
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the row as a dict of :data:`SUMMARY_COLUMNS` (JSON-ready)."""
        return {c: getattr(self, c) for c in SUMMARY_COLUMNS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryRow:
        """Build from :meth:`to_json`'s dict (unknown keys are ignored, missing ones None)."""
        values: dict[str, Any] = {c: data.get(c) for c in SUMMARY_COLUMNS}
        values["slide"] = str(values["slide"] or "")
        values["status"] = str(values["status"] or "")
        values["path"] = str(values["path"] or "")
        return cls(**values)

    def to_csv(self) -> list[str]:
        """Return the row's ``summary.csv`` fields, in :data:`SUMMARY_COLUMNS` order."""
        return [_fmt(getattr(self, c)) for c in SUMMARY_COLUMNS]

    @classmethod
    def from_csv(cls, fields: Mapping[str, str]) -> SummaryRow:
        """Build from a ``csv.DictReader`` row of ``summary.csv`` (numbers parsed)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
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


#: Columns of ``summary.csv``: the fields of :class:`SummaryRow`, in order.
SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SummaryRow))


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
    """Write ``summary.csv`` (:data:`SUMMARY_COLUMNS`, one row per slide), atomically."""
    with atomic_write(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(SUMMARY_COLUMNS)
        for row in rows:
            w.writerow(row.to_csv())


def read_summary(path: Path) -> list[SummaryRow]:
    """Read ``summary.csv`` back as :class:`SummaryRow` records."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [SummaryRow.from_csv(r) for r in csv.DictReader(fh)]
