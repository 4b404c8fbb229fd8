"""Output rows of the batch job: the page and document schemas and how rows are built.

A page row is written for every selected page of every input, whatever happened to it; a document
that cannot be opened at all (not a PDF, empty, encrypted, corrupt, no pages) gets one row with
``page_index = -1`` carrying its error, so every input is accounted for in ``pages/``. The
``documents/`` table is derived from ``pages/``; :func:`page_from_row` reads a row back as a protocol
``Page``. Pure: pyarrow only (no ray, vllm or torch).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from padoc_ray import status
from padoc_ray.protocol import Box, Page, Region, markdown_spans

REGION_TYPE = pa.struct([
    ("order", pa.int32()),  # reading-order position, 0-based
    ("category", pa.string()),
    ("bbox", pa.list_(pa.float32(), 4)),  # x1, y1, x2, y2 normalized to [0, 1], origin top-left
    ("content", pa.string()),
    ("content_format", pa.string()),  # text | latex | html | none
    ("finish_reason", pa.string()),  # of the region's branch: stop | length | stopped | skipped | null
    ("tokens", pa.int32()),  # generated tokens of the region's branch, every attempt (content in sequential mode)
    ("errors", pa.list_(pa.string())),
    ("attempts", pa.int32()),  # attempts of the region's branch (re-forks included; 0: none ran)
    ("finish", pa.string()),  # how its last attempt ended: stop | loop | length | skipped | stopped | ... | null
    # the draft its branch got from the page's text layer, in tokens (0: none), and how many the model accepted
    ("draft_tokens", pa.int32()),
    ("accepted_tokens", pa.int32()),
])

#: where each region's content sits in the page's ``markdown`` (see :func:`padoc_ray.protocol.markdown_spans`)
SPAN_TYPE = pa.struct([
    ("order", pa.int32()),  # the region's reading-order position (its ``order`` in ``regions``)
    ("start", pa.int32()),  # 0-based character offset into ``markdown``
    ("end", pa.int32()),  # exclusive
])

PAGE_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("processed_at", pa.timestamp("ms", tz="UTC")),
    ("doc_id", pa.string()),  # sha256 of the file bytes (null when the file could not be read)
    ("source_uri", pa.string()),
    ("page_index", pa.int32()),  # 0-based; -1 for a document-level error row
    ("page_count", pa.int32()),  # pages in the document (null when it could not be opened)
    ("status", pa.string()),
    ("error_code", pa.string()),
    ("error_message", pa.string()),
    ("valid", pa.bool_()),  # completed normally, structurally valid, no limit reached
    ("image_width", pa.int32()),
    ("image_height", pa.int32()),
    ("page_width_pt", pa.float32()),
    ("page_height_pt", pa.float32()),
    ("rotation", pa.int32()),
    ("repaired", pa.bool_()),  # the PDF opened only after qpdf repaired it (null: not opened)
    ("regions", pa.list_(REGION_TYPE)),
    ("markdown", pa.string()),
    ("spans", pa.list_(SPAN_TYPE)),  # one per region with content, reading order (null in outputs before it)
    ("mode", pa.string()),
    ("model_id", pa.string()),
    ("render_s", pa.float32()),
    ("e2e_s", pa.float32()),
    ("ttft_s", pa.float32()),
    ("layout_s", pa.float32()),
    ("n_branches", pa.int32()),
    ("output_tokens", pa.int32()),
    ("prompt_tokens", pa.int32()),
    ("cached_tokens", pa.int32()),
    ("f_seq", pa.int32()),
    ("f_padoc", pa.int32()),
    # engine seconds the page used: its requests' shares of the engine's busy time (padoc_ray.scheduler.meter);
    # null: the page never reached the engine, or an output written before the column
    ("engine_s", pa.float32()),
    # the input as the run's listing saw it: a listed input whose size or modification time differs from its
    # newest rows' is read again, and parsed again when its bytes (doc_id) changed (null: outputs before them)
    ("source_size", pa.int64()),
    ("source_mtime", pa.timestamp("ms", tz="UTC")),
    # the page's text layer as the scheduler judged it: used | absent | untrusted (null: --text-layer off, or
    # not parsed), and the branch tokens accepted from its drafts (each one a decode step saved)
    ("text_layer", pa.string()),
    ("accepted_tokens", pa.int32()),
])

#: a rendered page row's text layer (:meth:`TextLayer.to_bytes <padoc_ray.protocol.text_layer.TextLayer.to_bytes>`):
#: it travels with the row from the renderer to the engine, and no row that is written or answered holds it
TEXT_LAYER_KEY = "text_layer_bytes"

DOCUMENT_SCHEMA = pa.schema([
    ("source_uri", pa.string()),
    ("doc_id", pa.string()),
    ("page_count", pa.int32()),
    ("pages_selected", pa.int32()),  # pages this job was asked to parse (--pages, --max-pages-per-doc)
    ("pages_ok", pa.int32()),
    ("pages_failed", pa.int32()),
    ("status", pa.string()),  # ok | partial | failed | skipped | <document error code>
    ("error_code", pa.string()),  # the document's code, or for `failed` the most common page code
])



def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class PageRangeError(ValueError):
    """A page selection that does not parse, or selects more than allowed (``too_many`` is set)."""

    def __init__(self, message: str, too_many: bool = False):
        super().__init__(message)
        self.too_many = too_many


def parse_page_ranges(text: str | None, limit: int | None = None) -> tuple[int, ...] | None:
    """``"1-3,7"`` (1-based, inclusive ranges, any order) -> 0-based ``(0, 1, 2, 6)``; None or "" ->
    None (all pages). More than ``limit`` pages selected raises before anything is expanded."""
    if text is None or not str(text).strip():
        return None
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise PageRangeError(f"bad page range {part!r}; use e.g. 1-3,7") from None
        if a < 1 or b < a:
            raise PageRangeError(f"bad page range {part!r}: pages count from 1 and ranges go up")
        if limit is not None and len(out) + (b - a + 1) > limit:
            raise PageRangeError(f"more than {limit} pages selected", too_many=True)
        out.update(range(a - 1, b))
    return tuple(sorted(out))


def select_pages(page_count: int, ranges: Sequence[int] | None, max_pages: int | None) -> list[int]:
    """0-based page indices to parse: ``ranges`` (0-based, any order) clipped to the document,
    then at most ``max_pages`` of them."""
    idx = list(range(page_count)) if ranges is None else sorted({i for i in ranges if 0 <= i < page_count})
    return idx[:max_pages] if max_pages is not None else idx


def base_row(*, run_id: str, uri: str, doc_id: str | None, page_index: int, page_count: int | None,
             mode: str, model_id: str, source_size: int | None = None, source_mtime: int | None = None) -> dict:
    """The fields every row of an input has; ``source_size`` / ``source_mtime`` (ms since the epoch) are the
    listing's (see :func:`padoc_ray.listing.list_inputs`), None when unknown."""
    row = {f.name: None for f in PAGE_SCHEMA}
    row.update(run_id=run_id, processed_at=now(), doc_id=doc_id, source_uri=uri, page_index=page_index,
               page_count=page_count, mode=mode, model_id=model_id, valid=False, regions=[], spans=[],
               source_size=source_size if source_size is not None and source_size >= 0 else None,
               source_mtime=None if source_mtime is None or source_mtime < 0 else
               dt.datetime.fromtimestamp(source_mtime / 1000, dt.timezone.utc))
    return row


def error_row(base: dict, code: str, message: str) -> dict:
    return {**_written(base), "status": code, "error_code": code,
            "error_message": message[:2000], "processed_at": now()}


def _written(base: dict) -> dict:
    """``base`` without what only travels to the engine (:data:`TEXT_LAYER_KEY`)."""
    return {k: v for k, v in base.items() if k != TEXT_LAYER_KEY} if TEXT_LAYER_KEY in base else base


def _at(values, i: int):
    """``values[i]``, or None past the end (a record's per-region lists may be shorter than its regions)."""
    return values[i] if i < len(values) else None


def page_row(base: dict, rec, *, render_s: float | None = None) -> dict:
    """A row from a scheduler :class:`~padoc_ray.scheduler.PageRecord`."""
    page = rec.page
    regions = []
    for i, r in enumerate(page.regions):
        regions.append({
            "order": i, "category": r.category, "bbox": list(r.box.as_tuple()), "content": r.content,
            "content_format": r.content_format,
            "finish_reason": _at(rec.region_finish_reasons, i), "tokens": _at(rec.region_tokens, i),
            "errors": list(r.errors), "attempts": _at(rec.region_attempts, i), "finish": _at(rec.region_finish, i),
            "draft_tokens": _at(rec.region_draft_tokens, i), "accepted_tokens": _at(rec.region_accepted_tokens, i),
        })
    ok = rec.status == status.OK
    markdown, spans = markdown_spans(page)
    return {
        **_written(base), "processed_at": now(), "status": rec.status, "valid": rec.valid,
        "error_code": None if ok else rec.status, "error_message": None if ok else (rec.message or None),
        "regions": regions, "markdown": markdown,
        "spans": [{"order": o, "start": a, "end": b} for o, a, b in spans], "render_s": render_s, "e2e_s": rec.e2e_s,
        "ttft_s": rec.ttft_s, "layout_s": rec.layout_s, "n_branches": rec.n_branches,
        "output_tokens": rec.output_tokens, "prompt_tokens": rec.prompt_tokens, "cached_tokens": rec.cached_tokens,
        "f_seq": rec.f_seq, "f_padoc": rec.f_padoc, "engine_s": rec.engine_s,
        "text_layer": rec.text_layer, "accepted_tokens": sum(rec.region_accepted_tokens),
    }


#: row fields the JSON of a row leaves out (internal, or not the client's business)
_HIDDEN = frozenset({"run_id", TEXT_LAYER_KEY})


def row_json(row: dict) -> dict:
    """A page row (the batch job's schema) as JSON-ready values: what Serve answers for a page and what
    ``parse-page --format json`` prints (with its own keys added). Timestamps as ISO text, top-level
    floats rounded to 4 places, ``run_id`` left out."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in _HIDDEN:
            continue
        if isinstance(v, dt.datetime):
            v = v.isoformat()
        elif isinstance(v, float):
            v = round(v, 4)
        out[k] = v
    return out


def to_table(rows: Iterable[dict]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=PAGE_SCHEMA)


def status_counts(table: pa.Table) -> dict[str, int]:
    if table.num_rows == 0:
        return {}
    vc = pc.value_counts(table.column("status"))
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}


class RowFormatError(ValueError):
    """A page row whose regions cannot be read back (a missing or malformed box)."""


def region_box(reg: Mapping) -> Box:
    """A region struct's normalized box; :class:`RowFormatError` when missing or malformed."""
    bbox = reg.get("bbox") if isinstance(reg, Mapping) else None
    try:
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise TypeError
        return Box(*(float(v) for v in bbox))
    except (TypeError, ValueError):
        raise RowFormatError(f"region bbox missing or malformed: {bbox!r:.60}") from None


def page_from_row(row: Mapping, *, on_bad_region: Callable[[int, Mapping, str], None] | None = None) -> Page:
    """A page row (its ``regions``, ``image_width``/``image_height``, ``page_index``) as a protocol
    :class:`Page`, regions in reading order. The one converter from the row schema: readers of
    outputs (``show``, ``reannotate``, the evaluators, the trainer) all go through it.

    A region whose box is missing or malformed raises :class:`RowFormatError`, or, with
    ``on_bad_region``, is reported to it as (position, region, message) and left out."""
    regs = [r for r in (row.get("regions") or []) if isinstance(r, Mapping)]
    regs = sorted(enumerate(regs), key=lambda kr: (kr[1].get("order") is None, kr[1].get("order") or 0, kr[0]))
    regions = []
    for k, reg in regs:
        try:
            box = region_box(reg)
        except RowFormatError as e:
            if on_bad_region is None:
                raise
            on_bad_region(k, reg, str(e))
            continue
        regions.append(Region(category=reg.get("category"), box=box, content=reg.get("content"),
                              content_format=reg.get("content_format") or "text",
                              order=reg["order"] if reg.get("order") is not None else k))
    return Page(width=int(row.get("image_width") or 0), height=int(row.get("image_height") or 0),
                regions=tuple(regions), page_no=int(row.get("page_index") or 0))
