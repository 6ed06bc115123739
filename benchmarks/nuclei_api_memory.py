"""Peak memory of ``segment_nuclei(slide)`` over a whole dense slide, per source tree (#33).

Each ``--src`` runs in a fresh process (``PYTHONPATH=SRC``) that calls
``segment_nuclei(slide, segmenter=..., labels=...)`` and prints its peak RSS (``VmHWM``),
wall and CPU time, the nuclei and the outlines kept; the figures of every source tree
are printed side by side with the bytes of peak memory per nucleus. ``--labels false``
keeps outlines instead of the label image, as ``labels="auto"`` does past 1 GiB of labels
(a slide the size of the issue's), so a small slide shows the per-nucleus cost.

Usage::

    python benchmarks/nuclei_api_memory.py SLIDE --src src,/work/main/src [--labels false]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def child(slide: str, segmenter: str, labels: str) -> None:
    from napari_slidescope import segment_nuclei

    c0, t0 = time.process_time(), time.perf_counter()
    lab: bool | str = {"true": True, "false": False}.get(labels, labels)
    res = segment_nuclei(slide, segmenter=segmenter, labels=lab)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    outlines = 0 if res.outlines is None else len(res.outlines[0])
    print(
        json.dumps(
            {
                "peak_mib": peak,
                "wall": time.perf_counter() - t0,
                "cpu": time.process_time() - c0,
                "nuclei": res.count,
                "outlines": outlines,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slide")
    ap.add_argument("--src", default="src")
    ap.add_argument("--segmenter", default="builtin")
    ap.add_argument("--labels", default="false", help="true, false or auto")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.slide, a.segmenter, a.labels)
        return
    print(f"load at start: {os.getloadavg()}")
    print("| source | peak RSS MiB | wall s | CPU s | nuclei | outlines | peak KiB / nucleus |")
    print("|---|---|---|---|---|---|---|")
    for src in a.src.split(","):
        env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "PYTHONWARNINGS": "ignore"}
        cmd = [
            sys.executable,
            __file__,
            a.slide,
            "--child",
            "--segmenter",
            a.segmenter,
            "--labels",
            a.labels,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {src} | {r['peak_mib']:.0f} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['nuclei']} | "
            f"{r['outlines']} | {1024 * r['peak_mib'] / max(r['nuclei'], 1):.1f} |",
            flush=True,
        )
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
