"""What the ingress does with one uploaded document, apart from HTTP: page selection, rendering in
renderer processes, and turning page rows into the API's JSON. No ray, no fastapi.

pdfium is not thread-safe, even across documents, so nothing here renders in the ingress process:
each document is rendered by one of a small pool of :class:`~padoc_ray.raster.IsolatedRenderer`
processes (with the batch job's deadlines and crash isolation), driven from a worker thread, and
its events reach the event loop through a queue as pages finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator

from padoc_ray.pdf import PdfError
from padoc_ray.output import rows
from padoc_ray.raster import DocFailed, IsolatedRenderer, Opened, PageFailed, RendererConfig
from padoc_ray.status import PAGE_OUT_OF_RANGE, RENDER_FAILED, TOO_MANY_PAGES, http_status
from padoc_ray.status import document_status as status_rollup



class BadRequest(ValueError):
    """A request the client must change: ``code`` and ``status`` (HTTP) travel with it."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def parse_page_spec(spec: str | None, limit: int) -> tuple[int, ...] | None:
    """``pages=`` of a request (``"1-3,7"``, 1-based) -> 0-based indices; None/"" -> all pages."""
    try:
        return rows.parse_page_ranges(spec, limit)
    except rows.PageRangeError as e:
        raise BadRequest(TOO_MANY_PAGES, f"pages: {e}", http_status(TOO_MANY_PAGES)) if e.too_many else \
            BadRequest("bad_pages", f"pages: {e}", 422) from None


def select(count: int, wanted: tuple[int, ...] | None, max_pages: int) -> list[int]:
    """The pages to render of a document with ``count`` pages; raises the refusal as a PdfError
    (the renderer turns it into the document's failure before rendering anything)."""
    if wanted is not None and wanted and wanted[-1] >= count:
        missing = [i + 1 for i in wanted if i >= count]
        raise PdfError(PAGE_OUT_OF_RANGE, f"page {missing[0]} does not exist: the document has {count} page(s)")
    chosen = list(range(count)) if wanted is None else list(wanted)
    if len(chosen) > max_pages:
        raise PdfError(TOO_MANY_PAGES, f"{len(chosen)} pages selected, over this service's limit of {max_pages} "
                                         f"per request (select fewer with pages=, or use /v1/jobs)")
    return chosen


def doc_error_status(code: str) -> int:
    """The HTTP status of a document that failed as a whole (413 for the caps, else 422 mostly)."""
    return http_status(code)


def document_status(page_rows: list[dict]) -> str:
    """ok (every page ok) | partial | failed (no page ok): :func:`padoc_ray.status.document_status`."""
    return status_rollup(r.get("status") for r in page_rows)


#: row fields a response leaves out (internal, or not the client's business)
_HIDDEN = frozenset({"run_id"})


def row_json(row: dict) -> dict:
    """A page row (the batch job's schema) as JSON-ready values."""
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


@dataclass
class RenderedPage:
    row: dict  #: the page's row so far (image size, page size, render time), status None
    image: bytes


class RenderPool:
    """``workers`` long-lived threads, each driving its own renderer process; a document is
    rendered by one of them from start to end, the others wait their turn.

    The threads must outlive the documents: a renderer process dies with the *thread* that started
    it (PR_SET_PDEATHSIG is per thread on Linux), so a thread per document would start a new
    renderer process for every document (~70 ms each)."""

    def __init__(self, cfg: RendererConfig, workers: int):
        self.cfg = cfg
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="padoc-render")
        self._local = threading.local()
        self._all: list[IsolatedRenderer] = []
        self._lock = threading.Lock()

    def _renderer(self) -> IsolatedRenderer:
        r = getattr(self._local, "renderer", None)
        if r is None:
            r = self._local.renderer = IsolatedRenderer(self.cfg)
            with self._lock:
                self._all.append(r)
        return r

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for r in self._all:
                r.close()

    async def render(self, data: bytes, name: str, wanted: tuple[int, ...] | None, max_pages: int, render_cfg,
                     encoding: str, base: dict, max_frames: int, count_only: bool = False) -> AsyncIterator[Any]:
        """Yields ``("opened", page_count, repaired)``, then a :class:`RenderedPage` or an error row
        (dict) per page in order; or a single ``("failed", code, message)``. ``count_only``: open and
        check the selection, render nothing. Stopping early (the client left, the job was cancelled)
        abandons the document: its renderer is restarted."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue(maxsize=8)  # bounded: rendering waits for the engine side
        stop = threading.Event()
        done = object()

        def put(item) -> None:
            fut = asyncio.run_coroutine_threadsafe(q.put(item), loop)
            while not stop.is_set():
                try:
                    fut.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue
            fut.cancel()

        def chosen(n: int) -> list[int]:
            pages = select(n, wanted, max_pages)  # raises the refusal
            return [] if count_only else pages

        def work() -> None:
            count, repaired = None, None
            renderer = self._renderer()
            try:
                # closed at once when we stop early (its renderer is then killed and replaced)
                with contextlib.closing(renderer.render_document(data, name, chosen, render_cfg, encoding,
                                                                 max_frames=max_frames)) as events:
                    for ev in events:
                        if stop.is_set():
                            break
                        if isinstance(ev, DocFailed):
                            put(("failed", ev.code, ev.message))
                            break
                        if isinstance(ev, Opened):
                            count, repaired = ev.page_count, ev.repaired
                            put(("opened", count, repaired))
                            continue
                        b = {**base, "page_index": ev.index, "page_count": count, "repaired": repaired,
                             "processed_at": rows.now()}
                        if isinstance(ev, PageFailed):
                            put(rows.error_row(b, ev.code, ev.message))
                        else:
                            put(RenderedPage({**b, **ev.meta}, ev.image_bytes))
            except Exception as e:  # noqa: BLE001 - a bug in rendering is this document's failure
                put(("failed", RENDER_FAILED, f"{type(e).__name__}: {e}"))
            finally:
                put(done)

        job = loop.run_in_executor(self._executor, work)
        try:
            while True:
                item = await q.get()
                if item is done:
                    return
                yield item
        finally:
            stop.set()
            while not q.empty():  # unblock a put() waiting on a full queue
                q.get_nowait()
            await asyncio.shield(job)  # the document's thread is free again before we return
