"""What ``pages/`` says about each input, computed in columns: the driver's bookkeeping at scale.

The driver reads every page row back to plan a run (what is complete, which pages to resume) and
to build the documents table. Held as Python dicts, 10M rows took a minute and 8 GB; here rows
are reduced as they are read to a few integer columns per row (input number in the listing, page,
time as an int32 offset, page count, status and error codes, doc_id position: 16 bytes a row),
URIs stay in per-batch Arrow dictionaries until mapped to input numbers, doc_ids go to a compact
store (:mod:`~padoc_ray.pipeline.docids`), and the decisions are sorts and segment reductions over
those columns, a bounded number of rows at a time (:mod:`~padoc_ray.pipeline.facts`), giving both the plan and the documents table; the rules
are those of :func:`current_rows`, :func:`documents_table`
and :func:`padoc_ray.pipeline.job.plan`, which use the same code on in-memory tables.

Knows nothing of where files live (the caller feeds record batches). Pure: pyarrow and numpy only.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padoc_ray import status
from padoc_ray.pipeline import limits
from padoc_ray.pipeline.columns import as_dict, cat, cat_times, equals, indices, ints, same_buffers, small, time_offsets, trim
from padoc_ray.pipeline.docids import DocIds
from padoc_ray.pipeline.facts import Facts, analyze, current_mask

#: the columns the driver reads (strings as dictionaries)
COLUMNS = ["source_uri", "page_index", "processed_at", "page_count", "status", "error_code", "doc_id", "run_id",
           "output_tokens", "engine_s", "source_size", "source_mtime", "accepted_tokens", "text_layer"]
DICT_COLUMNS = ["source_uri", "status", "error_code", "doc_id", "run_id"]
#: the columns of the run summary (``run_id``'s own rows): not read where no row can be the run's (planning)
SUMMARY_COLUMNS = ["run_id", "output_tokens", "engine_s", "accepted_tokens", "text_layer"]
PLAN_COLUMNS = [c for c in COLUMNS if c not in SUMMARY_COLUMNS]
#: map rows to input numbers whenever this many URI dictionary entries are pending (bounds memory,
#: ~65 bytes an entry; each mapping looks up every listed URI once)
MAP_EVERY = 4_000_000
_NOPAGE = np.iinfo(np.int32).min  # a row without page_index: ignored
# a row's stamp (its input's size and time as its run listed it) against this listing's: -1 unknown (no stamp,
# or the listing has none), 0 the same, 1 different


class Ledger:
    """Rows of ``pages/`` reduced to integer columns, keyed by the inputs of one listing.

    Feed it record batches (:meth:`add`), then :meth:`finish`. Rows whose ``source_uri`` is not
    listed are dropped (neither the plan nor the documents table looks at them) but still count
    in the summary of ``run_id``'s rows.

    ``stamps`` (sizes, modification times in ms; -1 unknown), one per listed input: each row's own
    ``source_size`` / ``source_mtime`` is compared with its input's (1 byte a row once its input is
    known; until then a 64-bit hash of the pair, :func:`stamp_hash`), so the plan can read again an
    input whose newest rows were written for another size or time."""

    def __init__(self, listed_uris, run_id: str | None = None, stamps: tuple | None = None):
        if isinstance(listed_uris, pa.ChunkedArray):  # one chunk: no copy
            listed_uris = listed_uris.chunk(0) if listed_uris.num_chunks == 1 else listed_uris.combine_chunks()
        self.listed = listed_uris
        self.n = len(self.listed)
        if stamps is not None:
            self.listed_mtime = np.asarray(stamps[1], np.int64)
            self.listed_hash = stamp_hash(np.asarray(stamps[0], np.int64), self.listed_mtime)
        else:
            self.listed_mtime = np.full(self.n, -1, np.int64)
            self.listed_hash = np.zeros(self.n, np.uint64)
        self.run_id = run_id
        self.codes: list[str] = []  # status and error strings
        self._code_of: dict[str, int] = {}
        self._uri_dicts: list[pa.Array] = []
        self.doc_ids = DocIds()
        self._uri_off = 0
        self._last_uri = self._last_doc = None  # (dictionary, its offset / positions)
        self._t0: int | None = None  # times are kept as offsets from the first one seen
        self._cols: dict[str, list] = {k: [] for k in ("gpos", "hash", "u", "page", "t", "count", "status", "err",
                                                       "doc", "stamp")}
        self.rows_read = 0
        self.indexed_rows = 0  # rows read from key indexes (padoc_ray.pipeline.keyindex), of rows_read
        self.files_read = 0  # page files read one by one
        self.footers_read = 0
        self.run_rows = self.run_pages = self.run_tokens = 0
        #: ``run_id``'s pages that reached the engine (engine_s not null), and the sum of their engine_s
        self.run_engine_pages = 0
        self.run_engine_s = 0.0
        #: of ``run_id``'s pages: branch tokens accepted from text-layer drafts, and the text layers' verdicts
        self.run_accepted_tokens = 0
        self.run_text_layer: Counter = Counter()
        self.run_status: Counter = Counter()
        self.facts = None
        self._analyzed: tuple | None = None  # (facts, rows analyzed) of the last analysis of all rows: refresh()
        self._rows_at_facts = 0

    # ---- reading -------------------------------------------------------------------------------------------
    def _code(self, s: str) -> int:
        c = self._code_of.get(s)
        if c is None:
            c = self._code_of[s] = len(self.codes)
            self.codes.append(s)
        return c

    def _lut(self, col) -> np.ndarray:
        """Codes of a small string column (status, error_code): -1 for null."""
        d = as_dict(col)
        lut = np.array([self._code(s) for s in d.dictionary.to_pylist()] + [-1], dtype=np.int32)
        if len(self.codes) > 32000:
            raise ValueError(f"more than 32000 distinct status / error codes in pages/ ({len(self.codes)})")
        return lut.astype(np.int16)[indices(d)]

    def _uri_positions(self, col) -> np.ndarray:
        """Global positions of the URIs in the pending dictionaries (-1: null)."""
        d = as_dict(col)
        dic = d.dictionary
        if self._last_uri is not None and same_buffers(self._last_uri[0], dic):  # one row group's batches
            off = self._last_uri[1]
        else:
            off = self._uri_off
            self._uri_dicts.append(dic if dic.type == pa.string() else pc.cast(dic, pa.string()))
            self._uri_off += len(dic)
            self._last_uri = (dic, off)  # kept alive: its buffers cannot be reused
        lut = off + np.arange(len(dic) + 1, dtype=np.int32 if self._uri_off < 2**31 - 1 else np.int64)
        lut[-1] = -1
        return lut[indices(d)]

    def _doc_positions(self, col) -> np.ndarray:
        """Positions of the doc_ids in :attr:`doc_ids` (-1: null or empty)."""
        d = as_dict(col)
        if self._last_doc is None or not same_buffers(self._last_doc[0], d.dictionary):
            self._last_doc = (d.dictionary, small(self.doc_ids.add(d.dictionary)))
        return self._last_doc[1][indices(d)]

    def add(self, batch) -> None:
        """One record batch (or table) with :data:`COLUMNS` (missing columns count as nulls)."""
        n = batch.num_rows
        if n == 0:
            return
        names = set(batch.schema.names)

        def col(name, typ):
            return batch.column(name) if name in names else pa.nulls(n, typ)

        self.rows_read += n
        st_codes = self._lut(col("status", pa.string()))
        page = ints(col("page_index", pa.int32()), _NOPAGE, np.int32)
        if self.run_id is not None and "run_id" in names:
            mine = equals(col("run_id", pa.string()), self.run_id)
            if mine.any():
                real = mine & (page >= 0)
                self.run_rows += int(mine.sum())
                self.run_pages += int(real.sum())
                for code, k in Counter(st_codes[real].tolist()).items():
                    self.run_status[self.codes[code] if code >= 0 else None] += k
                self.run_tokens += int(ints(col("output_tokens", pa.int32()), 0, np.int64)[mine].sum())
                engine_s = ints(col("engine_s", pa.float32()), np.nan, np.float64)
                timed = real & ~np.isnan(engine_s)
                self.run_engine_pages += int(timed.sum())
                self.run_engine_s += float(engine_s[timed].sum())
                self.run_accepted_tokens += int(ints(col("accepted_tokens", pa.int32()), 0, np.int64)[real].sum())
                layers = pc.filter(col("text_layer", pa.string()), pa.array(real))
                for v in pc.value_counts(layers.drop_null()).to_pylist():
                    self.run_text_layer[v["values"]] += v["counts"]
        c = self._cols
        c["hash"].append(stamp_hash(ints(col("source_size", pa.int64()), -1, np.int64), ints(
            pc.cast(col("source_mtime", pa.timestamp("ms", tz="UTC")), pa.int64()), -1, np.int64)))
        c["gpos"].append(self._uri_positions(col("source_uri", pa.string())))
        if self._uri_off > MAP_EVERY:
            self._map_uris()
        c["page"].append(small(page))
        t = pc.cast(col("processed_at", pa.timestamp("ms", tz="UTC")), pa.int64())
        if self._t0 is None:
            self._t0 = pc.min(t).as_py()
        c["t"].append(time_offsets(t, self._t0 or 0))
        c["count"].append(small(ints(col("page_count", pa.int32()), -1, np.int32)))
        c["status"].append(small(st_codes))
        c["err"].append(small(self._lut(col("error_code", pa.string()))))
        c["doc"].append(self._doc_positions(col("doc_id", pa.string())))

    def _map_uris(self) -> None:
        """Turn the pending rows' dictionary positions into input numbers (and drop the dictionaries)."""
        c = self._cols
        if self._uri_dicts and self.n:
            # hash the pending URIs (a few million), not the listing: look each listed URI up in them
            enc = pc.dictionary_encode(pa.chunked_array(self._uri_dicts, pa.string()).combine_chunks())
            listed = self.listed if self.listed.type == pa.string() else pc.cast(self.listed, pa.string())
            where = ints(pc.index_in(listed, value_set=enc.dictionary), -1, np.int64)  # listing row -> unique
            of_unique = np.full(len(enc.dictionary) + 1, -1, np.int32)
            hit = np.flatnonzero(where >= 0)
            of_unique[where[hit][::-1]] = hit[::-1].astype(np.int32)  # a URI listed twice: its first row
            mapping = np.append(of_unique[ints(enc.indices, -1, np.int64)], np.int32(-1))
            del enc, where, hit, of_unique
        else:
            mapping = np.array([-1], np.int32)
        c["u"].extend(mapping[g] for g in c["gpos"])  # -1 (a null uri) hits the appended -1
        for k in range(len(c["gpos"])):  # each row's stamp against its input's in this listing, the hash dropped
            h, u = c["hash"][k], c["u"][len(c["u"]) - len(c["gpos"]) + k]
            lh = self.listed_hash[np.maximum(u, 0)] if self.n else np.zeros(len(u), np.uint64)
            c["stamp"].append(np.where((h == 0) | (u < 0) | (lh == 0), -1, h != lh).astype(np.int8))
            c["hash"][k] = None
        c["hash"] = []
        c["gpos"], self._uri_dicts, self._uri_off, self._last_uri = [], [], 0, None

    def finish(self) -> "Ledger":
        """Map the rows added since the last call to their inputs' numbers in the listing, drop rows
        of unlisted inputs, and append them to the ledger's columns (:meth:`add` may follow again:
        the driver adds the files a run wrote instead of reading everything twice)."""
        c = self._cols
        self._map_uris()
        trim()

        def joined(k):  # consumes the parts
            parts = c[k]
            return cat_times(parts) if k == "t" else cat(parts, np.result_type(*parts) if parts else np.int8)

        new = {"u": joined("u"), "page": joined("page")}
        keep = (new["u"] >= 0) & (new["page"] != _NOPAGE)
        everything = bool(keep.all())
        for k in ("u", "page", "t", "count", "status", "err", "doc", "stamp"):
            col = new.pop(k) if k in new else joined(k)
            if not everything:
                col = col[keep]
            old = getattr(self, k, None)
            if old is not None and len(col):
                col = cat_times([old, col]) if k == "t" else cat([old, col], np.result_type(old, col))
            elif old is not None:
                col = old
            setattr(self, k, col)
            del old, col
        self._last_doc = None
        if self.facts is not None and self._analyzed is None:
            self._analyzed = (self.facts, self._rows_at_facts)
        self.facts = None
        trim()
        return self

    def drop_rows(self) -> None:
        """Free the per-row columns once the facts are computed (the documents table needs only the
        facts, the listing and the doc_ids); the ledger can no longer be analyzed."""
        for k in ("u", "page", "t", "count", "status", "err", "doc", "stamp"):
            setattr(self, k, None)
        trim()


def stamp_hash(size: np.ndarray, mtime: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (size, modification time) pair (splitmix64 finalizer of each, combined); 0 where
    either is unknown (negative). Two different pairs share a hash with probability about 2**-64."""
    def mix(x):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    with np.errstate(over="ignore"):
        h = mix(mix(size.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) ^ mtime.astype(np.uint64))
    h[h == 0] = 1
    h[(size < 0) | (mtime < 0)] = 0
    return h


def from_table(table: pa.Table, listed_uris, run_id: str | None = None, stamps=None) -> Ledger:
    book = Ledger(listed_uris, run_id, stamps)
    for b in table.to_batches(max_chunksize=1 << 20):
        book.add(b)
    return book.finish()


# ---- the outputs ------------------------------------------------------------------------------------------
def plan(book: Ledger, sizes: np.ndarray, cfg_limits: limits.InputLimits, ranges, max_pages) -> tuple[list[dict], int]:
    """(inputs to do as {"uri", "size", "mtime", "done", "doc_id"}, number of complete inputs), in listing
    order; ``book.facts.restamped`` says how many are to do only because their size or time changed."""
    f = analyze(book, ranges=ranges, max_pages=max_pages, sizes=np.asarray(sizes, np.int64), cfg_limits=cfg_limits)
    book.facts = f
    idx = sorted(f.todo_done)
    uris = book.listed.take(pa.array(idx, pa.int64())).to_pylist() if idx else []
    # the doc_id the done pages belong to: a raster task that reads other bytes parses them all again
    docs = book.doc_ids.take(np.array([f.doc[i] if f.todo_done[i] else -1 for i in idx], np.int64)).to_pylist() \
        if idx else []
    return ([{"uri": u, "size": int(sizes[i]), "mtime": int(book.listed_mtime[i]), "done": f.todo_done[i],
              "doc_id": d} for u, i, d in zip(uris, idx, docs)], f.complete)


def changed_inputs(book: Ledger, recorded: Sequence[tuple[str, str]]) -> int:
    """How many of ``recorded`` (uri, the doc_id its done pages had when the run was planned) now
    stand at another doc_id (their bytes changed, and they were parsed again): needs ``book.facts``."""
    if not recorded or book.facts is None:
        return 0
    listed = book.listed.combine_chunks() if isinstance(book.listed, pa.ChunkedArray) else book.listed
    pos = pc.index_in(pa.array([u for u, _ in recorded], pa.string()), value_set=listed.cast(pa.string()))
    pos = np.asarray(pc.fill_null(pos, -1).to_numpy(zero_copy_only=False), np.int64)
    now = book.doc_ids.take(np.where(pos >= 0, book.facts.doc[np.maximum(pos, 0)], -1)).to_pylist()
    return sum(1 for (_, was), d in zip(recorded, now) if d is not None and d != was)


def document_batches(book: Ledger, f: Facts, chunk: int = 1 << 20) -> Iterable[pa.RecordBatch]:
    """The documents table (rows.DOCUMENT_SCHEMA), one input per row in listing order, in batches."""
    from padoc_ray.output.rows import DOCUMENT_SCHEMA

    codes = book.codes
    extra = list(status.DOCUMENT_STATUSES)
    names = codes + [x for x in extra if x not in book._code_of]
    at = {s: i for i, s in enumerate(names)}
    dic = pa.array(names, pa.string())
    skipped = np.array([s in status.SKIPPED_CODES for s in codes] + [False], bool)
    for a in range(0, book.n, chunk):
        b = min(book.n, a + chunk)
        sl = slice(a, b)
        dl, derr, cnt = f.doc_level[sl], f.doc_err[sl], f.count[sl]
        n_sel, ok, failed = f.n_sel[sl], f.ok[sl], f.failed[sl]
        missing = n_sel - ok - failed
        # status.rollup, vectorized: incomplete while pages lack rows, else ok / partial / failed
        doc_st = np.where(cnt < 0, at[status.DOC_MISSING], np.where(missing > 0, at[status.DOC_INCOMPLETE], np.where(
            failed == 0, at[status.DOC_OK], np.where(ok == 0, at[status.DOC_FAILED], at[status.DOC_PARTIAL]))))
        doc_st = np.where(dl, np.where(skipped[derr], at[status.DOC_SKIPPED], derr), doc_st)
        err = np.where(dl, derr, np.where(doc_st == at[status.DOC_FAILED], f.fail_code[sl], -1))
        zero = np.where(dl | (cnt < 0), 0, 1)
        doc_ids = book.doc_ids.take(f.doc[sl])
        yield pa.RecordBatch.from_arrays([
            book.listed.slice(a, b - a).cast(pa.string()),
            doc_ids,
            pa.array(cnt, pa.int32(), mask=cnt < 0),
            pa.array(n_sel * zero, pa.int32()),
            pa.array(ok * zero, pa.int32()),
            pa.array(failed * zero, pa.int32()),
            pc.take(dic, pa.array(doc_st, pa.int32(), mask=doc_st < 0)),
            pc.take(dic, pa.array(err, pa.int32(), mask=err < 0)),
        ], schema=DOCUMENT_SCHEMA)


def documents(book: Ledger, ranges, max_pages, *, current: bool = True) -> pa.Table:
    f = book.facts if (current and book.facts is not None) else analyze(book, ranges=ranges, max_pages=max_pages,
                                                                          current=current)
    from padoc_ray.output.rows import DOCUMENT_SCHEMA

    return pa.Table.from_batches(list(document_batches(book, f)), schema=DOCUMENT_SCHEMA)


def listing_table(listed: Sequence[tuple] | pa.Table) -> pa.Table:
    """The listing as a table: ``uri``, ``size`` and ``mtime`` (ms; -1 unknown) from (uri, size[, mtime]) rows."""
    if isinstance(listed, pa.Table):
        return listed if "mtime" in listed.column_names else listed.append_column(
            "mtime", pa.array(np.full(listed.num_rows, -1, np.int64)))
    return pa.table({"uri": pa.array([r[0] for r in listed], pa.string()),
                     "size": pa.array([r[1] for r in listed], pa.int64()),
                     "mtime": pa.array([r[2] if len(r) > 2 else -1 for r in listed], pa.int64())})


def stamps(listing: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, modification times) of a :func:`listing_table`, for :class:`Ledger`."""
    return (ints(listing.column("size"), -1, np.int64), ints(listing.column("mtime"), -1, np.int64))


# ---- the same rules on a whole table (tests and small outputs; the driver streams the ledger) ------
def documents_table(pages: pa.Table, listed: Sequence[tuple[str, int]], ranges, max_pages) -> pa.Table:
    """One row per listed input, from the page rows written so far (this run and earlier ones).

    An input with a document-level row gets that error (``skipped`` for :data:`padoc_ray.status.SKIPPED_CODES`);
    otherwise the last row of each selected page counts (``ok``, else failed); ``missing`` when
    no row gives a page count, ``incomplete`` while selected pages have no row, else ``ok``,
    ``failed`` (with the most common page code; ties: the first in name order) or ``partial``.
    ``doc_id`` and ``page_count`` come from the first row that has one. Vectorized
    (the ledger below)."""
    lt = listing_table(listed)
    book = from_table(pages, lt.column("uri"))
    return documents(book, ranges, max_pages, current=False)


def current_rows(table: pa.Table) -> pa.Table:
    """The rows that say where each input stands now (``table`` needs ``source_uri``,
    ``page_index`` and ``processed_at``; with ``doc_id``, versions are told apart).

    ``pages/`` only grows: a rerun that tries a document again (after ``read_failed``,
    ``missing_file``, a refusal or cap that no longer applies) adds rows next to the old ones. For
    each input only the rows of its newest version count (the doc_id of its newest row that has
    one: a file whose bytes changed is parsed again in full, and its old rows stay in the files but
    are never current); of those, the newest document-level row wins when it is newer than all its
    page rows, otherwise its page rows do, the newest row per page."""
    if table.num_rows == 0:
        return table
    uri = pc.dictionary_encode(table.column("source_uri").combine_chunks(), null_encoding="encode")
    u = np.asarray(uri.indices.to_numpy(zero_copy_only=False), np.int64)
    page = ints(table.column("page_index"), -1, np.int32)
    t = ints(pc.cast(table.column("processed_at"), pa.int64()), -1, np.int64)
    doc = None
    if "doc_id" in table.column_names:
        d = pc.dictionary_encode(table.column("doc_id").combine_chunks())
        doc = np.asarray(pc.fill_null(d.indices, -1).to_numpy(zero_copy_only=False), np.int64)
        # an empty doc_id is no doc_id (as in the ledger)
        empty = [i for i, v in enumerate(d.dictionary.to_pylist()) if not v]
        if empty:
            doc[np.isin(doc, empty)] = -1
    return table.filter(pa.array(current_mask(u, page, t, doc)))
