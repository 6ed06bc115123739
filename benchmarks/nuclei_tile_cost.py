"""Where a batch tile task's CPU goes, stage by stage, per source tree (#33).

In a fresh process per ``--src`` (``PYTHONPATH=SRC``), one thread, the tiles of a slide
(``--tiles`` of them, evenly spread over its plan) go through the steps of a batch
nuclei task one at a time, each timed in CPU seconds: read the tile, the segmenter's
``predict`` and ``postprocess`` (the segmenter's own work), the nuclei the tile owns,
the measurements, and the outlines as WKB (``tasks._tile_out``). Prints CPU-ms per
nucleus for each stage, the per-nucleus work (ownership + measurements + outlines)
against the segmenter's, and the ratio of each stage to the last ``--src``, with the
load average.

Usage::

    python benchmarks/nuclei_tile_cost.py SLIDE --src src,/work/main/src [--tiles 6]
        [--segmenter builtin] [--segmenter instanseg --runtime onnxruntime]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STAGES = ("read", "predict", "postprocess", "owned", "measure", "outlines")


def child(slide: str, segmenter: str, n_tiles: int, repeat: int, runtime: str) -> None:
    from napari_slidescope.batch import tasks
    from napari_slidescope.batch.params import BatchParams
    from napari_slidescope.options import NucleiOptions
    from napari_slidescope.pipeline.runner import TileResult
    from napari_slidescope.pipeline.tiling import owned_labels

    st = os.stat(slide)
    stamp = (st.st_size, st.st_mtime_ns)
    extra = {"runtime": runtime} if runtime else {}
    params = BatchParams(nuclei_options=NucleiOptions(segmenter=segmenter, segmenter_options=extra))
    info = tasks.slide_task(slide, stamp, params)
    run = tasks._prepare(slide, stamp, params, info.grid)
    seg, plan, measure = run.segmenter, run.plan, run._run.measure
    tiles = list(info.tiles)
    pick = tiles[:: max(1, len(tiles) // n_tiles)][:n_tiles]
    cpu = dict.fromkeys(STAGES, 0.0)
    nuclei = 0
    for _ in range(repeat):
        for i in pick:
            tile = run._tile(i)
            c = time.process_time()
            rgb = run._read(tile)
            cpu["read"] += time.process_time() - c
            c = time.process_time()
            raw = seg.predict(rgb[None], mpp=plan.mpp)[0]
            cpu["predict"] += time.process_time() - c
            c = time.process_time()
            labels = seg.postprocess(raw, mpp=plan.mpp)[: tile.shape[0], : tile.shape[1]]
            cpu["postprocess"] += time.process_time() - c
            c = time.process_time()
            owned = owned_labels(labels, tile)
            cpu["owned"] += time.process_time() - c
            c = time.process_time()
            table = measure(owned, rgb, tile)
            cpu["measure"] += time.process_time() - c
            c = time.process_time()
            res = TileResult(tile=tile, labels=owned, count=int(owned.max()), offset=0, table=table)
            out = tasks._tile_out(plan, res, 0.0)
            cpu["outlines"] += time.process_time() - c
            nuclei += len(out.wkb)
    print(json.dumps({"cpu": cpu, "nuclei": nuclei, "tiles": len(pick) * repeat}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slide")
    ap.add_argument("--src", default="src")
    ap.add_argument("--segmenter", default="builtin")
    ap.add_argument("--tiles", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1, help="passes over the tiles")
    ap.add_argument("--runtime", default="", help="InstanSeg's runtime (onnxruntime, torch)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.slide, a.segmenter, a.tiles, a.repeat, a.runtime)
        return
    load0 = os.getloadavg()
    rows = {}
    for src in a.src.split(","):
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(src).resolve()),
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            sys.executable,
            __file__,
            a.slide,
            "--child",
            "--segmenter",
            a.segmenter,
            "--tiles",
            str(a.tiles),
            "--repeat",
            str(a.repeat),
            "--runtime",
            a.runtime,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr)
        rows[src] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"{a.segmenter} {a.runtime}, load {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        "| source | tiles | nuclei | "
        + " | ".join(f"{s} ms/nuc" for s in STAGES)
        + " | per-nucleus work / segmenter |"
    )
    print("|---|---|---|" + "---|" * len(STAGES) + "---|")
    for src, r in rows.items():
        per = {s: 1000 * r["cpu"][s] / r["nuclei"] for s in STAGES}
        own = r["cpu"]["owned"] + r["cpu"]["measure"] + r["cpu"]["outlines"]
        segm = r["cpu"]["predict"] + r["cpu"]["postprocess"]
        print(
            f"| {src} | {r['tiles']} | {r['nuclei']} | "
            + " | ".join(f"{per[s]:.3f}" for s in STAGES)
            + f" | {own / segm:.2f} |"
        )
    base = list(rows.values())[-1]
    for src, r in list(rows.items())[:-1]:
        print(
            f"{src}: "
            + ", ".join(f"{s} x{base['cpu'][s] / max(r['cpu'][s], 1e-9):.2f}" for s in STAGES)
            + " less CPU"
        )


if __name__ == "__main__":
    main()
