"""Async parse jobs, stored where every ingress replica sees them (a private local folder or s3://).

Every job's whole state (``job.json``: every field but the signature itself) is signed with the
store's key, HMAC-SHA256 over its canonical JSON (sorted keys, no spaces), and signed again on every
write: a job planted, or a state edited, by anyone without the key (status set back to ``queued``,
pages, name or options changed) is never listed, returned or run, and nothing is written for it (no
lease: the runner and the sweeper verify before they write). The scheme is marked in the state
(``sig_v``: :data:`SIG_V`); a state signed the earlier way (its id, tenant, created time and input
digest only) is refused with its own log line: jobs written before this version are not run or
shown. They are transient (a day by default); their clients submit them again.

The key (:func:`signing_key`) never sits among the jobs: a file the config names (``job_key``, e.g. a
mounted Kubernetes Secret), else the ``PADOC_RAY_JOB_KEY`` environment variable (hex), else, for a
local store only, ``<root>/store.key`` (32 random bytes, created once, beside ``jobs/`` in the private
root). An s3:// store without the first two is refused at start (cluster/README.md: one Secret for
every replica), since an object in its prefix is readable by whoever can write the jobs there.

Under the store's root:

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
SIG_V = 2  #: the signature scheme: 2 = HMAC-SHA256 over the whole state (1, unmarked: four fields only)
KEY_ENV = "PADOC_RAY_JOB_KEY"  #: the environment variable that may hold the signing key, as hex
MIN_KEY_BYTES = 32
_SIGNED = b"padoc-ray job state v2\n"  # domain separation: this key signs nothing else


def valid_id(job_id: str) -> bool:
    return isinstance(job_id, str) and _ID.fullmatch(job_id) is not None


def tenant_key(tenant: str) -> str:
    """A tenant as a name part (a digest: tenants are arbitrary strings)."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def _hex_key(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where} must hold the job store's key as hex, at least {2 * MIN_KEY_BYTES} hex digits "
                         f"({MIN_KEY_BYTES} bytes): make one with `openssl rand -hex {MIN_KEY_BYTES}`")
    return key


def signing_key(root: str, key_file: str | None, local_key=None) -> tuple[bytes, str]:
    """(the store's signing key, where it came from): ``key_file`` (hex) when given, else the
    :data:`KEY_ENV` variable (hex) when set, else ``local_key()`` (a local store's ``<root>/store.key``).
    An s3:// store has no such fallback: without the first two it is refused."""
    if key_file:
        path = os.path.expanduser(key_file)
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read(4096)
        except OSError as e:
            raise ValueError(f"the job store's key file (job_key) {path} cannot be read: {e.strerror or e}") from None
        return _hex_key(text, f"the job store's key file (job_key) {path}"), f"the file {path}"
    if os.environ.get(KEY_ENV, "").strip():
        return _hex_key(os.environ[KEY_ENV], f"the environment variable {KEY_ENV}"), f"${KEY_ENV}"
    if local_key is None:
        raise ValueError(
            f"the job store {root} needs a signing key, the same on every ingress replica, and an s3:// store "
            f"never keeps it beside its jobs: set the environment variable {KEY_ENV} to "
            f"{2 * MIN_KEY_BYTES} hex digits (`openssl rand -hex {MIN_KEY_BYTES}`), or name a file holding them "
            "with job_key (--job-key), e.g. a mounted Kubernetes Secret (cluster/README.md)")
    return local_key(), "store.key"


class InvalidJob(ValueError):
    """The job's input does not match the digest its signed state carries."""


class JobStore:
    """The jobs' storage; every method is blocking (call it from a thread in async code). ``ops``
    counts its storage operations by kind (reads, writes, lists, deletes, existence checks)."""

    def __init__(self, root: str, storage: StorageConfig | None = None, *, key_file: str | None = None):
        """``key_file``: the config's ``job_key`` (see :func:`signing_key`)."""
        storage = storage or StorageConfig()
        self.root, self.storage = (root.rstrip("/") if is_s3(root) else os.path.abspath(root)), storage
        self.ops: Counter = Counter()
        if is_s3(root):
            self._key, self.key_source = signing_key(self.root, key_file)  # refused before any request
            self.backend = S3Backend(self.root, storage, self.ops)
        else:
            self.backend = LocalBackend(self.root, self.ops)
            self._key, self.key_source = signing_key(self.root, key_file, self.backend.key)
        self._warned: set[str] = set()

    # ---- signatures ---------------------------------------------------------------------------------
    def _sign(self, st: dict) -> str:
        """HMAC-SHA256 of every field but ``sig``, as canonical JSON (a float reads back as itself)."""
        body = json.dumps({k: v for k, v in st.items() if k != "sig"}, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=True, allow_nan=False)
        return hmac.new(self._key, _SIGNED + body.encode(), hashlib.sha256).hexdigest()

    def _signed_v1(self, st: dict) -> bool:
        """Whether ``st`` carries a good signature of the old scheme (only to say so when refusing it)."""
        try:
            msg = json.dumps([st["id"], st["tenant"], st["created"], st["input_sha256"]]).encode()
        except KeyError:
            return False
        return hmac.compare_digest(str(st.get("sig", "")), hmac.new(self._key, msg, hashlib.sha256).hexdigest())

    def _signed(self, st: dict) -> dict:
        state = {k: v for k, v in st.items() if k != "sig"}
        state["sig_v"] = SIG_V
        state["sig"] = self._sign(state)
        return state

    def _write_state(self, state: dict) -> dict:
        state = self._signed(state)
        self.backend.write(f"jobs/{self._id(state['id'])}/job.json", json.dumps(state).encode())
        return state

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
        state = self._write_state(state)
        self.backend.write(f"active/{tenant_key(tenant)}-{job_id}", b"")  # last: the job is whole once listed
        return state

    def get(self, job_id: str) -> dict | None:
        """The job's state, if it exists and its whole state's signature verifies (current scheme only:
        a state signed before it is refused, see the module's docstring)."""
        if not valid_id(job_id):
            return None
        raw = self.backend.read(f"jobs/{job_id}/job.json")
        if not raw:
            return None
        why = None
        try:
            state = json.loads(raw)
            if not isinstance(state, dict) or state.get("id") != job_id:
                why = "its state is not this job's"
            elif state.get("sig_v") != SIG_V and self._signed_v1(state):
                why = (f"its state is signed the old way (signature scheme {state.get('sig_v', 1)!r}, not {SIG_V}: "
                       "four fields only); jobs written before this version are not run or shown: resubmit it")
            elif state.get("sig_v") != SIG_V or not hmac.compare_digest(str(state.get("sig", "")),
                                                                       self._sign(state)):
                why = "its state is not signed with this store's key (planted, or edited by hand)"
        except (ValueError, TypeError):
            why = "its state is not readable JSON"
        if why:
            self._refuse(job_id, why)
            return None
        # jobs written before the one document-status vocabulary said success / partial_success / failure
        state["document_status"] = status.normalize_document_status(state.get("document_status"))
        return state

    def put(self, state: dict) -> None:
        """Write the state, signed again (every field is signed)."""
        self._write_state({**state, "updated": time.time()})

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

