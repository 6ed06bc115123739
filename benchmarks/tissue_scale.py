"""Whole-slide tissue detection at scanner size: this src against a baseline, interleaved.

For each slide and run, one fresh process per code (``python this.py --worker``, with
``PYTHONPATH`` set to that code's ``src``) imports the package, opens the slide and runs
``detect_tissue`` once. The worker reports

* **after open**: ``detect_tissue``'s wall time in the process that has opened the slide;
* **fresh**: from the process's creation to the end of ``detect_tissue`` (interpreter
  start, imports, open, detection);
* **peak growth**: the process's peak RSS during ``detect_tissue`` (a thread sampling
  ``psutil`` every 5 ms, and ``ru_maxrss``) minus its RSS just before;
* **CPU**: the process's CPU seconds (all threads) during ``detect_tissue``, a figure a
  busy machine inflates less than the wall time;
* **outlines**: the time to then read the result's ``polygons`` and ``holes`` (traced
  when first asked for after 8973cc3; about nothing for a code that traced them in
  ``detect_tissue``);

and saves the mask. The parent prints medians over the runs (the codes alternate in
each run), their ratios, whether the masks are identical, the IoU of the masks against
each other (on the baseline's grid) and, for the generated slides with a ``.truth.npz``,
against the true tissue map.
The load average is printed at the start and end: the machine may be busy.

Usage::

    python benchmarks/tissue_scale.py /work/bench-data/huge.svs --runs 5
    python benchmarks/tissue_scale.py SLIDE --ours SRC --base SRC   # any two src folders
    python benchmarks/tissue_scale.py --shared --runs 1             # the shared test slides

``--base`` defaults to ``src`` at ``--before`` (git revision, default ``1a0715f``: main
before the scaled tissue read), extracted with ``git archive``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "1a0715f"
# ../shared beside the repository, or $SLIDESCOPE_TOOLS (the generators' huge_common.py)
TOOLS = Path(
    os.environ.get("SLIDESCOPE_TOOLS", Path(__file__).resolve().parents[2] / "shared" / "tools")
)
SHARED = [
    "CMU-1-Small-Region.svs",
    "TCGA-CR-7395-01A-01-TS1.svs",
    "openslide-python_small.svs",
    "small_vectra.qptiff",
    "test3-DAPI-2-387.ndpi",
    "test3-TRITC-2-560.ndpi",
]

WORKER = r"""
import json, resource, sys, threading, time, warnings
import numpy as np, psutil
warnings.simplefilter("ignore")
path, out = sys.argv[1], sys.argv[2]
proc = psutil.Process()
from napari_slidescope.slide import open_slide
from napari_slidescope.pipeline.tissue import detect_tissue
t = time.perf_counter()
slide = open_slide(path)
t_open = time.perf_counter() - t
rss0 = proc.memory_info().rss
peak = [rss0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.005)
th = threading.Thread(target=sample, daemon=True)
th.start()
c = proc.cpu_times()
t = time.perf_counter()
res = detect_tissue(slide)
t_detect = time.perf_counter() - t
c1 = proc.cpu_times()
cpu = (c1.user + c1.system) - (c.user + c.system)
fresh = time.time() - proc.create_time()
t = time.perf_counter()
n_outlines = len(res.polygons) + sum(len(h) for h in res.holes)  # traced when asked for
t_outlines = time.perf_counter() - t
done.set(); th.join()
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
growth = max(peak[0], maxrss) - rss0
np.savez(out, mask=res.mask, origin=np.array(res.origin, float),
         downsample=np.array(res.downsample, float))
print(json.dumps(dict(open=t_open, detect=t_detect, fresh=fresh, growth=growth, cpu=cpu,
    outlines=t_outlines, rings=n_outlines,
    level=res.level, mpp=res.mpp, shape=list(res.mask.shape), fraction=res.fraction)))
"""


def _source_at(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _run(src: Path, slide: Path, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(slide), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{src} on {slide}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _centres(n: int, origin: float, step: float) -> np.ndarray:
    return origin + (np.arange(n) + 0.5) * step


def _on_grid(mask: np.ndarray, origin, ds, cy: np.ndarray, cx: np.ndarray) -> np.ndarray:
    """`mask` sampled at level-0 points (nearest pixel; outside is False)."""
    iy = np.floor((cy - origin[0]) / ds[0]).astype(np.int64)
    ix = np.floor((cx - origin[1]) / ds[1]).astype(np.int64)
    okr = (iy >= 0) & (iy < mask.shape[0])
    okc = (ix >= 0) & (ix < mask.shape[1])
    out = np.zeros((cy.size, cx.size), bool)
    out[np.ix_(okr, okc)] = mask[np.ix_(iy[okr], ix[okc])]
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = (a | b).sum()
    return 1.0 if union == 0 else float((a & b).sum() / union)  # both empty: they agree


def _truth_on_grid(truth_path: Path, cy: np.ndarray, cx: np.ndarray) -> np.ndarray:
    sys.path.insert(0, str(TOOLS))
    from huge_common import Truth  # the generators' own tissue map

    truth = Truth(str(truth_path))
    by = np.clip(cy.astype(np.int64), 0, truth.H - 1) // truth.block
    bx = np.clip(cx.astype(np.int64), 0, truth.W - 1) // truth.block
    return truth.tissue[np.ix_(by, bx)]


def _load(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z = np.load(path)
    return z["mask"], z["origin"], z["downsample"]


def _compare(files: dict[str, Path], slide: Path) -> dict[str, float]:
    mb, ob, db = _load(files["base"])
    mo, oo, do = _load(files["ours"])
    cy, cx = _centres(mb.shape[0], ob[0], db[0]), _centres(mb.shape[1], ob[1], db[1])
    out = {"iou_ours_base": _iou(_on_grid(mo, oo, do, cy, cx), mb)}
    same_grid = mo.shape == mb.shape and np.array_equal(oo, ob) and np.array_equal(do, db)
    out["identical"] = float(same_grid and np.array_equal(mo, mb))  # 1.0: bit for bit
    truth = Path(str(slide) + ".truth.npz")
    if truth.is_file():
        for name, (m, o, d) in (("base", (mb, ob, db)), ("ours", (mo, oo, do))):
            ty, tx = _centres(m.shape[0], o[0], d[0]), _centres(m.shape[1], o[1], d[1])
            out[f"iou_{name}_truth"] = _iou(m, _truth_on_grid(truth, ty, tx))
    return out


def _load_average() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("slides", nargs="*", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ours", type=Path, default=ROOT / "src")
    ap.add_argument("--base", type=Path, default=None)
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--shared", action="store_true", help="also the shared test slides")
    args = ap.parse_args(argv)
    slides = list(args.slides)
    if args.shared:
        testdata = Path(os.environ.get("SLIDESCOPE_TESTDATA", TOOLS.parent / "testdata"))
        slides += [testdata / n for n in SHARED]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base or _source_at(args.before, Path(tmp))
        codes = {"ours": args.ours, "base": base}
        print(f"ours: {codes['ours']}\nbase: {codes['base']}")
        print(f"load average at start: {_load_average()}")
        for slide in slides:
            rows: dict[str, list[dict]] = {k: [] for k in codes}
            files = {k: Path(tmp) / f"{k}.npz" for k in codes}
            for run in range(args.runs):
                order = list(codes) if run % 2 == 0 else list(codes)[::-1]
                for name in order:
                    rows[name].append(_run(codes[name], slide, files[name]))
            print(f"\n{slide.name}  ({args.runs} runs each, interleaved)")
            med = {}
            for name, rs in rows.items():
                med[name] = {
                    k: statistics.median(r[k] for r in rs)
                    for k in ("open", "detect", "fresh", "growth", "cpu", "outlines")
                }
                r0 = rs[0]
                runs = ", ".join(f"{r['detect']:.2f}" for r in rs)
                print(
                    f"  {name:4s}: level {r0['level']}, {r0['mpp'] or 0:.2f} µm/px, mask "
                    f"{r0['shape'][0]} x {r0['shape'][1]}, fraction {r0['fraction']:.3f} | "
                    f"after open {med[name]['detect']:.3f} s ({med[name]['cpu']:.2f} CPU s), "
                    f"fresh {med[name]['fresh']:.3f} s, "
                    f"open {med[name]['open']:.3f} s, peak growth "
                    f"{med[name]['growth'] / 2**20:.0f} MiB, then outlines "
                    f"{med[name]['outlines']:.3f} s ({r0['rings']} rings)  "
                    f"(after-open runs: {runs})"
                )
            for k in ("detect", "cpu", "fresh", "growth"):
                ratio = med["base"][k] / max(med["ours"][k], 1e-9)
                print(f"  base / ours {k}: {ratio:.1f}x")
            for k, v in _compare(files, slide).items():
                print(f"  {k}: {v:.4f}")
        print(f"\nload average at end: {_load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
