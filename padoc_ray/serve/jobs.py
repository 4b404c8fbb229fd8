"""Async parse jobs, stored where every ingress replica sees them (a private local folder or s3://).

Under the store's root:

* ``store.key``: 32 random bytes, created once; every job's state is signed with it (HMAC-SHA256
  over its id, tenant, created time and input digest), so a job planted by anyone without the key
  is never listed, returned or run;
* ``jobs/<id>/job.json`` (state), ``input`` (the document's bytes, its sha256 in the state; deleted
  when the job finishes),
  ``pages/<page_index>.parquet`` (one page row each, the batch job's schema, written as the page
  finishes), ``cancel`` (present once cancelled), ``lease`` (:mod:`padoc_ray.lease`: held by the
  replica running the job);
* ``active/<tenant digest>-<id>``: one empty marker per unfinished job, so finding the work costs
  O(unfinished jobs), however many finished ones are kept;
* ``finished/<hour>/<finish ms>-<id>``: finished jobs filed by the hour they finished, so retention
  costs O(expired jobs + hours kept).

A local root is private: created 0700 (with any parents it creates), files 0600; an existing root
owned by another uid, or open to its group or others, is refused. Job ids are generated here
(uuid4 hex) and checked against that shape before they touch a path. No ray, no fastapi.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import re
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.lease import Lease
from padoc_ray.output import rows
from padoc_ray.serve.store_backends import LocalBackend, S3Backend
from padoc_ray.storage import StorageConfig, is_s3, join

logger = logging.getLogger(__name__)

_ID = re.compile(r"[0-9a-f]{32}")  #: a job id, whole (fullmatch: "$" would let a trailing newline through)
FINAL = status.JOB_FINAL
BUCKET_S = 3600  #: finished jobs are filed by the hour they finished


def valid_id(job_id: str) -> bool:
    return isinstance(job_id, str) and _ID.fullmatch(job_id) is not None


def tenant_key(tenant: str) -> str:
    """A tenant as a name part (a digest: tenants are arbitrary strings)."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


class InvalidJob(ValueError):
    """The job's input does not match the digest its signed state carries."""


class JobStore:
    """The jobs' storage; every method is blocking (call it from a thread in async code). ``ops``
    counts its storage operations by kind (reads, writes, lists, deletes, existence checks)."""

    def __init__(self, root: str, storage: StorageConfig | None = None):
        storage = storage or StorageConfig()
        self.root, self.storage = (root.rstrip("/") if is_s3(root) else os.path.abspath(root)), storage
        self.ops: Counter = Counter()
        self.backend = S3Backend(self.root, storage, self.ops) if is_s3(root) else LocalBackend(self.root, self.ops)
        self._key = self.backend.key()
        self._warned: set[str] = set()

    # ---- signatures ---------------------------------------------------------------------------------
    def _sign(self, st: dict) -> str:
        msg = json.dumps([st["id"], st["tenant"], st["created"], st["input_sha256"]]).encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def _refuse(self, job_id: str, why: str) -> None:
        if job_id not in self._warned:
            self._warned.add(job_id)
            logger.warning("job %s in %s is refused: %s", job_id, self.root, why)

    # ---- state --------------------------------------------------------------------------------------
    def create(self, *, tenant: str, name: str, data: bytes, options: dict, pages_total: int) -> dict:
        job_id = uuid.uuid4().hex
        self.backend.write(f"jobs/{job_id}/input", data)
        now = time.time()
        state = {"id": job_id, "tenant": tenant, "name": name, "status": status.JOB_QUEUED, "pages_total": pages_total,
                 "options": options, "created": now, "updated": now, "owner": None, "finished": None,
                 "document_status": None, "error": None, "input_sha256": hashlib.sha256(data).hexdigest()}
        state["sig"] = self._sign(state)
        self.backend.write(f"jobs/{job_id}/job.json", json.dumps(state).encode())
        self.backend.write(f"active/{tenant_key(tenant)}-{job_id}", b"")  # last: the job is whole once listed
        return state

    def get(self, job_id: str) -> dict | None:
        """The job's state, if it exists and its signature verifies."""
        if not valid_id(job_id):
            return None
        raw = self.backend.read(f"jobs/{job_id}/job.json")
        if not raw:
            return None
        try:
            state = json.loads(raw)
            good = isinstance(state, dict) and state.get("id") == job_id and hmac.compare_digest(
                str(state.get("sig", "")), self._sign(state))
        except (ValueError, KeyError, TypeError):
            good = False
        if not good:
            self._refuse(job_id, "its state is not signed with this store's key")
            return None
        # jobs written before the one document-status vocabulary said success / partial_success / failure
        state["document_status"] = status.normalize_document_status(state.get("document_status"))
        return state

    def put(self, state: dict) -> None:
        state = {**state, "updated": time.time()}
        self.backend.write(f"jobs/{self._id(state['id'])}/job.json", json.dumps(state).encode())

    def input(self, state: dict) -> bytes:
        """The job's input; raises :class:`InvalidJob` when it is not the input the state was signed with."""
        raw = self.backend.read(f"jobs/{self._id(state['id'])}/input")
        if raw is None:
            raise FileNotFoundError("the job's input is gone")
        if not hmac.compare_digest(hashlib.sha256(raw).hexdigest(), state["input_sha256"]):
            self._refuse(state["id"], "its input does not match its digest")
            raise InvalidJob("the job's input does not match its digest")
        return raw

    def finish(self, state: dict, at: float | None = None) -> None:
        """Write the final state, drop the input (no longer needed), file the job for retention and take
        it off the active index."""
        at = time.time() if at is None else at
        self.put({**state, "finished": at})
        self.backend.delete(f"jobs/{state['id']}/input")
        bucket = int(at // BUCKET_S * BUCKET_S)
        self.backend.write(f"finished/{bucket}/{int(at * 1000)}-{state['id']}", b"")
        self.backend.delete(f"active/{tenant_key(state['tenant'])}-{state['id']}")

    def active(self) -> list[tuple[str, str]]:
        """(job id, tenant key) of every unfinished job: one listing of the active index."""
        out = []
        for n in self.backend.list("active"):
            key, _, job_id = n.partition("-")
            if valid_id(job_id):
                out.append((job_id, key))
        return out

    def lease(self, job_id: str, holder_id: str, stale_s: float) -> Lease:
        return Lease(join(self.root, "jobs", self._id(job_id)), "lease", self.storage, holder_id, stale_s=stale_s,
                     mode=0o600, what="job lease")

    # ---- cancellation -------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> None:
        self.backend.write(f"jobs/{self._id(job_id)}/cancel", b"")

    def cancelled(self, job_id: str) -> bool:
        return self.backend.exists(f"jobs/{self._id(job_id)}/cancel")

    # ---- page rows -----------------------------------------------------------------------------------
    def write_page(self, job_id: str, row: dict) -> None:
        buf = io.BytesIO()
        pq.write_table(rows.to_table([row]), buf)
        self.backend.write(f"jobs/{self._id(job_id)}/pages/{int(row['page_index'])}.parquet", buf.getvalue())

    def done_pages(self, job_id: str) -> set[int]:
        out = set()
        for n in self.backend.list(f"jobs/{self._id(job_id)}/pages"):
            stem = n.removesuffix(".parquet")
            if n.endswith(".parquet") and stem.lstrip("-").isdigit():
                out.add(int(stem))
        return out

    def page_rows(self, job_id: str) -> list[dict]:
        out = []
        for i in sorted(self.done_pages(job_id)):
            raw = self.backend.read(f"jobs/{job_id}/pages/{i}.parquet")
            if raw:
                out.extend(pq.read_table(pa.BufferReader(raw), schema=rows.PAGE_SCHEMA).to_pylist())
        return out

    # ---- retention -----------------------------------------------------------------------------------
    def expire(self, ttl_s: float, now: float | None = None) -> list[str]:
        """Delete every finished job (input, state, pages, lease) ``ttl_s`` after it finished; the ids
        deleted. Lists the hour folders, and only those holding a job old enough."""
        now = time.time() if now is None else now
        gone = []
        for b in sorted(int(n) for n in self.backend.list("finished") if n.isdigit()):
            if b + ttl_s > now:
                break  # this hour's jobs, and every later hour's, are younger than ttl_s
            names = self.backend.list(f"finished/{b}")
            for n in names:
                ms, _, job_id = n.partition("-")
                if not (ms.isdigit() and valid_id(job_id)) or int(ms) / 1000 + ttl_s > now:
                    continue
                self.backend.delete_tree(f"jobs/{job_id}")
                self.backend.delete(f"finished/{b}/{n}")
                gone.append(job_id)
            if b + BUCKET_S + ttl_s <= now:
                self.backend.delete_tree(f"finished/{b}")
        return gone

    @staticmethod
    def _id(job_id: str) -> str:
        if not valid_id(job_id):
            raise KeyError(job_id)
        return job_id

