"""Memory over time: repeated runs in one process do not grow the resident set.

Each test runs in a fresh child process (so other tests' allocations do not blur the
numbers) and reads RSS after every run, after ``gc.collect`` and ``malloc_trim`` so freed
heap shows as freed. After the first run has settled the caches and pools (decode
threads, imported modules; the tile cache is emptied when the slide closes), the process
must end within 5% of that level. Single nuclei runs were measured to leave up to 14 MiB
for a moment (threads' allocations handed back late), so a run in between may be up to
25% above it.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[2] / "src")

CHILD = textwrap.dedent(
    """
    import ctypes, gc, json, sys, warnings
    import psutil
    from napari_slidescope import open_slide
    from napari_slidescope.pipeline.tissue import detect_tissue
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    path, task, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    proc = psutil.Process()
    libc = ctypes.CDLL("libc.so.6")
    out = []
    for _ in range(runs):
        with open_slide(path) as slide:
            if task == "tissue":
                res = detect_tissue(slide, target_mpp=4.0)
                assert res.area_px > 0
            else:
                res = segment_nuclei(
                    slide, region=(0, 0, 1024, 1536), tissue=False, workers=2, segmenter="builtin"
                )
                assert res.count > 0
        del res
        gc.collect()
        libc.malloc_trim(0)
        out.append(proc.memory_info().rss)
    print(json.dumps(out))
    """
)


def _rss_per_run(path, task, runs):
    env = dict(os.environ, PYTHONPATH=SRC, MALLOC_ARENA_MAX="2")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), task, str(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim, /proc RSS")
@pytest.mark.parametrize(("task", "runs"), [("tissue", 20), ("nuclei", 10)])
def test_repeated_runs_keep_rss_within_5_percent(sample_slide, task, runs):
    rss = _rss_per_run(sample_slide[0], task, runs)
    settled = rss[0]
    mib = [round(r / 2**20, 1) for r in rss]
    # where the process ends up after all the runs (median of the last three, so one
    # run's transient allocations still being handed back does not decide)...
    assert sorted(rss[-3:])[1] <= 1.05 * settled, f"RSS per run (MiB): {mib}"
    # ...and no run in between holding much more (a leak would grow run after run)
    assert max(rss) <= 1.25 * settled, f"RSS per run (MiB): {mib}"
