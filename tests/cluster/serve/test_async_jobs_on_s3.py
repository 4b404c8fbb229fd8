"""The async jobs' s3:// store against a real S3 server (moto's, the session's ``s3`` fixture in
tests/conftest.py): a store that signs, runs, cancels and expires jobs, keeps no key beside them, its
exclusive leases taken over from a dead holder, and a run that stops when its lease was taken. The
local stores and everything else about jobs: tests/unit/serve/test_async_jobs.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import pytest

from padoc_ray import status
from padoc_ray.serve.jobs import KEY_ENV, JobStore, tenant_key
from padoc_ray.storage import StorageConfig

from tests.unit.serve.test_async_jobs import Runner, _create, _manager, _status_is, _until


# ---- the s3 variant (moto) --------------------------------------------------------------------------------
@pytest.fixture
def s3_store(s3, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(KEY_ENV, os.urandom(32).hex())  # as a Kubernetes Secret gives every replica
    bucket = f"jobs-{uuid.uuid4().hex[:8]}"
    s3["client"].create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store", StorageConfig(endpoint=s3["endpoint"]), s3["client"], bucket


def test_an_s3_store_signs_runs_cancels_and_expires_jobs(s3_store):
    root, cfg, client, bucket = s3_store

    async def main():
        store = JobStore(root, cfg)
        assert JobStore(root, cfg)._key == store._key  # one key per store, created once
        runner = Runner()
        mgr = _manager(store, runner, ttl_s=3600)
        await mgr.start()
        try:
            v = await _create(mgr, "t", "doc", pages=3)
            await _until(_status_is(mgr, v["id"], "t", status.JOB_DONE), "done on s3")
            state, page_rows = await mgr.rows(v["id"], "t")
            assert [r["page_index"] for r in page_rows] == [0, 1, 2] and state["document_status"] == status.DOC_OK
            orphan = store.create(tenant="t", name="orphan", data=b"%PDF orphan", options={}, pages_total=1)
            store.cancel(orphan["id"])  # marked, and nobody alive runs it: the sweeper ends it cancelled
            await _until(_status_is(mgr, orphan["id"], "t", status.JOB_CANCELLED), "the orphan cancelled")
            await _until(lambda: store.active() == [], "both off the active index")
            assert runner.started == ["doc"]
        finally:
            await mgr.close()
        planted = uuid.uuid4().hex
        client.put_object(Bucket=bucket, Key=f"store/jobs/{planted}/input", Body=b"%PDF planted")
        client.put_object(Bucket=bucket, Key=f"store/jobs/{planted}/job.json", Body=json.dumps(
            {"id": planted, "tenant": "t", "name": "planted", "status": status.JOB_QUEUED, "pages_total": 1,
             "created": 0, "input_sha256": "0" * 64, "sig": "0" * 64}).encode())
        client.put_object(Bucket=bucket, Key=f"store/active/{tenant_key('t')}-{planted}", Body=b"")
        mgr = _manager(store, runner)
        await mgr.sweep()
        await mgr.close()
        assert store.get(planted) is None and runner.started == ["doc"]
        assert sorted(store.expire(3600, now=time.time() + 3601)) == sorted([v["id"], orphan["id"]])
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="store/jobs/").get("Contents", [])]
        assert keys and all(k.startswith(f"store/jobs/{planted}/") for k in keys)

    asyncio.run(main())


def test_an_s3_store_keeps_no_key_beside_its_jobs(s3_store, monkeypatch, tmp_path):
    """An s3:// store needs its key from the config or the environment: without either it is refused
    at start, before any request; with one, nothing key-like is ever written to the bucket."""
    root, cfg, client, bucket = s3_store
    key_hex = os.environ[KEY_ENV]
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=f"set the environment variable {KEY_ENV}.*job_key \\(--job-key\\)"):
        JobStore(root, cfg)
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    key_file = tmp_path / "job-key"
    key_file.write_text(key_hex)
    a = JobStore(root, cfg, key_file=str(key_file))
    monkeypatch.setenv(KEY_ENV, key_hex)
    b = JobStore(root, cfg)  # another replica, the same Secret as an environment variable
    assert a._key == b._key == bytes.fromhex(key_hex)
    st = a.create(tenant="t", name="x", data=b"%PDF x", options={}, pages_total=1)
    a.finish({**st, "status": status.JOB_DONE})
    assert b.get(st["id"])["status"] == status.JOB_DONE
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys and all(k.startswith(("store/jobs/", "store/finished/")) for k in keys), keys
    assert not any(key_hex in client.get_object(Bucket=bucket, Key=k)["Body"].read().decode("latin-1")
                   for k in keys)


def test_an_s3_job_lease_is_exclusive_and_a_dead_holders_is_taken_over(s3_store):
    root, cfg, _, _ = s3_store
    store = JobStore(root, cfg)
    st = store.create(tenant="t", name="x", data=b"%PDF x", options={}, pages_total=1)
    a, b = store.lease(st["id"], "a", 2), store.lease(st["id"], "b", 2)
    assert a.try_acquire() is None and a.held
    assert b.try_acquire()["run_id"] == "a" and b.holder()["run_id"] == "a"
    time.sleep(3)  # longer than stale_s: a's heartbeat keeps it
    assert b.try_acquire()["run_id"] == "a"
    a.abandon()  # a dies
    deadline = time.monotonic() + 30
    while b.try_acquire() is not None:
        assert time.monotonic() < deadline, "the stale lease was never taken over"
        time.sleep(0.5)
    assert b.held and store.lease(st["id"], "c", 2).holder()["run_id"] == "b"
    b.release()
    assert store.lease(st["id"], "c", 2).holder() is None


def test_a_run_whose_s3_lease_was_taken_over_stops_and_writes_nothing_more(s3_store):
    root, cfg, client, bucket = s3_store

    async def main():
        runner = Runner("a", hold=1)
        mgr = _manager(JobStore(root, cfg), runner, lease_s=2, sweep_s=0.05)
        v = await _create(mgr, "t", "doc", pages=3)
        await _until(lambda: mgr.store.done_pages(v["id"]) == {0}, "the first page")
        # another replica took the lease over (this one stalled): the object is no longer this run's
        client.put_object(Bucket=bucket, Key=f"store/jobs/{v['id']}/lease.json", Body=b'{"run_id": "b"}')
        await _until(lambda: not mgr._running, "the local run stopped")
        state = mgr.store.get(v["id"])
        assert state["status"] == status.JOB_RUNNING and state["owner"] == "a"  # not finished, not cancelled
        assert mgr.store.lease(v["id"], "c", 2).holder() == {"run_id": "b"}  # the new holder's lease stays
        await mgr.close()

    asyncio.run(main())
