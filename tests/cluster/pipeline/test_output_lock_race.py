"""The S3 output lock under a race: several runs (each its own process) start on one output at the
same moment, on the S3 server (moto), and exactly one of them holds the lock, whether they race to
create it (``If-None-Match: *``) or to take over a dead run's stale one (``If-Match`` its ETag).

moto checks a write's condition and then applies the write in two steps of a threaded server, so two
racing conditional writes could both pass there; S3 applies each one atomically. The runs therefore
reach moto through a proxy (tests/helpers/s3_proxy.py) that forwards one request at a time: every
run still reads the lock before any of them writes it, as in a real race, and each conditional
write is decided on its own, as S3 decides it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from padoc_ray.pipeline.lock import OutputLock
from padoc_ray.storage import StorageConfig

from tests.conftest import _env
from tests.helpers.s3_proxy import S3Proxy

RUNS = 6
STALE_S = 2.0  # a lock whose heartbeat (every STALE_S / 4) is older than this is a dead run's

#: one run: loads boto3 and says ``ready``, tries the lock once when the start file appears, says ``held``
#: or ``refused``; a holder keeps the lock (its heartbeat running) until its stdin closes, then says
#: whether it still held it and releases it
RUN = """
import os, sys, time
from padoc_ray.pipeline.lock import OutputInUse, OutputLock
from padoc_ray.storage import StorageConfig, s3_client
out, endpoint, run_id, start, stale_s = sys.argv[1:6]
cfg = StorageConfig(endpoint=endpoint)
s3_client(cfg).list_buckets()  # botocore loaded before the start, so every run starts as fast
lock = OutputLock(out, cfg, run_id, stale_s=float(stale_s))
print("ready", flush=True)
while not os.path.exists(start):
    time.sleep(0.001)
try:
    lock.acquire()
except OutputInUse:
    print("refused", flush=True)
    sys.exit(0)
print("held", flush=True)
sys.stdin.read()
print("lost" if lock.lost else "kept", flush=True)
lock.release()
"""


class _AtomicStore(S3Proxy):
    """The proxy forwarding one request at a time (its conditional writes atomic, as S3's are)."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self._one = threading.Lock()

    def _serve(self, h) -> None:
        with self._one:
            super()._serve(h)


@pytest.mark.parametrize("lock_state", ["absent", "stale"])
def test_runs_racing_for_one_s3_output_lock_end_with_exactly_one_holder(s3, tmp_path, monkeypatch, lock_state):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    bucket = f"race-{lock_state}"
    s3["client"].create_bucket(Bucket=bucket)
    out = f"s3://{bucket}/run"
    with _AtomicStore(s3["endpoint"]) as store:
        cfg = StorageConfig(endpoint=store.endpoint)
        if lock_state == "stale":  # a run took the lock and died: no heartbeat, no release
            dead = OutputLock(out, cfg, "dead-run", stale_s=STALE_S)
            dead.acquire()
            dead.lease.abandon()
        start = tmp_path / "start"
        runs = [subprocess.Popen([sys.executable, "-c", RUN, out, store.endpoint, f"run-{i}", str(start), str(STALE_S)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(**s3["env"]))
                for i in range(RUNS)]
        try:
            assert [p.stdout.readline().strip() for p in runs] == ["ready"] * RUNS
            if lock_state == "stale":
                probe = OutputLock(out, cfg, "probe", stale_s=STALE_S).lease
                while probe.holder() is not None:  # the dead run's lock, until it is stale
                    time.sleep(0.1)
                assert json.loads(s3["client"].get_object(Bucket=bucket, Key="run/_lock.json")["Body"].read()
                                  )["run_id"] == "dead-run"
            start.touch()
            said = {f"run-{i}": p.stdout.readline().strip() for i, p in enumerate(runs)}
            holders = [r for r, s in said.items() if s == "held"]
            assert len(holders) == 1 and set(said.values()) == {"held", "refused"}, said
            time.sleep(STALE_S)  # heartbeats go on; no refused run writes the lock
            body = json.loads(s3["client"].get_object(Bucket=bucket, Key="run/_lock.json")["Body"].read())
            assert body["run_id"] == holders[0]
            winner = runs[int(holders[0].removeprefix("run-"))]
            winner.stdin.close()
            assert winner.stdout.readline().strip() == "kept"  # its heartbeat never found the lock taken over
            assert [p.wait(60) for p in runs] == [0] * RUNS
        finally:
            for p in runs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
    assert "Contents" not in s3["client"].list_objects_v2(Bucket=bucket)  # released by its one holder
