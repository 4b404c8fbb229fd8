"""A lease: one holder at a time of something named by a path or an ``s3://`` URI, taken without waiting.

* Local folder: an OS file lock (``BASE/NAME``, :mod:`filelock`). The operating system releases it
  when the holding process ends, however it ends, so a dead holder's lease is never stale.
  ``BASE/NAME.json`` says who holds it.
* ``s3://``: the object ``BASE/NAME.json``, created only if absent (``If-None-Match: *``) and
  rewritten by its holder every ``stale_s / 4`` seconds (a heartbeat, ``If-Match`` its own ETag).
  A lease whose heartbeat is older than ``stale_s`` (by the store's clock: the object's
  Last-Modified against the response's Date) belongs to a dead holder and is taken over with a
  conditional write on its ETag, so of two holders taking it over only one succeeds. A heartbeat
  that finds the object taken over sets :attr:`Lease.lost`. Needs a store with conditional writes
  (AWS S3, MinIO, moto).

Used by the batch job's output lock (:mod:`padoc_ray.pipeline.lock`) and the online service's
jobs (:mod:`padoc_ray.serve.jobs`). Pure: no ray, vllm or torch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from padoc_ray.storage import StorageConfig, is_s3, join, s3_client, split_s3

logger = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Lease:
    """``try_acquire()`` -> None (held now) or the current holder's info (a dict, ``{}`` when unreadable).

    ``holder_id`` names the holder in the info (with host, pid and since when); ``stale_s``: (s3) a
    heartbeat older than this marks a dead holder; ``mode``: (local) the lock and info files' mode."""

    def __init__(self, base: str, name: str, storage: StorageConfig, holder_id: str, *, stale_s: float = 120.0,
                 mode: int | None = None, what: str = "lease"):
        self.base, self.name, self.storage, self.holder_id = base, name, storage, holder_id
        self.stale_s, self.mode, self.what = stale_s, mode, what
        self.lost = False  #: (s3) a heartbeat found the lease taken over: this holder is no longer alone
        self.info_uri = join(base, f"{name}.json")
        self._token = uuid.uuid4().hex  # this Lease object's: two of one holder never take each other's for theirs
        self._flock = None
        self._etag = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return (self._flock is not None or self._etag is not None) and not self.lost

    def try_acquire(self) -> dict | None:
        return self._try_s3() if is_s3(self.base) else self._try_local()

    def holder(self) -> dict | None:
        """The live holder's info, or None when nobody holds the lease (local: nobody has the OS lock;
        s3: no object, or a stale one)."""
        if is_s3(self.base):
            from botocore.exceptions import ClientError

            bucket, key = split_s3(self.info_uri)
            try:
                got = s3_client(self.storage).get_object(Bucket=bucket, Key=key)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            info = _json(got["Body"].read())
            return None if (_server_time(got) - got["LastModified"]).total_seconds() > self.stale_s else info
        if self._flock is not None:
            return self._read_local_info()
        probe = self._file_lock()
        if probe is None:
            return None
        from filelock import Timeout

        try:
            probe.acquire(timeout=0)
        except Timeout:
            return self._read_local_info()
        probe.release()
        return None

    def release(self) -> None:
        """Give the lease up (a lost one is not ours to delete any more)."""
        if is_s3(self.base):
            self._stop_heartbeat()
            if self._etag is not None:
                bucket, key = split_s3(self.info_uri)
                try:
                    s3_client(self.storage).delete_object(Bucket=bucket, Key=key, IfMatch=self._etag)
                except Exception as e:  # noqa: BLE001 - taken over, or gone: not ours to delete any more
                    logger.warning("could not remove the %s %s: %s", self.what, self.info_uri, e)
                self._etag = None
            return
        if self._flock is not None:
            try:
                os.remove(self.info_uri)
            except FileNotFoundError:
                pass
            self._flock.release()
            self._flock = None

    def abandon(self) -> None:
        """Stop holding without cleaning up, as a dying process does: the OS lock goes (local), the
        heartbeat stops and the object is left to go stale (s3)."""
        self._stop_heartbeat()
        self._etag = None
        if self._flock is not None:
            self._flock.release()
            self._flock = None

    # ---- local folder: an OS lock ----
    def _file_lock(self, create: bool = False):
        from filelock import FileLock

        if not create and not os.path.exists(join(self.base, self.name)):
            return None
        os.makedirs(self.base, 0o777 if self.mode is None else 0o700, exist_ok=True)
        kw = {} if self.mode is None else {"mode": self.mode}
        return FileLock(join(self.base, self.name), thread_local=False, **kw)

    def _read_local_info(self) -> dict:
        try:
            with open(self.info_uri, encoding="utf-8") as f:
                info = json.load(f)
            return info if isinstance(info, dict) else {}
        except (OSError, ValueError):
            return {}

    def _try_local(self) -> dict | None:
        from filelock import Timeout

        lock = self._file_lock(create=True)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return self._read_local_info()
        self._flock = lock
        tmp = f"{self.info_uri}.{self.holder_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if self.mode is None else self.mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._info(), f)
        os.replace(tmp, self.info_uri)
        return None

    # ---- s3: a conditionally written object with a heartbeat ----
    def _info(self) -> dict:
        now = _now()
        return {"run_id": self.holder_id, "host": socket.gethostname(), "pid": os.getpid(), "since": now,
                "heartbeat": now, "token": self._token}

    def _try_s3(self) -> dict | None:
        from botocore.exceptions import ClientError

        client = s3_client(self.storage)
        bucket, key = split_s3(self.info_uri)
        body = json.dumps(self._info()).encode()
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
            # failed its condition: the lease is ours
            logger.info("the %s %s is this holder's own (a retried create found its first try applied)", self.what,
                        self.info_uri)
            self._etag = got["ETag"]
            self._start_heartbeat()
            return None
        age = (_server_time(got) - got["LastModified"]).total_seconds()
        if age <= self.stale_s:
            return holder
        try:  # a dead holder's lease: take it over, unless someone else just did
            self._etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfMatch=got["ETag"])["ETag"]
        except ClientError as e:
            if not _conflict(e):
                raise
            return holder
        logger.warning("took over the stale %s of %s on %s (no heartbeat for %.0f s)", self.what, describe(holder),
                       self.base, age)
        self._start_heartbeat()
        return None

    def _start_heartbeat(self) -> None:
        self.lost = False
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="padoc-lease", daemon=True)
        self._beat.start()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=30)
        self._beat = None

    def _heartbeat(self) -> None:
        from botocore.exceptions import ClientError

        client = s3_client(self.storage)
        bucket, key = split_s3(self.info_uri)
        info = self._info()
        while not self._stop.wait(self.stale_s / 4):
            info["heartbeat"] = _now()
            try:
                self._etag = client.put_object(Bucket=bucket, Key=key, Body=json.dumps(info).encode(),
                                               IfMatch=self._etag)["ETag"]
            except ClientError as e:
                if _conflict(e) and self._beat_landed(client, bucket, key, info):
                    continue  # the first try of this beat was applied, its answer lost: the lease is still ours
                if _conflict(e) or e.response.get("Error", {}).get("Code") == "NoSuchKey":
                    self.lost = True
                    self._etag = None
                    logger.error("the %s on %s was taken over by another holder (this one stalled for over %.0f s)",
                                 self.what, self.base, self.stale_s)
                    return
                logger.warning("%s heartbeat on %s failed: %s", self.what, self.base, e)
            except Exception as e:  # noqa: BLE001 - a transient error: the next beat tries again
                logger.warning("%s heartbeat on %s failed: %s", self.what, self.base, e)

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


def describe(info: dict | None, kind: str = "run") -> str:
    """A holder's info in words."""
    if not info:
        return f"another {kind}"
    return (f"{kind} {info.get('run_id')} (host {info.get('host')}, pid {info.get('pid')}, since {info.get('since')}, "
            f"last heartbeat {info.get('heartbeat')})")


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
