"""Panning a slide with a whole-slide nuclei result shown, against panning without it.

A synthetic SVS-like slide is written (``write_sample_slide``), and a whole-slide nuclei
result of ``--nuclei`` nuclei is generated straight into a label pyramid (round nuclei of
radius 3-7 px on a jittered grid, pasted tile by tile as a run would; no segmentation),
shown as the multiscale Labels layer a whole-slide run makes, with one feature row per
nucleus. In a shown napari viewer (run under ``xvfb-run``), the camera then pans 24 steps
of a quarter screen at full zoom (8 right, 8 down, 8 left) from random starts; a frame is
the time from moving the camera to the end of a synchronous repaint (slicing, reading,
colour mapping and drawing). Passes alternate the result layer visible / removed from
the draw (``visible=False``: napari neither slices nor draws it), so both conditions see
the same machine load.

Memory: resident set size (``/proc/self/statm``) after two warm-up passes without the
result (the slide's own tile cache at its steady state) and after all passes (the
generator's freed scratch handed back with ``malloc_trim``), against the pyramid's
chunk-cache bound plus the feature table.

Usage::

    xvfb-run -a python benchmarks/viewer_results.py [--size 16384] [--nuclei 200000]
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import os
import statistics
import time

import numpy as np
from scipy import ndimage as ndi


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def synth_nuclei(pyramid, n_target: int, tile: int = 1024, seed: int = 0) -> dict:
    """Paste about `n_target` round nuclei into `pyramid`, tile by tile; return the table."""
    h, w = pyramid.shape
    rng = np.random.default_rng(seed)
    spacing = np.sqrt(h * w / n_target)
    ys = np.arange(spacing / 2, h, spacing)
    xs = np.arange(spacing / 2, w, spacing)
    cy, cx = np.meshgrid(ys, xs, indexing="ij")
    cy = (cy + rng.uniform(-0.25, 0.25, cy.shape) * spacing).ravel()
    cx = (cx + rng.uniform(-0.25, 0.25, cx.shape) * spacing).ravel()
    ok = (cy >= 8) & (cy < h - 8) & (cx >= 8) & (cx < w - 8)
    cy, cx = cy[ok], cx[ok]
    radius = rng.uniform(3, 7, cy.size)
    ids = np.arange(1, cy.size + 1, dtype=np.int32)
    for y0 in range(0, h, tile):
        for x0 in range(0, w, tile):
            sel = (cy >= y0) & (cy < y0 + tile) & (cx >= x0) & (cx < x0 + tile)
            if not sel.any():
                continue
            m = 8  # nuclei near the tile edge reach into the margin
            th, tw = min(tile, h - y0) + 2 * m, min(tile, w - x0) + 2 * m
            seeds = np.zeros((th, tw), bool)
            r = (cy[sel] - y0 + m).astype(int)
            c = (cx[sel] - x0 + m).astype(int)
            seeds[r, c] = True
            index = np.zeros((th, tw), np.int32)
            index[r, c] = np.flatnonzero(sel) + 1
            dist, (iy, ix) = ndi.distance_transform_edt(~seeds, return_indices=True)
            nearest = index[iy, ix]
            lab = np.where(dist <= radius[np.maximum(nearest - 1, 0)], nearest, 0).astype(np.int32)
            yy0, xx0 = max(0, y0 - m), max(0, x0 - m)
            crop = lab[yy0 - (y0 - m) :, xx0 - (x0 - m) :]
            crop = crop[: h - yy0, : w - xx0]
            pyramid.paste((yy0, xx0, yy0 + crop.shape[0], xx0 + crop.shape[1]), crop)
    area = np.pi * radius**2
    return {
        "id": ids,
        "centroid_row": cy,
        "centroid_col": cx,
        "area_um2": area * 0.25,
        "perimeter_um": 2 * np.pi * radius * 0.5,
        "eccentricity": np.zeros(cy.size),
        "solidity": np.ones(cy.size),
    }


def pan_path(y: float, x: float, q: float) -> list[tuple[float, float]]:
    path = [(y, x)]
    for dy, dx in [(0, q)] * 8 + [(q, 0)] * 8 + [(0, -q)] * 8:
        y, x = y + dy, x + dx
        path.append((y, x))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=16384, help="slide side, level-0 px")
    ap.add_argument("--nuclei", type=int, default=200_000)
    ap.add_argument("--passes", type=int, default=6, help="passes per condition")
    ap.add_argument("--canvas", type=int, default=1024, help="viewer canvas side, screen px")
    ap.add_argument("--profile", action="store_true", help="cProfile the passes with the result")
    ap.add_argument(
        "--compare-unchunked",
        action="store_true",
        help="add passes with a second view of the same pyramid whose levels hide their "
        "chunk grid from napari (as before they had one: re-sliced at every camera move)",
    )
    ap.add_argument(
        "--compare-outlines",
        action="store_true",
        help="add passes with the same pyramid drawn as outlines (contour=1, the default of "
        "the nuclei layers since issue 36) beside the filled layer (contour=0)",
    )
    args = ap.parse_args()

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_slidescope._napari import layers as _layers
    from napari_slidescope._napari.viewport import camera_of
    from napari_slidescope.sample_data import cache_dir, write_sample_slide
    from napari_slidescope.slide.cache import tile_cache

    slide_path = cache_dir() / f"viewer-bench-{args.size}.svs"
    if not slide_path.exists():  # written once (atomically), then reused
        slide_path.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        write_sample_slide(slide_path, shape=(args.size, args.size), mpp=0.5, seed=3, tile=256)
        print(f"slide {args.size} x {args.size} written in {time.perf_counter() - t:.0f} s")

    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(args.canvas + 400, args.canvas + 200)
    [image] = viewer.open(str(slide_path), plugin="napari-slidescope")
    native = viewer.window._qt_viewer.canvas.native
    app = QApplication.instance()

    def frame() -> None:
        app.processEvents()
        native.repaint()
        app.processEvents()

    slice_ms: dict[str, list[float]] = {"image": [], "labels": []}

    def timed_slice(layer: object, key: str) -> None:
        state = layer._slicing_state  # type: ignore[attr-defined]  # napari 0.9 internals
        inner = state._set_view_slice

        def wrapper() -> None:
            t0 = time.perf_counter()
            inner()
            slice_ms[key].append((time.perf_counter() - t0) * 1000)

        state._set_view_slice = wrapper

    timed_slice(image, "image")
    camera = camera_of(viewer)
    camera.zoom = 2.0  # screen px per µm: one per level-0 px, level 0 of both layers
    frame()
    screen_um = max(native.width(), native.height()) * 0.5
    q = screen_um / 4
    rng = np.random.default_rng(7)
    side_um = args.size * 0.5

    def one_pass() -> list[float]:
        y = float(rng.uniform(screen_um, side_um - screen_um - 8 * q))
        x = float(rng.uniform(screen_um, side_um - screen_um - 8 * q))
        path = pan_path(y, x, q)
        camera.center = path[0]
        frame()
        steps = []
        for c in path[1:]:
            t0 = time.perf_counter()
            camera.center = c
            frame()
            steps.append((time.perf_counter() - t0) * 1000)
        return steps

    for _ in range(2):  # the slide's own tile cache reaches its steady state first
        one_pass()
    rss0 = rss_mib()
    tiles0 = tile_cache().nbytes + tile_cache().free_nbytes
    canvas = _layers.PyramidCanvas.for_slide(
        (args.size, args.size), (1.0, 1.0), (0.5, 0.5),
        read_chunk=_layers.image_read_chunk(image, (1.0, 1.0)),
    )  # fmt: skip
    t = time.perf_counter()
    table = synth_nuclei(canvas.pyramid, args.nuclei)
    canvas.tables.append(table)
    n = int(table["id"].size)
    print(f"{n:,} nuclei pasted into the pyramid in {time.perf_counter() - t:.0f} s")
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand back the generator's freed scratch
    scale, translate = _layers.aligned_transform(image, canvas.origin, canvas.downsample)
    layer = viewer.add_labels(
        canvas.data, name="nuclei", scale=scale, translate=translate, opacity=0.6,
        multiscale=True, units=("µm", "µm"),
    )  # fmt: skip
    _layers._CANVASES[layer] = canvas
    _layers.set_features(layer, canvas)
    feat_mib = layer.features.memory_usage(deep=True).sum() / 2**20
    timed_slice(layer, "labels")
    shown_as = {"without": None, "with": layer}
    if args.compare_unchunked:
        unchunked = []
        for level in canvas.data:
            view = copy.copy(level)  # the same pyramid (and chunk cache), no chunk grid
            view.chunks = None
            unchunked.append(view)
        old = viewer.add_labels(
            unchunked, name="nuclei unchunked", scale=scale, translate=translate,
            opacity=0.6, multiscale=True, units=("µm", "µm"), visible=False,
        )  # fmt: skip
        slice_ms["unchunked"] = []
        timed_slice(old, "unchunked")
        shown_as["unchunked"] = old
    if args.compare_outlines:
        outlined = viewer.add_labels(
            canvas.data, name="nuclei outlines", scale=scale, translate=translate,
            opacity=0.8, multiscale=True, units=("µm", "µm"), visible=False,
        )  # fmt: skip
        outlined.contour = 1
        slice_ms["outlines"] = []
        timed_slice(outlined, "outlines")
        shown_as["outlines"] = outlined
    layer.contour = 0  # "with": the filled drawing, as before issue 36
    print(f"canvas {native.width()} x {native.height()} screen px, {n:,} nuclei shown")
    ms: dict[str, list[float]] = {k: [] for k in shown_as}
    every: dict[str, list[float]] = {k: [] for k in shown_as}
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    for key in slice_ms:
        slice_ms[key].clear()
    for p in range(len(shown_as) * args.passes):
        cond = list(shown_as)[p % len(shown_as)]
        for other in shown_as.values():
            if other is not None:
                other.visible = other is shown_as[cond]
        if cond == "with" and prof is not None:
            prof.enable()
        steps = one_pass()
        if prof is not None:
            prof.disable()
        ms[cond].append(statistics.median(steps))
        every[cond].extend(steps)
    assert layer.data_level == 0 and image.data_level == 0
    rss1 = rss_mib()
    tiles1 = tile_cache().nbytes + tile_cache().free_nbytes
    bound = canvas.pyramid.cache_bytes / 2**20
    disk = sum(f.stat().st_size for f in canvas.pyramid.path.rglob("*") if f.is_file())
    print(f"pan frame, median of {args.passes} pass medians (24 steps each), ms:")
    med = {k: statistics.median(v) for k, v in ms.items()}
    mean = {k: statistics.fmean(v) for k, v in every.items()}
    p90 = {k: float(np.percentile(v, 90)) for k, v in every.items()}
    for k in shown_as:
        passes = ", ".join(f"{v:.1f}" for v in ms[k])
        print(
            f"  {k + ' result:':<19} {med[k]:7.1f}  (passes {passes}); "
            f"all steps mean {mean[k]:.1f}, 90th percentile {p90[k]:.1f}"
        )
    for k in shown_as:
        if k != "without":
            print(
                f"  ratio {k} / without: median {med[k] / med['without']:.2f} (target <= 1.5), "
                f"mean {mean[k] / mean['without']:.2f}, 90th pct {p90[k] / p90['without']:.2f}"
            )
    moves = args.passes * 25
    for k, key in (("with", "labels"), ("unchunked", "unchunked"), ("outlines", "outlines")):
        if k in shown_as and slice_ms[key]:
            print(
                f"  {k} result: labels re-sliced at {len(slice_ms[key])} of {moves} camera "
                f"moves, median {statistics.median(slice_ms[key]):.1f} ms each"
            )
    print(
        f"slicing on the main thread (napari _set_view_slice: read, colour map): image "
        f"re-sliced at {len(slice_ms['image'])} of {moves * len(shown_as)} camera moves, "
        f"median {statistics.median(slice_ms['image']):.1f} ms each; the rest of a frame is "
        f"drawing (OpenGL: software Mesa under xvfb here)"
    )
    print(
        f"memory: RSS {rss0:.0f} -> {rss1:.0f} MiB (+{rss1 - rss0:.0f} MiB) with the result; "
        f"pyramid chunk cache bound {bound:.0f} MiB, cached now "
        f"{canvas.pyramid.nbytes_cached / 2**20:.0f} MiB; feature table {feat_mib:.0f} MiB "
        f"({n:,} rows); label pyramid on disk "
        f"{disk / 2**20:.0f} MiB "
        f"in {canvas.pyramid.chunks_written} chunks; level 0 as a dense array would be "
        f"{canvas.data[0].nbytes / 2**20:.0f} MiB"
    )
    growth = rss1 - rss0
    tiles = (tiles1 - tiles0) / 2**20
    print(
        f"memory due to the result: RSS growth {growth:.0f} MiB minus the slide's own tile "
        f"cache growth {tiles:.0f} MiB (now {tiles1 / 2**20:.0f} MiB of its "
        f"{tile_cache().maxbytes / 2**20:.0f} MiB bound) = {growth - tiles:.0f} MiB, against "
        f"the label pyramid's cache bound {bound:.0f} MiB + feature table {feat_mib:.0f} MiB "
        f"= {bound + feat_mib:.0f} MiB; the rest ({growth - tiles - bound - feat_mib:.0f} MiB) "
        f"is the constant (napari's slice, texture and thumbnail copies"
        + (", of both result layers)" if args.compare_unchunked else ")")
    )
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    viewer.close()


if __name__ == "__main__":
    main()
