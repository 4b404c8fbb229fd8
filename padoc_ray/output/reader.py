"""The one reader of page rows (``OUTPUT/pages/*.parquet``), read-only.

Every consumer of a batch (or Serve job) output reads through here: ``show``, ``reannotate``, the
evaluators, the trainer, the benchmarks. A file that is not (yet) a readable Parquet file (torn by
a killed run, or being written by a live one) is skipped with a warning, never deleted: removing
leftovers is the batch driver's alone (:class:`padoc_ray.pipeline.pages.PagesDir`), under
the output's lock. A file a commit record names with its size (:mod:`padoc_ray.output.commits`)
is complete without reading its footer. A storage error is retried, then raised.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.output import commits
from padoc_ray.output.rows import PAGE_SCHEMA
from padoc_ray.protocol import Page
from padoc_ray.storage import StorageConfig, filesystem, is_s3, join

logger = logging.getLogger(__name__)

#: how often a storage error while reading pages/ is tried (then the read fails)
READ_ATTEMPTS = 4
#: how the retry waits between attempts (seconds): this module's own name, so that a test replaces the
#: reader's backoff alone, not ``time.sleep`` for every thread of the process
backoff_sleep = time.sleep
#: files a batch run writes under pages/: ``<run_id>_<write uuid>_<task>-<i>.parquet`` (Ray Data,
#: named by the run) and ``<run_id>_listing.parquet`` (the driver's own rows)
RUN_FILE = re.compile(r"^(?P<run>[A-Za-z0-9-]+)_(?:[0-9a-f]{32}_\d{6}(?:-\d+)?|listing)\.parquet$")


class RowsInputError(Exception):
    """A path that holds no readable padoc-ray page rows."""


def footer(fs: pafs.FileSystem, path: str) -> bytes:
    """The tail of a file that holds its Parquet footer (metadata, its length, the magic). Only
    storage errors (OSError) come out of here; what the bytes mean is judged apart from reading."""
    with fs.open_input_file(path) as fh:
        size = fh.size()
        n = min(size, 1 << 16)
        tail = fh.read_at(n, size - n) if n else b""
        if len(tail) >= 8 and tail[-4:] == b"PAR1":
            need = int.from_bytes(tail[-8:-4], "little") + 8
            if n < need <= size:
                tail = fh.read_at(need, size - need)
        return tail


def is_parquet(fs: pafs.FileSystem, path: str) -> bool | None:
    """True: a readable Parquet file; False: not one (torn by a killed writer, or still being
    written); None: it vanished. A storage error is retried, then raised."""
    for attempt in range(READ_ATTEMPTS):
        try:
            tail = footer(fs, path)
            break
        except FileNotFoundError:
            return None
        except OSError as e:
            if attempt == READ_ATTEMPTS - 1:
                raise OSError(f"cannot read {path} after {READ_ATTEMPTS} attempts: {e}") from e
            logger.warning("reading %s failed (%s); retrying", path, e)
            backoff_sleep(0.5 * 2 ** attempt)
    try:
        pq.read_metadata(pa.BufferReader(tail))
        return True
    except Exception:  # noqa: BLE001 - whatever the parser says, these bytes are not a Parquet file
        return False


@dataclass
class PageFiles:
    fs: pafs.FileSystem
    good: list[str] = field(default_factory=list)  #: complete Parquet files (filesystem paths)
    proven: list[tuple[str, int]] = field(default_factory=list)  #: (name under pages/, size) proven by a read
    unreadable: list[pafs.FileInfo] = field(default_factory=list)  #: skipped: torn or being written
    size_of: dict[str, int] = field(default_factory=dict)  #: path -> size of each complete file


def page_files(pages_uri: str, storage: StorageConfig, *, trust_run: str | None = None) -> PageFiles:
    """The Parquet files under ``pages_uri``, sorted into complete and unreadable ones. Files a
    commit record names with their size are complete without a read; so are the files of
    ``trust_run`` (the live run, once its pipeline returned). Read-only."""
    fs, path = filesystem(pages_uri, storage)
    out = PageFiles(fs)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return out
    files = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
             if f.type == pafs.FileType.File and f.path.endswith(".parquet")]
    root = path.rstrip("/") + "/"
    names = [f.path[len(root):] if f.path.startswith(root) else f.base_name for f in files]
    committed = commits.committed_mask(names, [f.size for f in files], commits.read_committed(pages_uri, storage))
    for f, name, known in zip(files, names, committed):
        if known:
            out.good.append(f.path)
            out.size_of[f.path] = f.size
            continue
        m = RUN_FILE.match(f.base_name)
        ok = True if (trust_run is not None and m is not None and m["run"] == trust_run) else is_parquet(fs, f.path)
        if ok:
            out.good.append(f.path)
            out.size_of[f.path] = f.size
            out.proven.append((name, f.size))
        elif ok is False:
            out.unreadable.append(f)
    return out


def pages_uri_of(path: str) -> str:
    """``OUTPUT`` or ``OUTPUT/pages`` (local or S3) -> the pages folder; a single file stays itself."""
    if is_s3(path):
        return path if path.rstrip("/").endswith("/pages") else join(path, "pages")
    if os.path.isdir(os.path.join(path, "pages")):
        return os.path.join(path, "pages")
    return path


def read_rows(path: str, storage: StorageConfig | None = None, columns: Sequence[str] | None = None, *,
              required: Iterable[str] = (), must_exist: bool = False) -> pa.Table:
    """Every page row written so far (all runs) under ``path``: a batch output folder, its
    ``pages/`` folder (local or S3), or one Parquet file. ``columns``: those to read (default all);
    ``required``: columns that must be in the files' schema, else :class:`RowsInputError`, as is a
    path with no Parquet files when ``must_exist`` (otherwise: no rows yet, an empty table).

    Unreadable files inside a folder are skipped (and logged); a single file given by name that is
    not readable Parquet is a :class:`RowsInputError`. Never deletes anything."""
    storage = storage or StorageConfig()
    need = list(required)
    cols = list(columns) if columns is not None else PAGE_SCHEMA.names
    cols += [c for c in need if c not in cols]
    path = pages_uri_of(path)
    if not is_s3(path) and os.path.isfile(path):
        try:
            pf = pq.ParquetFile(path)
            have = pf.schema_arrow.names
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a non-Parquet file
            raise RowsInputError(f"cannot read Parquet file {path}: {e}") from None
        _check_required(path, have, need)
        return pf.read(columns=[c for c in cols if c in have])
    if must_exist and not is_s3(path) and not os.path.exists(path):
        raise RowsInputError(f"prediction path not found: {path}")
    files = page_files(path, storage)
    for f in files.unreadable:
        logger.warning("skipping unreadable %s (a leftover of a killed run, or being written)", f.path)
    if not files.good:
        if must_exist:
            raise RowsInputError(f"no {'readable ' if files.unreadable else ''}Parquet files under {path} (expected pages/*.parquet of a "
                                 "padoc-ray batch output)")
        return PAGE_SCHEMA.empty_table().select(cols)
    if need:
        for f in files.good[:1]:
            _check_required(f, pq.read_schema(f, filesystem=files.fs).names, need)
    return pads.dataset(files.good, schema=PAGE_SCHEMA, filesystem=files.fs, format="parquet").to_table(columns=cols)


def _check_required(path: str, have: Sequence[str], need: Iterable[str]) -> None:
    missing = [c for c in dict.fromkeys(need) if c not in have]
    if missing:
        raise RowsInputError(f"{path} is not padoc-ray page output (needs {', '.join(missing)} columns)")


def pages_by_source(output: str, storage: StorageConfig | None = None) -> dict[tuple[str, int], tuple[str, Page | None, int | None]]:
    """(source file name, page_index) -> (status, page, document page count) from a batch output's rows."""
    from padoc_ray.output.rows import page_from_row

    t = read_rows(join(output, "pages"), storage, ["source_uri", "page_index", "page_count", "status", "image_width",
                                                  "image_height", "regions", "processed_at", "doc_id"])
    out: dict[tuple[str, int], tuple[str, Page | None, int | None]] = {}
    rows = sorted(t.to_pylist(), key=lambda r: r["processed_at"])
    # a source's rows of an older version (another doc_id than its newest row's) are not its pages
    newest = {r["source_uri"]: r["doc_id"] for r in rows if r["doc_id"]}
    for r in rows:  # the newest row wins
        if r["page_index"] < 0 or (r["doc_id"] and r["doc_id"] != newest[r["source_uri"]]):
            continue
        page = page_from_row(r, on_bad_region=lambda *_: None) if r["status"] == status.OK else None
        out[(os.path.basename(r["source_uri"]), r["page_index"])] = (r["status"], page, r["page_count"])
    return out
