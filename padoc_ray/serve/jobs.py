"""Async parse jobs, stored where every ingress replica sees them (a local folder or s3://).

One folder per job under ``<store>/jobs/<id>/``:

* ``job.json``: state (status, pages total, options, owner replica, heartbeat, tenant digest);
* ``input``: the document's bytes;
* ``pages/<page_index>.parquet``: one page row each, in the batch job's schema, written as the
  page finishes (so a replica that takes over a job parses only the pages still missing);
* ``cancel``: present once the job was cancelled (every replica's runner polls it).

A job whose owner has not written its heartbeat for ``lease_s`` is taken over by any replica's
sweeper, so a killed ingress replica loses no job. Job ids are generated here (uuid4 hex) and
checked against that shape before they touch a path. No ray, no fastapi.
"""

from __future__ import annotations

import io
import json
import re
import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from padoc_ray.output import rows
from padoc_ray.storage import StorageConfig, filesystem, is_s3, join, write_bytes
from padoc_ray import status

_ID = re.compile(r"^[0-9a-f]{32}$")
FINAL = status.JOB_FINAL


def valid_id(job_id: str) -> bool:
    return bool(_ID.match(job_id or ""))


class JobStore:
    def __init__(self, root: str, storage: StorageConfig = StorageConfig()):
        self.root, self.storage = root.rstrip("/") if is_s3(root) else root, storage
        self.fs, self.base = filesystem(join(root, "jobs"), storage)

    def _uri(self, job_id: str, *parts: str) -> str:
        if not valid_id(job_id):
            raise KeyError(job_id)
        return join(self.root, "jobs", job_id, *parts)

    def _path(self, job_id: str, *parts: str) -> str:
        if not valid_id(job_id):
            raise KeyError(job_id)
        return "/".join([self.base, job_id, *parts])

    def _read(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except (FileNotFoundError, OSError):
            return None

    # ---- state --------------------------------------------------------------------------------------
    def create(self, *, tenant: str, name: str, data: bytes, options: dict, pages_total: int, owner: str) -> dict:
        job_id = uuid.uuid4().hex
        write_bytes(self._uri(job_id, "input"), data, self.storage)
        now = time.time()
        state = {"id": job_id, "tenant": tenant, "name": name, "status": status.JOB_QUEUED, "pages_total": pages_total,
                 "options": options, "created": now, "updated": now, "owner": owner, "heartbeat": now,
                 "document_status": None, "error": None}
        self.put(state)
        return state

    def get(self, job_id: str) -> dict | None:
        if not valid_id(job_id):
            return None
        raw = self._read(self._path(job_id, "job.json"))
        if not raw:
            return None
        state = json.loads(raw)
        # jobs written before the one document-status vocabulary said success / partial_success / failure
        state["document_status"] = status.normalize_document_status(state.get("document_status"))
        return state

    def put(self, state: dict) -> None:
        state = {**state, "updated": time.time()}
        write_bytes(self._uri(state["id"], "job.json"), json.dumps(state).encode(), self.storage)

    def input(self, job_id: str) -> bytes:
        raw = self._read(self._path(job_id, "input"))
        if raw is None:
            raise FileNotFoundError("the job's input is gone")
        return raw

    def ids(self) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except OSError:
            return []
        return [i.base_name for i in infos if valid_id(i.base_name)]

    # ---- cancellation -------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> None:
        write_bytes(self._uri(job_id, "cancel"), b"", self.storage)

    def cancelled(self, job_id: str) -> bool:
        return self.fs.get_file_info(self._path(job_id, "cancel")).type != pafs.FileType.NotFound

    # ---- page rows -----------------------------------------------------------------------------------
    def write_page(self, job_id: str, row: dict) -> None:
        buf = io.BytesIO()
        pq.write_table(rows.to_table([row]), buf)
        write_bytes(self._uri(job_id, "pages", f"{int(row['page_index'])}.parquet"), buf.getvalue(), self.storage)

    def done_pages(self, job_id: str) -> set[int]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._path(job_id, "pages"), allow_not_found=True))
        except OSError:
            return set()
        out = set()
        for i in infos:
            stem = i.base_name.removesuffix(".parquet")
            if i.base_name.endswith(".parquet") and stem.lstrip("-").isdigit():
                out.add(int(stem))
        return out

    def page_rows(self, job_id: str) -> list[dict]:
        out = []
        for i in sorted(self.done_pages(job_id)):
            raw = self._read(self._path(job_id, "pages", f"{i}.parquet"))
            if raw:
                out.extend(pq.read_table(pa.BufferReader(raw), schema=rows.PAGE_SCHEMA).to_pylist())
        return out
