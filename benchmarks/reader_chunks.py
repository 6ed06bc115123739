"""Cost of the dask graph: one viewport on a level of ~10k vs ~1M chunks, and open times.

Ours (one native tile per chunk, and default 4 MiB chunks) against plain ``dask.from_zarr``
over tifffile's store; then the time to open slides of 10k, 302k and 1M tiles, ours against
OpenSlide and tiffslide, with tifffile's own parse measured alone. Run by
``reader_speed.py`` (its "1M-chunk" and "open" rows), or alone::

    python benchmarks/reader_chunks.py [--regions 60] [--size 1024]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402
from _common import med_ms, rotate, warm_page_cache  # noqa: E402
from _readers import READERS  # noqa: E402


def bench_open(path: Path, names: list[str], repeats: int) -> dict:
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        for n in rotate(names, i):
            gc.collect()
            t0 = time.perf_counter()
            r = READERS[n](path)
            times[n].append(time.perf_counter() - t0)
            r.close()
    return {n: med_ms(v) for n, v in times.items()}


def bench_many_chunks(args: argparse.Namespace) -> dict:
    """One viewport on a level of ~10k vs ~1M dask chunks (one native tile per chunk)."""
    import dask.array as da
    import tifffile
    import zarr

    from napari_slidescope import open_slide
    from napari_slidescope.slide.cache import tile_cache

    tile_bytes = 256 * 256 * 3
    paths = {"10k": _slides.many_tiles(100), "1M": _slides.many_tiles(1024)}
    for p in paths.values():
        warm_page_cache(p)
    out: dict[str, Any] = {}
    s = args.size
    opened = {k: open_slide(p, chunk_bytes=tile_bytes) for k, p in paths.items()}
    default = {k: open_slide(p) for k, p in paths.items()}
    tifs = {k: tifffile.TiffFile(p) for k, p in paths.items()}
    plain = {}
    for k, t in tifs.items():
        z = zarr.open(t.series[0].aszarr(), mode="r")
        plain[k] = da.from_zarr(z, chunks=(256, 256, 3))
    n = max(10, args.regions // 2)
    arrays = {
        "ours, 1 tile per chunk": {k: v.levels[0] for k, v in opened.items()},
        "ours, default 4 MiB chunks": {k: v.levels[0] for k, v in default.items()},
        "dask.from_zarr, 1 tile per chunk": plain,
    }
    cases = [(label, k) for label in arrays for k in paths]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    rng = np.random.default_rng(4000)
    for i in range(n):
        for label, k in rotate(cases, i):
            if label.startswith("dask") and i >= 5:  # ~1 s a viewport on the 1M level
                continue
            arr = arrays[label][k]
            hh, ww = arr.shape[:2]
            y, x = int(rng.integers(0, hh - s)), int(rng.integers(0, ww - s))
            tile_cache().clear()
            t0 = time.perf_counter()
            np.asarray(arr[y : y + s, x : x + s])
            times[(label, k)].append(time.perf_counter() - t0)
    rows: dict[str, list[float]] = {}
    for (label, k), ts in times.items():
        rows[f"{label} | {k}"] = [med_ms(ts), int(np.prod(arrays[label][k].numblocks)), len(ts)]
    out["viewport"] = rows
    for v in (*opened.values(), *default.values()):
        v.close()
    for t in tifs.values():
        t.close()
    opens = {}
    # 550 x 550 tiles = 140800 x 140800 px: the pixel count of the largest real slides
    # (200k x 100k), so its open time is what a user can meet
    paths = {"10k": paths["10k"], "302k": _slides.many_tiles(550), "1M": paths["1M"]}
    for k, p in paths.items():
        warm_page_cache(p)
        opens[k] = bench_open(p, ["ours", "openslide", "tiffslide"], 7)
        # ours split: tifffile's own parse vs the rest
        ts = []
        for _ in range(7):
            gc.collect()
            t0 = time.perf_counter()
            tifffile.TiffFile(p).close()
            ts.append(time.perf_counter() - t0)
        opens[k]["tifffile.TiffFile alone"] = med_ms(ts)
    out["open"] = opens
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", type=int, default=60, help="viewports (default 60)")
    ap.add_argument("--size", type=int, default=1024, help="viewport side in px (default 1024)")
    print(json.dumps(bench_many_chunks(ap.parse_args(argv)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
