"""Open time and 1024 x 1024 viewport reads on scanner-sized NDPI files (issue 33).

Every reader runs in a fresh process per run (imports untimed; the slide's open and each
viewport read timed), in an order rotated from run to run, on the same random level-0
viewports (half of them past the first band beyond 4 GiB, half past x = 65535). Each
viewport is compared with the file's ground truth (``<file>.truth.npz``, read with
``huge_common.Truth`` from the generators' folder): a reader that returns other pixels is
reported with the number of viewports it got wrong.

Readers: ``ours`` (this checkout), ``main`` and ``main-openslide`` (the baseline checkout
given by ``--baseline-src``, with its tifffile backend and with ``backend="openslide"``,
the baseline's only way into these files), OpenSlide, tiffslide, napari-tiff, fastslide.

Usage::

    python benchmarks/ndpi_large.py /work/bench-data/huge.ndpi /work/bench-data/huge_nohigh.ndpi \
        --baseline-src /work/main/src --tools /work/shared/tools --runs 5 --boxes 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS_SRC = HERE.parent / "src"
READERS = ["ours", "main", "main-openslide", "openslide", "tiffslide", "napari-tiff", "fastslide"]
BOX = 1024


def _open(name: str, path: str):
    """(levels reader, read(y, x, h, w) -> RGB array, close) of one reader."""
    import warnings

    import numpy as np

    if name in ("ours", "main", "main-openslide"):
        from napari_slidescope import open_slide

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = {"backend": "openslide"} if name == "main-openslide" else {}
            slide = open_slide(path, **kw)
        lv = slide.levels[0]
        return (lambda y, x, h, w: np.asarray(lv[y : y + h, x : x + w])), slide.close
    if name == "openslide":
        import openslide

        osr = openslide.OpenSlide(path)
        return (
            lambda y, x, h, w: np.asarray(osr.read_region((x, y), 0, (w, h)))[:, :, :3]
        ), osr.close
    if name == "tiffslide":
        import tiffslide

        ts = tiffslide.TiffSlide(path)
        return (lambda y, x, h, w: ts.read_region((x, y), 0, (w, h), as_array=True)), ts.close
    if name == "napari-tiff":
        from napari_tiff.napari_tiff_reader import reader_function

        data = reader_function(path)[0][0]
        data = data if isinstance(data, list) else [data]
        return (lambda y, x, h, w: np.asarray(data[0][y : y + h, x : x + w])), lambda: None
    if name == "fastslide":
        import fastslide

        fs = fastslide.FastSlide.from_file_path(path)
        return (
            lambda y, x, h, w: np.asarray(fs.read_region((x, y), 0, (w, h)).numpy())[:, :, :3]
        ), fs.close
    raise ValueError(name)


def _preimport(name: str) -> None:
    import numpy  # noqa: F401

    if name in ("ours", "main", "main-openslide"):
        import dask.array  # noqa: F401
        import tifffile  # noqa: F401

        import napari_slidescope.slide  # noqa: F401
    if name in ("openslide", "main-openslide"):
        import openslide  # noqa: F401
    if name == "tiffslide":
        import tiffslide  # noqa: F401
    if name == "napari-tiff":
        import napari_tiff.napari_tiff_reader  # noqa: F401
    if name == "fastslide":
        import fastslide  # noqa: F401


def worker(name: str, path: str, boxes: list[list[int]], tools: str) -> dict:
    """Run one reader once in this process; return its timings and exactness."""
    import numpy as np

    sys.path.insert(0, tools)
    import huge_common

    _preimport(name)
    truth = huge_common.Truth(path + ".truth.npz")
    out: dict = {"reader": name}
    t0 = time.perf_counter()
    try:
        read, close = _open(name, path)
    except BaseException as exc:  # noqa: BLE001  # what each reader does is the result
        out["error"] = f"open: {type(exc).__name__}: {str(exc)[:300]}"
        return out
    out["open_s"] = time.perf_counter() - t0
    out["read_s"], out["wrong"], out["errors"] = [], 0, []
    for y, x in boxes:
        t0 = time.perf_counter()
        try:
            got = read(y, x, BOX, BOX)
        except BaseException as exc:  # noqa: BLE001
            out["errors"].append(f"({y}, {x}): {type(exc).__name__}: {str(exc)[:200]}")
            continue
        out["read_s"].append(time.perf_counter() - t0)
        want = truth.region(0, y, x, y + BOX, x + BOX)
        if got.shape != want.shape or not np.array_equal(got, want):
            out["wrong"] += 1
            diff = int(np.abs(got.astype(np.int16) - want).max()) if got.shape == want.shape else -1
            out["maxdiff"] = max(out.get("maxdiff", 0), diff)
    close()
    return out


def boxes_for(path: str, tools: str, n: int, seed: int) -> list[list[int]]:
    """`n` level-0 viewports: half past the first band beyond 4 GiB, half past x = 65535."""
    import numpy as np

    sys.path.insert(0, tools)
    import huge_common

    meta = huge_common.Truth(path + ".truth.npz").meta["levels"][0]
    h, w = meta["shape"]
    row4g = (meta["first_band_past_4g"] or [0])[0] * meta["chunk"][0]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        y = int(rng.integers(row4g if k % 2 == 0 else 0, h - BOX))
        x = int(rng.integers(65536 if k % 2 == 1 else 0, w - BOX))
        out.append([y, x])
    return out


def run_worker(name: str, path: str, boxes: list[list[int]], args: argparse.Namespace) -> dict:
    src = args.baseline_src if name.startswith("main") else str(OURS_SRC)
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, __file__, "--worker", name, path, "--tools", args.tools]
    cmd += ["--box-json", json.dumps(boxes)]
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"reader": name, "error": f"no answer within {args.timeout} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"reader": name, "error": f"crashed: {tail[0][:300]}"}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    shared = Path(__file__).resolve().parents[2] / "shared"  # beside the repository
    ap.add_argument("--baseline-src", help="the src folder of the code to compare against")
    ap.add_argument("--tools", default=str(shared / "tools"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--boxes", type=int, default=6)
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker")
    ap.add_argument("--box-json")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.files[0], json.loads(args.box_json), args.tools)))
        return 0
    readers = args.readers.split(",")
    if not args.baseline_src and any(r.startswith("main") for r in readers):
        ap.error("--baseline-src SRC is needed for the main readers (or leave them out)")
    print(f"# load before: {os.getloadavg()}")
    for path in args.files:
        results: dict[str, list[dict]] = {r: [] for r in readers}
        for run in range(args.runs):
            boxes = boxes_for(path, args.tools, args.boxes, seed=run)
            order = readers[run % len(readers) :] + readers[: run % len(readers)]
            run_worker("ours", path, boxes, args)  # untimed: the viewports' bytes cached
            for name in order:
                results[name].append(run_worker(name, path, boxes, args))
        print(
            f"\n## {Path(path).name} ({os.path.getsize(path):,} bytes), {args.runs} runs, "
            f"{args.boxes} viewports of {BOX} x {BOX} px each; load {os.getloadavg()}"
        )
        ours = results.get("ours", [])
        ours_open = [r["open_s"] for r in ours if "open_s" in r]
        ours_read = [t for r in ours for t in r.get("read_s", [])]
        print(
            "| reader | opens | open s (median) | open / ours | read ms (median) | "
            "read / ours | wrong viewports | failed reads |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name in readers:
            rs = results[name]
            opened = [r for r in rs if "open_s" in r]
            if not opened:
                print(f"| {name} | 0/{len(rs)} | - | - | - | - | - | {rs[0].get('error', '?')} |")
                continue
            o = statistics.median(r["open_s"] for r in opened)
            reads = [t for r in opened for t in r["read_s"]]
            rd = statistics.median(reads) * 1e3 if reads else float("nan")
            o_ratio = o / statistics.median(ours_open) if ours_open else float("nan")
            r_ratio = (
                (rd / 1e3) / statistics.median(ours_read) if ours_read and reads else float("nan")
            )
            wrong = f"{sum(r['wrong'] for r in opened)}/{len(reads)}"
            maxdiff = max((r.get("maxdiff", 0) for r in opened), default=0)
            if maxdiff:
                wrong += f" (max diff {maxdiff})" if maxdiff > 0 else " (other shape)"
            failed = [e for r in opened for e in r["errors"]]
            nread = len(reads) + len(failed)
            fail_txt = f"{len(failed)}/{nread}" + (f" ({failed[0][:120]})" if failed else "")
            print(
                f"| {name} | {len(opened)}/{len(rs)} | {o:.3f} | {o_ratio:.2f} | {rd:.1f} | "
                f"{r_ratio:.2f} | {wrong} | {fail_txt} |"
            )
    print(f"\n# load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
