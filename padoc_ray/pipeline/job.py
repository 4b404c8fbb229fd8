"""The batch job's driver: list inputs, skip what is already written, run the Ray Data pipeline,
write the documents table and the run summary.

Resume works from the output itself: ``pages/`` says which (document, page) pairs are done, so a
rerun with the same ``--output`` parses only what is missing and never writes a row twice. One
run at a time works on an output (:class:`~padoc_ray.pipeline.lock.OutputLock`), and that run owns
``pages/`` through :class:`~padoc_ray.pipeline.pages.PagesDir`: which files are complete, which
leftovers it removes, what it commits, and its rows read back at scale.
"""

from __future__ import annotations

import json
import logging
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.output import rows
from padoc_ray.pipeline import facts, ledger, limits
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.lock import OutputLock
from padoc_ray.pipeline.pages import PagesDir
from padoc_ray.listing import list_inputs
from padoc_ray.storage import StorageConfig, filesystem, is_s3, join, write_bytes

logger = logging.getLogger(__name__)


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
    pages_dir = PagesDir(cfg.output, cfg.storage, cfg.run_id, grace_s=cfg.outputs.leftover_grace_s)
    found = pages_dir.survey(cleanup=True)
    files, proven = found.good, found.proven
    pages_dir.commit(proven)
    # the files of earlier runs (a rerun under the same --run-id included): no summary columns, none is this run's;
    # what no key index holds yet is read file by file, and indexed for the next plan
    book = pages_dir.ledger(found, files, listed.column("uri"), stamps=ledger.stamps(listed), summary=False,
                            index_name=f"{cfg.run_id}-plan")
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
        after = pages_dir.survey(trust_own=True)
        pages_dir.commit(set(proven) | set(after.proven))
        seen = set(files)
        book = pages_dir.ledger(after, [f for f in after.good if f not in seen], listed.column("uri"), book=book,
                                use_index=False, index_name=f"{cfg.run_id}-run")
        book.facts = facts.refresh(book, ranges=cfg.inputs.pages, max_pages=cfg.inputs.max_pages_per_doc)
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
        # text-layer drafts (--text-layer): pages per verdict (used | absent | untrusted), the branch tokens
        # accepted from drafts, and their share of all output tokens (decode steps a reading model saved)
        "text_layer": {str(k): v for k, v in book.run_text_layer.items()},
        "accepted_tokens": book.run_accepted_tokens,
        "accepted_fraction": round(book.run_accepted_tokens / book.run_tokens, 4) if book.run_tokens else None,
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
