"""Commit records: a cheap proof that a Parquet file under ``pages/`` is complete.

A reader must skip files that are torn (a killed writer) or still being written. Reading every
file's footer proves that, but costs one request per file: thousands of GETs on S3 before a
single row is read. Instead the driver, which holds the output's lock, writes one small record
per run under ``OUTPUT/commits/<run_id>.parquet`` once the run's files are complete (Ray Data's
write returned) and after it has checked the footers of files no record named yet. A record holds
each file's name (relative to ``pages/``) and size. A listed file whose name and size a record
holds is complete: files are never rewritten (names carry the run id and a write id), and a torn
file never had the committed size. Only files no record names have their footers read, once.

Records appear atomically (an S3 object appears whole; a local record is written to a temporary
name and renamed). An unreadable record proves nothing: its files fall back to footer checks.
Pure: pyarrow only (no ray, vllm or torch).
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from padoc_ray.storage import StorageConfig, filesystem, is_s3

logger = logging.getLogger(__name__)

COMMIT_SCHEMA = pa.schema([("name", pa.string()), ("size", pa.int64())])


def commits_uri(pages_uri: str) -> str:
    """``OUTPUT/commits`` for ``OUTPUT/pages`` (outside ``pages/``: readers of the dataset never see it)."""
    base = pages_uri.rstrip("/")
    if is_s3(base):
        return base.rsplit("/", 1)[0] + "/commits"
    return os.path.join(os.path.dirname(os.path.abspath(base)), "commits")


def _keys(names, sizes) -> pa.Array:
    """``name NUL size``: one string per (file, size), for set lookups in Arrow."""
    return pc.binary_join_element_wise(pa.array(names, pa.string()),
                                       pc.cast(pa.array(sizes, pa.int64()), pa.string()), "\x00")


def read_committed(pages_uri: str, storage: StorageConfig) -> pa.Array:
    """Every committed ``name NUL size`` key (unreadable records are skipped with a warning)."""
    fs, path = filesystem(commits_uri(pages_uri), storage)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as e:  # no records is never an error: the files are checked the slow way
        logger.warning("cannot list commit records under %s (%s); checking footers instead", path, e)
        return pa.array([], pa.string())
    keys = []
    for f in infos:
        if f.type != pafs.FileType.File or not f.base_name.endswith(".parquet"):
            continue
        try:
            t = pq.read_table(f.path, filesystem=fs, schema=COMMIT_SCHEMA)
        except Exception as e:  # noqa: BLE001 - a torn record proves nothing; never fatal
            logger.warning("skipping unreadable commit record %s (%s)", f.path, e)
            continue
        keys.append(_keys(t.column("name"), t.column("size")))
    return pa.chunked_array(keys, pa.string()).combine_chunks() if keys else pa.array([], pa.string())


def committed_mask(names: list[str], sizes: list[int], committed: pa.Array) -> list[bool]:
    """For each listed file (name relative to pages/, size): whether a record proves it complete."""
    if not names or len(committed) == 0:
        return [False] * len(names)
    return pc.is_in(_keys(names, sizes), value_set=committed).to_pylist()


def write_commit(pages_uri: str, storage: StorageConfig, run_id: str, names: list[str], sizes: list[int]) -> None:
    """Record ``names`` (relative to pages/, with their sizes) as complete files, for run ``run_id``.
    Call only for files known to be complete; a run writes at most one record (a second replaces it)."""
    if not names:
        return
    fs, path = filesystem(commits_uri(pages_uri), storage)
    final = f"{path.rstrip('/')}/{run_id}.parquet"
    table = pa.table({"name": pa.array(names, pa.string()), "size": pa.array(sizes, pa.int64())}, schema=COMMIT_SCHEMA)
    if is_s3(pages_uri):  # an S3 object appears only when complete
        pq.write_table(table, final, filesystem=fs)
        return
    os.makedirs(path, exist_ok=True)
    pq.write_table(table, final + ".tmp", filesystem=fs)
    fs.move(final + ".tmp", final)
