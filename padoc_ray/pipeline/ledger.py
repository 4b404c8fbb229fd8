"""What ``pages/`` says about each input, computed in columns: the driver's bookkeeping at scale.

The driver reads every page row back to plan a run (what is complete, which pages to resume) and
to build the documents table. Held as Python dicts, 10M rows took a minute and 8 GB; here rows
are reduced as they are read to a few integer columns per row (input number in the listing, page,
time, page count, status and error codes, doc_id number), strings stay in small per-batch Arrow
dictionaries, and the decisions are sorts and segment reductions over those columns, a bounded
number of rows at a time. :func:`analyze` gives both the plan and the documents table; the rules
are those of :func:`padoc_ray.pipeline.rows.current_rows`, :func:`~padoc_ray.pipeline.rows.documents_table`
and :func:`padoc_ray.pipeline.job.plan`, which use the same code on in-memory tables.

Knows nothing of where files live (the caller feeds record batches). Pure: pyarrow and numpy only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padoc_ray.pipeline import limits

#: the columns the driver reads (strings as dictionaries)
COLUMNS = ["source_uri", "page_index", "processed_at", "page_count", "status", "error_code", "doc_id", "run_id",
           "output_tokens"]
DICT_COLUMNS = ["source_uri", "status", "error_code", "doc_id", "run_id"]
#: rows sorted at once (bounds the sort's temporary memory; inputs are never split)
PART_ROWS = 4_000_000
#: map rows to input numbers whenever this many URI dictionary entries are pending (bounds memory)
MAP_EVERY = 2_000_000
_BIG = np.iinfo(np.int64).max
_NOPAGE = np.iinfo(np.int32).min  # a row without page_index: ignored


class Ledger:
    """Rows of ``pages/`` reduced to integer columns, keyed by the inputs of one listing.

    Feed it record batches (:meth:`add`), then :meth:`finish`. Rows whose ``source_uri`` is not
    listed are dropped (neither the plan nor the documents table looks at them) but still count
    in the summary of ``run_id``'s rows."""

    def __init__(self, listed_uris, run_id: str | None = None):
        if isinstance(listed_uris, pa.ChunkedArray):  # one chunk: no copy
            listed_uris = listed_uris.chunk(0) if listed_uris.num_chunks == 1 else listed_uris.combine_chunks()
        self.listed = listed_uris
        self.n = len(self.listed)
        self.run_id = run_id
        self.codes: list[str] = []  # status and error strings
        self._code_of: dict[str, int] = {}
        self._uri_dicts: list[pa.Array] = []
        self._doc_dicts: list[pa.Array] = []
        self._uri_off = self._doc_off = 0
        self._last_uri = self._last_doc = None  # (dictionary identity, its offset)
        self._cols: dict[str, list] = {k: [] for k in ("gpos", "u", "page", "t", "count", "status", "err", "doc")}
        self.rows_read = 0
        self.footers_read = 0
        self.run_rows = self.run_pages = self.run_tokens = 0
        self.run_status: Counter = Counter()
        self.facts = None

    # ---- reading -------------------------------------------------------------------------------------------
    def _code(self, s: str) -> int:
        c = self._code_of.get(s)
        if c is None:
            c = self._code_of[s] = len(self.codes)
            self.codes.append(s)
        return c

    def _lut(self, col) -> np.ndarray:
        """Codes of a small string column (status, error_code): -1 for null."""
        d = _dict(col)
        lut = np.array([self._code(s) for s in d.dictionary.to_pylist()] + [-1], dtype=np.int32)
        if len(self.codes) > 32000:
            raise ValueError(f"more than 32000 distinct status / error codes in pages/ ({len(self.codes)})")
        return lut.astype(np.int16)[_indices(d)]

    def _positions(self, col, which: str) -> np.ndarray:
        """Global positions of a big string column's values (uri, doc_id) in the kept dictionaries;
        -1 for null (and, for doc_id, the empty string)."""
        d = _dict(col)
        dic = d.dictionary
        last = self._last_uri if which == "uri" else self._last_doc
        if last is not None and _same_buffers(last[0], dic):  # batches of one row group share its dictionary
            off = last[1]
        else:
            off = self._uri_off if which == "uri" else self._doc_off
            store = dic if dic.type == pa.string() else pc.cast(dic, pa.string())
            if which == "uri":
                self._uri_dicts.append(store)
                self._uri_off += len(dic)
                self._last_uri = (dic, off)  # kept alive: its buffers cannot be reused
            else:
                self._doc_dicts.append(store)
                self._doc_off += len(dic)
                self._last_doc = (dic, off)
        total = self._uri_off if which == "uri" else self._doc_off
        lut = off + np.arange(len(dic) + 1, dtype=np.int32 if total < 2**31 - 1 else np.int64)
        lut[-1] = -1
        if which == "doc":
            lut[:-1][pc.equal(pc.utf8_length(dic), 0).to_numpy(zero_copy_only=False)] = -1
        return lut[_indices(d)]

    def add(self, batch) -> None:
        """One record batch (or table) with :data:`COLUMNS` (missing columns count as nulls)."""
        n = batch.num_rows
        if n == 0:
            return
        names = set(batch.schema.names)

        def col(name, typ):
            return batch.column(name) if name in names else pa.nulls(n, typ)

        self.rows_read += n
        status = self._lut(col("status", pa.string()))
        page = _ints(col("page_index", pa.int32()), _NOPAGE, np.int32)
        if self.run_id is not None:
            mine = _equals(col("run_id", pa.string()), self.run_id)
            if mine.any():
                real = mine & (page >= 0)
                self.run_rows += int(mine.sum())
                self.run_pages += int(real.sum())
                for code, k in Counter(status[real].tolist()).items():
                    self.run_status[self.codes[code] if code >= 0 else None] += k
                self.run_tokens += int(_ints(col("output_tokens", pa.int32()), 0, np.int64)[mine].sum())
        c = self._cols
        c["gpos"].append(self._positions(col("source_uri", pa.string()), "uri"))
        if self._uri_off > MAP_EVERY:
            self._map_uris()
        c["page"].append(_small(page))
        c["t"].append(_ints(pc.cast(col("processed_at", pa.timestamp("ms", tz="UTC")), pa.int64()), -1, np.int64))
        c["count"].append(_small(_ints(col("page_count", pa.int32()), -1, np.int32)))
        c["status"].append(_small(status))
        c["err"].append(_small(self._lut(col("error_code", pa.string()))))
        c["doc"].append(self._positions(col("doc_id", pa.string()), "doc"))

    def _map_uris(self) -> None:
        """Turn the pending rows' dictionary positions into input numbers (and drop the dictionaries)."""
        c = self._cols
        if self._uri_dicts and self.n:
            # hash the pending URIs (a few million), not the listing: look each listed URI up in them
            enc = pc.dictionary_encode(pa.chunked_array(self._uri_dicts, pa.string()).combine_chunks())
            listed = self.listed if self.listed.type == pa.string() else pc.cast(self.listed, pa.string())
            where = _ints(pc.index_in(listed, value_set=enc.dictionary), -1, np.int64)  # listing row -> unique
            of_unique = np.full(len(enc.dictionary) + 1, -1, np.int32)
            hit = np.flatnonzero(where >= 0)
            of_unique[where[hit][::-1]] = hit[::-1].astype(np.int32)  # a URI listed twice: its first row
            mapping = np.append(of_unique[_ints(enc.indices, -1, np.int64)], np.int32(-1))
            del enc, where, hit, of_unique
        else:
            mapping = np.array([-1], np.int32)
        c["u"].extend(mapping[g] for g in c["gpos"])  # -1 (a null uri) hits the appended -1
        c["gpos"], self._uri_dicts, self._uri_off, self._last_uri = [], [], 0, None

    def finish(self) -> "Ledger":
        """Map the rows added since the last call to their inputs' numbers in the listing, drop rows
        of unlisted inputs, and append them to the ledger's columns (:meth:`add` may follow again:
        the driver adds the files a run wrote instead of reading everything twice)."""
        c = self._cols
        self._map_uris()
        _trim()
        new = {}
        for k in ("u", "page", "t", "count", "status", "err", "doc"):
            parts, c[k] = c[k], []
            new[k] = _cat(parts, np.int64 if k == "t" else np.result_type(*parts) if parts else np.int32)
            del parts
        keep = (new["u"] >= 0) & (new["page"] != _NOPAGE)
        for k in ("u", "page", "t", "count", "status", "err", "doc"):
            col = new.pop(k)
            if not keep.all():
                col = col[keep]
            old = getattr(self, k, None)
            setattr(self, k, col if old is None else np.concatenate([old, col.astype(np.result_type(old, col))]))
            del old, col
        self.doc_ids = pa.chunked_array(self._doc_dicts, pa.string())  # taken from by global position
        self.facts = None
        _trim()
        return self


def from_table(table: pa.Table, listed_uris, run_id: str | None = None) -> Ledger:
    book = Ledger(listed_uris, run_id)
    for b in table.to_batches(max_chunksize=1 << 20):
        book.add(b)
    return book.finish()


# ---- helpers over columns ------------------------------------------------------------------------------------
def _small(a: np.ndarray) -> np.ndarray:
    """``a`` in the smallest of int8/int16/int32 that holds its values (most pages, counts and codes
    are small; the ledger holds one value a row)."""
    if len(a) == 0:
        return a
    lo, hi = int(a.min()), int(a.max())
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t, copy=False)
    return a


def _trim() -> None:
    """Give freed memory back to the system (glibc and Arrow's allocator keep freed blocks, which
    would count in the driver's RSS as if still used)."""
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages too
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _dict(col):
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    return col


def _same_buffers(a: pa.Array, b: pa.Array) -> bool:
    return len(a) == len(b) and a.offset == b.offset and all(
        (x is None and y is None) or (x is not None and y is not None and x.address == y.address)
        for x, y in zip(a.buffers(), b.buffers()))


def _indices(d) -> np.ndarray:
    """A dictionary array's indices, null as -1 (which the lookup tables map to their last entry)."""
    return _ints(d.indices, -1, np.int64)


def _ints(col, null, dtype) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        col = pc.fill_null(col, null)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=dtype)


def _equals(col, value: str) -> np.ndarray:
    d = _dict(col)
    hit = np.append(np.array([v == value for v in d.dictionary.to_pylist()], bool), False)
    return hit[_indices(d)]


def _cat(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _seg_starts(*keys) -> np.ndarray:
    """Start positions of runs of equal keys (sorted arrays)."""
    n = len(keys[0])
    new = np.zeros(n, bool)
    if n:
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(new)


def _first_per_u(us: np.ndarray, vals: np.ndarray, out: np.ndarray) -> None:
    """``out[u] = min(vals)`` over each run of equal ``us`` (sorted)."""
    if len(us):
        s = _seg_starts(us)
        out[us[s]] = np.minimum.reduceat(vals, s)


# ---- the decisions --------------------------------------------------------------------------------------------
@dataclass
class Facts:
    """Per listed input (arrays of length n): what its current rows say."""

    doc_level: np.ndarray  # its verdict is a document-level row
    doc_err: np.ndarray  # that row's error code (-1 null)
    doc_count: np.ndarray  # that row's page_count (-1 null)
    count: np.ndarray  # first non-null page_count of its rows (-1 null)
    doc: np.ndarray  # position of its first non-empty doc_id (-1 none)
    n_sel: np.ndarray  # pages the configuration selects (0 when count is null)
    ok: np.ndarray  # selected pages whose row says ok
    failed: np.ndarray  # selected pages with another status
    fail_code: np.ndarray  # for failed documents: the most common page code (-1 otherwise)
    todo_done: dict  # input -> pages with a row, for inputs that are not complete (plan only)
    present: np.ndarray  # selected pages with a row
    complete: int = 0  # inputs complete (plan only)


def _n_selected(count: np.ndarray, ranges, max_pages) -> np.ndarray:
    """len(rows.select_pages(count, ranges, max_pages)) per input; 0 for a null count."""
    c = np.maximum(count.astype(np.int64), 0)
    if ranges is None:
        n = c
    else:
        r = np.unique(np.asarray(list(ranges), np.int64))
        n = np.searchsorted(r, c, side="left") - np.searchsorted(r, 0, side="left")
    if max_pages is not None:
        n = np.minimum(n, max_pages)
    return n


def _rank(page: np.ndarray, ranges) -> np.ndarray:
    """Each page's position in the selection order (-1: never selected)."""
    if ranges is None:
        return np.where(page >= 0, page, -1).astype(np.int64)
    r = np.unique(np.asarray(list(ranges), np.int64))
    if len(r) == 0:
        return np.full(len(page), -1, np.int64)
    i = np.searchsorted(r, page)
    hit = (i < len(r)) & (r[np.minimum(i, len(r) - 1)] == page) & (page >= 0)
    return np.where(hit, i - np.searchsorted(r, 0), -1)


def current_mask(u: np.ndarray, page: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Rows that say where each input stands now (rules of rows.current_rows); u: small ints."""
    mask = np.zeros(len(u), bool)
    if len(u):
        pos, order = _pick(u, page, t, current=True)
        mask[order[pos]] = True
    return mask


def _pick(u, page, t, *, current: bool):
    """(rows in the table, sorted by input and page; the sort order). current: the newest row per
    (input, page) (ties: the later row), and per input either its document-level rows (when
    newer than all its page rows) or its page rows; else the last row per (input, page)."""
    lo = int(page.min()) if len(page) else 0
    span = int(page.max()) - lo + 1 if len(page) else 1
    order = np.argsort(u.astype(np.int64) * span + (page.astype(np.int64) - lo), kind="stable")
    us, ps = u[order], page[order]
    starts = _seg_starts(us, ps)
    n = len(order)
    idx = np.arange(n)
    if current:
        ts = t[order]
        tmax = np.maximum.reduceat(ts, starts)
        gid = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
        chosen = np.maximum.reduceat(np.where(ts == tmax[gid], idx, -1), starts)
        del ts, gid
    else:
        chosen = np.append(starts[1:], n) - 1
    if not current:
        return chosen, order
    ustarts = _seg_starts(us)
    lowest = np.iinfo(np.int64).min
    tt = t[order]
    doc_t = np.maximum.reduceat(np.where(ps < 0, tt, lowest), ustarts)
    page_t = np.maximum.reduceat(np.where(ps >= 0, tt, lowest), ustarts)
    has_doc = np.logical_or.reduceat(ps < 0, ustarts)
    has_page = np.logical_or.reduceat(ps >= 0, ustarts)
    doc_wins = has_doc & (~has_page | (doc_t > page_t))
    ugid = np.searchsorted(ustarts, chosen, side="right") - 1
    keep = (ps[chosen] < 0) == doc_wins[ugid]
    return chosen[keep], order


def analyze(book: Ledger, *, ranges=None, max_pages=None, current: bool = True, sizes=None,
            cfg_limits: limits.InputLimits | None = None) -> Facts:
    """Per input facts for the documents table and (with ``sizes``) the plan, partition by partition."""
    n = book.n
    f = Facts(doc_level=np.zeros(n, bool), doc_err=np.full(n, -1, np.int16), doc_count=np.full(n, -1, np.int32),
              count=np.full(n, -1, np.int32), doc=np.full(n, -1, np.int64), n_sel=np.zeros(n, np.int32),
              ok=np.zeros(n, np.int32), failed=np.zeros(n, np.int32), fail_code=np.full(n, -1, np.int16),
              todo_done={}, present=np.zeros(n, np.int32))
    for lo, hi, rows in _partitions(book.u, n):
        _partition(book, f, f.present, lo, hi, rows, ranges, max_pages, current, sizes, cfg_limits)
        _trim()
    return f


def _partitions(u: np.ndarray, n: int):
    """(lo, hi, row indices or None for all) covering inputs [0, n) with about PART_ROWS rows each."""
    if len(u) <= PART_ROWS:
        yield 0, n, None
        return
    cum = np.cumsum(np.bincount(u, minlength=n))
    cuts = np.searchsorted(cum, np.arange(PART_ROWS, cum[-1], PART_ROWS), side="left")
    bounds = [0, *sorted({int(c) + 1 for c in cuts if 0 < int(c) + 1 < n}), n]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        yield lo, hi, np.flatnonzero((u >= lo) & (u < hi))


def _partition(book, f: Facts, present, lo, hi, rows, ranges, max_pages, current, sizes, cfg_limits) -> None:
    def g(a):
        return a if rows is None else a[rows]

    u, page = g(book.u), g(book.page)
    if len(u) == 0 and sizes is None:
        return
    t = g(book.t) if current else None
    chosen, order = _pick(u, page, t, current=current) if len(u) else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    del t
    count, status, err, doc = g(book.count), g(book.status), g(book.err), g(book.doc)
    # rows of the table (current: the current rows; else all rows), sorted by input and page
    table_pos = chosen if current else np.arange(len(order))
    rows_t = order[table_pos]  # row numbers (row order within an input = ascending)
    ut, pt = u[rows_t], page[rows_t]
    is_doc = pt < 0
    ul = ut - lo  # inputs of this partition, from 0
    first = np.full(hi - lo, _BIG, np.int64)
    _first_per_u(ul, np.where(is_doc, rows_t, _BIG), first)
    has = first < _BIG
    f.doc_level[lo:hi] = has
    f.doc_err[lo:hi][has] = err[first[has]]
    f.doc_count[lo:hi][has] = count[first[has]]
    first[:] = _BIG
    _first_per_u(ul, np.where(count[rows_t] >= 0, rows_t, _BIG), first)
    has = first < _BIG
    f.count[lo:hi][has] = count[first[has]]
    first[:] = _BIG
    _first_per_u(ul, np.where(doc[rows_t] >= 0, rows_t, _BIG), first)
    has = first < _BIG
    f.doc[lo:hi][has] = doc[first[has]]
    del first, ul
    # picked page rows: current rows of page-level inputs, or the last row per (input, page)
    pick = chosen[page[order[chosen]] >= 0]
    prow = order[pick]
    pu, pp = u[prow], page[prow]
    f.n_sel[lo:hi] = _n_selected(f.count[lo:hi], ranges, max_pages)
    rank = _rank(pp, ranges)
    selected = (rank >= 0) & (f.count[pu] >= 0) & (pp < f.count[pu]) & (rank < f.n_sel[pu])
    okc = book._code_of.get("ok", -2)
    st = status[prow]
    good = selected & (st == okc)
    bad = selected & (st != okc)
    f.ok[lo:hi] = np.bincount(pu[good] - lo, minlength=hi - lo)
    f.failed[lo:hi] = np.bincount(pu[bad] - lo, minlength=hi - lo)
    present[lo:hi] = np.bincount(pu[selected] - lo, minlength=hi - lo)
    failed_doc = (~f.doc_level[lo:hi]) & (f.count[lo:hi] >= 0) & (f.ok[lo:hi] == 0) & (f.failed[lo:hi] > 0) \
        & (f.ok[lo:hi] + f.failed[lo:hi] == f.n_sel[lo:hi])
    if failed_doc.any():
        _fail_codes(book, f, lo, failed_doc, pu, bad, err[prow], st)
    if sizes is not None:
        _plan_part(book, f, present, lo, hi, sizes, cfg_limits, ranges, max_pages, pu, pp)


def _fail_codes(book, f, lo, failed_doc, pu, bad, perr, pst) -> None:
    """The most common page code of each failed document (ties: the first in name order)."""
    empty = book._code_of.get("")
    code = np.where((perr >= 0) & (perr != (empty if empty is not None else -3)), perr, pst)
    m = bad & failed_doc[pu - lo]
    cu, cc = pu[m].astype(np.int64), code[m].astype(np.int64)
    names = sorted(range(len(book.codes)), key=lambda i: book.codes[i])
    rank_of = np.empty(len(book.codes) + 1, np.int64)
    rank_of[np.array(names, np.int64)] = np.arange(len(names))
    rank_of[-1] = len(names)  # a null code last
    key, counts = np.unique(cu * (len(names) + 1) + rank_of[cc], return_counts=True)
    ku, kr = key // (len(names) + 1), key % (len(names) + 1)
    o = np.lexsort((kr, -counts, ku))
    starts = _seg_starts(ku[o])
    best = o[starts]
    inv = np.append(np.array(names, np.int64), -1)
    f.fail_code[ku[best]] = inv[kr[best]]


def _plan_part(book, f, present, lo, hi, sizes, cfg_limits, ranges, max_pages, pu, pp) -> None:
    """Which inputs of [lo, hi) are complete; the pages done of the others (rules of job.plan)."""
    s = sizes[lo:hi]
    code_of = book._code_of
    lim = cfg_limits
    # the listing's refusal of each input (limits.listing_refusal): 0 none, else 1 + its index in `refusals`
    refusals = (limits.MISSING_FILE, limits.DISALLOWED_URI, limits.FILE_TOO_LARGE)
    refusal = np.zeros(hi - lo, np.int8)
    refusal[s < 0] = 1
    refusal[s == -2] = 2
    if lim.max_file_bytes is not None:
        refusal[(s >= 0) & (s > lim.max_file_bytes)] = 3
    dl = f.doc_level[lo:hi]
    derr = f.doc_err[lo:hi]
    refused = refusal > 0
    complete = np.zeros(hi - lo, bool)
    for i, code in enumerate(refusals, 1):
        if code in code_of:
            complete |= (refusal == i) & dl & (derr == code_of[code])
    # a document-level verdict stands unless a rerun can change it (limits.retried)
    dcount = f.doc_count[lo:hi]
    n_sel_doc = _n_selected(dcount, ranges, max_pages)
    retried = np.zeros(hi - lo, bool)
    for code in limits.RETRIED_CODES:
        if code in code_of:
            retried |= derr == code_of[code]
    if limits.TOO_MANY_PAGES in code_of:
        cap = lim.max_doc_pages
        retried |= (derr == code_of[limits.TOO_MANY_PAGES]) & (dcount >= 0) & (
            True if cap is None else n_sel_doc <= cap)
    if limits.TOO_MANY_FRAMES in code_of:
        retried |= (derr == code_of[limits.TOO_MANY_FRAMES]) & (dcount >= 0) & (dcount <= lim.max_image_frames)
    doc_final = ~refused & dl & ~retried
    pagewise = ~refused & ~dl & (f.count[lo:hi] >= 0) & (present[lo:hi] == f.n_sel[lo:hi])
    complete |= doc_final | pagewise
    f.complete += int(complete.sum())
    todo = np.flatnonzero(~complete) + lo
    # pages already done (inputs with page rows as their verdict)
    want = np.zeros(hi - lo, bool)
    want[todo - lo] = ~refused[todo - lo] & ~dl[todo - lo]
    m = ~f.doc_level[pu] & want[pu - lo]
    du, dp = pu[m], pp[m]
    done: dict[int, list] = {}
    if len(du):
        starts = _seg_starts(du)
        for a, b in zip(starts, np.append(starts[1:], len(du))):
            done[int(du[a])] = np.unique(dp[a:b]).tolist()
    for i in todo.tolist():
        f.todo_done[i] = done.get(i, [])


# ---- the outputs ------------------------------------------------------------------------------------------
def plan(book: Ledger, sizes: np.ndarray, cfg_limits: limits.InputLimits, ranges, max_pages) -> tuple[list[dict], int]:
    """(inputs to do as {"uri", "size", "done"}, number of complete inputs), in listing order."""
    f = analyze(book, ranges=ranges, max_pages=max_pages, sizes=np.asarray(sizes, np.int64), cfg_limits=cfg_limits)
    book.facts = f
    idx = sorted(f.todo_done)
    uris = book.listed.take(pa.array(idx, pa.int64())).to_pylist() if idx else []
    return ([{"uri": u, "size": int(sizes[i]), "done": f.todo_done[i]} for u, i in zip(uris, idx)],
            f.complete)


def document_batches(book: Ledger, f: Facts, chunk: int = 1 << 20) -> Iterable[pa.RecordBatch]:
    """The documents table (rows.DOCUMENT_SCHEMA), one input per row in listing order, in batches."""
    from padoc_ray.pipeline.rows import DOCUMENT_SCHEMA, SKIPPED_CODES

    codes = book.codes
    extra = ["ok", "partial", "failed", "incomplete", "missing", "skipped"]
    names = codes + [x for x in extra if x not in book._code_of]
    at = {s: i for i, s in enumerate(names)}
    dic = pa.array(names, pa.string())
    skipped = np.array([s in SKIPPED_CODES for s in codes] + [False], bool)
    for a in range(0, book.n, chunk):
        b = min(book.n, a + chunk)
        sl = slice(a, b)
        dl, derr, cnt = f.doc_level[sl], f.doc_err[sl], f.count[sl]
        n_sel, ok, failed = f.n_sel[sl], f.ok[sl], f.failed[sl]
        missing = n_sel - ok - failed
        status = np.where(cnt < 0, at["missing"], np.where(missing > 0, at["incomplete"], np.where(
            failed == 0, at["ok"], np.where(ok == 0, at["failed"], at["partial"]))))
        status = np.where(dl, np.where(skipped[derr], at["skipped"], derr), status)
        err = np.where(dl, derr, np.where(status == at["failed"], f.fail_code[sl], -1))
        zero = np.where(dl | (cnt < 0), 0, 1)
        docpos = f.doc[sl]
        doc_ids = book.doc_ids.take(pa.array(np.where(docpos >= 0, docpos, 0), mask=docpos < 0)).combine_chunks() \
            if len(book.doc_ids) else pa.nulls(b - a, pa.string())
        yield pa.RecordBatch.from_arrays([
            book.listed.slice(a, b - a).cast(pa.string()),
            doc_ids.cast(pa.string()),
            pa.array(cnt, pa.int32(), mask=cnt < 0),
            pa.array(n_sel * zero, pa.int32()),
            pa.array(ok * zero, pa.int32()),
            pa.array(failed * zero, pa.int32()),
            pc.take(dic, pa.array(status, pa.int32(), mask=status < 0)),
            pc.take(dic, pa.array(err, pa.int32(), mask=err < 0)),
        ], schema=DOCUMENT_SCHEMA)


def documents(book: Ledger, ranges, max_pages, *, current: bool = True) -> pa.Table:
    f = book.facts if (current and book.facts is not None) else analyze(book, ranges=ranges, max_pages=max_pages,
                                                                          current=current)
    from padoc_ray.pipeline.rows import DOCUMENT_SCHEMA

    return pa.Table.from_batches(list(document_batches(book, f)), schema=DOCUMENT_SCHEMA)


def listing_table(listed: Sequence[tuple[str, int]] | pa.Table) -> pa.Table:
    if isinstance(listed, pa.Table):
        return listed
    return pa.table({"uri": pa.array([u for u, _ in listed], pa.string()),
                     "size": pa.array([s for _, s in listed], pa.int64())})
