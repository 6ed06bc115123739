"""The batch client's ``nuclei.geojson.gz`` features: per-nucleus ``json.dumps`` against bulk (#33).

``slidescope batch`` writes each tile's nuclei into ``nuclei.geojson.gz`` in the client
process as the tiles finish (``NucleiStream``; ``write_nuclei`` when it joins at the end).
Before, each nucleus was a ``polygon_feature`` dict passed to ``json.dumps`` (reproduced
here as the baseline, the code the tests compare against); now a tile's features are
formatted at once (``batch.outputs.nuclei.features_text``). The nuclei are real: the
built-in segmenter's on CMU-1-Small-Region (``exports_million.py``'s seed, made once),
copied and shifted until ``--nuclei`` of them, as one tile of that many nuclei.

Prints, interleaved ``--runs`` times, the CPU seconds of each (texts checked equal), the
CPU-µs per nucleus, the ratio, the cost of gzip level 6 (what the batch writes) on the
same text, and the load average.

Usage::

    PYTHONPATH=src python benchmarks/batch_geojson_features.py [--nuclei 20000 --runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def per_feature(ids, rings, measures, ns) -> str:  # type: ignore[no-untyped-def]
    """The previous writer: a ``polygon_feature`` dict and ``json.dumps`` per nucleus."""
    from napari_slidescope.analysis.geojson import polygon_feature
    from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR

    out = []
    for k in range(len(ids)):
        meas = {c: float(v[k]) for c, v in measures.items()}
        meas["id"] = float(ids[k])
        feature = polygon_feature(
            rings[k][:-1, ::-1],
            name="Nucleus",
            color=NUCLEUS_COLOR,
            object_type="detection",
            measurements=meas,
            feature_id=str(uuid.uuid5(ns, str(int(ids[k])))),
        )
        out.append(("," if k else "") + "\n" + json.dumps(feature))
    return "".join(out)


def main() -> None:
    import exports_million as em
    from napari_slidescope.analysis.phenotypes import NUCLEUS_COLOR
    from napari_slidescope.batch.outputs.nuclei import features_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nuclei", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default=None, help="folder for the seed")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="batch-geojson-"))
    seed = work / "seed.npz"
    if not seed.exists():
        em.make_seed(seed)
    res = em.build(seed, a.nuclei)
    polys, ids = res.outlines  # type: ignore[attr-defined]
    rings = [np.vstack([p[:, ::-1], p[:1, ::-1]]) for p in polys]  # closed (x, y), as WKB
    cols = res.columns  # type: ignore[attr-defined]
    measures = {c: np.asarray(v) for c, v in cols.items() if c != "id"}
    ns = uuid.uuid5(uuid.NAMESPACE_URL, "bench")
    colors = {"Nucleus": NUCLEUS_COLOR}
    cpu: dict[str, list[float]] = {"per-feature": [], "bulk": []}
    text = ""
    for r in range(a.runs):
        for name in ("per-feature", "bulk") if r % 2 == 0 else ("bulk", "per-feature"):
            c0 = time.process_time()
            if name == "bulk":
                got = features_text(ids, rings, measures, ns=ns, colors=colors, first=True)
            else:
                got = per_feature(ids, rings, measures, ns)
            cpu[name].append(time.process_time() - c0)
            if text and got != text:
                raise SystemExit("the two writers' texts differ")
            text = got
        print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} CPU-s" for k, v in cpu.items()))
    data = text.encode("ascii")
    c0 = time.process_time()
    zlib.compress(data, 6)
    gz = time.process_time() - c0
    med = {k: statistics.median(v) for k, v in cpu.items()}
    n = len(ids)
    print(f"\n{n:,} nuclei, {len(data) / 2**20:.0f} MiB of text, medians of {a.runs}:")
    for k, v in med.items():
        print(f"  {k:12s} {v:7.2f} CPU-s  {1e6 * v / n:7.1f} CPU-us / nucleus")
    print(f"  ratio per-feature / bulk: {med['per-feature'] / med['bulk']:.1f}x")
    print(f"  gzip level 6 of the text (both): {gz:.2f} CPU-s, {1e6 * gz / n:.1f} CPU-us / nucleus")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
