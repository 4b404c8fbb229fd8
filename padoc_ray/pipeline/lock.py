"""One run at a time on an output: a lock under ``OUTPUT/`` that a second run waits for or refuses.

A :class:`padoc_ray.lease.Lease` named ``_lock`` in the output:

* Local folder: an OS file lock (``OUTPUT/_lock``, :mod:`filelock`), held for the run. The
  operating system releases it when the process ends, however it ends, so a dead run's lock is
  never stale. ``OUTPUT/_lock.json`` says who holds it (run id, host, pid, since when).
* ``s3://``: the object ``OUTPUT/_lock.json``, created only if absent (``If-None-Match: *``) and
  rewritten by its holder every ``stale_s / 4`` seconds (a heartbeat, ``If-Match`` its own
  ETag). A lock whose heartbeat is older than ``stale_s`` (by the store's clock: the object's
  Last-Modified against the response's Date) belongs to a dead run and is taken over with a
  conditional write on its ETag, so of two runs taking it over only one succeeds. This needs a
  store with conditional writes (AWS S3 has them; so do MinIO and moto).

Pure: no ray, vllm or torch.
"""

from __future__ import annotations

import logging
import time

from padoc_ray.lease import Lease, describe
from padoc_ray.storage import InputError, StorageConfig

logger = logging.getLogger(__name__)

LOCK_NAME = "_lock.json"


class OutputInUse(InputError):
    """Another live run holds the output."""


class OutputLock:
    """``with OutputLock(output, storage, run_id): ...`` holds the output for the block.

    ``wait_s``: how long to wait for another run's lock before raising :class:`OutputInUse`
    (0: at once); ``stale_s``: (s3) a heartbeat older than this marks a dead run."""

    def __init__(self, output: str, storage: StorageConfig, run_id: str, *, wait_s: float = 0.0,
                 stale_s: float = 120.0, poll_s: float = 1.0, log=None):
        self.output, self.storage, self.run_id = output, storage, run_id
        self.wait_s, self.stale_s, self.poll_s = wait_s, stale_s, poll_s
        self.log = log or logger.info
        self.lease = Lease(output, LOCK_NAME.removesuffix(".json"), storage, run_id, stale_s=stale_s, what="lock")

    @property
    def lost(self) -> bool:
        """(s3) the heartbeat found the lock taken over: this run is no longer alone."""
        return self.lease.lost

    # ---- public ----
    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        told = False
        while True:
            holder = self.lease.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                hint = " or pass --wait-lock SECONDS" if not self.wait_s else ""
                raise OutputInUse(f"--output {self.output} is in use by {describe(holder)}; wait for it to "
                                  f"finish{hint}. Two runs on one output would plan the same work twice.")
            if not told:
                self.log(f"--output {self.output} is in use by {describe(holder)}; waiting up to {self.wait_s:g} s")
                told = True
            time.sleep(self.poll_s)

    def release(self) -> None:
        self.lease.release()
