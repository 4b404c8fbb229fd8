"""The async jobs' life on one ingress replica: caps, fair start order, leases, cancellation, the sweeper.

A job runs only while this replica holds its lease (:meth:`JobStore.lease`), so of several replicas
(or a restarted service) on one store exactly one runs it; a lease lost to a takeover stops the
local run. Its input is read when it starts (memory is bounded by the running jobs), and pages
with a row already are skipped (a takeover parses only the missing ones). At most ``max_jobs``
run at once, at most ``max_jobs_per_tenant`` of one tenant; the others wait ``queued`` and start
by tenant, the least served first (one tenant's many jobs do not all run before another's one).

The sweeper (every ``sweep_s``) lists only the active index and starts jobs nobody holds, and
runs retention every ``min(ttl_s / 10, 60)`` seconds: its cost does not grow with finished jobs.
A job's signed state is verified (:meth:`JobStore.get`) before anything is written for it (its
lease first of all): a planted or edited job leaves no file behind. Each id is verified once per
replica while it stays active, so a sweep reads no state it verified before. No ray, no fastapi.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import time
from collections import defaultdict, deque
from typing import AsyncIterator, Callable

from padoc_ray import status
from padoc_ray.serve import errors
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.jobs import FINAL, InvalidJob, JobStore, tenant_key

logger = logging.getLogger(__name__)

RunPages = Callable[[dict, frozenset], AsyncIterator[dict]]


#: seconds a client is told to wait (Retry-After) when the tenant has too many jobs, and for an unfinished result
TOO_MANY_JOBS_RETRY_S, NOT_FINISHED_RETRY_S = 30, 2


def result_refusal(view: dict) -> Refusal | None:
    """None for a done job; else what /result answers: a failed job its document code, a cancelled one
    ``job_cancelled`` (final: no Retry-After), an unfinished one ``job_not_finished`` with Retry-After."""
    state = view["status"]
    if state == status.JOB_DONE:
        return None
    if state == status.JOB_FAILED:
        err = view.get("error") or {}
        return Refusal(err.get("code") or status.JOB_FAILED, err.get("message", ""))
    if state == status.JOB_CANCELLED:
        return Refusal(errors.JOB_CANCELLED, "the job was cancelled; it has no result")
    return Refusal(errors.JOB_NOT_FINISHED, f"the job is {state}", retry_after=NOT_FINISHED_RETRY_S)


#: why a local run is stopped: a cancel (it ends ``cancelled``), the manager closing or a lost lease (it stays
#: unfinished for the lease's next holder)
CANCEL, CLOSE, LOST = "cancel", "close", "lost"


class JobManager:
    def __init__(self, store: JobStore, run_pages: RunPages, *, replica_id: str, max_jobs: int,
                 max_jobs_per_tenant: int, max_queued_jobs_per_tenant: int, lease_s: float, ttl_s: float,
                 sweep_s: float | None = None):
        if max_jobs < 1 or max_jobs_per_tenant < 1 or max_queued_jobs_per_tenant < 1 or lease_s <= 0 or ttl_s < 0:
            raise ValueError("max_jobs, max_jobs_per_tenant and max_queued_jobs_per_tenant must be >= 1, "
                             "lease_s > 0 and ttl_s >= 0")
        self.store, self.run_pages, self.replica_id = store, run_pages, replica_id
        self.max_jobs, self.max_jobs_per_tenant, self.max_queued = max_jobs, max_jobs_per_tenant, \
            max_queued_jobs_per_tenant
        self.lease_s, self.ttl_s = lease_s, ttl_s
        self.sweep_s = lease_s / 3 if sweep_s is None else sweep_s
        self.retention_s = min(ttl_s / 10, 60.0) if ttl_s else None
        self._queued: dict[str, deque[str]] = defaultdict(deque)  # tenant key -> job ids waiting here
        self._running: dict[str, tuple[str, asyncio.Task]] = {}  # job id -> (tenant key, its run)
        self._stops: dict[str, str] = {}  # job id -> why its run is being stopped
        self._served: dict[str, int] = {}  # tenant key -> when its last job started here (a sequence number)
        self._genuine: set[str] = set()  # active job ids whose signed state this replica verified (or created)
        self._seq = itertools.count(1)
        self._sweeper: asyncio.Task | None = None
        self._last_retention = float("-inf")
        self._closed = False

    # ---- life ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def close(self) -> None:
        """Stop the sweeper and every local run; their jobs stay unfinished (another replica, or this
        service's next start, takes them over)."""
        self._closed = True
        self._queued.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        runs = [t for _, t in self._running.values()]
        for job_id in list(self._running):
            self._stop(job_id, CLOSE)
        await asyncio.gather(*runs, return_exceptions=True)

    def counts(self) -> dict[str, int]:
        """Jobs of this replica now: queued here, and running here (for the jobs gauge)."""
        return {status.JOB_QUEUED: sum(len(q) for q in self._queued.values()), status.JOB_RUNNING: len(self._running)}

    # ---- the routes' calls ---------------------------------------------------------------------------
    async def create(self, *, tenant: str, name: str, data: bytes, options: dict, pages_total: int) -> dict:
        """The new job's view; refuses (``too_many_jobs``) a tenant with ``max_queued_jobs_per_tenant``
        unfinished jobs already."""
        key = tenant_key(tenant)
        active = await asyncio.to_thread(self.store.active)
        if sum(k == key for _, k in active) >= self.max_queued:
            raise Refusal(errors.TOO_MANY_JOBS, f"this tenant has {self.max_queued} unfinished jobs, the most it "
                          f"may have; retry when one finished", retry_after=TOO_MANY_JOBS_RETRY_S)
        st = await asyncio.to_thread(self.store.create, tenant=tenant, name=name, data=data, options=options,
                                     pages_total=pages_total)
        self._genuine.add(st["id"])
        self._queued[key].append(st["id"])
        self._pump()
        return self._view(st, 0, False)

    async def view(self, job_id: str, tenant: str) -> dict | None:
        st = await self._own(job_id, tenant)
        return None if st is None else await self._view_of(st)

    async def rows(self, job_id: str, tenant: str) -> tuple[dict, list[dict]] | None:
        st = await self._own(job_id, tenant)
        if st is None:
            return None
        return st, await asyncio.to_thread(self.store.page_rows, job_id)

    async def cancel(self, job_id: str, tenant: str) -> dict | None:
        """Running here: stop it and write ``cancelled``; queued or orphaned: ``cancelled`` at once;
        running on another replica: the cancel marker, which its runner sees (``cancelling`` till then)."""
        st = await self._own(job_id, tenant)
        if st is None or st["status"] in FINAL:
            return None if st is None else await self._view_of(st)
        await asyncio.to_thread(self.store.cancel, job_id)
        for q in self._queued.values():
            with contextlib.suppress(ValueError):
                q.remove(job_id)
        if job_id in self._running:
            task = self._running[job_id][1]
            self._stop(job_id, CANCEL)
            await asyncio.gather(task, return_exceptions=True)
        else:
            lease = self.store.lease(job_id, self.replica_id, self.lease_s)
            if await asyncio.to_thread(lease.try_acquire) is None:  # nobody runs it: it ends here
                try:
                    st = await asyncio.to_thread(self.store.get, job_id)
                    if st is not None and st["status"] not in FINAL:
                        await asyncio.to_thread(self.store.finish, {**st, "status": status.JOB_CANCELLED})
                finally:
                    await asyncio.to_thread(lease.release)
        st = await asyncio.to_thread(self.store.get, job_id)
        return None if st is None else await self._view_of(st)

    # ---- the sweeper ---------------------------------------------------------------------------------
    async def sweep(self) -> None:
        """One round: queue the active jobs that nobody holds (and are not queued or running here), once
        their signed state verified; retention when it is due."""
        active = await asyncio.to_thread(self.store.active)
        self._genuine &= {job_id for job_id, _ in active}  # finished jobs leave it
        for job_id, key in active:
            if self._known(job_id) or not await self._verified(job_id):
                continue  # a refused job (logged once by the store) gets nothing written: not even a lease probe
            lease = self.store.lease(job_id, self.replica_id, self.lease_s)
            if await asyncio.to_thread(lease.holder) is None and not self._known(job_id):  # created meanwhile?
                self._queued[key].append(job_id)
        self._pump()
        if self.retention_s is not None and time.monotonic() - self._last_retention >= self.retention_s:
            self._last_retention = time.monotonic()
            gone = await asyncio.to_thread(self.store.expire, self.ttl_s)
            if gone:
                logger.info("deleted %d finished jobs older than %g s", len(gone), self.ttl_s)

    async def _verified(self, job_id: str) -> bool:
        """Whether the job's state is signed with the store's key (read once per active job and replica)."""
        if job_id in self._genuine:
            return True
        if await asyncio.to_thread(self.store.get, job_id) is None:
            return False
        self._genuine.add(job_id)
        return True

    def _known(self, job_id: str) -> bool:
        return job_id in self._running or any(job_id in q for q in self._queued.values())

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - the store hiccuped: try again next round
                logger.exception("job sweep failed")
            await asyncio.sleep(self.sweep_s)

    # ---- scheduling ----------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Start queued jobs while slots are free: of the tenants under their cap, the one with the
        fewest jobs running here, then the one served longest ago."""
        while not self._closed and len(self._running) < self.max_jobs:
            running = defaultdict(int)
            for key, _ in self._running.values():
                running[key] += 1
            ready = [k for k, q in self._queued.items() if q and running[k] < self.max_jobs_per_tenant]
            if not ready:
                return
            key = min(ready, key=lambda k: (running[k], self._served.get(k, 0)))
            job_id = self._queued[key].popleft()
            if not self._queued[key]:
                del self._queued[key]
            self._served[key] = next(self._seq)
            task = asyncio.create_task(self._run(job_id), name=f"padoc-job-{job_id}")
            self._running[job_id] = (key, task)
            task.add_done_callback(lambda _t, j=job_id: self._done(j))

    def _done(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        self._stops.pop(job_id, None)
        self._pump()

    def _stop(self, job_id: str, why: str) -> None:
        self._stops.setdefault(job_id, why)
        self._running[job_id][1].cancel()

    # ---- one run -------------------------------------------------------------------------------------
    async def _run(self, job_id: str) -> None:
        store = self.store
        lease = store.lease(job_id, self.replica_id, self.lease_s)
        st, watch = None, None
        try:
            if not await self._verified(job_id):
                return  # refused before its lease is taken: nothing is written under jobs/<id>/
            if await _whole(lease.try_acquire) is not None:
                return  # another replica runs it
            st = await asyncio.to_thread(store.get, job_id)  # again: it may have moved on before the lease
            if st is None:
                return
            if st["status"] in FINAL:  # finished between the listing and the lease: tidy the index
                await _whole(store.finish, st, st.get("finished"))
                return
            if await asyncio.to_thread(store.cancelled, job_id):
                await _whole(store.finish, {**st, "status": status.JOB_CANCELLED})
                return
            st.update(status=status.JOB_RUNNING, owner=self.replica_id)
            await asyncio.to_thread(store.put, st)
            watch = asyncio.create_task(self._watch(job_id, lease))
            await self._pages(st)
        except asyncio.CancelledError:
            why = self._stops.get(job_id)
            if why is None:
                raise
            if why == CANCEL and lease.held:
                st = await asyncio.to_thread(store.get, job_id)
                if st is not None and st["status"] not in FINAL:
                    await _whole(store.finish, {**st, "status": status.JOB_CANCELLED})
            # CLOSE or LOST: the job stays unfinished for whoever holds its lease next
        finally:
            if watch is not None:
                watch.cancel()
            await _whole(lease.release)

    async def _pages(self, st: dict) -> None:
        store, job_id = self.store, st["id"]
        try:
            data = await asyncio.to_thread(store.input, st)
            skip = frozenset(await asyncio.to_thread(store.done_pages, job_id))
            async with contextlib.aclosing(self.run_pages({**st, "data": data}, skip)) as gen:
                async for row in gen:
                    await asyncio.to_thread(store.write_page, job_id, row)
            page_rows = await asyncio.to_thread(store.page_rows, job_id)
            done = {**st, "status": status.JOB_DONE, "document_status": status.document_status(
                r["status"] for r in page_rows if r["page_index"] >= 0)}
        except Refusal as e:
            done = {**st, "status": status.JOB_FAILED, "error": {"code": e.code, "message": e.message}}
        except InvalidJob as e:
            done = {**st, "status": status.JOB_FAILED, "error": {"code": status.INTERNAL_ERROR, "message": str(e)}}
        except Exception as e:  # noqa: BLE001 - a bug in the runner: the job fails, the replica lives on
            logger.exception("job %s failed", job_id)
            done = {**st, "status": status.JOB_FAILED, "error": {"code": status.INTERNAL_ERROR,
                                                                 "message": type(e).__name__}}
        await _whole(store.finish, done)
        logger.info("job %s: %s", job_id, done["status"])

    async def _watch(self, job_id: str, lease) -> None:
        """Stop the local run on a cancel written by any replica, or when the lease was taken over."""
        while True:
            await asyncio.sleep(self.sweep_s)
            if lease.lost:
                logger.error("job %s: its lease was taken over; stopping the local run", job_id)
                self._stop(job_id, LOST)
                return
            if await asyncio.to_thread(self.store.cancelled, job_id):
                self._stop(job_id, CANCEL)
                return

    # ---- views ---------------------------------------------------------------------------------------
    async def _own(self, job_id: str, tenant: str) -> dict | None:
        st = await asyncio.to_thread(self.store.get, job_id)
        if st is None or not hmac.compare_digest(st.get("tenant", "").encode(), tenant.encode()):
            return None
        return st

    async def _view_of(self, st: dict) -> dict:
        done = await asyncio.to_thread(self.store.done_pages, st["id"])
        cancelling = st["status"] not in FINAL and await asyncio.to_thread(self.store.cancelled, st["id"])
        return self._view(st, len(done), cancelling)

    @staticmethod
    def _view(st: dict, pages_done: int, cancelling: bool) -> dict:
        return {"id": st["id"], "status": status.JOB_CANCELLING if cancelling else st["status"],
                "pages_done": pages_done, "pages_total": st["pages_total"],
                "document_status": st.get("document_status"),
                "error": st.get("error"), "name": st["name"], "created": st["created"], "updated": st["updated"]}


async def _whole(fn, *args):
    """``fn(*args)`` in a thread, finished even when the caller is cancelled meanwhile (a lease half
    taken, or a final state half filed, would be left behind); the cancel is raised after it."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.gather(fut, return_exceptions=True)
        raise
