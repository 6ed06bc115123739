"""GPU stage separation: model tasks on the GPU worker, post-processing on the others."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client, Nanny, Scheduler, SpecCluster, get_task_stream

from napari_slidescope import analyze_slides, segment_nuclei
from napari_slidescope.analysis.measure import COLUMNS
from napari_slidescope.batch.engine import WORKER_UNSET_ENV, local_cluster

TILE_UM = 128.0


@pytest.fixture(scope="module")
def gpu_client():
    """One worker process with ``{"GPU": 1}`` and one without, one thread each."""
    with (
        SpecCluster(
            scheduler={
                "cls": Scheduler,
                "options": {"dashboard_address": "127.0.0.1:0", "dashboard": False},
            },
            workers={
                "gpu": {"cls": Nanny, "options": {"nthreads": 1, "resources": {"GPU": 1}}},
                "cpu": {"cls": Nanny, "options": {"nthreads": 1}},
            },
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(scope="module")
def reference(slides):
    return segment_nuclei(
        slides / "b.svs",
        segmenter="builtin",
        tissue=True,
        tile_size_um=TILE_UM,
        labels=False,
        workers=1,
    )


def _workers(client):
    info = client.scheduler_info()["workers"]
    gpu = {a for a, w in info.items() if w.get("resources", {}).get("GPU")}
    return gpu, set(info) - gpu


def _same_as(path, ref):
    table = pq.read_table(path)
    assert table.num_rows == ref.count > 0
    for col in COLUMNS:
        np.testing.assert_array_equal(table.column(col).to_numpy(), ref.columns[col], err_msg=col)


def test_model_on_gpu_worker_post_on_cpu_worker_same_nuclei(
    gpu_client, slides, reference, tmp_path
):
    path = slides / "b.svs"
    with get_task_stream(gpu_client) as ts:
        rows = analyze_slides(
            path, tmp_path, segmenter="builtin", tile_size_um=TILE_UM, client=gpu_client, gpu=True
        )
    gpu, _ = _workers(gpu_client)
    where: dict[str, set[str]] = {}
    count: dict[str, int] = {}
    for t in ts.data:
        kind = t["key"].split("-")[1]
        where.setdefault(kind, set()).add(t["worker"])
        count[kind] = count.get(kind, 0) + 1
    assert len(gpu) == 1
    assert where["model"] == gpu
    assert where["post"]
    assert not where["post"] & gpu
    assert "nuclei" not in where  # no fused tasks
    plan = json.loads((tmp_path / "b.svs" / "manifest.json").read_text())["plan"]
    assert count["model"] == count["post"] == plan["tiles_with_tissue"] > 1
    assert rows[0]["status"] == "done"
    _same_as(tmp_path / "b.svs" / "nuclei.parquet", reference)


def test_cpu_worker_killed_mid_run_post_tasks_move_same_nuclei(
    gpu_client, slides, reference, tmp_path
):
    killed = []

    def kill_cpu_worker(state):
        if not killed and state.tiles_done >= 2:
            _, cpu = _workers(gpu_client)
            (pid,) = gpu_client.run(os.getpid, workers=sorted(cpu)).values()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    rows = analyze_slides(
        slides / "b.svs",
        tmp_path,
        segmenter="builtin",
        tile_size_um=TILE_UM,
        client=gpu_client,
        gpu=True,
        progress=kill_cpu_worker,
    )
    assert killed, "no worker was killed"
    assert rows[0]["status"] == "done", rows
    _same_as(tmp_path / "b.svs" / "nuclei.parquet", reference)
    gpu_client.wait_for_workers(2, timeout=60)


def _exec_environ() -> dict[str, str]:
    """The environment this process was started with (what glibc's malloc read)."""
    with open("/proc/self/environ", "rb") as fh:
        items = [e.split(b"=", 1) for e in fh.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode() for k, v in items}


def test_local_cluster_workers_start_without_dask_malloc_trim(monkeypatch):
    # what an earlier dask cluster in this process leaves in os.environ
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with local_cluster(1) as cluster, Client(cluster) as client:
        (env,) = client.run(_exec_environ).values()
    assert not set(WORKER_UNSET_ENV) & set(env)
    assert env["OMP_NUM_THREADS"] == "1"  # dask's other pre-spawn settings stay
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "65536"  # ours left as it was
