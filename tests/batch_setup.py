"""Set-ups shared by the batch tests, on local files (tests/batch) and over URLs (tests/remote).

Import as ``from tests.batch_setup import ...`` (see ``tests/fakes.py``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq


def write_two_slides(folder: Path) -> Path:
    """Write two small synthetic H&E slides, ``a.svs`` and ``b.svs`` (0.5 µm/px, 3 levels)."""
    from napari_slidescope.sample_data import write_sample_slide

    write_sample_slide(folder / "a.svs", shape=(1024, 1536), mpp=0.5, seed=1, tile=128)
    write_sample_slide(folder / "b.svs", shape=(1024, 1024), mpp=0.5, seed=5, tile=128)
    return folder


@contextlib.contextmanager
def process_cluster():
    """``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` and its client."""
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def cli(*args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m napari_slidescope.batch ARGS`` (captured, text)."""
    return subprocess.run(
        [sys.executable, "-m", "napari_slidescope.batch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def summary(out: Path) -> dict[str, dict[str, str]]:
    """The rows of ``out/summary.csv``, by slide name."""
    with open(out / "summary.csv", newline="") as fh:
        return {r["slide"]: r for r in csv.DictReader(fh)}


def sigkill_then_resume(slide, name: str, client, tmp_path: Path, tile_um: float):
    """Kill ``slidescope batch`` once two tiles are written, resume, and check what it kept.

    `slide` is a path or URL whose outputs land in ``out/<name>``. The batch runs on
    `client`'s scheduler with the built-in segmenter; an uninterrupted run is the
    reference. Returns ``(resumed, reference)`` nuclei tables.
    """
    from napari_slidescope import analyze_slides

    ref = tmp_path / "ref"
    analyze_slides(slide, ref, tile_size_um=tile_um, client=client, segmenter="builtin")
    out = tmp_path / "out"
    args = ["batch", slide, "-o", out, "--tile-size-um", tile_um, "--no-progress"]
    args += ["--segmenter", "builtin", "--scheduler", client.scheduler.address]
    proc = subprocess.Popen(
        [sys.executable, "-m", "napari_slidescope.batch", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    parts = out / name / "parts"
    deadline = time.monotonic() + 120  # a hang guard while polling, not a timing check
    try:
        while time.monotonic() < deadline:
            if parts.is_dir() and len(list(parts.glob("tile-*.parquet"))) >= 2:
                break
            assert proc.poll() is None, "the command ended before it could be killed"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    manifest = json.loads((out / name / "manifest.json").read_text())
    assert manifest["status"] == "running"
    kept = len(list(parts.glob("tile-*.parquet")))
    first: list[int] = []
    rows = analyze_slides(
        slide,
        out,
        tile_size_um=tile_um,
        client=client,
        segmenter="builtin",
        resume=True,
        progress=lambda s: first.append(s.tiles_done) if not first else None,
    )
    assert rows[0]["status"] == "done"
    assert 2 <= kept  # killed after two tiles ...
    assert kept == first[0]  # ... which resume kept ...
    assert first[0] < len(manifest["tiles"])  # ... and did not redo, out of more
    got = pq.read_table(out / name / "nuclei.parquet").sort_by("id")
    want = pq.read_table(ref / name / "nuclei.parquet").sort_by("id")
    return got, want
