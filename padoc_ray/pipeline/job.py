"""The batch job's driver: list inputs, skip what is already written, run the Ray Data pipeline,
write the documents table and the run summary.

Resume works from the output itself: ``pages/`` says which (document, page) pairs are done, so a
rerun with the same ``--output`` parses only what is missing and never writes a row twice. A
file left half-written by a killed driver is detected (unreadable Parquet) and removed first.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from padoc_ray.pipeline import rows
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.storage import StorageConfig, filesystem, is_s3, join, list_inputs, write_bytes

logger = logging.getLogger(__name__)

KEY_COLUMNS = ["source_uri", "doc_id", "page_index", "page_count", "status", "error_code", "run_id",
               "output_tokens", "valid"]


def read_pages(pages_uri: str, storage: StorageConfig, columns=KEY_COLUMNS) -> pa.Table:
    """Every page row written so far (all runs); removes unreadable leftovers of killed runs."""
    fs, path = filesystem(pages_uri, storage)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return rows.PAGE_SCHEMA.empty_table().select(columns)
    files = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
             if f.type == pafs.FileType.File and f.path.endswith(".parquet")]
    good = []
    for f in files:
        try:
            with fs.open_input_file(f.path) as fh:
                pq.read_metadata(fh)
            good.append(f.path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is a leftover
            logger.warning("removing unreadable leftover %s (%s)", f.path, e)
            fs.delete_file(f.path)
    if not good:
        return rows.PAGE_SCHEMA.empty_table().select(columns)
    return pads.dataset(good, schema=rows.PAGE_SCHEMA, filesystem=fs, format="parquet").to_table(columns=columns)


def plan(listed: list[tuple[str, int]], existing: pa.Table, cfg: BatchConfig) -> tuple[list[dict], int]:
    """Inputs still to do (with the pages already done), and how many inputs are complete."""
    by_uri: dict[str, list[dict]] = {}
    for r in existing.select(["source_uri", "page_index", "page_count"]).to_pylist():
        by_uri.setdefault(r["source_uri"], []).append(r)
    todo, complete = [], 0
    for uri, size in listed:
        prev = by_uri.get(uri, [])
        if any(r["page_index"] < 0 for r in prev):
            complete += 1
            continue
        done = sorted({r["page_index"] for r in prev})
        count = next((r["page_count"] for r in prev if r["page_count"] is not None), None)
        if count is not None and set(rows.select_pages(count, cfg.pages, cfg.max_pages_per_doc)) <= set(done):
            complete += 1
            continue
        todo.append({"uri": uri, "size": size, "done": done})
    return todo, complete


def docs_per_task(cfg: BatchConfig, n_docs: int, cpus: float) -> int:
    """Input files per raster task: the configured number, else up to 8 while every CPU still gets
    about 4 tasks (many small files share Ray's per-task cost; few files keep full parallelism)."""
    if cfg.raster_docs_per_task:
        return cfg.raster_docs_per_task
    return max(1, min(8, int(n_docs // max(1.0, 4 * cpus))))


def _pipeline(todo: list[dict], cfg: BatchConfig, model_id: str) -> None:
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext

    from padoc_ray.pipeline.stages import EngineStage, rasterize

    ctx = DataContext.get_current()
    ctx.target_max_block_size = cfg.raster_block_mb << 20
    ds = ray.data.from_items(todo, override_num_blocks=min(len(todo), 200))
    per_task = docs_per_task(cfg, len(todo), ray.cluster_resources().get("CPU", 1))
    ds = ds.map_batches(rasterize, batch_size=per_task, batch_format="pyarrow", num_cpus=cfg.raster_cpus,
                        fn_kwargs={"cfg": cfg, "model_id": model_id})
    lo, hi = cfg.num_actors
    # Keep pages_in_flight pages inside each actor: batches of `batch` pages, enough of them queued.
    batch = min(cfg.engine_batch_pages, cfg.pages_in_flight)
    batches_in_flight = -(-cfg.pages_in_flight // batch) + 1
    ds = ds.map_batches(
        EngineStage, fn_constructor_kwargs={"cfg": cfg}, batch_size=batch, batch_format="pyarrow",
        compute=ActorPoolStrategy(min_size=lo, max_size=hi, max_tasks_in_flight_per_actor=batches_in_flight),
        num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor or None,
        runtime_env={"env_vars": {"RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY": str(batches_in_flight)}},
    )
    fs, path = filesystem(join(cfg.output, "pages"), cfg.storage)
    if not is_s3(cfg.output):
        os.makedirs(path, exist_ok=True)
    # Writing Parquet is light; Ray Data's default of 1 CPU per write task would reserve a whole core
    # on a small node and starve rasterization (its budget is taken from the same pool).
    ds.write_parquet(path, filesystem=fs, min_rows_per_file=cfg.rows_per_file,
                     ray_remote_args={"num_cpus": cfg.writer_cpus})


def run_batch(cfg: BatchConfig, *, log=print, start_ray=None) -> dict:
    """Run the job; returns the summary (also written to OUTPUT/summary.json).

    ``start_ray`` (a callable) starts or joins Ray; it is called only when there is work to do, so
    a rerun with nothing left answers from the listing and the existing rows alone. Without it,
    Ray must already be initialized (or ``ray.data`` starts a default local cluster)."""
    t0 = time.perf_counter()
    listed = list_inputs(cfg.input, cfg.storage)
    pages_uri = join(cfg.output, "pages")
    existing = read_pages(pages_uri, cfg.storage)
    todo, complete = plan(listed, existing, cfg)
    model_id = cfg.model.rstrip("/").rsplit("/", 1)[-1]
    log(f"padoc-ray batch run {cfg.run_id}: {len(listed)} inputs, {complete} already complete, "
        f"{len(todo)} to do; output {cfg.output}")
    if todo:
        if start_ray is not None:
            start_ray()
        _pipeline(todo, cfg, model_id)
    wall = time.perf_counter() - t0
    final = read_pages(pages_uri, cfg.storage)
    docs = rows.documents_table(final, listed, cfg.pages, cfg.max_pages_per_doc)
    fs, dpath = filesystem(join(cfg.output, "documents"), cfg.storage)
    if not is_s3(cfg.output):
        os.makedirs(dpath, exist_ok=True)
    tmp = dpath.rstrip("/") + "/documents.parquet.tmp"
    pq.write_table(docs, tmp, filesystem=fs)
    fs.move(tmp, dpath.rstrip("/") + "/documents.parquet")
    this_run = final.filter(pc.equal(final.column("run_id"), cfg.run_id))
    real_pages = this_run.filter(pc.greater_equal(this_run.column("page_index"), 0))
    doc_status = rows.status_counts(docs)
    unaccounted = docs.filter(pc.is_in(docs.column("status"), pa.array(["incomplete", "missing"])))
    tokens = pc.sum(this_run.column("output_tokens")).as_py() or 0
    summary = {
        "run_id": cfg.run_id, "input": cfg.input, "output": cfg.output, "model": cfg.model, "mode": cfg.mode,
        "inputs": len(listed), "inputs_already_complete": complete, "inputs_processed": len(todo),
        "rows_written": this_run.num_rows, "pages_written": real_pages.num_rows,
        "page_status": rows.status_counts(real_pages), "document_status": doc_status,
        "all_inputs_accounted": unaccounted.num_rows == 0,
        "unaccounted": unaccounted.column("source_uri").to_pylist()[:100],
        "wall_s": round(wall, 3),
        "pages_per_s": round(real_pages.num_rows / wall, 4) if wall else None,
        "output_tokens_per_s": round(tokens / wall, 2) if wall else None,
        "config": _config_dict(cfg),
    }
    body = json.dumps(summary, indent=2, default=str).encode()
    write_bytes(join(cfg.output, "summary.json"), body, cfg.storage)
    write_bytes(join(cfg.output, "runs", f"{cfg.run_id}.json"), body, cfg.storage)
    log(f"done in {wall:.1f}s: {real_pages.num_rows} pages written ({summary['page_status']}), documents "
        f"{doc_status}; all inputs accounted: {summary['all_inputs_accounted']}")
    return summary


def _config_dict(cfg: BatchConfig) -> dict:
    d = asdict(cfg)
    d["pages"] = list(cfg.pages) if cfg.pages is not None else None
    return d
