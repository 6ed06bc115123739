"""Opening a ``slidescope batch`` result of many nuclei in napari, and panning it at full zoom.

``--make`` writes a synthetic batch result folder with the project's own writers: round
nuclei (12-gon outlines, radius 4-9 px) on a jittered grid over a ``--size`` px square
slide at 0.5 µm/px, one Parquet part per 1024 px tile (``outputs.write_part``), joined by
``outputs.write_nuclei`` (``nuclei.parquet``, ``nuclei.geojson.gz``) and painted by
``label_image.write_label_image`` (``labels.zarr``), with a ``manifest.json``.

Measuring: each run is a fresh Python process with ``PYTHONPATH`` set to one variant's
``src`` (``--variant NAME=SRC``; e.g. this worktree's and the untouched main's), so the
runs see the same folder and the same machine; variants alternate run by run. In a shown
napari viewer (``xvfb-run``) the folder is opened with the plugin's reader; printed:

* open: ``viewer.open`` returning (the reader and the layers' creation);
* first paint: open plus the first synchronous repaint of the canvas;
* pan: at full resolution (one screen px per level-0 px), 3 passes of 24 camera moves of
  a quarter screen from random starts; a step is the time from moving the camera to the
  end of a synchronous repaint, i.e. how long the event loop is blocked: its p50 / p95
  over all steps (target: p95 < 100 ms); passes alternate with 3 where the folder's
  layers are hidden (``hidden_p95_ms``: the empty canvas's own frame, software OpenGL
  under xvfb); ``reslice_p95_ms``: the nuclei layer's re-slices (napari's
  ``_set_view_slice``: reading the label chunks and colour mapping, on the main thread),
  the part of a step that is this layer's CPU work and no drawing;
* RSS after opening and the peak (VmHWM) at the end.

A run that has not finished within ``--timeout`` seconds is killed and reported so.

Usage::

    python benchmarks/batch_results_gui.py --make OUT/dense.svs --nuclei 270000 --size 40960
    xvfb-run -a python benchmarks/batch_results_gui.py --folder OUT/dense.svs \\
        --variant zarr=src --variant main=/path/to/main/src --reps 5 --timeout 300
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

import numpy as np


def make(folder: Path, n_target: int, size: int, seed: int = 0) -> None:
    from napari_slidescope.batch import outputs
    from napari_slidescope.batch.label_image import write_label_image
    from napari_slidescope.batch.tasks import TileOut, wkb_polygon

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    spacing = np.sqrt(size * size / n_target)
    g = np.arange(spacing / 2, size, spacing)
    cy, cx = np.meshgrid(g, g, indexing="ij")
    cy = (cy + rng.uniform(-0.2, 0.2, cy.shape) * spacing).ravel()
    cx = (cx + rng.uniform(-0.2, 0.2, cx.shape) * spacing).ravel()
    radius = np.minimum(rng.uniform(4, 9, cy.size), spacing * 0.45)
    ok = (cy > 10) & (cy < size - 10) & (cx > 10) & (cx < size - 10)
    cy, cx, radius = cy[ok], cx[ok], radius[ok]
    angles = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    tile = 1024
    per_row = -(-size // tile)
    owner = (cy // tile).astype(int) * per_row + (cx // tile).astype(int)
    tiles = []
    t0 = time.perf_counter()
    for index in np.unique(owner):
        sel = np.flatnonzero(owner == index)
        rings = [
            np.stack([cy[i] + radius[i] * np.sin(angles), cx[i] + radius[i] * np.cos(angles)], 1)
            for i in sel
        ]
        table = {
            "id": np.arange(1, sel.size + 1),
            "centroid_row": cy[sel],
            "centroid_col": cx[sel],
            "area_um2": np.pi * radius[sel] ** 2 * 0.25,
            "perimeter_um": 2 * np.pi * radius[sel] * 0.5,
        }
        out = TileOut(int(index), 0.0, table, [wkb_polygon(r) for r in rings])
        outputs.write_part(folder, out, "synthetic")
        tiles.append(int(index))
    print(f"{cy.size:,} nuclei in {len(tiles)} parts in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    outputs.write_nuclei(
        folder, tiles, file_metadata={"synthetic": True}, units={}, feature_ns="synthetic"
    )
    print(f"nuclei.parquet + nuclei.geojson.gz in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    write_label_image(folder, tiles, shape0=(size, size), mpp=(0.5, 0.5))
    print(f"labels.zarr in {time.perf_counter() - t0:.0f} s")
    outputs.remove_parts(folder)
    manifest = {
        "slide": folder.name,
        "status": "done",
        "parameters_sha256": "synthetic",
        "slide_stamp": {},
        "slide_info": {"shape0": [size, size], "mpp": [0.5, 0.5], "format": "synthetic"},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _status_mib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(folder: str, seed: int) -> None:
    """One measurement in this process; prints one JSON line."""
    import napari
    from qtpy.QtWidgets import QApplication

    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1424, 1224)
    native = viewer.window._qt_viewer.canvas.native
    app = QApplication.instance()

    def frame() -> None:
        app.processEvents()
        native.repaint()
        app.processEvents()

    frame()
    rss_before = _status_mib("VmRSS")
    t0 = time.perf_counter()
    layers = viewer.open(folder, plugin="napari-slidescope")
    t_open = time.perf_counter() - t0
    frame()
    t_paint = time.perf_counter() - t0
    rss_open = _status_mib("VmRSS")
    nuclei = next(layer for layer in layers if layer.name.endswith("nuclei"))
    n = len(nuclei.features)
    slices: list[float] = []  # the labels' re-slices (read, colour map) on the main thread
    state = nuclei._slicing_state  # napari 0.9 internals, as viewer_results.py
    inner = state._set_view_slice

    def timed() -> None:
        t = time.perf_counter()
        inner()
        slices.append((time.perf_counter() - t) * 1000)

    state._set_view_slice = timed
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
    um = float(nuclei.scale[-1])  # µm per level-0 px (the layer's world units are µm)
    camera.zoom = 1.0 / um  # one screen px per level-0 px
    frame()
    shape = np.asarray(nuclei.level_shapes[0]) * um
    screen = max(native.width(), native.height()) * um
    q = screen / 4
    rng = np.random.default_rng(seed)
    steps: dict[bool, list[float]] = {True: [], False: []}
    slices.clear()
    for k in range(6):  # passes alternate the nuclei shown / hidden (the empty canvas's cost)
        shown = k % 2 == 0
        for layer in layers:
            layer.visible = shown
        y = float(rng.uniform(screen, shape[0] - screen - 8 * q))
        x = float(rng.uniform(screen, shape[1] - screen - 8 * q))
        camera.center = (y, x)
        frame()
        for dy, dx in [(0, q)] * 8 + [(q, 0)] * 8 + [(0, -q)] * 8:
            y, x = y + dy, x + dx
            t = time.perf_counter()
            camera.center = (y, x)
            frame()
            steps[shown].append((time.perf_counter() - t) * 1000)
        if shown:
            assert nuclei.data_level == 0 if nuclei.multiscale else True
    level = nuclei.data_level if nuclei.multiscale else 0
    out = {
        "nuclei": n,
        "open_s": t_open,
        "paint_s": t_paint,
        "pan_p50_ms": float(np.percentile(steps[True], 50)),
        "pan_p95_ms": float(np.percentile(steps[True], 95)),
        "hidden_p95_ms": float(np.percentile(steps[False], 95)),
        "reslices": len(slices),
        "reslice_p95_ms": float(np.percentile(slices, 95)) if slices else 0.0,
        "rss_open_mib": rss_open - rss_before,
        "rss_peak_mib": _status_mib("VmHWM"),
        "level": level,
        "layer": type(nuclei).__name__,
    }
    print("RESULT " + json.dumps(out), flush=True)
    viewer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", type=Path, help="write a synthetic batch folder here")
    ap.add_argument("--nuclei", type=int, default=270_000)
    ap.add_argument("--size", type=int, default=40960, help="slide side, level-0 px")
    ap.add_argument("--folder", type=Path, help="measure opening this batch folder")
    ap.add_argument("--variant", action="append", default=[], help="NAME=SRC (repeatable)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seed)
        return
    if args.make:
        make(args.make, args.nuclei, args.size)
        return
    variants = dict(v.split("=", 1) for v in args.variant)
    results: dict[str, list[dict]] = {k: [] for k in variants}
    failed: dict[str, list[str]] = {k: [] for k in variants}
    print(f"load average at start: {os.getloadavg()}")
    for rep in range(args.reps):
        names = list(variants) if rep % 2 == 0 else list(variants)[::-1]
        for name in names:
            env = {**os.environ, "PYTHONPATH": str(Path(variants[name]).resolve())}
            cmd = [sys.executable, __file__, "--child", str(args.folder), "--seed", str(rep)]
            t0 = time.perf_counter()
            try:
                done = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=args.timeout
                )
            except subprocess.TimeoutExpired:
                failed[name].append(f"not finished in {args.timeout:.0f} s")
                print(f"{name}: rep {rep} not finished in {args.timeout:.0f} s", flush=True)
                continue
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                failed[name].append(done.stderr[-500:])
                print(f"{name}: rep {rep} failed: {done.stderr[-500:]}", flush=True)
                continue
            r = json.loads(line[0][7:])
            results[name].append(r)
            print(f"{name}: rep {rep} {r} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    keys = [
        "open_s", "paint_s", "pan_p50_ms", "pan_p95_ms", "hidden_p95_ms", "reslice_p95_ms",
        "rss_open_mib", "rss_peak_mib",
    ]  # fmt: skip
    print(f"{'variant':12s} {'runs':>5s}" + "".join(f"{k:>14s}" for k in keys))
    med = {}
    for name, rows in results.items():
        if not rows:
            print(f"{name:12s} {0:5d}  {failed[name][:1]}")
            continue
        med[name] = {k: statistics.median(r[k] for r in rows) for k in keys}
        print(f"{name:12s} {len(rows):5d}" + "".join(f"{med[name][k]:14.2f}" for k in keys))
    if len(med) == 2:
        a, b = list(med)
        ratios = "".join(f"{med[a][k] / med[b][k]:14.3f}" for k in keys)
        print(f"{'ratio ' + a + '/' + b:18s}" + ratios)


if __name__ == "__main__":
    main()
