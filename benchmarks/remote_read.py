"""Reading a slide over a slow link: viewport and open times against the local file.

A real HTTP server on 127.0.0.1 (``tests/remote_server.py``: ``http.server`` in a thread,
byte ranges, keep-alive) serves the slide and sleeps ``--delay`` seconds (20 ms by
default) before answering each request, in the handler thread, so concurrent requests
wait concurrently: the delay acts like a network round trip, not like a slow disk or a
thin pipe. What is measured, in one run:

* **round trip**: one 1-byte ranged GET through the same client (the link's RTT as the
  reader sees it: the delay plus the local HTTP stack);
* **viewport**: ``np.asarray(slide.levels[0][y0:y1, x0:x1])`` of ``--size`` px at random
  places, the decoded-tile cache emptied before each, local file vs URL, interleaved;
  the issue's target: URL <= 5 round trips (100 ms at 20 ms) + the local time;
* **open**: ``open_slide(url)`` (target: <= 4 round trips) vs ``open_slide(path)``.

The slide: ``--slide PATH``, else an Aperio-SVS-like 16384 x 16384 slide written once by
the shared ``make_svs.py`` into ``$SLIDESCOPE_BENCH_CACHE`` (default
``~/.cache/napari-slidescope/bench``): level 0 first, then the thumbnail, the reduced
levels, label and macro, each directory after the previous page's tiles, as real SVS
files are laid out.

Usage::

    python benchmarks/remote_read.py                 # ~1 min once the slide exists
    python benchmarks/remote_read.py --delay 0.05 --viewports 9
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _server_module():
    spec = importlib.util.spec_from_file_location(
        "remote_server", HERE.parent / "tests" / "remote_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_slide() -> Path:
    sys.path.insert(0, str(HERE))
    from _slides import cache_dir, tools_dir

    path = cache_dir() / "svs_16k.svs"
    if not path.is_file():
        part = path.with_suffix(".part")
        print(f"writing {path} (make_svs.py, ~1 min) ...", file=sys.stderr)
        subprocess.run(
            [
                sys.executable,
                str(tools_dir() / "make_svs.py"),
                str(part),
                "--width",
                "16384",
                "--height",
                "16384",
                "--seed",
                "0",
            ],
            check=True,
        )
        os.replace(part, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--slide", type=Path, help="slide file (default: svs_16k.svs, written once)")
    ap.add_argument("--delay", type=float, default=0.020, help="seconds per response (0.020)")
    ap.add_argument("--size", type=int, default=1024, help="viewport side in px (1024)")
    ap.add_argument("--viewports", type=int, default=15, help="viewports per reader (15)")
    ap.add_argument("--opens", type=int, default=7, help="opens per reader (7)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from napari_slidescope.slide import open_slide, tile_cache
    from napari_slidescope.slide.remote import RemoteFile
    from napari_slidescope.slide.source import resolve

    path = args.slide or _bench_slide()
    server_mod = _server_module()
    t_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    with server_mod.serve(path.parent) as server:
        url = server.url(path.name)
        server.delay = args.delay

        # one round trip as the reader sees it
        probe = RemoteFile(resolve(url))
        rtts = []
        for _ in range(9):
            t = time.perf_counter()
            probe.cat_ranges([12345], [1])
            rtts.append(time.perf_counter() - t)
        probe.close()
        rtt = statistics.median(rtts)

        # open
        opens_local, opens_remote, open_requests = [], [], []
        for _ in range(args.opens):
            t = time.perf_counter()
            open_slide(path).close()
            opens_local.append(time.perf_counter() - t)
            n0 = len(server.log)
            t = time.perf_counter()
            open_slide(url).close()
            opens_remote.append(time.perf_counter() - t)
            open_requests.append(len(server.log) - n0)

        # viewports, interleaved, cache emptied before each read
        local, remote = open_slide(path), open_slide(url)
        h, w = local.shape0
        rng = np.random.default_rng(args.seed)
        times_local, times_remote, requests = [], [], []
        s = args.size
        for _ in range(args.viewports):
            y = int(rng.integers(0, h - s))
            x = int(rng.integers(0, w - s))
            tile_cache().clear()
            t = time.perf_counter()
            a = np.asarray(local.levels[0][y : y + s, x : x + s])
            times_local.append(time.perf_counter() - t)
            tile_cache().clear()
            n0 = len(server.log)
            t = time.perf_counter()
            b = np.asarray(remote.levels[0][y : y + s, x : x + s])
            times_remote.append(time.perf_counter() - t)
            requests.append(len(server.log) - n0)
            assert np.array_equal(a, b)
        local.close()
        remote.close()
    load1 = os.getloadavg()[0]

    ms = 1000.0
    med_l, med_r = statistics.median(times_local), statistics.median(times_remote)
    target = 5 * args.delay + med_l
    print(f"Run: {t_start}; load average {load0:.1f} at start, {load1:.1f} at end")
    print(f"slide: {path.name} {h}x{w}, delay {args.delay * ms:.0f} ms per response")
    print(f"round trip (1-byte ranged GET): median {rtt * ms:.1f} ms")
    print()
    print(f"| {s}x{s} viewport, level 0, cold cache | median ms | min-max ms | requests |")
    print("|---|---|---|---|")
    print(
        f"| local file (decode baseline) | {med_l * ms:.1f} | "
        f"{min(times_local) * ms:.1f}-{max(times_local) * ms:.1f} | - |"
    )
    print(
        f"| URL | {med_r * ms:.1f} | {min(times_remote) * ms:.1f}-{max(times_remote) * ms:.1f} | "
        f"{statistics.median(requests):.0f} |"
    )
    print(
        f"| URL - local | {(med_r - med_l) * ms:.1f} = {(med_r - med_l) / rtt:.1f} round trips "
        f"| | |"
    )
    print(
        f"target: URL <= 5 x {args.delay * ms:.0f} ms + local = {target * ms:.1f} ms: "
        f"{'met' if med_r <= target else 'NOT met'}"
    )
    print()
    mo_l, mo_r = statistics.median(opens_local), statistics.median(opens_remote)
    print("| open | median ms | requests | round trips' time (open / RTT) |")
    print("|---|---|---|---|")
    print(f"| local file (parse baseline) | {mo_l * ms:.1f} | - | - |")
    print(f"| URL | {mo_r * ms:.1f} | {statistics.median(open_requests):.0f} | {mo_r / rtt:.1f} |")
    print(f"| URL - local | {(mo_r - mo_l) * ms:.1f} | | {(mo_r - mo_l) / rtt:.1f} |")
    print(
        f"target: open <= 4 round trips ({4 * rtt * ms:.0f} ms): "
        f"{'met' if mo_r <= 4 * rtt else 'NOT met'}; "
        f"network part (URL - local parse) <= 4 round trips: "
        f"{'met' if mo_r - mo_l <= 4 * rtt else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
