"""Exports of a million nuclei: to_geojson / to_csv / to_geoparquet, today's code against ours.

How the result is made (cheaply, the same for both codes): the built-in segmenter runs
once on CMU-1-Small-Region.svs (2,970 nuclei, outlines kept: ``labels=False``), and its
nuclei are replicated on a grid of copies, each copy's outlines and centroids shifted by
the copy's offset (level-0 px) and its ids renumbered, until the result holds
``--nuclei`` nuclei (a ``NucleiResult`` with ``labels=None`` and outlines, as a
whole-slide run gives). Each write runs in its own subprocess (the code under test on
``PYTHONPATH``), interleaved run by run: ours (this checkout's ``src``) at ``--nuclei``,
and the baseline (``--baseline``, e.g. ``/work/main/src``) at ``--baseline-nuclei``
(today's GeoJSON writer takes ~100 s per million) and ours at that size too, for a
same-size ratio. Prints per code, format and size the median seconds of ``--runs`` runs,
seconds per million nuclei (wall and CPU: the machine is shared), the median peak RSS
growth during the write (sampled every 10 ms) and the file size; the ratios baseline /
ours; and the load average.

Usage::

    PYTHONPATH=src python benchmarks/exports_million.py --baseline /work/main/src \\
        --nuclei 1000000 --baseline-nuclei 200000 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLIDE = Path(os.environ.get("SLIDESCOPE_TESTDATA", HERE.parents[1] / "shared" / "testdata")) / (
    "CMU-1-Small-Region.svs"
)
FORMATS = {"geojson": "to_geojson", "csv": "to_csv", "geoparquet": "to_geoparquet"}
SUFFIX = {"geojson": ".geojson", "csv": ".csv", "geoparquet": ".parquet"}


def make_seed(path: Path) -> None:
    """Segment the seed slide once; keep its outlines and table (npz)."""
    import numpy as np

    from napari_slidescope.pipeline.nuclei import segment_nuclei

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = segment_nuclei(str(SLIDE), segmenter="builtin", labels=False)
    polys, ids = res.outlines_of("nuclei")
    lens = np.array([len(p) for p in polys])
    np.savez(
        path,
        points=np.concatenate(polys),
        lens=lens,
        ids=ids,
        region=np.array(res.region),
        mpp=np.array(res.mpp, float),
        **{f"col_{k}": np.asarray(v) for k, v in res.columns.items()},
    )


def build(seed: Path, n: int) -> object:
    """A NucleiResult of `n` nuclei: copies of the seed's, shifted on a grid."""
    import numpy as np

    from napari_slidescope.pipeline.nuclei_result import NucleiResult

    z = np.load(seed)
    points, lens, ids = z["points"], z["lens"], z["ids"]
    y0, x0, y1, x1 = (int(v) for v in z["region"])
    h, w = y1 - y0, x1 - x0
    base = np.split(points, np.cumsum(lens)[:-1])
    table0 = {k[4:]: z[k] for k in z.files if k.startswith("col_")}
    order = np.argsort(table0["id"])
    row_of = order[np.searchsorted(table0["id"][order], ids)]
    k = len(base)
    copies = -(-n // k)
    side = int(np.ceil(np.sqrt(copies)))
    polys: list = []
    new_ids, rows, dys, dxs = [], [], [], []
    for c in range(copies):
        dy, dx = (c // side) * h, (c % side) * w
        take = min(k, n - c * k)
        off = np.array([dy, dx], float)
        polys.extend(p + off for p in base[:take])
        new_ids.append(ids[:take] + c * 100_000)
        rows.append(row_of[:take])
        dys.append(np.full(take, dy, float))
        dxs.append(np.full(take, dx, float))
    rows_a, dy_a, dx_a = np.concatenate(rows), np.concatenate(dys), np.concatenate(dxs)
    mpp = float(z["mpp"].ravel()[0])
    table = {c: v[rows_a] for c, v in table0.items()}
    table["id"] = np.concatenate(new_ids).astype(table0["id"].dtype)
    table["centroid_row"] = table["centroid_row"] + dy_a
    table["centroid_col"] = table["centroid_col"] + dx_a
    table["centroid_y_um"] = table["centroid_y_um"] + dy_a * mpp
    table["centroid_x_um"] = table["centroid_x_um"] + dx_a * mpp
    return NucleiResult(
        labels=None, mpp=mpp, origin=(0, 0), downsample=(1.0, 1.0), count=n, columns=table,
        region=(0, 0, side * h, side * w), segmenter="builtin",
        outlines=(polys, np.concatenate(new_ids)),
    )  # fmt: skip


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(seed: Path, n: int, fmt: str, out: Path) -> None:
    """Build the result, write it once, print seconds and peak RSS growth (JSON)."""
    res = build(seed, n)
    start, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0, c0 = time.perf_counter(), time.process_time()
    getattr(res, FORMATS[fmt])(out)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    done.set()
    t.join()
    peak[0] = max(peak[0], _rss())
    print(json.dumps({"s": seconds, "cpu": cpu, "peak_mib": (peak[0] - start) / 2**20,
                      "mib": out.stat().st_size / 2**20}))  # fmt: skip
    out.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="the src folder of the code to compare against")
    ap.add_argument("--ours", default=str(HERE.parent / "src"), help="our src folder")
    ap.add_argument("--nuclei", type=int, default=1_000_000)
    ap.add_argument("--baseline-nuclei", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--formats", default="geojson,csv,geoparquet")
    ap.add_argument("--work", default=None, help="folder for the seed and outputs")
    ap.add_argument("--child", nargs=4, metavar=("SEED", "N", "FORMAT", "OUT"))
    a = ap.parse_args()
    if a.child:
        child(Path(a.child[0]), int(a.child[1]), a.child[2], Path(a.child[3]))
        return
    if not a.baseline:
        ap.error("--baseline SRC is required: the src folder of the code to compare against")
    work = Path(a.work or tempfile.mkdtemp(prefix="exports-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    seed = work / "seed.npz"
    if not seed.exists():
        make_seed(seed)
    ours = str(Path(a.ours).resolve())
    formats = a.formats.split(",")
    cases = []
    for fmt in formats:
        cases.append(("ours", ours, a.nuclei, fmt))
        if a.baseline_nuclei != a.nuclei:
            cases.append(("ours", ours, a.baseline_nuclei, fmt))
        if fmt != "geoparquet":  # today's NucleiResult has no GeoParquet writer
            cases.append(("baseline", a.baseline, a.baseline_nuclei, fmt))
    results: dict[tuple, list[dict]] = {}
    for r in range(a.runs):
        for name, src, n, fmt in cases[r % len(cases) :] + cases[: r % len(cases)]:
            env = dict(os.environ, PYTHONPATH=src)
            out = work / f"out{SUFFIX[fmt]}"
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(seed), str(n), fmt, str(out)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            results.setdefault((name, n, fmt), []).append(json.loads(proc.stdout.splitlines()[-1]))
            print(f"run {r + 1}: {name:8s} {fmt:10s} {n:>9,} {results[(name, n, fmt)][-1]}",
                  flush=True)  # fmt: skip
    print(f"\nload average (1, 5, 15 min): {os.getloadavg()}")
    print(f"{'code':8s} {'format':10s} {'nuclei':>9s} {'median s':>9s} {'s/million':>9s} "
          f"{'CPU s/M':>9s} {'peak MiB':>9s} {'file MiB':>9s}")  # fmt: skip
    per_million, cpu_million = {}, {}
    for (name, n, fmt), runs in results.items():
        s = statistics.median(x["s"] for x in runs)
        cpu = statistics.median(x["cpu"] for x in runs)
        mem = statistics.median(x["peak_mib"] for x in runs)
        per_million[(name, n, fmt)] = s / n * 1e6
        cpu_million[(name, n, fmt)] = cpu / n * 1e6
        print(f"{name:8s} {fmt:10s} {n:>9,} {s:9.2f} {s / n * 1e6:9.2f} {cpu / n * 1e6:9.2f} "
              f"{mem:9.0f} {runs[0]['mib']:9.0f}")  # fmt: skip
    for fmt in formats:
        base = per_million.get(("baseline", a.baseline_nuclei, fmt))
        base_cpu = cpu_million.get(("baseline", a.baseline_nuclei, fmt))
        for n in sorted({a.nuclei, a.baseline_nuclei}):
            mine = per_million.get(("ours", n, fmt))
            if base and base_cpu and mine:
                mine_cpu = cpu_million[("ours", n, fmt)]
                print(f"{fmt}: baseline at {a.baseline_nuclei:,} / ours at {n:,} per million: "
                      f"{base / mine:.1f}x wall, {base_cpu / mine_cpu:.1f}x CPU")  # fmt: skip


if __name__ == "__main__":
    main()
