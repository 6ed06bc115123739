"""A slide's ``manifest.json``: what was asked, what ran, where each tile stands."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from napari_slidescope._io import atomic_write
from napari_slidescope.batch.outputs.summary import SummaryRow


@dataclass(frozen=True)
class TileRecord:
    """A tile's line in a manifest: its status and, once done, its seconds."""

    status: str
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"status": ..., "seconds": ...}`` (seconds only once done)."""
        if self.seconds is None:
            return {"status": self.status}
        return {"status": self.status, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TileRecord:
        """Build from :meth:`to_json`'s dict."""
        seconds = data.get("seconds")
        return cls(str(data.get("status", "")), None if seconds is None else float(seconds))


@dataclass(frozen=True)
class Manifest:
    """A slide's ``manifest.json``: what was asked, what ran, where it stands.

    Attributes
    ----------
    slide, path : str
        The slide's file name, and its absolute path or URL without credentials.
    status : {"running", "done", "failed"}
        Where the slide stands.
    error, traceback : str or None
        Why it failed: one line, and the traceback.
    slide_stamp : dict or None
        Size, modification time and hash of the slide's first MiB (a URL: what its
        store says about the object's version), as resume compares them.
    parameters : dict or None
        :meth:`~napari_slidescope.batch.params.BatchParams.as_dict`.
    requested_sha256 : str or None
        Digest of `parameters`.
    resolved : dict or None
        What ran (the segmenter ``auto`` chose, its model and weights, the working
        resolution, the stain and tissue modes...), once the slide task has said.
    parameters_sha256 : str or None
        Digest of `parameters` and `resolved` (``run_digest``): parts and outputs carry it.
    segmentation_sha256 : str or None
        The same without the classification (``segmentation_digest``): equal when only
        the rules changed.
    slide_info : dict or None
        ``shape0``, ``mpp`` and ``format`` of the slide.
    tissue_area_mm2, slide_task_seconds : float or None
        The tissue area, and the seconds of the slide task.
    plan : dict or None
        The tile plan (working µm/px, tile size and overlap in px, grid, tiles).
    tiles : dict of int to TileRecord, or None
        Each tile with tissue: its status and seconds.
    summary : SummaryRow or None
        The slide's summary row once done.
    tile_table : dict or None
        The tiles task's record (``--tiles``): ``sha256`` of its parameters (the model
        file's SHA-256 and the tiling, the slide's stamp: what ``resume`` compares), tile
        count, features, seconds, tiles per second and the model's wait on reading.
    """

    slide: str
    path: str
    status: str
    error: str | None = None
    traceback: str | None = None
    slide_stamp: dict[str, Any] | None = None
    parameters: dict[str, Any] | None = None
    requested_sha256: str | None = None
    resolved: dict[str, Any] | None = None
    parameters_sha256: str | None = None
    segmentation_sha256: str | None = None
    slide_info: dict[str, Any] | None = None
    tissue_area_mm2: float | None = None
    slide_task_seconds: float | None = None
    plan: dict[str, Any] | None = None
    tiles: dict[int, TileRecord] | None = None
    summary: SummaryRow | None = None
    tile_table: dict[str, Any] | None = None

    def replace(self, **changes: Any) -> Manifest:
        """Return a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """Return the manifest as JSON-ready values (tile keys as strings)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.tiles is not None:
            out["tiles"] = {str(i): t.to_json() for i, t in self.tiles.items()}
        if self.summary is not None:
            out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """Build from :meth:`to_json`'s dict; keys it does not know are ignored.

        Raises
        ------
        ValueError
            If `data` is not a JSON object.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"manifest: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values.setdefault("slide", "")
        values.setdefault("path", "")
        values.setdefault("status", "")
        tiles = values.get("tiles")
        if tiles is not None:
            values["tiles"] = {int(i): TileRecord.from_json(t) for i, t in tiles.items()}
        summary = values.get("summary")
        if summary is not None:
            values["summary"] = SummaryRow.from_json(summary)
        return cls(**values)


def read_manifest(slide_dir: Path) -> Manifest | None:
    """Read the slide's ``manifest.json``; None when missing or unreadable."""
    try:
        data = json.loads((slide_dir / "manifest.json").read_text(encoding="utf-8"))
        return Manifest.from_json(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def write_manifest(slide_dir: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically."""
    with atomic_write(slide_dir / "manifest.json", "w") as fh:
        json.dump(manifest.to_json(), fh, indent=1, sort_keys=True)
