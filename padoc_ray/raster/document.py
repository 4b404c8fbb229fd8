"""One document's renderer events as page rows: the one path from the renderer to a row, shared by
the batch job's raster stage (:func:`padoc_ray.pipeline.stages.rasterize`) and the online service
(:class:`padoc_ray.serve.documents.RenderPool`).

:func:`document_rows` drives a renderer (:mod:`.renderer`) over one document and yields, in order:

* :class:`DocumentOpened` once the document is open and its pages are selected (page count,
  repaired, the selected pages and those to render);
* one :class:`PageRow` per page to render: its row in the batch job's schema
  (:func:`padoc_ray.output.rows.base_row`) with the rendered image, or, when rendering the page
  failed, its error row (:func:`padoc_ray.output.rows.error_row`) and no image;
* or, instead of all that, a single :class:`~padoc_ray.raster.events.DocFailed` (code, message,
  page count when known): the document could not be opened, or its selection was refused (nothing
  is rendered then, and no :class:`DocumentOpened` comes first).

The renderer's own events (:mod:`padoc_ray.raster.events`: ``PageRendered`` and the others) stay
between the renderer and this module; every surface sees :class:`PageRow` only.

:class:`PageChoice` is the one page selection with its caps: the batch job's ``--pages`` /
``--max-pages-per-doc`` and ``--doc-page-limit``, and the service's ``pages=`` with its
per-request cap; each surface keeps its own messages. Pure: no ray, no fastapi.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from padoc_ray.output import rows
from padoc_ray.pdf import PdfError, RenderConfig
from padoc_ray.raster.events import DocFailed, Opened, PageFailed
from padoc_ray.status import PAGE_OUT_OF_RANGE, TOO_MANY_PAGES
from padoc_ray.knobs import MB, knob, none_is_zero, zero_is_none


# ---- the caps on one input ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class InputLimits:
    """Per-input caps; None: no cap (the frame cap is always on).

    * ``max_doc_pages`` 5,000: pages selected in one document. Long books and filings have a few
      thousand pages; 5,000 pages are hours of one engine, and a tiny PDF can claim 100,000.
    * ``max_image_frames`` 1,000: frames of one image (a multi-page TIFF scan has tens to
      hundreds); every frame's size is also checked against PIL's pixel limit before decoding.
    * ``max_file_bytes`` 512 MiB: a raster task holds the whole file (and pdfium a copy), so this
      bounds a task's memory; large scanned PDFs stay well below it.
    """

    #: selected pages of one document; more: too_many_pages (None: no cap)
    max_doc_pages: int | None = knob(5000, flags=("--doc-page-limit",), metavar="N", to_field=zero_is_none,
                                     from_field=none_is_zero, note="0: no limit")
    #: frames of one image; more: too_many_frames
    max_image_frames: int = knob(1000, flags=("--image-frame-limit",), metavar="N")
    #: bytes of one input file; more: file_too_large (None: no cap)
    max_file_bytes: int | None = knob(512 << 20, flags=("--file-size-limit-mb",), dest="file_size_limit_mb",
                                      parse="float", metavar="MB", to_field=lambda mb: int(mb * MB) or None,
                                      from_field=lambda b: 0 if b is None else b / MB,
                                      help="refuse input files larger than this many MB, from the listing without "
                                           "reading them, or when read if a file grew past it (status "
                                           "file_too_large; 0: no limit)")

    def __post_init__(self) -> None:
        for name in ("max_doc_pages", "max_image_frames", "max_file_bytes"):
            v = getattr(self, name)
            if (v is not None or name == "max_image_frames") and not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")



# ---- page selection -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PageChoice:
    """Which pages of a document are parsed, and the caps that refuse it before any page renders.

    The batch job drops wanted pages past the end and keeps the first ``first`` of the rest; the
    service refuses a wanted page past the end (``strict``: ``page_out_of_range``). Either way,
    more than ``cap`` selected pages refuse the document (``too_many_pages``, message from
    ``cap_message(selected, page_count, cap)``)."""

    wanted: tuple[int, ...] | None = None  #: 0-based pages asked for, any order (None: all)
    strict: bool = False  #: a wanted page past the document's end refuses it (else: dropped)
    first: int | None = None  #: keep at most the first this many selected pages (None: all)
    cap: int | None = None  #: more selected pages than this refuse the document (None: no cap)
    cap_message: Callable[[int, int, int], str] = field(
        default=lambda n, count, cap: f"{n} of its {count} pages selected, over the limit of {cap}")

    def select(self, page_count: int) -> list[int]:
        """The selected pages, in order; raises the refusal as a :class:`~padoc_ray.pdf.PdfError`."""
        wanted = self.wanted
        if self.strict and wanted:
            missing = sorted(i + 1 for i in wanted if i >= page_count)
            if missing:
                raise PdfError(PAGE_OUT_OF_RANGE,
                               f"page {missing[0]} does not exist: the document has {page_count} page(s)")
        chosen = rows.select_pages(page_count, wanted, self.first)
        if self.cap is not None and len(chosen) > self.cap:
            raise PdfError(TOO_MANY_PAGES, self.cap_message(len(chosen), page_count, self.cap))
        return chosen


# ---- what one document yields -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DocumentOpened:
    """The document is open and its selection accepted."""

    page_count: int  #: pages of the document (frames of an image)
    repaired: bool  #: it opened only after qpdf repaired it
    selected: tuple[int, ...]  #: the pages the selection names (already done ones included)
    pages: tuple[int, ...]  #: the pages that will be rendered: ``selected`` less the skipped ones


@dataclass
class PageRow:
    """One page's row (the batch job's schema). Rendered: ``status`` None, the image size, page
    size and render time filled, and ``image`` the encoded image (:mod:`padoc_ray.raster.codec`).
    Rendering failed: the row carries the error, ``image`` is None."""

    row: dict
    image: bytes | None = None

    @property
    def rendered(self) -> bool:
        return self.image is not None


DocumentItem = DocumentOpened | PageRow | DocFailed


def document_error_row(base: dict, code: str, message: str, page_count: int | None = None) -> dict:
    """The one row of a document that cannot be parsed at all (``page_index = -1``). ``base``: the
    :func:`~padoc_ray.output.rows.base_row` arguments but page_index and page_count, doc_id included."""
    return rows.error_row(rows.base_row(page_index=-1, page_count=page_count, **base), code, message)


def document_rows(renderer, data: bytes, name: str, base: dict, choice: PageChoice, render: RenderConfig,
                  encoding: str, *, max_frames: int | None = None, skip: frozenset[int] | set[int] = frozenset(),
                  count_only: bool = False, cancel: threading.Event | None = None) -> Iterator[DocumentItem]:
    """Render one document with ``renderer`` (an Isolated- or InProcessRenderer) and yield its
    items (see the module doc). ``base``: the :func:`~padoc_ray.output.rows.base_row` arguments but
    page_index and page_count (run_id, uri, doc_id, mode, model_id). ``skip``: selected pages not to
    render (done by an earlier run); ``count_only``: open and select, render nothing (``base`` is
    then unused and may be empty). Closing the
    generator early closes the renderer's (an isolated renderer then replaces its process).
    ``cancel``: set by another thread to end the document mid-page (the renderer's
    ``render_document``); the items stop, with no row for the page it was rendering."""
    chosen: list = []  # the selection, computed once when the document opens (or its refusal)

    def selector(count: int) -> list[int]:  # called by the renderer right after it yields Opened
        if not chosen:
            chosen.append(_choose(choice, count))
        got = chosen[0]
        if isinstance(got, PdfError):
            raise got
        return [] if count_only else [i for i in got if i not in skip]

    count, repaired = None, None
    events = renderer.render_document(data, name, selector, render, encoding, max_frames=max_frames, cancel=cancel)
    try:
        for ev in events:
            if isinstance(ev, DocFailed):
                yield ev
                return
            if isinstance(ev, Opened):
                count, repaired = ev.page_count, ev.repaired
                if not chosen:
                    chosen.append(_choose(choice, count))
                if not isinstance(chosen[0], PdfError):  # refused: the renderer's DocFailed follows
                    yield DocumentOpened(count, repaired, tuple(chosen[0]),
                                         tuple(i for i in chosen[0] if i not in skip))
                continue
            b = rows.base_row(page_index=ev.index, page_count=count, **base)
            b["repaired"] = repaired
            if isinstance(ev, PageFailed):
                yield PageRow(rows.error_row(b, ev.code, ev.message))
            else:
                yield PageRow({**b, **ev.meta}, ev.image_bytes)
    finally:
        events.close()


def _choose(choice: PageChoice, count: int) -> list[int] | PdfError:
    try:
        return choice.select(count)
    except PdfError as e:
        return e
