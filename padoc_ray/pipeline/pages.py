"""``pages/`` as the batch driver owns it, holding the output's lock (:class:`PagesDir`): which files are
complete (listed, proven by a commit record or a footer read), which unreadable leftovers it may remove
(never its own run's; an earlier run's at once; one of unknown origin after a grace period), the commit
record of what it proved, and the rows read back into a ledger (:mod:`~padoc_ray.pipeline.ledger`): key
indexes first (:mod:`~padoc_ray.pipeline.keyindex`), the other files one by one, and those indexed for
the next plan. Readers that never delete use :mod:`padoc_ray.output.reader`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from padoc_ray.output import commits, reader, rows
from padoc_ray.pipeline import columns, keyindex, ledger
from padoc_ray.storage import StorageConfig, join

logger = logging.getLogger(__name__)

KEY_COLUMNS = ["source_uri", "doc_id", "page_index", "page_count", "status", "error_code", "run_id",
               "output_tokens", "valid", "processed_at", "engine_s"]


def _leftover(name: str, age_s: float | None, run_id: str, grace_s: float) -> bool:
    """Whether an unreadable file under pages/ may be removed by run ``run_id``, which holds the
    output's lock: never its own; an earlier run's at once (that run is over); a file of unknown
    origin only when older than ``grace_s``."""
    m = reader.RUN_FILE.match(name)
    if m is not None:
        return m["run"] != run_id
    return age_s is not None and age_s > grace_s


def page_files_for_run(pages_uri: str, storage: StorageConfig, *, cleanup_for_run: str | None = None,
                       grace_s: float = 3600.0, trust_run: str | None = None):
    """(filesystem, complete Parquet files under pages/, [(name, size)] of those proven here): the
    driver's view of :func:`padoc_ray.output.reader.page_files` (:func:`found_page_files`)."""
    found = found_page_files(pages_uri, storage, cleanup_for_run=cleanup_for_run, grace_s=grace_s,
                             trust_run=trust_run)
    return found.fs, found.good, found.proven


def found_page_files(pages_uri: str, storage: StorageConfig, *, cleanup_for_run: str | None = None,
                     grace_s: float = 3600.0, trust_run: str | None = None) -> reader.PageFiles:
    """:func:`padoc_ray.output.reader.page_files`, for the driver. With ``cleanup_for_run`` (the run
    holding the output's lock; only the driver passes it) the unreadable files :func:`_leftover`
    allows are deleted; the others are skipped. A storage error is retried and then raised, never
    a reason to delete."""
    found = reader.page_files(pages_uri, storage, trust_run=trust_run)
    now = datetime.now(timezone.utc)
    for f in found.unreadable:
        age = (now - f.mtime.astimezone(timezone.utc)).total_seconds() if f.mtime is not None else None
        if cleanup_for_run is not None and _leftover(f.base_name, age, cleanup_for_run, grace_s):
            logger.warning("removing unreadable leftover %s", f.path)
            found.fs.delete_file(f.path)
        else:
            logger.warning("skipping unreadable %s (a leftover of a killed run, or being written)", f.path)
    return found


def read_pages(pages_uri: str, storage: StorageConfig, columns=KEY_COLUMNS, *, cleanup_for_run: str | None = None,
               grace_s: float = 3600.0) -> pa.Table:
    """The driver's read of every page row written so far (all runs), after removing the leftovers
    ``cleanup_for_run`` may remove (see :func:`page_files_for_run`). Everyone else reads with
    :func:`padoc_ray.output.reader.read_rows`, which never deletes."""
    fs, good, _ = page_files_for_run(pages_uri, storage, cleanup_for_run=cleanup_for_run, grace_s=grace_s)
    if not good:
        return rows.PAGE_SCHEMA.empty_table().select(columns)
    return pads.dataset(good, schema=rows.PAGE_SCHEMA, filesystem=fs, format="parquet").to_table(columns=columns)


#: how the driver reads pages/: its key columns only, strings as dictionaries (few distinct per file)
_SCAN_SCHEMA = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string()))
                          if f.name in ledger.DICT_COLUMNS else f for f in rows.PAGE_SCHEMA])
SCAN_FILES = 512  #: files read (and reduced) at a time
_SCAN_FORMAT = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=ledger.DICT_COLUMNS))


def scan_pages(fs: pafs.FileSystem, files: list[str], listed_uris, run_id: str | None = None,
               book: ledger.Ledger | None = None, stamps=None, summary: bool = True,
               index: keyindex.IndexWriter | None = None) -> ledger.Ledger:
    """The page rows of ``files`` as a :class:`~padoc_ray.pipeline.ledger.Ledger` of the inputs
    ``listed_uris`` with their ``stamps`` (:func:`ledger.stamps`; or added to ``book``), read a group of
    files at a time, only the key columns; without ``summary``, not those of ``run_id``'s summary (the scan
    before a run: none of the rows is this run's, and three columns fewer read a quarter faster). With
    ``index``, what is read is written to that key index too (:mod:`~padoc_ray.pipeline.keyindex`)."""
    book = book if book is not None else ledger.Ledger(listed_uris, run_id, stamps)
    for table in _key_tables(fs, files, ledger.COLUMNS if summary else ledger.PLAN_COLUMNS):
        if index is not None:
            index.write(table)
        book.add(table)
        del table
    return book.finish()


def _key_tables(fs: pafs.FileSystem, files: list[str], cols: list[str]):
    """The key columns ``cols`` of ``files``, a table per group of :data:`SCAN_FILES` files (a dataset keeps
    each file's footer once read: a group at a time), one dictionary per string column."""
    for k, i in enumerate(range(0, len(files), SCAN_FILES)):
        ds = pads.dataset(files[i:i + SCAN_FILES], schema=_SCAN_SCHEMA, filesystem=fs, format=_SCAN_FORMAT)
        yield ds.to_table(columns=cols).unify_dictionaries()
        del ds
        if k % 16 == 15:
            columns.trim()


INDEX_SCHEMA = pa.schema([_SCAN_SCHEMA.field(c) for c in ledger.PLAN_COLUMNS])


def read_ledger(pages_uri: str, storage: StorageConfig, found: reader.PageFiles, files: list[str], listed_uris, *,
                run_id: str, stamps=None, summary: bool = True, book: ledger.Ledger | None = None,
                use_index: bool = True, index_name: str | None = None) -> ledger.Ledger:
    """The rows of ``files`` (complete page files of ``found``) in a ledger (new, or ``book``): those a
    usable key index holds read from the index, the others file by file (:func:`scan_pages`), and, with
    ``index_name``, written as a new key index for the next plan (:mod:`~padoc_ray.pipeline.keyindex`;
    an index that cannot be written is logged and skipped: it only saves time)."""
    book = book if book is not None else ledger.Ledger(listed_uris, run_id, stamps)
    indexed = keyindex.usable(pages_uri, storage, files, found.size_of) if use_index else keyindex.Indexed()
    for batch in keyindex.read_batches(pages_uri, storage, indexed, INDEX_SCHEMA, ledger.PLAN_COLUMNS):
        book.add(batch)
    rest = [f for f in files if f not in indexed.covered]
    writer = None
    if index_name and rest:
        try:
            writer = keyindex.IndexWriter(pages_uri, storage, index_name, rest, found.size_of, INDEX_SCHEMA)
        except OSError as e:
            logger.warning("cannot write the key index %s (%s); the next plan reads the page files", index_name, e)
    try:
        scan_pages(found.fs, rest, listed_uris, run_id, book=book, summary=summary, index=writer)
    except BaseException:
        if writer is not None:
            writer.abandon()
        raise
    if writer is not None:
        try:
            writer.close()
        except OSError as e:
            writer.abandon()
            logger.warning("cannot write the key index %s (%s); the next plan reads the page files", index_name, e)
    book.indexed_rows += indexed.rows
    book.files_read += len(rest)
    return book


def write_index(pages_uri: str, storage: StorageConfig, found: reader.PageFiles, files: list[str], name: str) -> int:
    """Index ``files`` (complete page files of ``found``) as :func:`read_ledger` does after reading them one
    by one, without a ledger (what a run's driver left; the driver benchmark builds its outputs so);
    returns the rows indexed."""
    writer = keyindex.IndexWriter(pages_uri, storage, name, files, found.size_of, INDEX_SCHEMA)
    try:
        for table in _key_tables(found.fs, files, ledger.PLAN_COLUMNS):
            writer.write(table)
    except BaseException:
        writer.abandon()
        raise
    writer.close()
    return writer.rows


@dataclass
class PagesDir:
    """``OUTPUT/pages`` for run ``run_id`` (which holds the output's lock): the driver's one handle on it."""

    output: str
    storage: StorageConfig
    run_id: str
    grace_s: float = 3600.0  #: an unreadable file of unknown origin is removed only when older than this

    @property
    def uri(self) -> str:
        return join(self.output, "pages")

    def survey(self, *, cleanup: bool = False, trust_own: bool = False) -> reader.PageFiles:
        """The files under pages/, sorted into complete and unreadable ones; with ``cleanup``, the
        leftovers this run may remove are removed (:func:`found_page_files`); with ``trust_own``, this
        run's own files are complete without a read (its pipeline's write returned)."""
        return found_page_files(self.uri, self.storage, cleanup_for_run=self.run_id if cleanup else None,
                                grace_s=self.grace_s, trust_run=self.run_id if trust_own else None)

    def commit(self, proven) -> None:
        """Record ``proven`` ((name, size) pairs) as complete files: this run's commit record (one a run)."""
        proven = sorted(proven)
        commits.write_commit(self.uri, self.storage, self.run_id, [n for n, _ in proven], [s for _, s in proven])

    def ledger(self, found: reader.PageFiles, files: list[str], listed_uris, **kw) -> ledger.Ledger:
        """The rows of ``files`` in a ledger (:func:`read_ledger`: key indexes first, then file by file)."""
        return read_ledger(self.uri, self.storage, found, files, listed_uris, run_id=self.run_id, **kw)
