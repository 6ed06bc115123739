"""The batch scheduler: what to submit to the dask.distributed cluster, and when.

dask.distributed schedules, retries and replaces dead workers; this module only
decides what to submit and hands what comes back to the slide ledger
(:class:`~napari_slidescope.batch.ledger.Ledger`). Per slide, one task finds the
tissue and plans the tiles (:func:`~napari_slidescope.batch.tasks.slide_task`); then
one task per tile (or a few) with tissue segments it
(:func:`~napari_slidescope.batch.tasks.nuclei_task`), or, with ``gpu``, a model task on
a GPU worker and a post-processing task on a CPU worker, re-homed when the CPU workers
it may run on are gone. With ``--regions`` one more task per slide classifies its tissue
into regions (:func:`~napari_slidescope.batch.tasks.regions_task`, gated by the regions'
own tissue, which keeps fat at a section's edge); a slide whose nuclei ``resume`` keeps gets
that task alone. With ``--tiles`` one more task per slide cuts it into tissue tiles and
embeds them (:func:`~napari_slidescope.batch.tasks.tiles_task`, gated by the slide task's
tissue); a slide whose other outputs ``resume`` keeps gets that task alone.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any, cast

from napari_slidescope.batch.ledger import Ledger, _Slide
from napari_slidescope.batch.tasks import (
    RegionsOut,
    SlideInfo,
    TaskFailed,
    TilesOut,
    model_identity,
    model_task,
    nuclei_task,
    post_task,
    regions_task,
    slide_task,
    summary_of,
    tiles_task,
)
from napari_slidescope.errors import SlidescopeWarning

if TYPE_CHECKING:
    from distributed import Client, Future

    #: A future of one of the batch's tasks: its result is a SlideInfo, a list of
    #: TileOut, a ModelOut or a TaskFailed (told apart where it is read). Future is
    #: invariant in its result, so the union cannot be written here.
    _Future = Future[Any]

__all__ = ["Scheduler", "cluster_model"]


#: Seconds a ``--gpu`` run waits for a worker without a GPU (a restarted one) before it
#: lets post tasks run on the GPU workers.
CPU_WORKER_WAIT_S = 30.0


def _cpu_workers(client: Client) -> list[str]:
    """Addresses of the workers without a ``GPU`` resource (where post tasks go)."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return sorted(a for a, w in workers.items() if not (w.get("resources") or {}).get("GPU"))


def cluster_model(client: Client) -> Callable[[str, str], dict[str, Any]]:
    """Return ``model_now(segmenter, stain_mode)``: the model identity a worker has now."""

    def model_now(segmenter: str, stain_mode: str) -> dict[str, Any]:
        return dict(client.submit(model_identity, segmenter, stain_mode, pure=False).result())

    return model_now


class Scheduler:
    """Submit a batch's tasks to a cluster and hand their results to its ledger.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    ledger : Ledger
        The slides and what is recorded of them.
    retries : int
        dask's retries of a task that raised.
    tiles_per_task : int
        Tiles per nuclei task (1 with ``gpu``).
    gpu : bool
        Model tasks on ``GPU`` workers, post-processing tasks on the others.
    """

    def __init__(
        self, client: Client, ledger: Ledger, *, retries: int, tiles_per_task: int, gpu: bool
    ) -> None:
        self.client, self.ledger = client, ledger
        self.params, self.slides = ledger.params, ledger.slides
        self.retries, self.per_task, self.gpu = retries, tiles_per_task, gpu
        self.meta: dict[_Future, tuple[str, _Slide, list[int]]] = {}
        self.token = uuid.uuid4().hex[:8]
        self.tiles_in_flight = 0
        self.cpu_workers: list[str] = []
        self.no_cpu_workers = False  # a GPU run found no worker without a GPU (said once)
        # post task -> its model task, arguments and the workers it may run on
        self.posts: dict[_Future, tuple[_Future, tuple[Any, ...], str, list[str]]] = {}

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        """Run the batch to its end; return the summary rows, in input order."""
        from distributed import as_completed

        queue = deque(s for s in self.slides if self.ledger.start(s))
        self.ledger.write_summary()
        self.ac = as_completed()
        active: list[_Slide] = []
        try:
            nthreads, asked = 1, -1.0
            while True:
                if time.monotonic() - asked > 2.0:  # workers come and go: ask now and then
                    nthreads = max(1, sum(self.client.nthreads().values()))
                    if self.gpu:
                        self._rehome_posts(_cpu_workers(self.client))
                    asked = time.monotonic()
                active = [s for s in active if s.status == "running"]
                while queue and len(active) < 2 * nthreads + 1:
                    s = queue.popleft()
                    self._submit_slide(s)
                    active.append(s)
                self._submit_tiles(active, cap=4 * nthreads)
                if not self.meta:
                    if queue:
                        continue
                    break
                future = self._next()
                if future is not None:
                    self._handle(future)
        finally:
            for s in self.slides:
                if s.futures:
                    self.client.cancel(list(s.futures))
            self.ledger.write_summary()
        return self.ledger.rows()

    def _next(self) -> _Future | None:
        """Return the next finished future; with ``gpu``, None after 2 s without one.

        With ``gpu`` the loop must come back now and then: a post task whose workers
        have all gone waits for :meth:`_rehome_posts`.
        """
        if not self.gpu:
            return cast("_Future", next(self.ac))
        import distributed.client
        from distributed import wait

        cancelled = getattr(distributed.client, "FuturesCancelledError", CancelledError)
        for f in self.meta:  # finished or cancelled already (wait raises for cancelled)
            if f.status != "pending":
                return f
        try:
            done, _ = wait(list(self.meta), timeout=2.0, return_when="FIRST_COMPLETED")
        except (TimeoutError, cancelled):  # one cancelled meanwhile: the scan finds it
            return None
        return cast("_Future", next(iter(done)))

    def _handle(self, future: _Future) -> None:
        if future not in self.meta:  # a post task moved to other workers
            return
        kind, s, chunk = self.meta.pop(future)
        s.futures.discard(future)
        self.posts.pop(future, None)
        if kind == "tiles":
            self.tiles_in_flight -= 1
        if s.status != "running":  # failed already; cancelled futures land here
            return
        try:
            result = future.result()
        except BaseException as exc:  # noqa: BLE001 - the slide fails, the batch goes on
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._fail(s, exc)
            return
        if isinstance(result, TaskFailed):  # an error a retry would repeat: not retried
            self._fail(s, result)
            return
        try:
            if kind == "regions":
                assert isinstance(result, RegionsOut)
                self.ledger.regions_done(s, result)
            elif kind == "tile-table":
                assert isinstance(result, TilesOut)
                self.ledger.tiles_table_done(s, result)
            elif kind == "slide":
                assert isinstance(result, SlideInfo)
                todo = self.ledger.planned(s, result)
                n = self.per_task
                s.todo = deque(todo[k : k + n] for k in range(0, len(todo), n))
            else:
                assert isinstance(result, list)
                self.ledger.tiles_done(s, result)
        except Exception as exc:  # noqa: BLE001 - e.g. an output that cannot be written
            self._fail(s, exc)
        if s.status != "running":
            s.prep = None  # dask frees the tissue mask on the workers

    def _fail(self, s: _Slide, exc: BaseException | TaskFailed) -> None:
        """Fail the slide: nothing more of it is submitted, its futures are cancelled."""
        s.todo.clear()
        if s.futures:
            self.client.cancel(list(s.futures))
        self.ledger.fail(s, exc)
        s.prep = None

    # -- submitting ------------------------------------------------------------------------

    def _submit_slide(self, s: _Slide) -> None:
        assert s.stamp is not None
        if s.skip_slide_task:  # its nuclei are kept: only its regions / tiles are computed
            if s.regions_only:
                self._submit_regions(s, None)
            if s.tiles_todo:
                self._submit_tile_table(s, None)
            return
        s.prep = self.client.submit(
            slide_task,
            str(s.path),
            s.stamp.key,
            self.params,
            key=f"slidescope-slide-{s.index}-{self.token}",
            retries=self.retries,
            priority=1,
        )
        light = self.client.submit(
            summary_of, s.prep, key=f"slidescope-summary-{s.index}-{self.token}", priority=1
        )
        self._track(light, "slide", s, [])
        if self.params.regions:
            self._submit_regions(s, s.prep)
        if s.tiles_todo:
            self._submit_tile_table(s, s.prep)

    def _submit_gated(self, kind: str, fn: Any, s: _Slide, prep: _Future | None) -> None:
        """Submit one per-slide task gated by the slide task's tissue (`prep`, when given).

        `kind` is the regions task (``"regions"``) or the tiles task (``"tile-table"``):
        only the path, the stamp and the parameters travel, the worker reads the pixels.
        """
        assert s.stamp is not None
        fut = self.client.submit(
            fn,
            str(s.path),
            s.stamp.key,
            self.params,
            prep,
            key=f"slidescope-{kind}-{s.index}-{self.token}",
            retries=self.retries,
            priority=0,
        )
        self._track(fut, kind, s, [])

    def _submit_tile_table(self, s: _Slide, prep: _Future | None) -> None:
        """Submit the slide's tiles task."""
        self._submit_gated("tile-table", tiles_task, s, prep)

    def _submit_regions(self, s: _Slide, prep: _Future | None) -> None:
        """Submit the slide's regions task."""
        self._submit_gated("regions", regions_task, s, prep)

    def _track(self, future: _Future, kind: str, s: _Slide, chunk: list[int]) -> None:
        self.meta[future] = (kind, s, chunk)
        s.futures.add(future)
        if not self.gpu:
            self.ac.add(future)

    def _submit_tiles(self, active: list[_Slide], cap: int) -> None:
        for s in active:
            while s.todo and self.tiles_in_flight < cap:
                assert s.stamp is not None
                chunk = s.todo.popleft()
                args = (str(s.path), s.stamp.key, self.params, s.prep)
                name = f"{s.index}-{chunk[0]}-{self.token}"
                if self.gpu:  # the post task holds the model future; dask frees its output
                    model = self.client.submit(
                        model_task,
                        *args,
                        chunk[0],
                        key=f"slidescope-model-{name}",
                        retries=self.retries,
                        resources={"GPU": 1},
                        priority=-s.index,
                    )
                    fut = self._submit_post(s, model, args, name)
                else:
                    fut = self.client.submit(
                        nuclei_task,
                        *args,
                        chunk,
                        key=f"slidescope-nuclei-{name}",
                        retries=self.retries,
                        priority=-s.index,
                    )
                self._track(fut, "tiles", s, chunk)
                self.tiles_in_flight += 1

    def _submit_post(self, s: _Slide, model: _Future, args: tuple[Any, ...], name: str) -> _Future:
        """Submit the post task of a model task, restricted to the workers without a GPU.

        A strict restriction: a loose one lets an idle GPU worker steal post tasks.
        """
        workers = self._post_workers()
        fut = self.client.submit(
            post_task,
            *args,
            model,
            key=f"slidescope-post-{name}-{uuid.uuid4().hex[:6]}",
            retries=self.retries,
            workers=workers,
            priority=-s.index,
        )
        self.posts[fut] = (model, args, name, list(workers or ()))
        return fut

    def _post_workers(self) -> list[str] | None:
        """Return the workers a post task may run on: those without a GPU.

        When none is known (the only one was killed and its nanny is starting it again),
        wait up to :data:`CPU_WORKER_WAIT_S` for one to join rather than let the post task
        run on a GPU worker. A cluster that has none by then runs its post tasks anywhere
        (None), said once.
        """
        if self.cpu_workers or self.no_cpu_workers:
            return self.cpu_workers or None
        deadline = time.monotonic() + CPU_WORKER_WAIT_S
        while not self.cpu_workers and time.monotonic() < deadline:
            time.sleep(0.2)
            self.cpu_workers = _cpu_workers(self.client)
        if self.cpu_workers:
            return self.cpu_workers
        self.no_cpu_workers = True
        warnings.warn(
            f"--gpu: no worker without a GPU joined within {CPU_WORKER_WAIT_S:g} s; "
            "post-processing runs on the GPU workers",
            SlidescopeWarning,
            stacklevel=2,
        )
        return None

    def _rehome_posts(self, cpu_workers: list[str]) -> None:
        """Resubmit the post tasks none of whose allowed workers is left.

        A restarted worker comes back under a new address; the post tasks go to the
        workers without a GPU there are now.
        """
        self.cpu_workers = cpu_workers
        if cpu_workers:
            self.no_cpu_workers = False
        for fut, (model, args, name, allowed) in list(self.posts.items()):
            if not allowed or set(allowed) & set(cpu_workers):
                continue
            kind, s, chunk = self.meta.pop(fut)
            s.futures.discard(fut)
            del self.posts[fut]
            self.client.cancel([fut])
            self._track(self._submit_post(s, model, args, name), kind, s, chunk)
