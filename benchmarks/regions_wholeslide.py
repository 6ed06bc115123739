"""Tissue regions over whole slides: time, peak memory, throughput, and the live-update time.

Usage: python benchmarks/regions_wholeslide.py SYNTH.svs [SCANNER.svs ...] [--runs 5]
       python benchmarks/regions_wholeslide.py --classifier CLF.npz SCANNER.svs [--no-viewport]

SYNTH.svs is a slide of benchmarks/regions_data.py (its SYNTH.svs.truth.npz gives the
strokes: 5 per class, and the accuracy of the whole-slide map); the classifier trained on
it is saved and applied to every slide given (a scanner-size one shows time and memory
only: its content is not drawn from known regions). Each whole-slide run is a fresh child
process (python -c), so its peak resident memory (ru_maxrss) is its own; it prints wall
time, tiles, tissue working pixels classified and Mpx/s. Then viewport-sized regions
(256, 512 and 1024 working px square, tissue gating off, as a live preview would ask) are
timed on the synthetic slide: median of `--runs`, on a warm process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

CHILD = r"""
import json, resource, sys, time, threading
import numpy as np
from napari_slidescope import classify_regions, load_region_classifier, open_slide
clf = load_region_classifier(sys.argv[1])
slide = open_slide(sys.argv[2])
u0 = resource.getrusage(resource.RUSAGE_SELF)
rss0, cpu0 = u0.ru_maxrss, u0.ru_utime + u0.ru_stime
tiles = []
t0 = time.perf_counter()
def progress(p):
    tiles.append(p.total)
    if p.total and (p.done % max(1, p.total // 20) == 0):
        el = time.perf_counter() - t0
        print(f"  {p.done}/{p.total} tiles, {el:.0f} s", file=sys.stderr, flush=True)
region = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
rm = classify_regions(slide, clf, progress=progress, region=region)
dt = time.perf_counter() - t0
u = resource.getrusage(resource.RUSAGE_SELF)
out = {"seconds": dt, "cpu_seconds": u.ru_utime + u.ru_stime - cpu0,
       "tiles": tiles[-1] if tiles else 0, "shape": list(rm.labels.shape),
       "tissue_px": int((rm.labels > 0).sum()), "peak_rss_mib": resource.getrusage(
       resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mib": rss0 / 1024,
       "mpp": rm.mpp, "fractions": rm.fractions}
if len(sys.argv) > 3 and sys.argv[3]:
    np.save(sys.argv[3], rm.labels)
print(json.dumps(out))
"""


def main() -> None:
    from napari_slidescope import classify_regions, open_slide, train_region_classifier
    from regions_data import load_truth

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("synthetic")
    ap.add_argument("others", nargs="*")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--classifier", help="a saved classifier (else trained on SYNTH.svs)")
    ap.add_argument("--no-viewport", action="store_true")
    ap.add_argument(
        "--region", help="y0,x0,y1,x1: classify this level-0 box of the slides (not all of them)"
    )
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    tmp = Path(tempfile.mkdtemp())
    tpath = Path(a.synthetic + ".truth.npz")  # (the huge_* generators write another kind)
    has_truth = tpath.exists() and "labels" in np.load(tpath).files
    truth = load_truth(a.synthetic) if has_truth else None
    if a.classifier:
        from napari_slidescope import load_region_classifier

        clf = load_region_classifier(a.classifier)
        clf_path = Path(a.classifier)
    else:
        assert truth is not None, "SYNTH.svs needs its .truth.npz to train on"
        t0 = time.perf_counter()
        clf = train_region_classifier(a.synthetic, truth.example_lines(per_class=5, seed=0))
        print(f"training on 25 strokes: {time.perf_counter() - t0:.1f} s", flush=True)
        clf_path = clf.save(tmp / "clf.npz")
    for path in [a.synthetic, *a.others]:
        labels_out = str(tmp / "labels.npy") if path == a.synthetic and truth else None
        cmd = [sys.executable, "-c", CHILD, str(clf_path), path, labels_out or ""]
        if a.region:
            cmd.append(json.dumps([int(v) for v in a.region.split(",")]))
        run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if run.returncode:
            continue
        r = json.loads(run.stdout.strip().splitlines()[-1])
        mpx = r["tissue_px"] / 1e6
        print(
            f"{Path(path).name}: map {r['shape'][0]} x {r['shape'][1]} at {r['mpp']:.3f} µm/px, "
            f"{r['tiles']} tissue tiles, {mpx:.1f} Mpx of tissue classified "
            f"in {r['seconds']:.1f} s "
            f"({mpx / r['seconds']:.2f} Mpx/s; {r['cpu_seconds']:.1f} CPU s = "
            f"{mpx / r['cpu_seconds']:.2f} Mpx per CPU s); peak RSS {r['peak_rss_mib']:.0f} MiB "
            f"({r['rss_before_mib']:.0f} MiB after imports and open)",
            flush=True,
        )
        if labels_out and truth is not None:
            lab = np.load(labels_out)
            want = truth.grid(truth.shape[0] / lab.shape[0], lab.shape)
            ok = (want > 0) & (lab > 0)
            print(f"  accuracy on the tissue classified: {(lab[ok] == want[ok]).mean():.3f}")
    if a.no_viewport:
        print(f"load average at end: {os.getloadavg()}")
        return
    print("\nviewport-sized regions (tissue gating off), warm process:")
    slide = open_slide(a.synthetic)
    cy, cx = slide.shape0[0] // 2, slide.shape0[1] // 2
    ds = 2.0 / slide.mpp[0]
    for side in (256, 512, 1024):
        half = int(side * ds / 2)
        box = (cy - half, cx - half, cy + half, cx + half)
        times, cpus = [], []
        for k in range(a.runs + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            classify_regions(slide, clf, region=box, tissue=False)
            if k:  # the first warms the tile cache and the trees
                times.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
        med = statistics.median(times)
        cpu = statistics.median(cpus)
        print(
            f"  {side} x {side} working px ({side * 2 / 1000:.2f} mm square): median {med:.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}) = {side * side / med / 1e6:.2f} Mpx/s; "
            f"CPU {cpu:.2f} s (all threads)",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
