"""Cold start: a fresh process imports the package, opens a slide and detects its tissue.

Each repetition is a new Python process (nothing cached but the file in the page cache),
timing ``import napari_slidescope``, ``open_slide`` and ``detect_tissue`` on the whole
slide, and listing which heavy modules the process ended up importing. Two versions of
the package, interleaved:

* **now**: the ``src`` folder next to this script;
* **before**: the same ``src`` at git revision ``--before`` (default: the commit before
  the cold-start work of issue 26, whose open imported dask.array and zarr), extracted
  with ``git archive`` into a temporary folder.

Both must give the same tissue (the mask's pixel count and area are printed per version).

Usage::

    python benchmarks/cold_start.py [--reps 5] [--slide PATH] [--before REV]

Default slide: the 30720 x 23040 NDPI-like ``_slides.ndpi_30k()``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: The revision measured as "before" unless --before says otherwise.
BEFORE = "b5c3229"

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import napari_slidescope as ns
t1 = time.perf_counter()
slide = ns.open_slide(sys.argv[1])
t2 = time.perf_counter()
tissue = ns.detect_tissue(slide)
t3 = time.perf_counter()
heavy = ("dask.array", "zarr", "distributed", "skimage.morphology")
print(t1 - t0, t2 - t1, t3 - t2, t3 - t0, tissue.area_um2, int(tissue.mask.sum()),
      ",".join(m for m in heavy if m in sys.modules) or "-")
"""


def _source_at(rev: str, into: Path) -> Path:
    """Extract ``src`` at git revision `rev` into `into`; return the folder to import from."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--slide", type=Path, default=None)
    ap.add_argument("--before", default=BEFORE, help="git revision measured as 'before'")
    args = ap.parse_args(argv)
    path = args.slide or _slides.ndpi_30k()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"now": ROOT / "src", "before": _source_at(args.before, Path(tmp))}
        modes = list(srcs)
        rows: dict[str, list[list[float]]] = {m: [] for m in modes}
        results: dict[str, set[tuple[int, int]]] = {m: set() for m in modes}
        imported: dict[str, set[str]] = {m: set() for m in modes}
        load0 = os.getloadavg()[0]
        for i in range(args.reps):
            for m in modes[i % 2 :] + modes[: i % 2]:
                env = dict(os.environ, PYTHONPATH=str(srcs[m]))
                out = subprocess.run(
                    [sys.executable, "-W", "ignore", "-c", CHILD, str(path)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                ).stdout.split()
                rows[m].append([float(v) for v in out[:4]])
                results[m].add((round(float(out[4])), int(out[5])))
                imported[m].add(out[6])
        load1 = os.getloadavg()[0]
    print(
        f"{path.name}, {args.reps} fresh processes per version, before = {args.before}, "
        f"load {load0:.1f} -> {load1:.1f}; median seconds"
    )
    print(
        f"{'version':>8} {'import':>7} {'open':>7} {'tissue':>7} {'total':>7}"
        "  (tissue µm², mask px)  heavy modules imported"
    )
    for m in modes:
        med = [statistics.median(col) for col in zip(*rows[m], strict=True)]
        print(
            f"{m:>8} "
            + " ".join(f"{v:7.3f}" for v in med)
            + f"  {sorted(results[m])}  {sorted(imported[m])}"
        )
    a = statistics.median(r[3] for r in rows["now"])
    b = statistics.median(r[3] for r in rows["before"])
    print(f"total, now / before: {a / b:.2f}; same tissue: {results['now'] == results['before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
