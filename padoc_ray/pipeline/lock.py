"""One run at a time on an output: a lock under ``OUTPUT/`` that a second run waits for or refuses.

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

import json
import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from padoc_ray.storage import InputError, StorageConfig, is_s3, join, s3_client, split_s3

logger = logging.getLogger(__name__)

LOCK_NAME = "_lock.json"


class OutputInUse(InputError):
    """Another live run holds the output."""


def _info(run_id: str) -> dict:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "since": now, "heartbeat": now}


def _describe(info: dict | None) -> str:
    if not info:
        return "another run"
    return (f"run {info.get('run_id')} (host {info.get('host')}, pid {info.get('pid')}, since {info.get('since')}, "
            f"last heartbeat {info.get('heartbeat')})")


class OutputLock:
    """``with OutputLock(output, storage, run_id): ...`` holds the output for the block.

    ``wait_s``: how long to wait for another run's lock before raising :class:`OutputInUse`
    (0: at once); ``stale_s``: (s3) a heartbeat older than this marks a dead run."""

    def __init__(self, output: str, storage: StorageConfig, run_id: str, *, wait_s: float = 0.0,
                 stale_s: float = 120.0, poll_s: float = 1.0, log=None):
        self.output, self.storage, self.run_id = output, storage, run_id
        self.wait_s, self.stale_s, self.poll_s = wait_s, stale_s, poll_s
        self.log = log or logger.info
        self.lost = False  #: (s3) the heartbeat found the lock taken over: this run is no longer alone
        self._flock = None
        self._etag = None
        self._stop = threading.Event()
        self._beat = None

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
            holder = self._try_s3() if is_s3(self.output) else self._try_local()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                hint = " or pass --wait-lock SECONDS" if not self.wait_s else ""
                raise OutputInUse(f"--output {self.output} is in use by {_describe(holder)}; wait for it to "
                                  f"finish{hint}. Two runs on one output would plan the same work twice.")
            if not told:
                self.log(f"--output {self.output} is in use by {_describe(holder)}; waiting up to {self.wait_s:g} s")
                told = True
            time.sleep(self.poll_s)

    def release(self) -> None:
        if is_s3(self.output):
            self._stop.set()
            if self._beat is not None:
                self._beat.join(timeout=30)
            if self._etag is not None:
                bucket, key = split_s3(join(self.output, LOCK_NAME))
                try:
                    s3_client(self.storage).delete_object(Bucket=bucket, Key=key, IfMatch=self._etag)
                except Exception as e:  # noqa: BLE001 - taken over, or gone: not ours to delete any more
                    logger.warning("could not remove the lock %s: %s", self.output, e)
                self._etag = None
            return
        if self._flock is not None:
            try:
                os.remove(join(self.output, LOCK_NAME))
            except FileNotFoundError:
                pass
            self._flock.release()
            self._flock = None

    # ---- local folder: an OS lock ----
    def _try_local(self) -> dict | None:
        from filelock import FileLock, Timeout

        os.makedirs(self.output, exist_ok=True)
        lock = FileLock(join(self.output, "_lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            try:
                with open(join(self.output, LOCK_NAME), encoding="utf-8") as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {}
        self._flock = lock
        tmp = join(self.output, f"{LOCK_NAME}.{self.run_id}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(_info(self.run_id), f)
        os.replace(tmp, join(self.output, LOCK_NAME))
        return None

    # ---- s3: a conditionally written object with a heartbeat ----
    def _try_s3(self) -> dict | None:
        from botocore.exceptions import ClientError

        client = s3_client(self.storage)
        bucket, key = split_s3(join(self.output, LOCK_NAME))
        body = json.dumps(_info(self.run_id)).encode()
        try:
            self._etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")["ETag"]
        except ClientError as e:
            if not _conflict(e):
                raise
        else:
            self._start_heartbeat()
            return None
        try:
            got = client.get_object(Bucket=bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return self._try_s3()  # released in between: try again
            raise
        holder = _json(got["Body"].read())
        if holder == json.loads(body):
            # our own create landed but its answer was lost (a dropped connection), so the client's retry
            # failed its condition: the lock is ours
            logger.info("the lock on %s is this run's own (a retried create found its first try applied)", self.output)
            self._etag = got["ETag"]
            self._start_heartbeat()
            return None
        server_now = _server_time(got)
        age = (server_now - got["LastModified"]).total_seconds()
        if age <= self.stale_s:
            return holder
        try:  # a dead run's lock: take it over, unless someone else just did
            self._etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfMatch=got["ETag"])["ETag"]
        except ClientError as e:
            if not _conflict(e):
                raise
            return holder
        logger.warning("took over the stale lock of %s on %s (no heartbeat for %.0f s)", _describe(holder),
                       self.output, age)
        self._start_heartbeat()
        return None

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="padoc-output-lock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        from botocore.exceptions import ClientError

        client = s3_client(self.storage)
        bucket, key = split_s3(join(self.output, LOCK_NAME))
        info = _info(self.run_id)
        while not self._stop.wait(self.stale_s / 4):
            info["heartbeat"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            try:
                self._etag = client.put_object(Bucket=bucket, Key=key, Body=json.dumps(info).encode(),
                                               IfMatch=self._etag)["ETag"]
            except ClientError as e:
                if _conflict(e) and self._beat_landed(client, bucket, key, info):
                    continue  # the first try of this beat was applied, its answer lost: the lock is still ours
                if _conflict(e) or e.response.get("Error", {}).get("Code") == "NoSuchKey":
                    self.lost = True
                    self._etag = None
                    logger.error("the lock on %s was taken over by another run (this run stalled for over %.0f s); "
                                 "its rows may overlap with this run's", self.output, self.stale_s)
                    return
                logger.warning("lock heartbeat on %s failed: %s", self.output, e)
            except Exception as e:  # noqa: BLE001 - a transient error: the next beat tries again
                logger.warning("lock heartbeat on %s failed: %s", self.output, e)

    def _beat_landed(self, client, bucket: str, key: str, info: dict) -> bool:
        """After a failed conditional heartbeat: whether the object is this very beat (an earlier try of
        the same request was applied and its answer lost); then its ETag is ours again."""
        try:
            got = client.get_object(Bucket=bucket, Key=key)
        except Exception:  # noqa: BLE001 - cannot tell: treat as lost
            return False
        if _json(got["Body"].read()) != info:
            return False
        self._etag = got["ETag"]
        return True


def _conflict(e) -> bool:
    """A failed condition (412), or a concurrent conditional write (409)."""
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in (409, 412) or e.response.get("Error", {}).get("Code") in ("PreconditionFailed",
                                                                                "ConditionalRequestConflict")


def _server_time(resp) -> datetime:
    date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        t = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.now(timezone.utc)
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)  # HTTP dates are GMT


def _json(data: bytes) -> dict:
    try:
        obj = json.loads(data)
        return obj if isinstance(obj, dict) else {}
    except ValueError:
        return {}
