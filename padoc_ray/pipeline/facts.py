"""The decisions over a ledger's columns (:class:`~padoc_ray.pipeline.ledger.Ledger`): which rows say where
each input stands now, and per input what the documents table and the plan need (:class:`Facts`), sorted
and reduced a partition of about :data:`PART_ROWS` rows at a time. The rules are those of
:func:`~padoc_ray.pipeline.ledger.current_rows` and :func:`~padoc_ray.pipeline.job.plan`: for each input
only its newest version counts (its doc_id), the newest row per page wins, a newer document-level row wins
over page rows, and an input listed with another size or time than its newest rows is read again.

Pure: numpy only (and the status and limits vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from padoc_ray import status
from padoc_ray.pipeline import limits
from padoc_ray.pipeline.columns import first_per_u, n_selected, seg_starts, selection_rank, small, trim

#: rows sorted at once (bounds the sort's temporary memory; inputs are never split)
PART_ROWS = 4_000_000
_BIG = np.iinfo(np.int64).max


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
    restamped: int = 0  # inputs that would be complete but whose newest rows have another size or time (plan only)


def current_mask(u: np.ndarray, page: np.ndarray, t: np.ndarray, doc: np.ndarray | None = None) -> np.ndarray:
    """Rows that say where each input stands now (rules of current_rows below); u: small ints,
    doc: a key per row, equal exactly when the rows' doc_ids are (-1: none)."""
    mask = np.zeros(len(u), bool)
    if len(u):
        pos, order = _pick(u, page, t, current=True, doc=doc)
        mask[order[pos]] = True
    return mask


def _stale(us: np.ndarray, ts: np.ndarray, ds: np.ndarray, ustarts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rows (in sorted order; ``order``: their rows in the table) of an older version of their input: a
    doc_id other than the one of the input's newest row that has a doc_id (ties: the later row in the
    table). Rows without a doc_id are never stale."""
    lowest = np.iinfo(np.int64).min
    n = len(us)
    ugid = np.repeat(np.arange(len(ustarts)), np.diff(np.append(ustarts, n)))
    has = ds != -1
    key = np.where(has, ts.astype(np.int64), lowest)
    newest = np.maximum.reduceat(key, ustarts)
    where = np.empty(len(order), np.int64)
    where[order] = np.arange(n)  # a table row's place in the sorted order
    last = np.maximum.reduceat(np.where(has & (key == newest[ugid]), order, -1), ustarts)
    latest = np.where(last >= 0, ds[where[np.maximum(last, 0)]], -1)
    return has & (ds != latest[ugid])


def _pick(u, page, t, *, current: bool, doc=None):
    """(rows in the table, sorted by input and page; the sort order). current: the newest row per
    (input, page) (ties: the later row), and per input either its document-level rows (when
    newer than all its page rows) or its page rows; rows of an older version of the input (another
    doc_id than its newest, see :func:`_stale`) are never current. Else the last row per (input, page)."""
    lo = int(page.min()) if len(page) else 0
    span = int(page.max()) - lo + 1 if len(page) else 1
    order = np.argsort(u.astype(np.int64) * span + (page.astype(np.int64) - lo), kind="stable")
    us, ps = u[order], page[order]
    starts = seg_starts(us, ps)
    n = len(order)
    idx = np.arange(n)
    if not current:
        return np.append(starts[1:], n) - 1, order
    lowest = np.iinfo(np.int64).min
    ustarts = seg_starts(us)
    tt = t[order]
    live = ~_stale(us, tt, doc[order], ustarts, order) if doc is not None else np.ones(n, bool)
    tmax = np.maximum.reduceat(np.where(live, tt, np.iinfo(tt.dtype).min), starts)  # the dtype's null time
    gid = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    chosen = np.maximum.reduceat(np.where(live & (tt == tmax[gid]), idx, -1), starts)
    del gid
    chosen = chosen[chosen >= 0]  # a page only an older version has: not current (to do again)
    # in int64: an int32 array with the int64 lowest would wrap it to 0 (numpy 2 keeps the array's dtype), and
    # a doc row would lose to pages written before the first time read (negative offsets)
    tt = tt.astype(np.int64)
    doc_t = np.maximum.reduceat(np.where((ps < 0) & live, tt, lowest), ustarts)
    page_t = np.maximum.reduceat(np.where((ps >= 0) & live, tt, lowest), ustarts)
    has_doc = np.logical_or.reduceat((ps < 0) & live, ustarts)
    has_page = np.logical_or.reduceat((ps >= 0) & live, ustarts)
    doc_wins = has_doc & (~has_page | (doc_t > page_t))
    ugid = np.searchsorted(ustarts, chosen, side="right") - 1
    keep = (ps[chosen] < 0) == doc_wins[ugid]
    return chosen[keep], order


def analyze(book, *, ranges=None, max_pages=None, current: bool = True, sizes=None,
            cfg_limits: limits.InputLimits | None = None) -> Facts:
    """Per input facts for the documents table and (with ``sizes``) the plan, partition by partition."""
    n = book.n
    f = Facts(doc_level=np.zeros(n, bool), doc_err=np.full(n, -1, np.int16), doc_count=np.full(n, -1, np.int32),
              count=np.full(n, -1, np.int32), doc=np.full(n, -1, np.int64), n_sel=np.zeros(n, np.int32),
              ok=np.zeros(n, np.int32), failed=np.zeros(n, np.int32), fail_code=np.full(n, -1, np.int16),
              todo_done={}, present=np.zeros(n, np.int32))
    for lo, hi, rows in _partitions(book.u, n):
        _partition(book, f, f.present, lo, hi, rows, ranges, max_pages, current, sizes, cfg_limits)
        trim()
    if current and hasattr(book, "_analyzed"):  # a Ledger (not a _Subset of one)
        book._rows_at_facts, book._analyzed = len(book.u), None
    return f


_FACT_FIELDS = ("doc_level", "doc_err", "doc_count", "count", "doc", "n_sel", "ok", "failed", "fail_code", "present")


class _Subset:
    """The rows of some inputs of a ledger, those inputs numbered from 0 (what :func:`analyze` reads)."""

    def __init__(self, book, inputs: np.ndarray):
        at = np.full(book.n, -1, np.int64)
        at[inputs] = np.arange(len(inputs))
        mine = at[book.u]
        rows = np.flatnonzero(mine >= 0)
        self.n, self.u = len(inputs), small(mine[rows])
        for k in ("page", "t", "count", "status", "err", "doc"):
            setattr(self, k, getattr(book, k)[rows])
        self.stamp, self.doc_ids, self.codes, self._code_of = None, book.doc_ids, book.codes, book._code_of


def refresh(book, *, ranges=None, max_pages=None) -> Facts:
    """The documents table's facts after rows were added (:meth:`Ledger.finish`) to a ledger analyzed
    before (the driver's plan): only the inputs the added rows are of are analyzed again, the others keep
    their facts (their rows did not change). Without an earlier analysis: :func:`analyze`."""
    if book._analyzed is None:
        return book.facts if book.facts is not None else analyze(book, ranges=ranges, max_pages=max_pages)
    f, done = book._analyzed
    touched = np.unique(book.u[done:]) if len(book.u) > done else np.zeros(0, np.int64)
    if len(touched):
        g = analyze(_Subset(book, touched), ranges=ranges, max_pages=max_pages)
        for k in _FACT_FIELDS:
            getattr(f, k)[touched] = getattr(g, k)
    book._rows_at_facts, book._analyzed = len(book.u), None
    return f


def _partitions(u: np.ndarray, n: int):
    """(lo, hi, row indices or None for all) covering inputs [0, n) with about PART_ROWS rows each."""
    if len(u) <= PART_ROWS:
        yield 0, n, None
        return
    cum = np.cumsum(np.bincount(u, minlength=n))
    cuts = np.searchsorted(cum, np.arange(PART_ROWS, cum[-1], PART_ROWS), side="left")
    bounds = [0, *sorted({int(c) + 1 for c in cuts if 0 < int(c) + 1 < n}), n]
    step = 1 << 24  # rows compared at once (the masks of all rows would be temporaries of 3 bytes a row)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        yield lo, hi, np.concatenate([a + np.flatnonzero((u[a:a + step] >= lo) & (u[a:a + step] < hi))
                                      for a in range(0, len(u), step)])


def _partition(book, f: Facts, present, lo, hi, rows, ranges, max_pages, current, sizes, cfg_limits) -> None:
    def g(a):
        return a if rows is None else a[rows]

    u, page = g(book.u), g(book.page)
    if len(u) == 0 and sizes is None:
        return
    t = g(book.t) if current else None
    stamp = g(book.stamp) if sizes is not None else None
    count, st_codes, err, doc = g(book.count), g(book.status), g(book.err), g(book.doc)
    versions = book.doc_ids.fingerprint(doc) if current else None  # equal exactly when the doc_ids are
    chosen, order = _pick(u, page, t, current=current, doc=versions) if len(u) else (np.zeros(0, np.int64),
                                                                                     np.zeros(0, np.int64))
    del versions
    changed = _restamped(u, t, stamp, order, lo, hi) if stamp is not None and len(u) else np.zeros(hi - lo, bool)
    del t, stamp
    # rows of the table (current: the current rows; else all rows), sorted by input and page
    table_pos = chosen if current else np.arange(len(order))
    rows_t = order[table_pos]  # row numbers (row order within an input = ascending)
    ut, pt = u[rows_t], page[rows_t]
    is_doc = pt < 0
    ul = ut - lo  # inputs of this partition, from 0
    first = np.full(hi - lo, _BIG, np.int64)
    first_per_u(ul, np.where(is_doc, rows_t, _BIG), first)
    has = first < _BIG
    f.doc_level[lo:hi] = has
    f.doc_err[lo:hi][has] = err[first[has]]
    f.doc_count[lo:hi][has] = count[first[has]]
    first[:] = _BIG
    first_per_u(ul, np.where(count[rows_t] >= 0, rows_t, _BIG), first)
    has = first < _BIG
    f.count[lo:hi][has] = count[first[has]]
    first[:] = _BIG
    first_per_u(ul, np.where(doc[rows_t] != -1, rows_t, _BIG), first)
    has = first < _BIG
    f.doc[lo:hi][has] = doc[first[has]]
    del first, ul
    # picked page rows: current rows of page-level inputs, or the last row per (input, page)
    pick = chosen[page[order[chosen]] >= 0]
    prow = order[pick]
    pu, pp = u[prow], page[prow]
    f.n_sel[lo:hi] = n_selected(f.count[lo:hi], ranges, max_pages)
    rank = selection_rank(pp, ranges)
    selected = (rank >= 0) & (f.count[pu] >= 0) & (pp < f.count[pu]) & (rank < f.n_sel[pu])
    okc = book._code_of.get(status.OK, -2)
    st = st_codes[prow]
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
        _plan_part(book, f, present, lo, hi, sizes, cfg_limits, ranges, max_pages, pu, pp, changed)


def _restamped(u, t, stamp, order, lo, hi) -> np.ndarray:
    """Per input of [lo, hi): a row of its newest stamped ones (equal times: any of them) says another size
    or time than the listing's."""
    us, ss = u[order], stamp[order]
    has = ss >= 0
    out = np.zeros(hi - lo, bool)
    if not has.any():
        return out
    ustarts = seg_starts(us)
    tt = np.where(has, t[order].astype(np.int64), np.iinfo(np.int64).min)
    newest = np.maximum.reduceat(tt, ustarts)
    ugid = np.repeat(np.arange(len(ustarts)), np.diff(np.append(ustarts, len(us))))
    out[us[ustarts] - lo] = np.logical_or.reduceat(has & (tt == newest[ugid]) & (ss == 1), ustarts)
    return out


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
    starts = seg_starts(ku[o])
    best = o[starts]
    inv = np.append(np.array(names, np.int64), -1)
    f.fail_code[ku[best]] = inv[kr[best]]


def _plan_part(book, f, present, lo, hi, sizes, cfg_limits, ranges, max_pages, pu, pp, changed) -> None:
    """Which inputs of [lo, hi) are complete; the pages done of the others (rules of job.plan). An input
    ``changed`` since its newest rows (another size or time in the listing) is never complete: it is read
    again, and its doc_id decides whether its pages are parsed again."""
    s = sizes[lo:hi]
    code_of = book._code_of
    lim = cfg_limits
    # the listing's refusal of each input (limits.listing_refusal): 0 none, else 1 + its index in REFUSALS
    refusals = [code for _, code in limits.REFUSALS]
    refusal = np.zeros(hi - lo, np.int8)
    refusal[s < 0] = 1 + refusals.index(limits.MISSING_FILE)  # any other negative size: missing
    for i, (size, _) in enumerate(limits.REFUSALS, 1):
        if size is not None:
            refusal[s == size] = i
    if lim.max_file_bytes is not None:
        refusal[(s >= 0) & (s > lim.max_file_bytes)] = 1 + refusals.index(limits.FILE_TOO_LARGE)
    dl = f.doc_level[lo:hi]
    derr = f.doc_err[lo:hi]
    refused = refusal > 0
    complete = np.zeros(hi - lo, bool)
    for i, code in enumerate(refusals, 1):
        if code in code_of:
            complete |= (refusal == i) & dl & (derr == code_of[code])
    # a document-level verdict stands unless a rerun can change it (limits.retried)
    dcount = f.doc_count[lo:hi]
    n_sel_doc = n_selected(dcount, ranges, max_pages)
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
    restamped = complete & changed & ~refused
    complete &= ~restamped
    f.restamped += int(restamped.sum())
    f.complete += int(complete.sum())
    todo = np.flatnonzero(~complete) + lo
    # pages already done (inputs with page rows as their verdict)
    want = np.zeros(hi - lo, bool)
    want[todo - lo] = ~refused[todo - lo] & ~dl[todo - lo]
    m = ~f.doc_level[pu] & want[pu - lo]
    du, dp = pu[m], pp[m]
    done: dict[int, list] = {}
    if len(du):
        starts = seg_starts(du)
        for a, b in zip(starts, np.append(starts[1:], len(du))):
            done[int(du[a])] = np.unique(dp[a:b]).tolist()
    for i in todo.tolist():
        f.todo_done[i] = done.get(i, [])
