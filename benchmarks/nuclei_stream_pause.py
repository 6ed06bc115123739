"""The pause after a batch slide's last tile: nuclei outputs joined at the end vs streamed.

``slidescope batch`` used to write ``nuclei.parquet`` and ``nuclei.geojson.gz`` once all
of a slide's tiles were in (``outputs.write_nuclei``: every part read again, a pause that
grows with the nuclei); now the ledger writes them a tile at a time as the tiles finish
(``batch.nuclei_stream.NucleiStream``) and only the footers are left at the end.

First, once: the slide is run through ``analyze_slides`` (a 2-worker process cluster)
with its tile parts kept and the arguments of its ``write_nuclei`` call recorded, into
``--work``. Then, ``--runs`` times, interleaved in this process on those very parts:

* **joined**: ``write_nuclei`` (today's end-of-slide join), wall and CPU seconds;
* **streamed**: ``NucleiStream.advance`` tile by tile (the work spread over the run),
  then ``close``; the *pause* is the last tile's ``advance`` plus ``close``.

Prints medians, µs per nucleus, the ratio joined / streamed pause, checks the files are
byte-identical, and the load average.

Usage::

    PYTHONPATH=src python benchmarks/nuclei_stream_pause.py SLIDE --work DIR --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
import warnings
from pathlib import Path


def _prepare(slide: Path, work: Path) -> tuple[Path, list[int], dict]:
    """Run the batch once, keeping the parts and the write_nuclei arguments."""
    done = work / "args.json"
    folder = work / "out" / slide.name
    if done.is_file():
        args = json.loads(done.read_text())
        return folder, args.pop("tiles"), args
    from napari_slidescope import analyze_slides
    from napari_slidescope.batch import engine, ledger, outputs

    seen: dict = {}
    real = outputs.write_nuclei

    def record(slide_dir, tiles, **kwargs):
        seen.update(kwargs, tiles=list(tiles))
        return real(slide_dir, tiles, **kwargs)

    remove = outputs.remove_parts
    outputs.write_nuclei = record
    outputs.remove_parts = lambda folder: None
    ledger.Ledger.stream_outputs = False
    try:
        with engine.local_cluster(2) as cluster:
            from distributed import Client

            with Client(cluster) as client, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rows = analyze_slides(slide, work / "out", client=client, segmenter="builtin")
    finally:
        outputs.write_nuclei, outputs.remove_parts = real, remove
        ledger.Ledger.stream_outputs = True
    assert rows[0]["status"] == "done", rows
    seen.pop("classes", None)
    done.write_text(json.dumps(seen))
    tiles = seen.pop("tiles")
    return folder, tiles, dict(seen)


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    (dst / "parts").symlink_to((src / "parts").resolve())
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    folder, tiles, kwargs = _prepare(a.slide, a.work)
    from napari_slidescope.batch import outputs
    from napari_slidescope.batch.nuclei_stream import NucleiStream

    print(f"load average at start: {os.getloadavg()}")
    joined_dir, streamed_dir = _copy(folder, a.work / "j"), _copy(folder, a.work / "s")
    res: dict[str, list[float]] = {k: [] for k in ("joined", "jcpu", "pause", "pcpu", "spread")}
    n = 0
    for _ in range(a.runs):
        t, c = time.perf_counter(), time.process_time()
        summary = outputs.write_nuclei(joined_dir, tiles, **kwargs)
        res["joined"].append(time.perf_counter() - t)
        res["jcpu"].append(time.process_time() - c)
        n = summary.nuclei
        t0 = time.perf_counter()
        stream = NucleiStream(streamed_dir, **kwargs)
        for k in range(len(tiles) - 1):
            stream.advance(tiles, set(tiles[: k + 1]))
        res["spread"].append(time.perf_counter() - t0)
        t, c = time.perf_counter(), time.process_time()
        stream.advance(tiles, set(tiles))
        stream.close()
        res["pause"].append(time.perf_counter() - t)
        res["pcpu"].append(time.process_time() - c)
    med = {k: statistics.median(v) for k, v in res.items()}
    same = all(
        (joined_dir / f).read_bytes() == (streamed_dir / f).read_bytes()
        for f in ("nuclei.parquet", "nuclei.geojson.gz")
    )
    print(f"{a.slide.name}: {n} nuclei, {len(tiles)} tiles, {a.runs} runs, medians")
    print(
        f"  joined at the end : {med['joined']:.3f} s wall ({med['jcpu']:.3f} CPU s), "
        f"{1e6 * med['joined'] / max(n, 1):.0f} µs per nucleus"
    )
    print(
        f"  streamed          : pause after the last tile {med['pause']:.3f} s wall "
        f"({med['pcpu']:.3f} CPU s); the other tiles while they finished {med['spread']:.3f} s"
    )
    print(f"  pause joined / streamed: {med['joined'] / max(med['pause'], 1e-9):.1f}x")
    print(f"  files byte-identical: {same}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
