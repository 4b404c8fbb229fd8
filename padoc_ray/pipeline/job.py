"""The batch job's driver: list inputs, skip what is already written, run the Ray Data pipeline,
write the documents table and the run summary.

Resume works from the output itself: ``pages/`` says which (document, page) pairs are done, so a
rerun with the same ``--output`` parses only what is missing and never writes a row twice. One
run at a time works on an output (:class:`~padoc_ray.pipeline.lock.OutputLock`). Unreadable
Parquet files under ``pages/`` are skipped by every reader; only the driver, holding the lock,
removes them, and never its own run's: a file named by an earlier run (that run is over: its lock
is gone) at once, a file of unknown origin only when older than a grace period. A file a commit
record names with its size (:mod:`~padoc_ray.output.commits`) is complete without reading its
footer; the driver records the files it proved or wrote. The driver's reading of pages/ scales
to 100M rows: key columns only, reduced to integers as read (:mod:`~padoc_ray.pipeline.ledger`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.output import commits, reader, rows
from padoc_ray.pipeline import columns, keyindex, ledger, limits
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.lock import OutputLock
from padoc_ray.storage import filesystem, is_s3, join, StorageConfig, write_bytes
from padoc_ray.listing import list_inputs

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
    for i in range(0, len(files), SCAN_FILES):  # a dataset keeps each file's footer once read: a group at a time
        ds = pads.dataset(files[i:i + SCAN_FILES], schema=_SCAN_SCHEMA, filesystem=fs, format=_SCAN_FORMAT)
        cols = ledger.COLUMNS if summary else ledger.PLAN_COLUMNS
        table = ds.to_table(columns=cols).unify_dictionaries()  # one dictionary per column
        if index is not None:
            index.write(table)
        book.add(table)
        del table
        del ds
        if (i // SCAN_FILES) % 16 == 15:
            columns.trim()
    return book.finish()


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
        for i in range(0, len(files), SCAN_FILES):
            ds = pads.dataset(files[i:i + SCAN_FILES], schema=_SCAN_SCHEMA, filesystem=found.fs, format=_SCAN_FORMAT)
            writer.write(ds.to_table(columns=ledger.PLAN_COLUMNS).unify_dictionaries())
    except BaseException:
        writer.abandon()
        raise
    writer.close()
    return writer.rows


def plan(listed: list[tuple[str, int]], existing: pa.Table, cfg: BatchConfig) -> tuple[list[dict], int]:
    """Inputs still to do (with the pages already done), and how many inputs are complete.

    An input whose current row (:func:`ledger.current_rows`) is document-level is complete, unless a
    rerun can change it (:func:`limits.retried`: a failed read, a missing or refused listing, a cap
    no longer exceeded). Inputs the listing refuses are to do (the driver writes their rows) unless
    the same refusal is already recorded. An input listed with another size or modification time than
    its newest rows recorded is to do (read again; a changed doc_id parses it again). (The driver runs
    the same rules on a scan: :func:`~padoc_ray.pipeline.ledger.plan`.)"""
    lt = ledger.listing_table(listed)
    book = ledger.from_table(existing, lt.column("uri"), stamps=ledger.stamps(lt))
    inp = cfg.inputs
    return ledger.plan(book, lt.column("size").to_numpy(), inp.limits, inp.pages, inp.max_pages_per_doc)


def _write_listing_rows(refused: list[dict], cfg: BatchConfig, model_id: str) -> None:
    """The rows of inputs refused from the listing (missing, disallowed, too large), written by the
    driver itself: nothing of them is ever read."""
    out = []
    for t in refused:
        code, message = limits.listing_refusal(t["size"], cfg.inputs.limits)
        base = rows.base_row(run_id=cfg.run_id, uri=t["uri"], doc_id=None, page_index=-1, page_count=None,
                             mode=cfg.mode, model_id=model_id)
        out.append(rows.error_row(base, code, message))
    fs, path = filesystem(join(cfg.output, "pages"), cfg.storage)
    final = f"{path.rstrip('/')}/{cfg.run_id}_listing.parquet"
    if is_s3(cfg.output):  # an S3 object appears only when complete
        pq.write_table(rows.to_table(out), final, filesystem=fs)
        return
    os.makedirs(path, exist_ok=True)
    pq.write_table(rows.to_table(out), final + ".tmp", filesystem=fs)
    fs.move(final + ".tmp", final)


def docs_per_task(cfg: BatchConfig, n_docs: int, cpus: float) -> int:
    """Input files per raster task: the configured number, else up to 8 while every CPU still gets
    about 4 tasks (many small files share Ray's per-task cost; few files keep full parallelism)."""
    if cfg.raster.docs_per_task:
        return cfg.raster.docs_per_task
    return max(1, min(8, int(n_docs // max(1.0, 4 * cpus))))


def _pipeline(todo: list[dict], cfg: BatchConfig, model_id: str) -> None:
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext
    from ray.data.datasource import FilenameProvider

    from padoc_ray.pipeline.stages import EngineStage, missing_engine_resources, rasterize

    ctx = DataContext.get_current()
    ctx.target_max_block_size = cfg.raster.block_mb << 20
    ds = ray.data.from_items(todo, override_num_blocks=min(len(todo), 200))
    per_task = docs_per_task(cfg, len(todo), ray.cluster_resources().get("CPU", 1))
    if (short := missing_engine_resources(cfg, ray.cluster_resources())) is not None:
        logger.warning(short)
    ds = ds.map_batches(rasterize, batch_size=per_task, batch_format="pyarrow", num_cpus=cfg.raster.cpus,
                        fn_kwargs={"cfg": cfg, "model_id": model_id})
    lo, hi = cfg.engines.num_actors
    # Keep pages_in_flight pages inside each actor: batches of `batch` pages, enough of them queued.
    batch = min(cfg.engines.batch_pages, cfg.engines.host.pages_in_flight)
    batches_in_flight = -(-cfg.engines.host.pages_in_flight // batch) + 1
    ds = ds.map_batches(
        EngineStage, fn_constructor_kwargs={"cfg": cfg}, batch_size=batch, batch_format="pyarrow",
        compute=ActorPoolStrategy(min_size=lo, max_size=hi, max_tasks_in_flight_per_actor=batches_in_flight),
        num_cpus=cfg.engines.cpus_per_actor, num_gpus=cfg.engines.gpus_per_actor or None,
        resources=dict(cfg.engines.engine_resources) or None,
        runtime_env={"env_vars": {"RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY": str(batches_in_flight)}},
    )
    fs, path = filesystem(join(cfg.output, "pages"), cfg.storage)
    if not is_s3(cfg.output):
        os.makedirs(path, exist_ok=True)
    # Writing Parquet is light; Ray Data's default of 1 CPU per write task would reserve a whole core
    # on a small node and starve rasterization (its budget is taken from the same pool).
    # files are named by the run (reader.RUN_FILE), so a later run can tell a killed run's torn file
    ds.write_parquet(path, filesystem=fs, min_rows_per_file=cfg.outputs.rows_per_file,
                     filename_provider=FilenameProvider(dataset_uuid=cfg.run_id, file_format="parquet"),
                     ray_remote_args={"num_cpus": cfg.outputs.writer_cpus})


def run_batch(cfg: BatchConfig, *, log=print, start_ray=None) -> dict:
    """Run the job holding the output's lock; returns the summary (also written to
    OUTPUT/summary.json). Raises :class:`~padoc_ray.pipeline.lock.OutputInUse` (an InputError) when
    another live run holds the output and ``cfg.outputs.lock_wait_s`` passes.

    ``start_ray`` (a callable) starts or joins Ray; it is called only when there is work to do, so
    a rerun with nothing left answers from the listing and the existing rows alone. Without it,
    Ray must already be initialized (or ``ray.data`` starts a default local cluster)."""
    with OutputLock(cfg.output, cfg.storage, cfg.run_id, wait_s=cfg.outputs.lock_wait_s,
                    stale_s=cfg.outputs.lock_stale_s, log=log):
        return _run_locked(cfg, log=log, start_ray=start_ray)


def _run_locked(cfg: BatchConfig, *, log=print, start_ray=None) -> dict:
    t0 = time.perf_counter()
    listed = ledger.listing_table(list_inputs(cfg.input, cfg.storage, cfg.inputs.manifest_allow,
                                              follow_symlinks=cfg.inputs.follow_symlinks, mtimes=True))
    sizes = listed.column("size").to_numpy()
    pages_uri = join(cfg.output, "pages")
    found = found_page_files(pages_uri, cfg.storage, cleanup_for_run=cfg.run_id, grace_s=cfg.outputs.leftover_grace_s)
    files, proven = found.good, found.proven
    commits.write_commit(pages_uri, cfg.storage, cfg.run_id, [n for n, _ in proven], [s for _, s in proven])
    # the files of earlier runs (a rerun under the same --run-id included): no summary columns, none is this run's;
    # what no key index holds yet is read file by file, and indexed for the next plan
    book = read_ledger(pages_uri, cfg.storage, found, files, listed.column("uri"), run_id=cfg.run_id,
                       stamps=ledger.stamps(listed), summary=False, index_name=f"{cfg.run_id}-plan")
    todo, complete = ledger.plan(book, sizes, cfg.inputs.limits, cfg.inputs.pages, cfg.inputs.max_pages_per_doc)
    model_id = cfg.model.rstrip("/").rsplit("/", 1)[-1]
    refused = [t for t in todo if limits.listing_refusal(t["size"], cfg.inputs.limits) is not None]
    restamped = book.facts.restamped
    log(f"padoc-ray batch run {cfg.run_id}: {listed.num_rows} inputs, {complete} already complete, "
        f"{len(todo)} to do ({len(refused)} refused from the listing"
        f"{f', {restamped} read again: size or time changed since their rows' if restamped else ''}); "
        f"output {cfg.output}")
    if refused:
        _write_listing_rows(refused, cfg, model_id)
    work = [t for t in todo if limits.listing_refusal(t["size"], cfg.inputs.limits) is None]
    del todo
    if work:
        if start_ray is not None:
            start_ray()
        _pipeline(work, cfg, model_id)
    wall = time.perf_counter() - t0
    if work or refused:  # add the files written since: this run's are complete now (the write returned)
        after = found_page_files(pages_uri, cfg.storage, trust_run=cfg.run_id)
        proven = sorted(set(proven) | set(after.proven))
        commits.write_commit(pages_uri, cfg.storage, cfg.run_id, [n for n, _ in proven], [s for _, s in proven])
        seen = set(files)
        book = read_ledger(pages_uri, cfg.storage, after, [f for f in after.good if f not in seen],
                           listed.column("uri"), run_id=cfg.run_id, book=book, use_index=False,
                           index_name=f"{cfg.run_id}-run")
        book.facts = ledger.refresh(book, ranges=cfg.inputs.pages, max_pages=cfg.inputs.max_pages_per_doc)
    changed = ledger.changed_inputs(book, [(t["uri"], t["doc_id"]) for t in work if t.get("doc_id")])
    book.drop_rows()  # the documents table needs the facts only
    doc_status, unaccounted = write_documents(book, join(cfg.output, "documents"), cfg.storage, cfg.run_id)
    summary = {
        "run_id": cfg.run_id, "input": cfg.input, "output": cfg.output, "model": cfg.model, "mode": cfg.mode,
        "inputs": listed.num_rows, "inputs_already_complete": complete, "inputs_processed": len(work) + len(refused),
        "inputs_refused_from_listing": len(refused),
        # complete inputs listed with another size or modification time than their rows': read again
        "inputs_restamped": restamped,
        "inputs_changed": changed,  # inputs whose bytes changed since pages of theirs were written: parsed again
        "rows_written": book.run_rows, "pages_written": book.run_pages,
        # how the driver read pages/: rows from its key indexes, and page files read one by one (then indexed)
        "ledger_rows_from_index": book.indexed_rows, "ledger_files_read": book.files_read,
        "page_status": {str(k): v for k, v in book.run_status.items()}, "document_status": doc_status,
        "all_inputs_accounted": not unaccounted,
        "unaccounted": unaccounted[:100],
        "wall_s": round(wall, 3),
        "pages_per_s": round(book.run_pages / wall, 4) if wall else None,
        "output_tokens_per_s": round(book.run_tokens / wall, 2) if wall else None,
        **cost_summary(book.run_engine_s, book.run_engine_pages, cfg.outputs.gpu_hour_usd),
        "config": cfg.flat(),
    }
    body = json.dumps(summary, indent=2, default=str).encode()
    write_bytes(join(cfg.output, "summary.json"), body, cfg.storage)
    write_bytes(join(cfg.output, "runs", f"{cfg.run_id}.json"), body, cfg.storage)
    log(f"done in {wall:.1f}s: {book.run_pages} pages written ({summary['page_status']}), documents "
        f"{doc_status}; all inputs accounted: {summary['all_inputs_accounted']}")
    return summary


def cost_summary(engine_s: float, pages: int, gpu_hour_usd: float | None) -> dict:
    """What this run's pages cost: ``engine_seconds_per_page``, the mean ``engine_s`` of the run's pages
    that reached the engine (None: none did), and with a price per GPU hour ``usd_per_million_pages``
    = engine_seconds_per_page / 3600 * gpu_hour_usd * 1e6. A page's engine_s is engine time on one engine,
    and one engine runs on one GPU, so an engine-second is a GPU-second, however many engines ran (with
    tensor parallelism over k GPUs, price a GPU hour at k times the price). Only this run's rows count:
    a resumed run's earlier pages keep their engine_s in their rows and their cost in their own run's
    summary (runs/<run_id>.json)."""
    per_page = engine_s / pages if pages else None
    out: dict = {"engine_seconds": round(engine_s, 3),
                 "engine_seconds_per_page": round(per_page, 6) if per_page is not None else None}
    if gpu_hour_usd is not None:
        out["usd_per_million_pages"] = round(per_page / 3600 * gpu_hour_usd * 1e6, 4) if per_page is not None else None
    return out


def write_documents(book: ledger.Ledger, documents_uri: str, storage: StorageConfig, run_id: str):
    """Write ``documents/documents.parquet`` (one row per listed input, row group by row group,
    never the whole table in memory); returns (counts by status, inputs still incomplete or
    missing: the first 100)."""
    if book.facts is None:
        raise ValueError("plan or analyze the ledger first")
    fs, dpath = filesystem(documents_uri, storage)
    if not is_s3(documents_uri):
        os.makedirs(dpath, exist_ok=True)
    tmp = dpath.rstrip("/") + f"/documents.parquet.{run_id}.tmp"  # unique: never shared with another run
    counts: dict[str, int] = {}
    unaccounted: list[str] = []
    with pq.ParquetWriter(tmp, rows.DOCUMENT_SCHEMA, filesystem=fs) as w:
        for batch in ledger.document_batches(book, book.facts):
            w.write_batch(batch)
            st = batch.column("status")
            for v in pc.value_counts(st).to_pylist():
                counts[str(v["values"])] = counts.get(str(v["values"]), 0) + int(v["counts"])
            if len(unaccounted) < 100:
                lost = pc.is_in(st, pa.array(sorted(status.UNACCOUNTED)))
                unaccounted += batch.column("source_uri").filter(lost).to_pylist()[:100 - len(unaccounted)]
    fs.move(tmp, dpath.rstrip("/") + "/documents.parquet")
    return counts, unaccounted
