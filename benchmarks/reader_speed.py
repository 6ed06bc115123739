"""Viewport read speed of napari-slidescope against fastslide, OpenSlide, tiffslide, napari-tiff
and zarr.

Everything is measured in one run, readers interleaved region by region (the order rotates),
on big synthetic slides held in the page cache:

* **random**: random level-0 viewports (``--size`` px square);
* **pan**: 24 consecutive viewports each shifted by a quarter screen (8 right, 8 down,
  8 left), the first screen read untimed;
* **zoom**: a zoom-out through the levels at one centre, a viewport per level;
* **open**: opening the slide (the constructor, nothing read).

Readers: **ours** through the slide's dask levels (``np.asarray(level[y0:y1, x0:x1])``);
**ours-layer**, the napari layer path: the npe2 reader's layer data sliced inside napari's own
dask context (``configure_dask``), as napari's slice request reads it; **fastslide**
``read_region`` (C++, its own tile cache; level-native (x, y)); **openslide** ``read_region``
(its default tile cache, RGBA array); **tiffslide** ``read_region(..., as_array=True)``;
**napari-tiff**'s reader output (dask arrays, ``np.asarray`` of a slice, no napari dask cache);
**zarr** (plain zarr on the tifffile store, ``z[y0:y1, x0:x1]``); and the **floor**: one thread
decoding exactly the native chunks the viewport touches with ``TiffPage.decode`` on raw
segments read beforehand (untimed), i.e. the decode work with no overhead around it.

Then: the ~1M-chunk check (one viewport on a level of ~10k vs ~1M dask chunks, ours and
plain dask over zarr, and open times), and peak RSS while reading in a fresh process
against the decoded-tile cache bound.

Usage::

    python benchmarks/reader_speed.py [--regions 60] [--passes 3] [--size 1024]
        [--slides svs,ndpi,svs24,qptiff] [--busy 1] [--no-write] [--results benchmarks/RESULTS.md]

``--busy N`` runs N processes that each keep one core busy (a pure-Python loop, at the
same priority) for the whole run: "loaded" figures. ``svs24`` is the 24000 x 30000 SVS the
fastslide comparison was first reported on; ``qptiff`` is the shared ``small_vectra.qptiff``
(``$SLIDESCOPE_TESTDATA``), the one QPTIFF at hand.

The slides are written once into ``~/.cache/napari-slidescope/bench`` (see ``_slides.py``).
Results go to the "Reader speed" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slides  # noqa: E402
from _common import (  # noqa: E402
    fmt,
    level_map,
    log,
    machine,
    med_ms,
    pan_path,
    pass_summary,
    rotate,
    table,
    timed,
    versions,
    warm_page_cache,
    write_results,
)
from _readers import READERS, Reader  # noqa: E402
from reader_chunks import bench_many_chunks, bench_open  # noqa: E402
from reader_memory import CASES as RSS_CASES  # noqa: E402
from reader_memory import bench_rss  # noqa: E402

MARK_START, MARK_END = "<!-- reader-speed -->", "<!-- /reader-speed -->"
PEERS = ("fastslide", "openslide", "tiffslide", "napari-tiff", "zarr")


# --------------------------------------------------------------------------- scenarios


def warm_up(readers: dict[str, Reader], shape0: tuple[int, int], s: int) -> None:
    """Bring every reader to its steady state before measuring.

    Imports, thread pools and first allocations for all; then ours reads random viewports
    until its decoded-tile cache is full at its present limit (a cold process pays for
    faulting in the cache's memory once: see the memory section), OpenSlide likewise fills
    its 32 MiB cache. ``reader_fair.py`` measures without this warm-up.
    """
    from napari_slidescope.slide.cache import tile_cache

    rng = np.random.default_rng(999)
    h, w = shape0
    for r in readers.values():
        for _ in range(12):
            y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
            r.prepare(0, y, x, s, s)
            r.read(0, y, x, s, s)
    cache = tile_cache()
    for _ in range(400):
        # full at its present limit (it grows towards maxbytes only on re-reads of chunks
        # it evicted): from here on a new tile reuses an evicted one's slab
        if cache.nbytes >= 0.98 * cache.limit:
            break
        y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
        readers["ours"].read(0, y, x, s, s)


def bench_random(
    readers: dict[str, Reader], shape0: tuple[int, int], args: argparse.Namespace
) -> dict:
    h, w = shape0
    s = args.size
    names = list(readers)
    times: dict[str, list[list[float]]] = {n: [] for n in names}
    for p in range(args.passes):
        rng = np.random.default_rng(1000 + p)
        for n in names:
            times[n].append([])
        for i in range(args.regions):
            y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
            for n in rotate(names, i + p):
                times[n][p].append(timed(readers[n], 0, y, x, s, s))
    return {n: pass_summary(times[n]) for n in names}


def bench_pan(
    readers: dict[str, Reader], shape0: tuple[int, int], args: argparse.Namespace
) -> dict:
    h, w = shape0
    s = args.size
    names = [n for n in readers if n != "floor"]
    times: dict[str, list[list[float]]] = {n: [] for n in names}
    if h - s - 8 * (s // 4) <= 0 or w - s - 8 * (s // 4) <= 0:
        return {}  # too small a slide for a pan sequence of this viewport size
    for p in range(args.passes):
        rng = np.random.default_rng(2000 + p)
        y0 = int(rng.integers(0, h - s - 8 * (s // 4)))
        x0 = int(rng.integers(0, w - s - 8 * (s // 4)))
        path = pan_path(y0, x0, s)
        for n in rotate(names, p):
            r = readers[n]
            r.read(0, path[0][0], path[0][1], s, s)  # the first screen, untimed
            times[n].append([timed(r, 0, y, x, s, s) for y, x in path[1:]])
    return {n: pass_summary(times[n]) for n in names}


def bench_zoom(readers: dict[str, Reader], args: argparse.Namespace) -> dict:
    ours = readers["ours"].levels()
    lmap = level_map(readers)
    names = list(readers)
    s = args.size
    per_level: dict[str, list[list[float]]] = {n: [[] for _ in ours] for n in names}
    h0, w0 = ours[0]
    for p in range(args.passes):
        rng = np.random.default_rng(3000 + p)
        cy, cx = int(rng.integers(h0 // 4, 3 * h0 // 4)), int(rng.integers(w0 // 4, 3 * w0 // 4))
        for n in rotate(names, p):
            r = readers[n]
            for lv, (lh, lw) in enumerate(ours):
                theirs = lmap[n][lv]
                if theirs is None:
                    continue
                vh, vw = min(s, lh), min(s, lw)
                y = min(max(round(cy * lh / h0) - vh // 2, 0), lh - vh)
                x = min(max(round(cx * lw / w0) - vw // 2, 0), lw - vw)
                per_level[n][lv].append(timed(r, theirs, y, x, vh, vw))
    out = {}
    for n in names:
        if all(per_level[n][lv] for lv in range(len(ours))):
            levels = [med_ms(v) for v in per_level[n]]
            out[n] = {"levels": levels, "total": sum(levels)}
    return out


def report(results: dict, args: argparse.Namespace, command: str, load: tuple, wall: float) -> str:
    out = [
        "## Reader speed",
        "",
        f"Command: `{command}`  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {wall / 60:.1f} min; "
        f"machine: {machine()}; load average {load[0]:.1f} at start, {load[1]:.1f} at end "
        "(**the machine was shared with other engineers' jobs while this ran**: absolute "
        "numbers drift by tens of per cent between runs; the readers were interleaved region "
        "by region, so the ratios are the figures to read).  ",
        f"Versions: {versions()}.",
        "",
        f"Busy cores: {args.busy} (`--busy`: processes each spinning a pure-Python loop at "
        "normal priority for the whole run).  ",
        "",
        f"Viewports are {args.size} x {args.size} px (RGB), files in the page cache. Times are "
        f"milliseconds, the median of {args.passes} pass medians (lowest-highest pass median in "
        "brackets); `x ours` is the reader's median over ours (above 1: ours is faster). "
        "Ours and OpenSlide keep their default decoded-tile caches (ours 256 MiB, OpenSlide "
        "32 MiB), both filled by a warm-up before measuring (steady state); napari-tiff is "
        "read without napari's dask cache. The floor decodes on one core; ours and "
        "the others may use both (ours decodes a viewport's missing tiles on every core).",
        "",
    ]
    for key, res in results.items():
        if key in ("many", "rss"):
            continue
        title = {
            "svs": "SVS-like 40000 x 40000, 256 x 256 JPEG tiles (`svs_40k.svs`)",
            "ndpi": "NDPI-like 30720 x 23040, one JPEG per level, restart bands 8 x 3840 px "
            "(`ndpi_30k.ndpi`)",
            "svs24": "SVS-like 24000 x 30000, 256 x 256 JPEG tiles (`svs_24k.svs`)",
            "qptiff": "QPTIFF `small_vectra.qptiff` (shared test data), 3 x 1440 x 1920, one level",
        }[key]
        out += [f"### {title}", ""]
        rnd, pan, zoom, opn = res["random"], res["pan"], res["zoom"], res["open"]
        ours_r = rnd["ours"]["median"]
        ours_p = pan["ours"]["median"] if pan else float("nan")
        rows = []
        for n in READERS:
            if n not in rnd:
                continue
            r = rnd[n]
            p = pan.get(n)
            z = zoom.get(n)
            rows.append(
                [
                    f"**{n}**" if n == "ours" else n,
                    f"{fmt(r['median'])} ({fmt(r['lo'])}-{fmt(r['hi'])})",
                    f"{r['median'] / ours_r:.2f}",
                    f"{fmt(p['median'])} ({fmt(p['lo'])}-{fmt(p['hi'])})" if p else "-",
                    f"{p['median'] / ours_p:.2f}" if p else "-",
                    fmt(z["total"]) if z else "-",
                    fmt(opn[n]) if n in opn else "-",
                ]
            )
        out += [
            table(
                rows,
                [
                    "reader",
                    "random viewport ms",
                    "x ours",
                    "pan step ms",
                    "x ours",
                    "zoom-out, all levels ms",
                    "open ms",
                ],
            ),
            "",
        ]
        zl = [[n] + [fmt(v) for v in z["levels"]] for n, z in zoom.items()]
        nlev = len(next(iter(zoom.values()))["levels"])
        out += [
            "Zoom-out per level (ms, median over passes):",
            "",
            table(zl, ["reader"] + [f"level {i}" for i in range(nlev)]),
            "",
        ]
        out += target_lines(key, rnd, pan) + [""]
    if "many" in results:
        m = results["many"]
        out += [
            "### ~1M-chunk level",
            "",
            "One-level BigTIFFs of 256 x 256 JPEG tiles (`tiles_10k.tif`: 25600 x 25600 px, "
            "10 000 tiles; `tiles_1m.tif`: 262144 x 262144 px, 1 048 576 tiles; the tile "
            "table cycles over 256 real tiles, so decode work per viewport is the same). "
            "Tile cache cleared before each viewport.",
            "",
        ]
        rows = [
            [k.split(" | ")[0], k.split(" | ")[1], str(v[1]), fmt(v[0]), str(v[2])]
            for k, v in m["viewport"].items()
        ]
        out += [table(rows, ["array", "file", "dask chunks", "viewport ms", "viewports"]), ""]
        v = m["viewport"]
        for label in ("ours, 1 tile per chunk", "ours, default 4 MiB chunks"):
            ratio = v[f"{label} | 1M"][0] / v[f"{label} | 10k"][0]
            out.append(
                f"- {label}: 1M / 10k = **{ratio:.2f}** (target <= 1.2: "
                f"{'met' if ratio <= 1.2 else 'NOT met'})"
            )
        out.append("")
        rows = [
            [k]
            + [
                fmt(o.get(n, float("nan")))
                for n in ("ours", "tifffile.TiffFile alone", "openslide", "tiffslide")
            ]
            for k, o in m["open"].items()
        ]
        out += [
            "Open (ms):",
            "",
            table(rows, ["file", "ours", "of which tifffile.TiffFile", "openslide", "tiffslide"]),
            "",
            "`tiles_550.tif` (140800 x 140800 px, 302 500 tiles) has the pixel count of the "
            "largest real slides (200k x 100k px).",
            "",
        ]
        for k, o in m["open"].items():
            ok = o["ours"] < 50
            out.append(
                f"- open, {k} tiles: **{fmt(o['ours'])} ms** (target < 50: "
                f"{'met' if ok else 'NOT met'})"
            )
        out.append("")
    if "rss" in results:
        out += [
            "### Memory while reading",
            "",
            f"Fresh process per row: open the SVS, read {max(20, args.regions)} random "
            "starts x 9 pan steps through the layer's dask array; RSS sampled every 2 ms.",
            "",
        ]
        rows = []
        for r in results["rss"]:
            extra = (r["peak"] - r["base"]) / 2**20
            rows.append(
                [
                    f"{r['bound'] / 2**20:.0f}",
                    r["env"],
                    f"{r['base'] / 2**20:.0f}",
                    f"{r['peak'] / 2**20:.0f}",
                    f"{extra:.0f}",
                    f"{extra - r['bound'] / 2**20:.0f}",
                    f"{r['cached'] / 2**20:.0f}",
                    f"{fmt(r['growing'])} ({r['n_growing']})",
                    f"{fmt(r['full'])} ({r['n_full']})",
                ]
            )
        out += [
            table(
                rows,
                [
                    "cache bound MiB",
                    "environment",
                    "RSS after open MiB",
                    "peak RSS MiB",
                    "peak - open MiB",
                    "over the bound MiB",
                    "cache held at end MiB",
                    "step ms while the cache grows (n)",
                    "step ms once full (n)",
                ],
            ),
            "",
            "A step is one viewport of the pan sequences (3 of 4 quarter-columns cached on most "
            "steps). While the cache grows, every decoded tile lands in fresh memory the "
            "kernel must fault in (about 2 µs per 4 KiB page here, i.e. ~100 µs per 256 x 256 "
            "RGB tile); once full, an evicted tile's slab is reused for the next one. The "
            "cache copies every tile into a memory map of its own, so a tile decoded on a "
            "pool thread does not stay in that thread's malloc arena once evicted; what RSS "
            "holds beyond the bound is the viewport being assembled and the decoders' "
            "scratch. The `MALLOC_ARENA_MAX=1` rows (one malloc arena for every thread) "
            "check that the excess no longer depends on glibc's arenas.",
            "",
        ]
    return "\n".join(out)


def target_lines(key: str, rnd: dict, pan: dict) -> list[str]:
    ours = rnd["ours"]["median"]
    peers = {n: rnd[n]["median"] for n in PEERS if n in rnd}
    fastest = min(peers, key=peers.get) if peers else None
    lines = ["Targets:"]

    def line(text: str, value: float, limit: float) -> None:
        verdict = "met" if value <= limit else "NOT met"
        lines.append(f"- {text}: **{value:.2f}** (target <= {limit}: {verdict})")

    if fastest:
        line(f"random viewport, ours / fastest peer ({fastest})", ours / peers[fastest], 1.0)
    if "fastslide" in rnd:
        line("random viewport, ours / fastslide", ours / rnd["fastslide"]["median"], 1.0)
        if "ours-layer" in rnd:
            line(
                "random viewport, ours-layer (napari path) / fastslide",
                rnd["ours-layer"]["median"] / rnd["fastslide"]["median"],
                1.0,
            )
        if "fastslide" in pan:
            ratio = pan["ours"]["median"] / pan["fastslide"]["median"]
            line("pan step, ours / fastslide", ratio, 1.0)
    if key == "svs" and "floor" in rnd:
        line("random viewport, ours / single-core decode floor", ours / rnd["floor"]["median"], 1.5)
    if "openslide" in rnd and key == "ndpi":
        line("random viewport, ours / OpenSlide", ours / rnd["openslide"]["median"], 1.0)
    if "openslide" in pan:
        line(
            "pan step, ours / OpenSlide",
            pan["ours"]["median"] / pan["openslide"]["median"],
            0.5 if key == "svs" else 1.0,
        )
    return lines


# --------------------------------------------------------------------------- main


def run_slide(key: str, path: Path, args: argparse.Namespace) -> dict:
    log(f"== {key}: {path}")
    warm_page_cache(path)
    names = [n for n in READERS if n in args.readers]
    if key == "qptiff":  # the others cannot open it or read (C, Y, X) levels as (Y, X, S)
        names = [n for n in names if n in ("ours", "ours-layer", "fastslide")]
    readers = {n: READERS[n](path) for n in names}
    shape0 = readers["ours"].levels()[0]
    warm_up(readers, shape0, args.size)
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    res["random"] = bench_random(readers, shape0, args)
    log(
        f"   random done in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{n} {v['median']:.1f}" for n, v in res["random"].items())
    )
    t0 = time.perf_counter()
    res["pan"] = bench_pan(readers, shape0, args)
    log(
        f"   pan done in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{n} {v['median']:.1f}" for n, v in res["pan"].items())
    )
    res["zoom"] = bench_zoom(readers, args)
    for r in readers.values():
        r.close()
    res["open"] = bench_open(path, [n for n in names if n != "floor"], 7)
    log("   zoom and open done")
    return res


def _shared_qptiff() -> Path:
    root = os.environ.get("SLIDESCOPE_TESTDATA")
    path = Path(root or "") / "small_vectra.qptiff"
    if not root or not path.is_file():
        raise SystemExit("qptiff: set SLIDESCOPE_TESTDATA to the shared testdata folder")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--regions", type=int, default=60, help="random viewports per pass (default 60)"
    )
    ap.add_argument("--passes", type=int, default=3, help="passes (default 3)")
    ap.add_argument("--size", type=int, default=1024, help="viewport side in px (default 1024)")
    ap.add_argument("--slides", default="svs,ndpi", help="comma list of svs, ndpi")
    ap.add_argument("--readers", default=",".join(READERS), help="comma list of readers")
    ap.add_argument("--skip", default="", help="comma list of: many, rss")
    ap.add_argument(
        "--busy", type=int, default=0, help="processes keeping a core busy during the run"
    )
    ap.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.readers = set(args.readers.split(",")) | {"ours"}
    command = "python benchmarks/reader_speed.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    slides = {
        "svs": _slides.svs_40k,
        "ndpi": _slides.ndpi_30k,
        "svs24": _slides.svs_24k,
        "qptiff": _shared_qptiff,
    }
    results: dict[str, Any] = {}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for key in [k for k in args.slides.split(",") if k]:
            results[key] = run_slide(key, slides[key](), args)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    skip = set(args.skip.split(","))
    if "many" not in skip:
        results["many"] = bench_many_chunks(args)
        log("   1M-chunk check done")
    if "rss" not in skip:
        results["rss"] = bench_rss(
            _slides.svs_40k(),
            RSS_CASES,
            args,
        )
        log("   RSS check done")
    text = report(
        results, args, command.strip(), (load0, os.getloadavg()[0]), time.perf_counter() - t_start
    )
    print(text)
    if not args.no_write:
        write_results(args.results, text, MARK_START, MARK_END)
        log(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
