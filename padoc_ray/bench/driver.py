"""Driver-bookkeeping benchmark: plan a run and build the documents table over a large ``pages/``.

``build`` writes a synthetic batch-job output once (cached in a scratch folder, keyed by its
size): ``pages/`` as many Parquet files in the job's own schema and file naming, written by two
runs, with the cases the driver must get right mixed in (document-level errors, a read that
failed and was retried, incomplete and never-written documents, failed and partial documents,
pages retried by a later run so the newest row wins, an input replaced since its rows, rows from
before sizes and times were recorded, an unreadable leftover), plus the commit records and the key
indexes the two runs' drivers wrote (:mod:`padoc_ray.output.commits`, :mod:`padoc_ray.pipeline.keyindex`). Text columns are short (the driver
never reads them), so files are smaller than a real job's.

``measure`` runs in a fresh process (so its peak RSS is the driver's alone) and does what the
driver does around a run: prove which files are complete, scan the key columns, plan (what is
done, what to resume), list ``pages/`` again and add the files written since (none here: no
pipeline runs), and write the documents table; it reports seconds and peak RSS with a breakdown.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from padoc_ray.bench import write_json
from padoc_ray.knobs import knob
from padoc_ray.status import CORRUPT_PDF, DEADLINE, NOT_PDF, OK, READ_FAILED, RUNAWAY, TOKEN_LIMIT

FORMAT = 3  #: bump when the synthetic layout changes (the cache key holds it)
BENCH_RUN = "bench-driver"  #: the measuring run's id
LEFTOVER = "being-written.parquet"
RUNS = ("0a1b2c3d4e5f", "9f8e7d6c5b4a")  #: the two runs that wrote pages/
DOCS_PER_CHUNK = 50_000
T0_MS = 1_780_000_000_000  # 2026-05-28
MTIME_MS = T0_MS - 86_400_000


def scratch_dir(scratch: str, pages: int, ppd: int, rows_per_file: int) -> str:
    return os.path.join(scratch, f"driver-v{FORMAT}-{pages}p-{ppd}ppd-{rows_per_file}rpf")


def n_docs(pages: int, ppd: int) -> int:
    return max(1, pages // ppd)


def uris(d: np.ndarray) -> pa.Array:
    """The synthetic inputs' URIs (sorted like a listing: zero-padded numbers)."""
    da = pa.array(d, pa.int64())
    shard = pc.utf8_lpad(pc.cast(pc.divide(da, 1000), pa.string()), 6, "0")
    num = pc.utf8_lpad(pc.cast(da, pa.string()), 10, "0")
    return pc.binary_join_element_wise("s3://corpus-pdfs/crawl-2026-05/shard-", shard, "/doc-", num, ".pdf", "")


def sizes_of(d: np.ndarray) -> np.ndarray:
    return 100_000 + (d * 7919) % 900_000


def mtimes_of(d: np.ndarray) -> np.ndarray:
    """The inputs' modification times (ms) when the two runs listed them: a day before the first run."""
    return MTIME_MS + (d * 104_729) % 86_400_000


def listing(pages: int, ppd: int) -> pa.Table:
    """The listing the driver would get: every synthetic input with a size and modification time; the
    inputs of case 31 (see :func:`_doc_rows`) were replaced since (a newer time: read again)."""
    d = np.arange(n_docs(pages, ppd), dtype=np.int64)
    uri = pa.chunked_array([uris(d[i:i + 1_000_000]) for i in range(0, len(d), 1_000_000)], pa.string())
    mtime = mtimes_of(d) + np.where(d % 1000 == 31, 30 * 86_400_000, 0)
    return pa.table({"uri": uri.combine_chunks(), "size": pa.array(sizes_of(d), pa.int64()),
                     "mtime": pa.array(mtime, pa.int64())})


def _doc_rows(d: np.ndarray, ppd: int, run: int) -> dict[str, np.ndarray]:
    """Rows (doc, page, status) that ``run`` (0 or 1) wrote for documents ``d``; the case of a
    document is ``d % 1000``: 1 corrupt_pdf, 2 not_pdf, 3 read_failed (run 0) then parsed (run 1),
    4 last page never written (incomplete), 999 nothing written (missing), 5-24 last page runaway,
    25 every page token_limit, 26-30 page 0 deadline (run 0) then ok (run 1), 31 ok but replaced since
    (the listing's time is newer than the rows'), 32 ok in rows written before sizes and times were
    recorded (null: compared with nothing), else ok."""
    case = d % 1000
    if run == 0:
        n = np.where(np.isin(case, (1, 2, 3)), 1, np.where(case == 4, ppd - 1, np.where(case == 999, 0, ppd)))
    else:
        n = np.where(case == 3, ppd, np.where((case >= 26) & (case <= 30), 1, 0))
    doc = np.repeat(d, n)
    starts = np.repeat(np.cumsum(n) - n, n)
    page = (np.arange(len(doc)) - starts).astype(np.int32)
    c = doc % 1000
    status = np.full(len(doc), OK, dtype=object)
    if run == 0:
        for k, code in ((1, CORRUPT_PDF), (2, NOT_PDF), (3, READ_FAILED)):
            page[c == k] = -1
            status[c == k] = code
        status[(c >= 5) & (c <= 24) & (page == ppd - 1)] = RUNAWAY
        status[c == 25] = TOKEN_LIMIT
        status[(c >= 26) & (c <= 30) & (page == 0)] = DEADLINE
    return {"doc": doc, "page": page, "status": status}


def _table(r: dict, ppd: int, run: int, t_base: int) -> pa.Table:
    from padoc_ray.output.rows import PAGE_SCHEMA

    doc, page, status = r["doc"], r["page"], r["status"]
    n = len(doc)
    ok = status == OK
    st = pa.array(status, pa.string())
    doc_level = page < 0
    out_tok = ((doc * 7 + page) % 900 + 100).astype(np.int32)
    docid = pc.utf8_lpad(pc.cast(pa.array(doc * 2654435761 + 97, pa.int64()), pa.string()), 64, "0")
    read_failed = status == READ_FAILED
    cols = {
        "run_id": pa.array(np.full(n, RUNS[run], dtype=object), pa.string()),
        "processed_at": pa.array(t_base + np.arange(n, dtype=np.int64), pa.timestamp("ms", tz="UTC")),
        "doc_id": pc.if_else(pa.array(read_failed), pa.nulls(n, pa.string()), docid),
        "source_uri": uris(doc),
        "page_index": pa.array(page, pa.int32()),
        "page_count": pa.array(np.full(n, ppd, np.int32), pa.int32(), mask=doc_level),
        "status": st,
        "error_code": pc.if_else(pa.array(ok), pa.nulls(n, pa.string()), st),
        "error_message": pc.if_else(pa.array(ok), pa.nulls(n, pa.string()), pc.binary_join_element_wise(st, "", " (synthetic)")),
        "valid": pa.array(ok),
        "image_width": pa.array(np.full(n, 1224, np.int32), mask=doc_level),
        "image_height": pa.array(np.full(n, 1584, np.int32), mask=doc_level),
        "page_width_pt": pa.array(np.full(n, 612.0, np.float32), mask=doc_level),
        "page_height_pt": pa.array(np.full(n, 792.0, np.float32), mask=doc_level),
        "rotation": pa.array(np.zeros(n, np.int32), mask=doc_level),
        "repaired": pa.array(np.zeros(n, bool), mask=doc_level),
        "markdown": pc.if_else(pa.array(ok), pc.binary_join_element_wise(
            "# Section ", pc.cast(pa.array(page), pa.string()), "\n\nSynthetic page text.", ""), pa.nulls(n, pa.string())),
        "mode": pa.array(np.full(n, "fork", dtype=object), pa.string()),
        "model_id": pa.array(np.full(n, "padoc", dtype=object), pa.string()),
        "e2e_s": pa.array(((doc + page) % 50 / 10 + 0.5).astype(np.float32)),
        "output_tokens": pa.array(out_tok),
        "prompt_tokens": pa.array(np.full(n, 1400, np.int32)),
        "cached_tokens": pa.array((out_tok // 2).astype(np.int32)),
        "n_branches": pa.array((out_tok % 20).astype(np.int32)),
        "source_size": pa.array(sizes_of(doc), pa.int64(), mask=doc % 1000 == 32),
        "source_mtime": pa.array(mtimes_of(doc), pa.timestamp("ms", tz="UTC"), mask=doc % 1000 == 32),
    }
    return pa.table([cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in PAGE_SCHEMA], schema=PAGE_SCHEMA)


def _build_chunk(args) -> list[tuple[str, int]]:
    out, chunk, d0, d1, ppd, rows_per_file = args
    written = []
    for run in (0, 1):
        r = _doc_rows(np.arange(d0, d1, dtype=np.int64), ppd, run)
        if len(r["doc"]) == 0:
            continue
        t_base = T0_MS + run * 10 * 86_400_000 + d0 * (ppd + 1)
        t = _table(r, ppd, run, t_base)
        write_id = hashlib.md5(f"{RUNS[run]}/{chunk}".encode()).hexdigest()
        for i, off in enumerate(range(0, t.num_rows, rows_per_file)):
            name = f"{RUNS[run]}_{write_id}_{chunk:06d}-{i}.parquet"
            pq.write_table(t.slice(off, rows_per_file), os.path.join(out, "pages", name))
            written.append((name, os.path.getsize(os.path.join(out, "pages", name))))
    return written


def build(scratch: str, pages: int, ppd: int = 10, rows_per_file: int = 1000, workers: int = 2, log=print) -> str:
    """The synthetic output for (pages, ppd, rows_per_file), built once; returns its folder."""
    from padoc_ray.output.commits import write_commit
    from padoc_ray.storage import StorageConfig

    out = scratch_dir(scratch, pages, ppd, rows_per_file)
    if os.path.exists(os.path.join(out, "BUILT")):
        return out
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "pages"))
    docs = n_docs(pages, ppd)
    jobs = [(out, k, d0, min(docs, d0 + DOCS_PER_CHUNK), ppd, rows_per_file)
            for k, d0 in enumerate(range(0, docs, DOCS_PER_CHUNK))]
    t0, files = time.perf_counter(), []
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        for i, w in enumerate((pool.map if pool else map)(_build_chunk, jobs), 1):
            files.extend(w)
            if i % 20 == 0 or i == len(jobs):
                log(f"  built {i}/{len(jobs)} chunks ({len(files)} files, {time.perf_counter() - t0:.0f} s)")
    finally:
        if pool:
            pool.shutdown()
    from padoc_ray.pipeline import pages as pg

    for run in RUNS:  # what each run's driver recorded when it finished: its commit record and its key index
        mine = [(n, s) for n, s in files if n.startswith(run + "_")]
        write_commit(os.path.join(out, "pages"), StorageConfig(), run, [n for n, _ in mine], [s for _, s in mine])
        found = pg.found_page_files(os.path.join(out, "pages"), StorageConfig())
        pg.write_index(os.path.join(out, "pages"), StorageConfig(), found,
                        [os.path.join(out, "pages", n) for n, _ in mine], f"{run}-run")
        log(f"  indexed run {run} ({time.perf_counter() - t0:.0f} s)")
    size = sum(s for _, s in files)
    with open(os.path.join(out, "BUILT"), "w") as f:
        json.dump({"pages": pages, "pages_per_doc": ppd, "rows_per_file": rows_per_file, "files": len(files),
                   "bytes": size, "build_s": round(time.perf_counter() - t0, 1)}, f)
    return out


def measure(folder: str, pages: int, ppd: int) -> dict:
    """The driver's bookkeeping over ``folder`` (run in a fresh process): seconds and peak RSS."""
    from padoc_ray.output import reader
    from padoc_ray.pipeline import columns, facts, job, ledger
    from padoc_ray.pipeline import pages as pg
    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.storage import StorageConfig

    t0 = time.perf_counter()
    listed = listing(pages, ppd)
    sizes = listed.column("size").to_numpy()
    columns.trim()  # the synthetic listing's temporaries are the benchmark's, not the driver's
    t_list = time.perf_counter() - t0
    rss_listing = _peak_rss()
    # an unreadable file no record names, young (maybe being written): its footer is read, it is skipped and kept
    with open(os.path.join(folder, "pages", LEFTOVER), "wb") as f:
        f.write(b"PAR1 torn")
    footers = []
    check = reader.is_parquet
    reader.is_parquet = lambda fs, path: (footers.append(path), check(fs, path))[1]  # count the footer reads
    cfg = BatchConfig(input="synthetic", output=folder, model="padoc", run_id=BENCH_RUN)
    pages_uri, st = os.path.join(folder, "pages"), StorageConfig()
    # planning: what _run_locked does before the pipeline
    t1 = time.perf_counter()
    found = pg.found_page_files(pages_uri, st, cleanup_for_run=BENCH_RUN)
    files = found.good
    t_proof = time.perf_counter() - t1
    # the plan writes no key index here: the measured output stays as built (every file is in the runs' indexes)
    book = pg.read_ledger(pages_uri, st, found, files, listed.column("uri"), run_id=BENCH_RUN,
                           stamps=ledger.stamps(listed), summary=False)
    t_scan = time.perf_counter() - t1 - t_proof
    todo, complete = ledger.plan(book, sizes, cfg.inputs.limits, cfg.inputs.pages, cfg.inputs.max_pages_per_doc)
    restamped = book.facts.restamped
    t_plan = time.perf_counter() - t1
    rows_read = book.rows_read
    rss_plan = _peak_rss()
    # the documents table: what _run_locked does after the pipeline (list again, add the new files)
    t2 = time.perf_counter()
    after = pg.found_page_files(pages_uri, st, trust_run=BENCH_RUN)
    seen = set(files)
    book = pg.read_ledger(pages_uri, st, after, [f for f in after.good if f not in seen], listed.column("uri"),
                           run_id=BENCH_RUN, book=book, use_index=False)
    book.facts = facts.refresh(book, ranges=cfg.inputs.pages, max_pages=cfg.inputs.max_pages_per_doc)
    book.drop_rows()
    counts, _ = job.write_documents(book, os.path.join(folder, "documents"), st, BENCH_RUN)
    t_docs = time.perf_counter() - t2
    return {
        "seconds": round(t_plan + t_docs, 2), "peak_rss_bytes": _peak_rss(),
        "breakdown": {"plan_s": round(t_plan, 2), "plan_proof_s": round(t_proof, 2), "plan_scan_s": round(t_scan, 2),
                      "documents_s": round(t_docs, 2), "untimed_listing_s": round(t_list, 2),
                      "peak_rss_after_listing_bytes": rss_listing, "peak_rss_after_plan_bytes": rss_plan},
        "files": len(files), "footers_read": len(footers), "rows_from_index": book.indexed_rows,
        "files_read": book.files_read,
        "page_rows": rows_read, "inputs": listed.num_rows, "todo": len(todo), "complete": complete,
        "restamped": restamped,
        "document_status": counts,
    }


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def run(pages: int, ppd: int, rows_per_file: int, scratch: str, workers: int, log=print) -> dict:
    t0 = time.perf_counter()
    folder = build(scratch, pages, ppd, rows_per_file, workers, log=log)
    built = json.load(open(os.path.join(folder, "BUILT")))
    log(f"synthetic output {folder}: {built['files']} files, {built['bytes'] / 2**30:.2f} GiB "
        f"(built in {built['build_s']} s; this call {time.perf_counter() - t0:.0f} s)")
    code = ("import json, sys; from padoc_ray.bench.driver import measure; "
            "print('RESULT ' + json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))")
    p = subprocess.run([sys.executable, "-c", code, folder, str(pages), str(ppd)], check=False, capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the measuring process failed ({p.returncode}):\n{p.stderr[-3000:]}")
    res = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    return {"pages": pages, "pages_per_doc": ppd, "rows_per_file": rows_per_file, "scratch": folder,
            "output_files": built["files"], "output_bytes": built["bytes"], "build_s": built["build_s"],
            "load_avg": list(os.getloadavg()), "cpus": os.cpu_count(), **res}


def _scratch() -> str:
    return os.path.join(tempfile.gettempdir(), "padoc-bench-driver")


@dataclass(frozen=True, kw_only=True)
class DriverBenchConfig:
    """Build a synthetic batch-job output once (pages/ as many Parquet files in the job's schema and naming,
    written by two runs, with document errors, retries, incomplete and missing inputs and an unreadable leftover
    mixed in, plus the runs' commit records), cached in --scratch; then, in a fresh process, time what the driver
    does around a run: prove the files complete, scan the key columns, plan, list again and add the files
    written since (none: no pipeline runs), and write documents/documents.parquet. Prints and writes seconds,
    peak RSS (the fresh process's) and a breakdown. Building 100M rows takes ~15 min on 2 cores and 2.4 GiB of
    files (~2.9 GiB of disk in 4 KiB blocks)."""

    pages: int = knob(help="page rows to synthesize, e.g. 1000000")
    pages_per_doc: int = 10  #: pages per input document
    #: page rows per Parquet file (the job writes at least --rows-per-file 64)
    rows_per_file: int = 1000
    scratch: str = knob(factory=_scratch, show=lambda v: "$TMPDIR/padoc-bench-driver",
                        help="where synthetic outputs are built and kept, one folder per size (100M rows: 2.4 GiB "
                             "of files, ~2.9 GiB of disk)")
    workers: int = 2  #: processes building the synthetic output
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")

    def __post_init__(self) -> None:
        if self.pages < self.pages_per_doc or self.pages_per_doc < 1 or self.rows_per_file < 1:
            raise ValueError("--pages must be >= --pages-per-doc >= 1 and --rows-per-file >= 1")


def main(cfg: DriverBenchConfig) -> int:
    res = run(cfg.pages, cfg.pages_per_doc, cfg.rows_per_file, cfg.scratch, cfg.workers)
    b = res["breakdown"]
    print(f"{res['page_rows']} page rows, {res['inputs']} inputs, {res['files']} files: plan {b['plan_s']} s "
          f"+ documents table {b['documents_s']} s = {res['seconds']} s; peak RSS "
          f"{res['peak_rss_bytes'] / 2**30:.2f} GiB; footers read {res['footers_read']}; rows from key indexes "
          f"{res['rows_from_index']}, page files read {res['files_read']}; load {res['load_avg']}")
    write_json(cfg.json, res, announce=False)
    return 0
