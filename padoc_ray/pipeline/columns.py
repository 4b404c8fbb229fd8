"""Helpers over numpy / Arrow columns for the driver's ledger (:mod:`padoc_ray.pipeline.ledger`): compact
integer columns, time offsets, segment reductions and the page-selection arithmetic.

Pure: pyarrow and numpy only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NO_TIME32 = np.int32(np.iinfo(np.int32).min)  #: a null time among int32 offsets (below every offset)
NO_TIME64 = np.int64(np.iinfo(np.int64).min)  #: a null time among int64 offsets


def small(a: np.ndarray) -> np.ndarray:
    """``a`` in the smallest of int8/int16/int32 that holds its values (most pages, counts and codes
    are small; the ledger holds one value a row)."""
    if len(a) == 0:
        return a
    lo, hi = int(a.min()), int(a.max())
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t, copy=False)
    return a


def trim() -> None:
    """Give freed memory back to the system (glibc and Arrow's allocator keep freed blocks, which
    would count in the driver's RSS as if still used)."""
    from padoc_ray.engine.memory import trim_heap

    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages too
    trim_heap()  # not glibc: nothing to do


def as_dict(col):
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    return col


def same_buffers(a: pa.Array, b: pa.Array) -> bool:
    return len(a) == len(b) and a.offset == b.offset and all(
        (x is None and y is None) or (x is not None and y is not None and x.address == y.address)
        for x, y in zip(a.buffers(), b.buffers()))


def indices(d) -> np.ndarray:
    """A dictionary array's indices, null as -1 (which the lookup tables map to their last entry)."""
    return ints(d.indices, -1, np.int64)


def ints(col, null, dtype) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        col = pc.fill_null(col, null)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=dtype)


def equals(col, value: str) -> np.ndarray:
    d = as_dict(col)
    hit = np.append(np.array([v == value for v in d.dictionary.to_pylist()], bool), False)
    return hit[indices(d)]


def time_offsets(col, t0: int) -> np.ndarray:
    """A timestamp column as milliseconds since ``t0``: int32 when every offset fits (half the
    memory of int64), else int64; null is the dtype's lowest value (below every time, as the rules
    want). Orders exactly like the times themselves; :func:`cat_times` joins parts of both kinds."""
    ms = pc.subtract_checked(pc.cast(col, pa.int64()), t0)
    lo, hi = pc.min_max(ms).values()
    fits = lo.as_py() is None or (NO_TIME32 < lo.as_py() and hi.as_py() <= np.iinfo(np.int32).max)
    return ints(ms, NO_TIME32 if fits else NO_TIME64, np.int32 if fits else np.int64)


def cat_times(parts: list) -> np.ndarray:
    """Concatenate :func:`time_offsets` parts (int64 as soon as one part needs it); empties ``parts``."""
    if all(p.dtype == np.int32 for p in parts):
        return cat(parts, np.int32)
    return cat(parts, np.int64, lambda p: np.where(p == NO_TIME32, NO_TIME64, p.astype(np.int64)) if p.dtype == np.int32 else p)


def cat(parts: list, dtype, convert=None) -> np.ndarray:
    """Concatenate ``parts`` into one array of ``dtype``, emptying the list as it goes and giving
    the copied parts' memory back now and then (the peak is about one copy of the data, not two)."""
    total = sum(len(p) for p in parts)
    out = np.empty(total, dtype)
    end = total
    while parts:
        p = parts.pop()
        out[end - len(p):end] = p if convert is None else convert(p)
        end -= len(p)
        del p
        if len(parts) % 64 == 0:
            trim()
    return out


def seg_starts(*keys) -> np.ndarray:
    """Start positions of runs of equal keys (sorted arrays)."""
    n = len(keys[0])
    new = np.zeros(n, bool)
    if n:
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(new)


def first_per_u(us: np.ndarray, vals: np.ndarray, out: np.ndarray) -> None:
    """``out[u] = min(vals)`` over each run of equal ``us`` (sorted)."""
    if len(us):
        s = seg_starts(us)
        out[us[s]] = np.minimum.reduceat(vals, s)


def n_selected(count: np.ndarray, ranges, max_pages) -> np.ndarray:
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


def selection_rank(page: np.ndarray, ranges) -> np.ndarray:
    """Each page's position in the selection order (-1: never selected)."""
    if ranges is None:
        return np.where(page >= 0, page, -1).astype(np.int64)
    r = np.unique(np.asarray(list(ranges), np.int64))
    if len(r) == 0:
        return np.full(len(page), -1, np.int64)
    i = np.searchsorted(r, page)
    hit = (i < len(r)) & (r[np.minimum(i, len(r) - 1)] == page) & (page >= 0)
    return np.where(hit, i - np.searchsorted(r, 0), -1)
