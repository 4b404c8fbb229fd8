"""The online service's async jobs without Ray, FastAPI or an S3 server (local stores under tmp_path,
fake document runners): the private signed store, leases, caps and fair start order, cancellation in
every state, retention, what a sweep costs, and job ids. The s3:// store on moto's S3 server:
tests/cluster/serve/test_async_jobs_on_s3.py (which imports this file's runner and helpers)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import stat
import threading
import time
import uuid

import pytest

from padoc_ray import status
from padoc_ray.output import rows
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.job_manager import JobManager, result_refusal
from padoc_ray.serve.jobs import KEY_ENV, JobStore, tenant_key


def _row(st: dict, i: int) -> dict:
    r = rows.base_row(run_id=st["id"][:12], uri=st["name"], doc_id="d", page_index=i, page_count=st["pages_total"],
                      mode="fork", model_id="m")
    return {**r, "status": status.OK}


class Runner:
    """A fake document runner: records every page it yields, by replica; ``hold`` makes it stop (forever)
    before the page of that index."""

    def __init__(self, name: str = "r", hold: int | None = None, gate: bool = False):
        self.name, self.hold, self.gate = name, hold, gate
        self.yielded: list[tuple[str, int]] = []
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def __call__(self, st: dict, skip: frozenset):
        assert st["data"] == b"%PDF " + st["name"].encode()
        self.started.append(st["name"])
        if self.gate:
            await self.gates.setdefault(st["id"], asyncio.Event()).wait()
        for i in range(st["pages_total"]):
            if i in skip:
                continue
            if i == self.hold:
                await asyncio.Event().wait()
            self.yielded.append((st["id"], i))
            yield _row(st, i)
            await asyncio.sleep(0)


def _manager(store, runner, name="a", **kw):
    args = dict(replica_id=name, max_jobs=4, max_jobs_per_tenant=2, max_queued_jobs_per_tenant=100, lease_s=5,
                ttl_s=0, sweep_s=0.01)
    return JobManager(store, runner, **{**args, **kw})


async def _until(cond, what: str, limit: float = 60):
    """Poll until ``cond()`` (an async or plain callable) holds; fail after ``limit`` s (a hang, not a timing)."""
    deadline = time.monotonic() + limit
    while True:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def _create(mgr, tenant, name, pages=2):
    return await mgr.create(tenant=tenant, name=name, data=b"%PDF " + name.encode(), options={"mode": "fork"},
                            pages_total=pages)


def _status_is(mgr, job_id, tenant, want):
    async def check():
        return (await mgr.view(job_id, tenant))["status"] == want
    return check


# ---- the store: private, signed ----------------------------------------------------------------------
def test_a_local_store_and_its_files_are_private(tmp_path):
    root = tmp_path / "a" / "b" / "store"
    store = JobStore(str(root))
    st = store.create(tenant="t", name="x.pdf", data=b"%PDF x", options={}, pages_total=1)
    store.write_page(st["id"], _row(st, 0))
    assert store.lease(st["id"], "me", 5).try_acquire() is None
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, d)).st_mode) == 0o700, d
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode) == 0o600, f
    assert len((root / "store.key").read_bytes()) == 32


def test_an_open_or_foreign_store_root_is_refused(tmp_path):
    root = tmp_path / "shared"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with pytest.raises(ValueError, match=r"shared is open to its group or others \(mode 0755\)"):
        JobStore(str(root))
    os.chmod(root, 0o700)
    other = os.getuid() + 1 if os.getuid() else 65534
    if os.getuid() == 0:
        os.chown(root, other, -1)
    else:
        pytest.skip("needs root to give a folder away")
    with pytest.raises(ValueError, match=f"shared is owned by uid {other}, not by this process's uid"):
        JobStore(str(root))
    assert os.listdir(root) == []  # nothing written into a store it refused


def test_a_planted_unsigned_job_or_a_swapped_input_is_never_run(tmp_path, caplog):
    async def main():
        store = JobStore(str(tmp_path / "s"))
        planted = uuid.uuid4().hex
        (tmp_path / "s" / "jobs" / planted).mkdir(parents=True)
        (tmp_path / "s" / "jobs" / planted / "input").write_bytes(b"%PDF planted")
        state = {"id": planted, "tenant": "t", "name": "planted", "status": status.JOB_QUEUED, "pages_total": 1,
                 "options": {}, "created": 0, "updated": 0, "heartbeat": 0, "input_sha256": "0" * 64, "sig": "f" * 64}
        (tmp_path / "s" / "jobs" / planted / "job.json").write_text(json.dumps(state))
        (tmp_path / "s" / "active").mkdir(exist_ok=True)
        (tmp_path / "s" / "active" / f"{tenant_key('t')}-{planted}").write_bytes(b"")
        swapped = store.create(tenant="t", name="swapped", data=b"%PDF swapped", options={}, pages_total=1)
        (tmp_path / "s" / "jobs" / swapped["id"] / "input").write_bytes(b"%PDF something else")
        runner = Runner()
        mgr = _manager(store, runner)
        await mgr.start()
        try:
            await _until(_status_is(mgr, swapped["id"], "t", status.JOB_FAILED), "the swapped job failed")
            for _ in range(5):
                await mgr.sweep()
        finally:
            await mgr.close()
        assert runner.started == []
        assert store.get(planted) is None and await mgr.view(planted, "t") is None
        assert "digest" in (await mgr.view(swapped["id"], "t"))["error"]["message"]

    with caplog.at_level(logging.WARNING, logger="padoc_ray.serve.jobs"):
        asyncio.run(main())
    refused = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 2  # one warning per job id, however many sweeps


def _files(root) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


def _edit_state(root, job_id: str, **changes) -> None:
    """Edit a job's job.json by hand, its signature left as it was."""
    path = os.path.join(root, "jobs", job_id, "job.json")
    with open(path) as f:
        state = json.load(f)
    state.update(changes)
    with open(path, "w") as f:
        json.dump(state, f)


class Recorder:
    """A document runner that records every job it was asked to run (whatever its name or data)."""

    def __init__(self):
        self.started: list[str] = []

    async def __call__(self, st: dict, skip: frozenset):
        self.started.append(st["id"])
        for i in range(st["pages_total"]):
            yield _row(st, i)


@pytest.mark.parametrize("edit", [
    {"status": status.JOB_QUEUED, "finished": None},  # a cancelled job set back to queued
    {"pages_total": 3},
    {"name": "renamed.pdf"},
    {"options": {"mode": "sequential"}},
    {"tenant": "someone else"},
], ids=["status", "pages", "name", "options", "tenant"])
def test_a_job_state_edited_by_hand_is_refused_and_never_run(tmp_path, caplog, edit):
    """Every field is signed: a state changed in any of them is refused (never returned, listed or run),
    and the sweeper writes nothing for it."""
    root = str(tmp_path / "s")

    async def main():
        store = JobStore(root)
        st = store.create(tenant="t", name="x.pdf", data=b"%PDF x.pdf", options={"mode": "fork"}, pages_total=1)
        if "status" in edit:  # cancelled, yet still indexed (as between finish's writes)
            store.put({**st, "status": status.JOB_CANCELLED, "finished": time.time()})
        assert store.get(st["id"]) is not None
        _edit_state(root, st["id"], **edit)
        assert store.get(st["id"]) is None
        before = _files(root)
        runner = Recorder()
        mgr = _manager(JobStore(root), runner)
        await mgr.start()
        try:
            for _ in range(5):
                await mgr.sweep()
        finally:
            await mgr.close()
        assert runner.started == []
        assert await mgr.view(st["id"], "t") is None and await mgr.view(st["id"], "someone else") is None
        assert _files(root) == before  # no lease, no state written

    with caplog.at_level(logging.WARNING, logger="padoc_ray.serve.jobs"):
        asyncio.run(main())
    assert any("edited by hand" in r.getMessage() for r in caplog.records)


def test_a_state_signed_the_old_way_is_refused_with_its_own_log_line(tmp_path, caplog):
    """A state signed over its id, tenant, time and input digest only (before the whole state was
    signed) is refused, even with a good signature under this store's key: jobs are transient."""
    root = str(tmp_path / "s")
    store = JobStore(root)
    st = store.create(tenant="t", name="x.pdf", data=b"%PDF x", options={}, pages_total=1)
    old = {k: v for k, v in st.items() if k not in ("sig", "sig_v")}
    old["sig"] = hmac.new(store._key, json.dumps([old["id"], old["tenant"], old["created"], old["input_sha256"]])
                          .encode(), hashlib.sha256).hexdigest()
    with open(os.path.join(root, "jobs", st["id"], "job.json"), "w") as f:
        json.dump(old, f)
    with caplog.at_level(logging.WARNING, logger="padoc_ray.serve.jobs"):
        assert store.get(st["id"]) is None
        _edit_state(root, st["id"], sig_v=1)
        assert JobStore(root).get(st["id"]) is None
    said = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(said) == 2 and all("signed the old way" in m and "resubmit" in m for m in said), said


def test_a_sweep_over_a_planted_job_writes_nothing_under_its_folder(tmp_path):
    """The sweeper verifies a job before it takes (or probes) its lease: a planted job, signed with
    another key, leaves the store exactly as it was."""
    root = str(tmp_path / "s")

    async def main():
        store = JobStore(root)
        elsewhere = JobStore(str(tmp_path / "another store"))  # a well-formed job, signed with another key
        planted = elsewhere.create(tenant="t", name="planted", data=b"%PDF planted", options={}, pages_total=1)
        (tmp_path / "s" / "jobs").mkdir(mode=0o700)
        os.rename(tmp_path / "another store" / "jobs" / planted["id"], tmp_path / "s" / "jobs" / planted["id"])
        (tmp_path / "s" / "active").mkdir(exist_ok=True)
        (tmp_path / "s" / "active" / f"{tenant_key('t')}-{planted['id']}").write_bytes(b"")
        before = _files(root)
        assert sorted(before) == sorted(["store.key", f"active/{tenant_key('t')}-{planted['id']}",
                                         *(f"jobs/{planted['id']}/{n}" for n in ("input", "job.json"))])
        runner = Recorder()
        mgr = _manager(store, runner)
        await mgr.start()
        try:
            for _ in range(5):
                await mgr.sweep()
            await asyncio.sleep(0.05)
        finally:
            await mgr.close()
        assert runner.started == [] and store.get(planted["id"]) is None
        assert _files(root) == before  # no lease (nor anything else) under jobs/<planted id>/

    asyncio.run(main())


def test_a_key_named_by_the_config_or_the_environment_is_used_and_never_written_to_the_store(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    key = os.urandom(32)
    key_file = tmp_path / "secret" / "job-key"
    key_file.parent.mkdir()
    key_file.write_text(key.hex() + "\n")  # as `openssl rand -hex 32 > file` writes it
    a = JobStore(str(tmp_path / "s"), key_file=str(key_file))
    b = JobStore(str(tmp_path / "s"), key_file=str(key_file))  # another replica, the same Secret mounted
    assert a._key == b._key == key and a.key_source == f"the file {key_file}"
    st = a.create(tenant="t", name="x", data=b"%PDF x", options={}, pages_total=1)
    assert b.get(st["id"])["name"] == "x"
    monkeypatch.setenv(KEY_ENV, os.urandom(32).hex())
    from_env = JobStore(str(tmp_path / "s"))
    assert from_env.get(st["id"]) is None  # another key: the job is not this store's
    monkeypatch.setenv(KEY_ENV, key.hex())
    assert JobStore(str(tmp_path / "s")).get(st["id"])["name"] == "x"
    assert not (tmp_path / "s" / "store.key").exists()  # a named key is never copied into the store
    key_file.write_text("abcd")
    with pytest.raises(ValueError, match="at least 64 hex digits"):
        JobStore(str(tmp_path / "s"), key_file=str(key_file))
    with pytest.raises(ValueError, match="cannot be read"):
        JobStore(str(tmp_path / "s"), key_file=str(tmp_path / "missing"))
    monkeypatch.setenv(KEY_ENV, "not hex")
    with pytest.raises(ValueError, match=f"environment variable {KEY_ENV} must hold"):
        JobStore(str(tmp_path / "s"))
    from padoc_ray.serve.config import ServeConfig

    assert ServeConfig(model="m", job_key=str(key_file)).job_key == str(key_file)
    with pytest.raises(ValueError, match="job_key is a local file"):
        ServeConfig(model="m", job_key="s3://bucket/key")


# ---- leases: one runner per job, a dead replica's job finished by another ------------------------------
def test_two_replicas_never_both_run_a_job(tmp_path):
    async def main():
        store = JobStore(str(tmp_path / "s"))
        ids = [store.create(tenant=f"t{i % 3}", name=f"d{i}", data=f"%PDF d{i}".encode(), options={},
                            pages_total=2)["id"] for i in range(40)]
        ra, rb = Runner("a"), Runner("b")
        a = _manager(JobStore(str(tmp_path / "s")), ra, "a", max_jobs_per_tenant=4)
        b = _manager(JobStore(str(tmp_path / "s")), rb, "b", max_jobs_per_tenant=4)
        await asyncio.gather(a.start(), b.start())
        try:
            for job_id in ids:
                await _until(lambda j=job_id: store.get(j)["status"] == status.JOB_DONE, f"job {job_id} done")
        finally:
            await asyncio.gather(a.close(), b.close())
        runs = sorted(ra.started + rb.started)
        assert runs == sorted(f"d{i}" for i in range(40))  # each job started exactly once, by one replica
        assert ra.started and rb.started  # both replicas took part in the race
        assert sorted(ra.yielded + rb.yielded) == sorted((j, p) for j in ids for p in (0, 1))
        assert store.active() == []

    asyncio.run(main())


def test_a_killed_replicas_job_is_finished_by_another_parsing_only_the_missing_pages(tmp_path):
    async def main():
        ra, rb = Runner("a", hold=3), Runner("b")
        a = _manager(JobStore(str(tmp_path / "s")), ra, "a")
        v = await _create(a, "t", "doc", pages=6)
        await _until(lambda: len(a.store.done_pages(v["id"])) == 3, "three pages written")
        await a.close()  # as a killed replica: the run stops, its lease goes, nothing is marked
        assert a.store.get(v["id"])["status"] == status.JOB_RUNNING
        b = _manager(JobStore(str(tmp_path / "s")), rb, "b")
        await b.start()
        try:
            await _until(_status_is(b, v["id"], "t", status.JOB_DONE), "taken over and done")
        finally:
            await b.close()
        assert [p for _, p in ra.yielded] == [0, 1, 2]
        assert [p for _, p in rb.yielded] == [3, 4, 5]
        state, page_rows = await b.rows(v["id"], "t")
        assert [r["page_index"] for r in page_rows] == list(range(6)) and state["document_status"] == status.DOC_OK
        assert not (tmp_path / "s" / "jobs" / v["id"] / "input").exists()  # a finished job keeps no input

    asyncio.run(main())


# ---- caps and fair order --------------------------------------------------------------------------------
def test_caps_hold_and_tenants_start_round_robin(tmp_path):
    async def main():
        runner = Runner(gate=True)
        mgr = _manager(JobStore(str(tmp_path / "s")), runner, max_jobs=3, max_jobs_per_tenant=2,
                       max_queued_jobs_per_tenant=4)
        views = {}
        for name in ("a1", "a2", "a3", "a4"):
            views[name] = await _create(mgr, "A", name)
        with pytest.raises(Refusal, match="4 unfinished jobs") as refused:
            await _create(mgr, "A", "a5")
        assert (refused.value.code, refused.value.status, refused.value.headers) == ("too_many_jobs", 429,
                                                                                    {"Retry-After": "30"})
        for name in ("b1", "b2"):
            views[name] = await _create(mgr, "B", name)
        await _until(lambda: len(runner.started) == 3, "three jobs running")
        assert sorted(runner.started) == ["a1", "a2", "b1"]  # 3 at once, 2 of one tenant
        for name, tenant in (("a3", "A"), ("a4", "A"), ("b2", "B")):
            assert (await mgr.view(views[name]["id"], tenant))["status"] == status.JOB_QUEUED
        runner.gates[views["a1"]["id"]].set()
        await _until(lambda: len(runner.started) == 4, "a fourth job")
        assert runner.started[3] == "a3"  # A and B run one each now; A was served longer ago
        await mgr.close()

    asyncio.run(main())


def test_one_tenants_many_jobs_do_not_all_run_before_anothers_one(tmp_path):
    async def main():
        runner = Runner(gate=True)
        mgr = _manager(JobStore(str(tmp_path / "s")), runner, max_jobs=1)
        views = [await _create(mgr, "A", n) for n in ("a1", "a2", "a3")] + [await _create(mgr, "B", "b1")]
        for n in range(1, 5):
            await _until(lambda n=n: len(runner.started) == n, f"job {n} started")
            assert len(runner.started) == n  # one at a time
            runner.gates[next(v["id"] for v in views if v["name"] == runner.started[-1])].set()
        await _until(lambda: all(mgr.store.get(v["id"])["status"] == status.JOB_DONE for v in views), "all done")
        assert runner.started == ["a1", "b1", "a2", "a3"]
        await mgr.close()

    asyncio.run(main())


# ---- cancel, in every state ------------------------------------------------------------------------------
def test_cancel_ends_cancelled_in_every_state(tmp_path):
    async def main():
        root = str(tmp_path / "s")
        ra, rb = Runner("a", hold=1), Runner("b", hold=1)
        # leases that cannot go stale while the test runs: a holds "elsewhere" without heartbeats (never
        # started) and b must see it held, however slow the machine (5 s of a loaded suite once let it lapse)
        a = _manager(JobStore(root), ra, "a", max_jobs=1, lease_s=3600)
        b = _manager(JobStore(root), rb, "b", lease_s=3600)
        running = await _create(a, "t", "running", pages=3)
        queued = await _create(a, "t", "queued")
        await _until(lambda: a.store.done_pages(running["id"]) == {0}, "the first job's first page")
        assert (await a.cancel(queued["id"], "t"))["status"] == status.JOB_CANCELLED  # queued here: at once
        assert (await a.cancel(running["id"], "t"))["status"] == status.JOB_CANCELLED  # running here: stopped
        orphan = a.store.create(tenant="t", name="orphan", data=b"%PDF orphan", options={}, pages_total=1)
        assert (await b.cancel(orphan["id"], "t"))["status"] == status.JOB_CANCELLED  # nobody runs it
        elsewhere = await _create(a, "t", "elsewhere", pages=3)
        await _until(lambda: a.store.done_pages(elsewhere["id"]) == {0}, "the job elsewhere runs")
        # a's watcher (every 10 ms, in this same loop) would otherwise see b's cancel marker, stop its run and let
        # the lease go while b's cancel still awaits its own store calls: b would then end the job itself. a's
        # store reads no marker until b has answered (once in a loaded suite, and 2 runs in 15 alone)
        answered, read_marker = threading.Event(), a.store.cancelled
        a.store.cancelled = lambda job_id: answered.is_set() and read_marker(job_id)
        assert (await b.cancel(elsewhere["id"], "t"))["status"] == status.JOB_CANCELLING  # a's runner sees it
        answered.set()
        assert await b.cancel(elsewhere["id"], "someone else") is None
        await _until(_status_is(b, elsewhere["id"], "t", status.JOB_CANCELLED), "stopped by its own runner")
        await a.start()
        for _ in range(3):
            await a.sweep()
        await a.close()
        assert ra.started == ["running", "elsewhere"] and rb.started == []  # the queued one never ran
        for v in (running, queued, orphan, elsewhere):
            view = await b.view(v["id"], "t")
            assert view["status"] == status.JOB_CANCELLED, v["name"]
            refusal = result_refusal(view)
            assert (refusal.status, refusal.code, refusal.headers) == (409, "job_cancelled", {})
            assert (await b.cancel(v["id"], "t"))["status"] == status.JOB_CANCELLED  # final
        assert a.store.active() == []

    asyncio.run(main())


def test_result_refusals_say_what_each_state_means():
    base = {"error": None}
    assert result_refusal({**base, "status": status.JOB_DONE}) is None
    waiting = result_refusal({**base, "status": status.JOB_QUEUED})
    assert (waiting.status, waiting.code, waiting.headers) == (409, "job_not_finished", {"Retry-After": "2"})
    failed = result_refusal({"status": status.JOB_FAILED, "error": {"code": status.ENCRYPTED_PDF, "message": "pw"}})
    assert (failed.status, failed.code, failed.message) == (422, status.ENCRYPTED_PDF, "pw")


def test_a_document_that_fails_as_a_whole_fails_its_job(tmp_path):
    async def runner(st, skip):
        raise Refusal(status.ENCRYPTED_PDF, "the PDF needs a password")
        yield  # an async generator

    async def main():
        mgr = _manager(JobStore(str(tmp_path / "s")), runner)
        v = await _create(mgr, "t", "locked")
        await _until(_status_is(mgr, v["id"], "t", status.JOB_FAILED), "failed")
        assert (await mgr.view(v["id"], "t"))["error"] == {"code": status.ENCRYPTED_PDF,
                                                           "message": "the PDF needs a password"}
        await mgr.close()

    asyncio.run(main())


# ---- retention and what a sweep costs -----------------------------------------------------------------------
def test_retention_deletes_expired_finished_jobs_only(tmp_path):
    store = JobStore(str(tmp_path / "s"))
    t0 = 1_800_000_000.0
    jobs = {}
    for name, at in (("old", t0), ("recent", t0 + 100), ("later", t0 + 5000), ("open", None)):
        st = store.create(tenant="t", name=name, data=b"%PDF " + name.encode(), options={}, pages_total=1)
        store.write_page(st["id"], _row(st, 0))
        if at is not None:
            store.finish({**st, "status": status.JOB_DONE}, at=at)
        jobs[name] = st["id"]
    assert store.expire(1000, now=t0 + 999) == []
    assert store.expire(1000, now=t0 + 1050) == [jobs["old"]]
    assert store.expire(1000, now=t0 + 1100) == [jobs["recent"]]
    assert store.get(jobs["old"]) is None and not (tmp_path / "s" / "jobs" / jobs["old"]).exists()
    assert store.expire(1000, now=t0 + 10**6) == [jobs["later"]]
    assert [j for j, _ in store.active()] == [jobs["open"]] and store.done_pages(jobs["open"]) == {0}
    assert os.listdir(tmp_path / "s" / "finished") == []  # emptied hours go too


def test_a_sweep_costs_the_same_with_300_finished_jobs_as_with_none(tmp_path):
    async def cost(root: str, finished: int):
        store = JobStore(root)
        for i in range(finished):
            st = store.create(tenant="t", name=f"f{i}", data=b"%PDF f", options={}, pages_total=1)
            store.finish({**st, "status": status.JOB_DONE})
        live = store.create(tenant="t", name="live", data=b"%PDF live", options={}, pages_total=1)
        other = store.lease(live["id"], "another replica", 5)
        assert other.try_acquire() is None  # running elsewhere
        runner = Runner()
        mgr = _manager(store, runner, ttl_s=86400)
        store.ops.clear()
        await mgr.sweep()  # the first sweep runs retention too
        await mgr.sweep()
        other.release()
        assert runner.started == [] and len(store.active()) == 1
        return dict(store.ops)

    none, many = asyncio.run(cost(str(tmp_path / "none"), 0)), asyncio.run(cost(str(tmp_path / "many"), 300))
    assert many == none and none["list"] > 0


# ---- job ids -------------------------------------------------------------------------------------------
def test_a_job_id_is_32_hex_characters_and_nothing_more():
    from padoc_ray.serve.jobs import valid_id

    good = uuid.uuid4().hex
    assert valid_id(good)
    for bad in (good + "\n", good + "\r\n", "\n" + good, good.upper(), good[:-1], good + "0", "", None, "../" + good[3:]):
        assert not valid_id(bad), repr(bad)
