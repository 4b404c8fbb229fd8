"""The driver's bookkeeping at scale: the vectorized plan, current rows and documents table agree
with the per-row rules they replace (kept here as the reference), commit records spare footer
reads without trusting torn files, and `padoc-ray bench driver` runs end to end on a small output."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padoc_ray.output import commits, reader, rows
from padoc_ray.pipeline import facts, job, ledger, limits
from padoc_ray.pipeline import pages as pg
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.status import SKIPPED_CODES
from padoc_ray.storage import StorageConfig
from padoc_ray.listing import DISALLOWED
from tests.conftest import _env


# ---- the per-row rules the vectorized code replaces (as they were, for comparison) -------------------------
def ref_current_rows(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    uris = table.column("source_uri").to_pylist()
    pages = table.column("page_index").to_pylist()
    times = [-1 if t is None else t for t in pa.compute.cast(table.column("processed_at"), pa.int64()).to_pylist()]
    docs = table.column("doc_id").to_pylist() if "doc_id" in table.column_names else [None] * len(uris)
    version = {}  # input -> (time, row) of its newest row with a doc_id: rows of other doc_ids are stale
    for i, (u, t, d) in enumerate(zip(uris, times, docs)):
        if d and (u not in version or t >= version[u][0]):
            version[u] = (t, i)
    newest, last_doc, last_page = {}, {}, {}
    for i, (u, p, t) in enumerate(zip(uris, pages, times)):
        if docs[i] and docs[i] != docs[version[u][1]]:
            continue
        if (u, p) not in newest or t >= times[newest[(u, p)]]:
            newest[(u, p)] = i
        latest = last_doc if p < 0 else last_page
        latest[u] = max(latest.get(u, t), t)
    keep = [i for (u, p), i in newest.items()
            if (p < 0) == (u in last_doc and (u not in last_page or last_doc[u] > last_page[u]))]
    return table.take(sorted(keep))


def _plan_args(cfg):
    """(limits, pages, max_pages_per_doc): what the ledger's plan takes of a batch config."""
    return cfg.inputs.limits, cfg.inputs.pages, cfg.inputs.max_pages_per_doc


def ref_documents(pages: pa.Table, listed, ranges, max_pages) -> list[dict]:
    by_uri: dict = {}
    for r in pages.select(["source_uri", "doc_id", "page_index", "page_count", "status", "error_code"]).to_pylist():
        by_uri.setdefault(r["source_uri"], []).append(r)
    out = []
    for uri, _size, *_ in listed:
        rs = by_uri.get(uri, [])
        doc_err = next((r for r in rs if r["page_index"] < 0), None)
        pages_rows = {r["page_index"]: r for r in rs if r["page_index"] >= 0}
        doc_id = next((r["doc_id"] for r in rs if r["doc_id"]), None)
        count = next((r["page_count"] for r in rs if r["page_count"] is not None), None)
        if doc_err is not None:
            code = doc_err["error_code"]
            out.append(dict(source_uri=uri, doc_id=doc_id, page_count=count, pages_selected=0, pages_ok=0,
                            pages_failed=0, status="skipped" if code in SKIPPED_CODES else code, error_code=code))
            continue
        selected = rows.select_pages(count, ranges, max_pages) if count is not None else []
        ok = sum(1 for i in selected if i in pages_rows and pages_rows[i]["status"] == "ok")
        failed = sum(1 for i in selected if i in pages_rows and pages_rows[i]["status"] != "ok")
        status = "missing" if count is None else "incomplete" if len(selected) - ok - failed else \
            "ok" if failed == 0 else ("failed" if ok == 0 else "partial")
        code = None
        if status == "failed":
            codes = Counter(pages_rows[i]["error_code"] or pages_rows[i]["status"] for i in selected)
            code = min(codes.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        out.append(dict(source_uri=uri, doc_id=doc_id, page_count=count, pages_selected=len(selected), pages_ok=ok,
                        pages_failed=failed, status=status, error_code=code))
    return out


def ref_restamped(all_rows: list[dict], size: int, mtime: int) -> bool:
    """Whether a row among an input's newest ones with a stamp has another size or time than the listing's."""
    if size < 0 or mtime < 0:
        return False
    stamped = [r for r in all_rows if r["source_size"] is not None and r["source_mtime"] is not None]
    if not stamped:
        return False
    def at(r):
        return -1 if r["processed_at"] is None else r["processed_at"]
    newest = max(at(r) for r in stamped)
    return any((r["source_size"], r["source_mtime"]) != (size, mtime) for r in stamped if at(r) == newest)


def ref_plan(listed, existing: pa.Table, cfg: BatchConfig):
    by_uri: dict = {}
    for r in ref_current_rows(existing).to_pylist():
        by_uri.setdefault(r["source_uri"], []).append(r)
    everything: dict = {}
    t = existing.set_column(existing.schema.get_field_index("source_mtime"), "source_mtime",
                            pa.compute.cast(existing.column("source_mtime"), pa.int64()))
    t = t.set_column(t.schema.get_field_index("processed_at"), "processed_at",
                     pa.compute.cast(t.column("processed_at"), pa.int64()))
    for r in t.select(["source_uri", "processed_at", "source_size", "source_mtime"]).to_pylist():
        everything.setdefault(r["source_uri"], []).append(r)
    todo, complete = [], 0
    for uri, size, mtime in listed:
        prev = by_uri.get(uri, [])
        doc = next((r for r in prev if r["page_index"] < 0), None)
        refusal = limits.listing_refusal(size, cfg.inputs.limits)
        if refusal is not None:
            if doc is not None and doc["error_code"] == refusal[0]:
                complete += 1
            else:
                todo.append({"uri": uri, "size": size, "mtime": mtime, "done": [], "doc_id": None})
            continue
        changed = ref_restamped(everything.get(uri, []), size, mtime)
        if doc is not None:
            count = doc["page_count"]
            n_sel = len(rows.select_pages(count, *_plan_args(cfg)[1:])) if count is not None else None
            if not limits.retried(doc["error_code"], count, n_sel, cfg.inputs.limits) and not changed:
                complete += 1
                continue
            prev = []
        done = sorted({r["page_index"] for r in prev})
        count = next((r["page_count"] for r in prev if r["page_count"] is not None), None)
        if count is not None and set(rows.select_pages(count, *_plan_args(cfg)[1:])) <= set(done) and not changed:
            complete += 1
            continue
        todo.append({"uri": uri, "size": size, "mtime": mtime, "done": done,
                     "doc_id": next((r["doc_id"] for r in prev if r["doc_id"]), None) if done else None})
    return todo, complete


# ---- random outputs with every case mixed in -----------------------------------------------------------------
DOC_CODES = ["corrupt_pdf", "not_pdf", "read_failed", "missing_file", "disallowed_uri", "file_too_large",
             "too_many_pages", "too_many_frames", "encrypted_pdf", None]
PAGE_CODES = ["ok", "ok", "ok", "runaway", "deadline", "token_limit", "render_failed", None]


def _row(uri, page, count, status, t, doc_id="d", err=None, run="r1", stamp=(None, None)):
    b = rows.base_row(run_id=run, uri=uri, doc_id=doc_id, page_index=page, page_count=count, mode="fork",
                      model_id="m", source_size=stamp[0], source_mtime=stamp[1])
    at = None if t is None else dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=t)
    return {**b, "status": status, "error_code": err if err is not None else (None if status == "ok" else status),
            "processed_at": at, "output_tokens": 5}


def random_output(rng: random.Random, n_docs: int):
    out, listed = [], []
    for d in range(n_docs):
        uri = f"s3://b/in/doc-{d:04d}.pdf"
        size, mtime = rng.choice([10, 10, 10, -1, DISALLOWED, 10 << 30]), rng.choice([1000, 1000, 2000, -1])
        listed.append((uri, size, mtime))
        count = rng.choice([1, 2, 3, 5, 8, 12, 7000])
        sha = hashlib.sha256(uri.encode()).hexdigest()  # what the job writes: kept as 32 bytes
        doc_id = rng.choice([f"sha{d}", sha, sha, sha.upper(), "", None])
        for _ in range(rng.choice([0, 1, 1, 2, 3])):  # runs that wrote rows of this input
            t0 = rng.randint(0, 50)  # small: equal times happen (ties: the later row wins)
            # now and then the file changed between runs: this run's rows are of another version
            run_doc = doc_id if rng.random() < 0.75 else rng.choice([f"new{d}", sha[::-1]])
            # the size and time this run's listing saw: mostly today's; or an older file's; or none (an output
            # written before they were recorded)
            stamp = rng.choice([(size, mtime), (size, mtime), (size, 500), (11, mtime), (None, None)])
            if rng.random() < 0.3:
                out.append(_row(uri, -1, rng.choice([None, count]), rng.choice(DOC_CODES) or "corrupt_pdf", t0,
                                doc_id=rng.choice([run_doc, None]), stamp=stamp))
            else:
                for p in rng.sample(range(min(count, 12)), rng.randint(0, min(count, 12))):
                    out.append(_row(uri, p, rng.choice([count, count, None]), rng.choice(PAGE_CODES) or "ok",
                                    rng.choice([t0, t0 + rng.randint(0, 3), None]), doc_id=run_doc,
                                    err=rng.choice([None, None, ""]), stamp=stamp))
    rng.shuffle(out)
    out.append(_row("s3://b/unlisted.pdf", 0, 1, "ok", 5))  # rows of inputs no longer listed: ignored
    return rows.to_table(out), listed


CONFIGS = [dict(), dict(max_pages_per_doc=2), dict(pages=(0, 2, 5, 9)), dict(pages=(1, 3), max_pages_per_doc=1),
           dict(limits=InputLimits(max_doc_pages=4, max_image_frames=2, max_file_bytes=None))]


@pytest.mark.parametrize("seed", range(6))
def test_vectorized_rules_match_the_per_row_rules_on_random_outputs(seed):
    rng = random.Random(seed)
    table, listed = random_output(rng, 60)
    want = ref_current_rows(table)
    got = ledger.current_rows(table)
    assert got.to_pylist() == want.to_pylist()  # the same rows, in the same order
    for kw in CONFIGS:
        cfg = BatchConfig.from_flat(input="x", output="y", model="m", **kw)
        assert job.plan(listed, table, cfg) == ref_plan(listed, table, cfg), kw
        for pages in (table, want):  # any table, and the current rows the driver passes
            got = ledger.documents_table(pages, listed, cfg.inputs.pages, cfg.inputs.max_pages_per_doc).to_pylist()
            assert got == ref_documents(pages, listed, cfg.inputs.pages, cfg.inputs.max_pages_per_doc), kw


def test_the_driver_scan_agrees_with_the_table_rules_and_partitions_change_nothing(tmp_path, monkeypatch):
    """scan_pages (dictionary batches, many files) + plan/documents == the in-memory rules, also
    when the rows are sorted in several partitions."""
    rng = random.Random(7)
    table, listed = random_output(rng, 200)
    pages = tmp_path / "pages"
    pages.mkdir()
    for i in range(0, table.num_rows, 37):  # many files, one input's rows spread over several
        pq.write_table(table.slice(i, 37), pages / f"part-{i:05d}.parquet")
    lt = ledger.listing_table(listed)
    cfg = BatchConfig.from_flat(input="x", output=str(tmp_path), model="m", max_pages_per_doc=3)
    table = pg.read_pages(str(pages), StorageConfig(), columns=rows.PAGE_SCHEMA.names)  # in the files' order
    want_plan = ref_plan(listed, table, cfg)
    want_docs = ref_documents(ref_current_rows(table), listed, cfg.inputs.pages, cfg.inputs.max_pages_per_doc)
    for part_rows in (10 ** 9, 50):
        monkeypatch.setattr(facts, "PART_ROWS", part_rows)
        monkeypatch.setattr(ledger, "MAP_EVERY", 2_000_000 if part_rows > 50 else 5)  # map URIs once, or often
        monkeypatch.setattr(pg, "SCAN_FILES", 512 if part_rows > 50 else 3)
        fs, files, _ = pg.page_files_for_run(str(pages), StorageConfig())
        book = pg.scan_pages(fs, files, lt.column("uri"), "r1", stamps=ledger.stamps(lt))
        assert ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg)) \
            == want_plan
        counts, lost = job.write_documents(book, str(tmp_path / "documents"), StorageConfig(), "run")
        assert pq.read_table(tmp_path / "documents" / "documents.parquet").to_pylist() == want_docs
        assert counts == dict(Counter(d["status"] for d in want_docs))
        assert lost == [d["source_uri"] for d in want_docs if d["status"] in ("incomplete", "missing")][:100]
        assert book.run_rows == table.num_rows and book.run_tokens == 5 * table.num_rows
        # the driver after a pipeline: the files written since are added to the ledger it planned with
        book = pg.scan_pages(fs, files[:len(files) // 2], lt.column("uri"), "r1", stamps=ledger.stamps(lt))
        ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg))
        book = pg.scan_pages(fs, files[len(files) // 2:], lt.column("uri"), "r1", book=book)
        assert book.facts is None and book.rows_read == table.num_rows
        assert ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg)) \
            == want_plan
        assert ledger.documents(book, cfg.inputs.pages, cfg.inputs.max_pages_per_doc).to_pylist() == want_docs
        # ... and the documents table from the plan's facts, only the inputs of the added rows analyzed again
        book = pg.scan_pages(fs, files[:len(files) // 2], lt.column("uri"), "r1", stamps=ledger.stamps(lt))
        ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg))
        book = pg.scan_pages(fs, files[len(files) // 2:], lt.column("uri"), "r1", book=book)
        book.facts = facts.refresh(book, ranges=cfg.inputs.pages, max_pages=cfg.inputs.max_pages_per_doc)
        assert ledger.documents(book, cfg.inputs.pages, cfg.inputs.max_pages_per_doc).to_pylist() == want_docs


def test_times_months_apart_and_doc_ids_across_store_blocks(tmp_path, monkeypatch):
    """Times are kept as int32 offsets while they fit and int64 once a file's do not (rows of both
    kinds joined), doc_ids as 32 bytes over several store blocks or as strings: same results."""
    from padoc_ray.pipeline import columns, docids

    rng = random.Random(11)
    table, listed = random_output(rng, 120)
    ms = pa.compute.cast(table.column("processed_at"), pa.int64())
    late = pa.array([i >= table.num_rows // 2 for i in range(table.num_rows)])  # later files: ~70 days on
    t0 = pa.compute.min(ms).as_py()  # t ms after t0 becomes t * 10^5 s (up to ~60 days) after t0 + 10^6 s
    at = pa.compute.if_else(late, pa.compute.add(pa.compute.multiply(pa.compute.subtract(ms, t0), 10 ** 8),
                                                 t0 + 10 ** 9), ms)
    table = table.set_column(table.schema.get_field_index("processed_at"), "processed_at",
                             pa.compute.cast(at, pa.timestamp("ms", tz="UTC")))
    pages = tmp_path / "pages"
    pages.mkdir()
    for i in range(0, table.num_rows, 29):
        pq.write_table(table.slice(i, 29), pages / f"part-{i:05d}.parquet")
    monkeypatch.setattr(docids, "BLOCK", 7)
    monkeypatch.setattr(pg, "SCAN_FILES", 2)
    lt = ledger.listing_table(listed)
    cfg = BatchConfig(input="x", output=str(tmp_path), model="m")
    table = pg.read_pages(str(pages), StorageConfig(), columns=rows.PAGE_SCHEMA.names)
    fs, files, _ = pg.page_files_for_run(str(pages), StorageConfig())
    book = pg.scan_pages(fs, files, lt.column("uri"), "r1", stamps=ledger.stamps(lt))
    assert book.t.dtype == np.int64 and book.doc_ids.n_hex > 7 and book.doc_ids.n_str > 0
    assert ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg)) \
        == ref_plan(listed, table, cfg)
    assert ledger.documents(book, cfg.inputs.pages, cfg.inputs.max_pages_per_doc).to_pylist() \
        == ref_documents(ref_current_rows(table), listed, cfg.inputs.pages, cfg.inputs.max_pages_per_doc)
    parts = [columns.time_offsets(pa.array([5, None, 3], pa.int64()), 0),
             columns.time_offsets(pa.array([2 ** 40, None], pa.int64()), 0)]
    assert [p.dtype for p in parts] == [np.int32, np.int64]
    joined = columns.cat_times(parts)
    assert joined.tolist()[:3] == [5, columns.NO_TIME64, 3] and joined[4] == columns.NO_TIME64 and not parts


def test_hand_built_retries_duplicates_and_page_ranges():
    t = rows.to_table([
        _row("a", 0, 3, "deadline", 0), _row("a", 0, 3, "ok", 5), _row("a", 1, 3, "ok", 5),  # retried page
        _row("a", 2, 3, "runaway", 5), _row("a", 2, 3, "ok", 5),  # equal times: the later row wins
        _row("b", -1, None, "read_failed", 9, doc_id=None), _row("b", 0, 2, "ok", 3),  # the read failed later
        _row("c", -1, 7000, "too_many_pages", 1), _row("d", 4, 9, "ok", 1),
    ])
    listed = [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", -1)]
    cur = ledger.current_rows(t)
    assert sorted((r["source_uri"], r["page_index"], r["status"]) for r in cur.to_pylist()) == [
        ("a", 0, "ok"), ("a", 1, "ok"), ("a", 2, "ok"), ("b", -1, "read_failed"), ("c", -1, "too_many_pages"),
        ("d", 4, "ok")]
    docs = {d["source_uri"]: d for d in ledger.documents_table(cur, listed, (4, 5), None).to_pylist()}
    assert docs["a"]["status"] == "ok" and docs["a"]["pages_selected"] == 0  # pages 5-6 are past its end
    assert docs["d"]["pages_selected"] == 2 and docs["d"]["status"] == "incomplete"  # 5 of pages 5,6 has no row
    assert docs["b"]["status"] == "read_failed" and docs["e"]["status"] == "missing"
    cfg = BatchConfig.from_flat(input="x", output="y", model="m", max_pages_per_doc=10)
    todo, complete = job.plan(listed, t, cfg)
    assert [(x["uri"], x["done"]) for x in todo] == [("b", []), ("c", []), ("d", [4]), ("e", [])] and complete == 1


def test_a_document_row_newer_than_its_pages_wins_when_times_come_before_the_first_read():
    """Times are kept as offsets from the first batch's earliest; rows read later may be older (negative
    offsets). A document-level row newer than its input's page rows still wins (numpy 2 once wrapped the
    int64 "no row" marker to 0 in int32, and that 0 beat both)."""
    later = rows.to_table([_row("b", 0, 1, "ok", 100)])
    earlier = rows.to_table([_row("a", 0, 2, "ok", 10), {**_row("a", -1, 2, "read_failed", 20), "doc_id": None}])
    book = ledger.Ledger(pa.array(["a", "b"]))
    book.add(later)
    book.add(earlier)
    book.finish()
    f = facts.analyze(book)
    assert f.doc_level.tolist() == [True, False] and book.codes[f.doc_err[0]] == "read_failed"


# ---- key indexes ----------------------------------------------------------------------------------------------
def test_a_plan_from_key_indexes_equals_the_plan_from_the_files_and_stale_indexes_are_not_used(tmp_path):
    """The driver's reading with indexes gives the plan and documents table it gives reading every file;
    the files it reads one by one it indexes, so the next plan reads none; an index that names a file that
    is gone or has another size, a torn one, and one naming a file another index holds are not used."""
    from padoc_ray.pipeline import keyindex

    rng = random.Random(11)
    table, listed = random_output(rng, 150)
    pages = tmp_path / "pages"
    pages.mkdir()
    for i in range(0, table.num_rows, 29):
        pq.write_table(table.slice(i, 29), pages / f"r0_{i:05d}.parquet")
    lt = ledger.listing_table(listed)
    cfg = BatchConfig.from_flat(input="x", output=str(tmp_path), model="m", max_pages_per_doc=3)
    st = StorageConfig()

    def plan_and_docs(**kw):
        found = pg.found_page_files(str(pages), st)
        book = pg.read_ledger(str(pages), st, found, found.good, lt.column("uri"), run_id="r9",
                               stamps=ledger.stamps(lt), summary=False, **kw)
        todo = ledger.plan(book, lt.column("size").to_numpy(), *_plan_args(cfg))
        docs = ledger.documents(book, cfg.inputs.pages, cfg.inputs.max_pages_per_doc).to_pylist()
        return (todo, docs), book

    want, book = plan_and_docs(use_index=False)
    assert book.files_read == len(os.listdir(pages)) and book.indexed_rows == 0
    assert want[0] == ref_plan(listed, pg.read_pages(str(pages), st, columns=rows.PAGE_SCHEMA.names), cfg)
    got, book = plan_and_docs(index_name="r9-plan")  # no index yet: every file read, and indexed
    assert got == want and book.files_read == len(os.listdir(pages))
    assert os.listdir(tmp_path / "index") == ["r9-plan.parquet"]
    got, book = plan_and_docs()
    assert got == want and book.files_read == 0 and book.indexed_rows == table.num_rows
    # a later run's files: only they are read one by one, and indexed in a second index
    extra = rows.to_table([_row(listed[0][0], 0, 1, "ok", 99, stamp=listed[0][1:])])
    pq.write_table(extra, pages / "r1_extra.parquet")
    table = pa.concat_tables([table, extra])
    want = (ref_plan(listed, pg.read_pages(str(pages), st, columns=rows.PAGE_SCHEMA.names), cfg), None)
    got, book = plan_and_docs(index_name="r10-plan")
    assert got[0] == want[0] and book.files_read == 1 and book.indexed_rows == table.num_rows - 1
    got, book = plan_and_docs()
    assert got[0] == want[0] and book.files_read == 0
    # a file of an index rewritten with another size: that index is not used, its files are read themselves
    victim = sorted(os.listdir(pages))[0]
    pq.write_table(pq.read_table(pages / victim).slice(0, 1), pages / victim)
    # rows are read index by index (oldest first), then the files no index holds: here the later run's row first
    listing_order = pg.found_page_files(str(pages), st).good
    table2 = pa.concat_tables([pq.read_table(pages / "r1_extra.parquet", schema=rows.PAGE_SCHEMA)] + [
        pq.read_table(f, schema=rows.PAGE_SCHEMA) for f in listing_order if "/r0_" in f])
    got, book = plan_and_docs()
    assert got[0] == ref_plan(listed, table2, cfg) and book.files_read == len(os.listdir(pages)) - 1
    # a torn index and a copy of a used one (naming the same files) are not used either
    (tmp_path / "index" / "r11-plan.parquet").write_bytes(b"PAR1 torn")
    idx = tmp_path / "index"
    (idx / "zz-copy.parquet").write_bytes((idx / "r10-plan.parquet").read_bytes())
    got, book = plan_and_docs()
    assert got[0] == ref_plan(listed, table2, cfg) and book.files_read == len(os.listdir(pages)) - 1
    found = pg.found_page_files(str(pages), st)
    assert keyindex.usable(str(pages), st, found.good, found.size_of).paths == [str(idx / "r10-plan.parquet")]


def test_the_batch_driver_indexes_what_it_reads_and_the_next_plan_reads_no_page_file(tmp_path):
    """Two real driver runs (no Ray: nothing left to parse after the first): the first reads the output's
    files one by one and indexes them; the second reads them from the index."""
    from tests.unit.pipeline.test_listing_and_plan import _files

    inp, out = tmp_path / "in", tmp_path / "out"
    _files(inp, ["a.pdf", "b.pdf"])
    pages = out / "pages"
    pages.mkdir(parents=True)
    rows_ = [_row(str(inp / n), p, 2, "ok", 1, stamp=(os.path.getsize(inp / n),
                                                      os.stat(inp / n).st_mtime_ns // 1_000_000))
             for n in ("a.pdf", "b.pdf") for p in (0, 1)]
    pq.write_table(rows.to_table(rows_[:2]), pages / "r0_a.parquet")
    pq.write_table(rows.to_table(rows_[2:]), pages / "r0_b.parquet")
    summaries = []
    for run in ("run-1", "run-2"):
        cfg = BatchConfig.from_flat(input=str(inp), output=str(out), model="m", run_id=run)
        summaries.append(job.run_batch(cfg, log=lambda *_: None))
    first, second = summaries
    assert first["inputs_already_complete"] == second["inputs_already_complete"] == 2
    assert first["ledger_files_read"] == 2 and first["ledger_rows_from_index"] == 0
    assert second["ledger_files_read"] == 0 and second["ledger_rows_from_index"] == 4
    assert second["document_status"] == {"ok": 2}


# ---- the cheap proof of complete files ----------------------------------------------------------------------
def test_commit_records_spare_footer_reads_and_never_vouch_for_a_torn_file(tmp_path, monkeypatch):
    pages = tmp_path / "pages"
    pages.mkdir()
    good = "r1_0123456789abcdef0123456789abcdef_000001-0.parquet"
    pq.write_table(rows.to_table([_row("a", 0, 1, "ok", 1)]), pages / good)
    torn = "r1_0123456789abcdef0123456789abcdef_000002-0.parquet"
    (pages / torn).write_bytes(b"PAR1 torn")
    reads = []
    real = reader.footer
    monkeypatch.setattr(reader, "footer", lambda fs, p: (reads.append(os.path.basename(p)), real(fs, p))[1])
    _, files, proven = pg.page_files_for_run(str(pages), StorageConfig())
    assert [os.path.basename(f) for f in files] == [good] and sorted(reads) == sorted([good, torn])
    size = (pages / good).stat().st_size
    assert proven == [(good, size)]
    commits.write_commit(str(pages), StorageConfig(), "r2", [good, torn], [size, 5])  # a record naming a wrong size
    assert os.path.exists(tmp_path / "commits" / "r2.parquet") and not os.listdir(tmp_path / "commits")[1:]
    reads.clear()
    _, files, proven = pg.page_files_for_run(str(pages), StorageConfig())
    assert [os.path.basename(f) for f in files] == [good] and reads == [torn] and proven == []  # torn: still checked
    # a record is trusted for its size only: a file rewritten with another size is checked again
    pq.write_table(rows.to_table([_row("a", 0, 1, "ok", 1), _row("a", 1, 2, "ok", 1)]), pages / good)
    reads.clear()
    assert pg.read_pages(str(pages), StorageConfig()).num_rows == 2 and sorted(reads) == sorted([good, torn])
    (tmp_path / "commits" / "r3.parquet").write_bytes(b"PAR1 a torn record")  # proves nothing, breaks nothing
    assert pg.read_pages(str(pages), StorageConfig()).num_rows == 2


def test_the_driver_commits_what_it_proved_and_leftovers_are_still_removed(tmp_path, monkeypatch):
    """Run 1 finds an old output without records: it reads each footer once, removes an earlier
    run's torn file, keeps a young one of unknown origin, and records the good files; run 2 reads
    no footer of a recorded file."""
    from tests.unit.pipeline.test_listing_and_plan import _files

    inp, out = tmp_path / "in", tmp_path / "out"
    _files(inp, ["a.pdf"])
    pages = out / "pages"
    pages.mkdir(parents=True)
    uri = str(inp / "a.pdf")
    pq.write_table(rows.to_table([_row(uri, 0, 1, "ok", 1)]), pages / "old-layout.parquet")
    killed = pages / "0123abcd4567_0123456789abcdef0123456789abcdef_000002-0.parquet"
    killed.write_bytes(b"PAR1 torn by a killed run")
    (pages / "young.parquet").write_bytes(b"PAR1 being written")
    reads = []
    real = reader.footer
    monkeypatch.setattr(reader, "footer", lambda fs, p: (reads.append(os.path.basename(p)), real(fs, p))[1])
    monkeypatch.setattr(job, "_pipeline", lambda work, cfg, model_id: pytest.fail("nothing is to do"))
    for run in ("run-1", "run-2"):
        reads.clear()
        summary = job.run_batch(BatchConfig(input=str(inp), output=str(out), model="m", run_id=run), log=lambda s: None)
        assert summary["all_inputs_accounted"] and summary["document_status"] == {"ok": 1}
        assert not killed.exists() and (pages / "young.parquet").exists()
        want = [killed.name, "old-layout.parquet", "young.parquet"] if run == "run-1" else ["young.parquet"]
        assert sorted(reads) == want
    assert pq.read_table(out / "commits" / "run-1.parquet").column("name").to_pylist() == ["old-layout.parquet"]


def test_a_run_adds_the_files_it_wrote_and_records_them(tmp_path, monkeypatch):
    """After the pipeline the driver lists pages/ again, trusts its own run's files (their write
    returned) without reading their footers, adds them to the ledger it planned with, and records
    them; the summary and the documents table count them."""
    from tests.unit.pipeline.test_listing_and_plan import _files

    inp, out = tmp_path / "in", tmp_path / "out"
    _files(inp, ["a.pdf", "b.pdf"])
    a, b = str(inp / "a.pdf"), str(inp / "b.pdf")
    pages = out / "pages"
    pages.mkdir(parents=True)
    pq.write_table(rows.to_table([_row(a, 0, 2, "ok", 1)]), pages / "old.parquet")  # a: page 1 still to do
    mine = f"run-1_{'ab' * 16}_000000-0.parquet"

    def pipeline(work, cfg, model_id):  # what Ray Data's write leaves: files named by the run
        assert sorted((w["uri"], w["done"]) for w in work) == [(a, [0]), (b, [])]
        pq.write_table(rows.to_table([_row(a, 1, 2, "ok", 5, run=cfg.run_id),
                                      _row(b, 0, 1, "runaway", 5, run=cfg.run_id)]), pages / mine)

    reads = []
    real = reader.footer
    monkeypatch.setattr(reader, "footer", lambda fs, p: (reads.append(os.path.basename(p)), real(fs, p))[1])
    monkeypatch.setattr(job, "_pipeline", pipeline)
    summary = job.run_batch(BatchConfig(input=str(inp), output=str(out), model="m", run_id="run-1"), log=lambda s: None)
    assert summary["rows_written"] == 2 and summary["pages_written"] == 2
    assert summary["page_status"] == {"ok": 1, "runaway": 1} and summary["output_tokens_per_s"] > 0
    assert summary["document_status"] == {"ok": 1, "failed": 1} and summary["all_inputs_accounted"]
    assert reads == ["old.parquet"]  # the run's own file is not read back
    assert sorted(pq.read_table(out / "commits" / "run-1.parquet").column("name").to_pylist()) == ["old.parquet", mine]
    docs = {d["source_uri"]: d for d in pq.read_table(out / "documents" / "documents.parquet").to_pylist()}
    assert docs[a]["pages_ok"] == 2 and docs[b]["error_code"] == "runaway"


# ---- the benchmark command ------------------------------------------------------------------------------------
def test_bench_driver_builds_once_and_measures_in_a_fresh_process(tmp_path):
    from padoc_ray.bench.driver import build

    out = tmp_path / "driver.json"
    cmd = [sys.executable, "-m", "padoc_ray.cli", "bench", "driver", "--pages", "10000", "--pages-per-doc", "5",
           "--rows-per-file", "700", "--workers", "1", "--scratch", str(tmp_path / "scratch"), "--json", str(out)]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["seconds"] > 0 and res["peak_rss_bytes"] > 0 and res["inputs"] == 2000
    # every synthetic case is accounted for: 2 inputs per 1000 cases, the rest ok or partial
    st = res["document_status"]
    assert st["missing"] == 2 and st["incomplete"] == 2 and st["failed"] == 2 and st["corrupt_pdf"] == 2
    assert st["skipped"] == 2 and st["partial"] == 40 and sum(st.values()) == 2000
    # to do: incomplete, missing, and (case 31) replaced since its rows (a newer time): read again; read_failed was
    # healed by run 2, and case 32's rows predate recorded sizes and times (nothing to compare: complete)
    assert res["todo"] == 6 and res["complete"] == 1994 and res["restamped"] == 2
    assert res["footers_read"] == 2  # the unreadable leftover, once per listing: the others have commit records
    built = os.path.join(res["scratch"], "BUILT")
    stamp = os.stat(built).st_mtime_ns
    assert build(str(tmp_path / "scratch"), 10000, 5, 700, 1) == res["scratch"]  # reused, not rebuilt
    assert os.stat(built).st_mtime_ns == stamp
