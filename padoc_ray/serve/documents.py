"""What the ingress does with one uploaded document, apart from HTTP: page selection, rendering in
renderer processes, and turning page rows into the API's JSON. No ray, no fastapi.

pdfium is not thread-safe, even across documents, so nothing here renders in the ingress process:
each document is rendered by one of a small pool of :class:`~padoc_ray.raster.IsolatedRenderer`
processes (with the batch job's deadlines and crash isolation), driven from a worker thread, and
its items (page rows, made as the batch job makes them: :mod:`padoc_ray.raster.document`) reach the
event loop through a queue as pages finish.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from padoc_ray.output import rows
from padoc_ray.output.rows import row_json
from padoc_ray.raster import DocFailed, IsolatedRenderer, RendererConfig, decode_image
from padoc_ray.raster.document import DocumentItem, PageChoice, document_rows
from padoc_ray.serve import errors
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.fair import FairGate
from padoc_ray.status import PAGE_OUT_OF_RANGE, RENDER_FAILED, TOO_MANY_PAGES
from padoc_ray.status import document_status as status_rollup

__all__ = ["PAGE_OUT_OF_RANGE", "RenderPool", "document_status", "page_choice", "parse_page_spec", "png_data_url",
           "row_json"]


def parse_page_spec(spec: str | None, limit: int) -> tuple[int, ...] | None:
    """``pages=`` of a request (``"1-3,7"``, 1-based) -> 0-based indices; None/"" -> all pages. Refuses
    (:class:`~padoc_ray.serve.errors.Refusal`) more than ``limit`` (``too_many_pages``) or a selection
    that does not parse (``bad_pages``)."""
    try:
        return rows.parse_page_ranges(spec, limit)
    except rows.PageRangeError as e:
        raise Refusal(TOO_MANY_PAGES if e.too_many else errors.BAD_PAGES, f"pages: {e}") from None


def page_choice(wanted: tuple[int, ...] | None, max_pages: int) -> PageChoice:
    """A request's page selection: ``wanted`` (from :func:`parse_page_spec`) must exist in the
    document (``page_out_of_range``), and at most ``max_pages`` may be selected (``too_many_pages``)."""
    return PageChoice(wanted=wanted, strict=True, cap=max_pages, cap_message=_cap_message)


def _cap_message(n: int, _count: int, cap: int) -> str:
    return (f"{n} pages selected, over this service's limit of {cap} per request (select fewer with pages=, "
            f"or use /v1/jobs)")


def document_status(page_rows: list[dict]) -> str:
    """ok (every page ok) | partial | failed (no page ok): :func:`padoc_ray.status.document_status`."""
    return status_rollup(r.get("status") for r in page_rows)


def png_data_url(image: bytes | memoryview) -> str:
    """A rendered page image (any :mod:`padoc_ray.raster.codec` encoding) as a ``data:image/png`` URL,
    the page image a browser shows (``view=true``)."""
    buf = io.BytesIO()
    decode_image(image).save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class RenderPool:
    """``workers`` long-lived threads, each driving its own renderer process; a document is
    rendered by one of them from start to end, the others wait their turn.

    Turns are fair between tenants (:class:`~padoc_ray.serve.fair.FairGate`): one tenant's
    documents hold at most ``per_tenant`` workers at once, and a freed worker goes to the tenants
    waiting in turn, so one client's heavy PDFs cannot hold every renderer nor queue ahead of
    everyone else's documents.

    The threads must outlive the documents: a renderer process dies with the *thread* that started
    it (PR_SET_PDEATHSIG is per thread on Linux), so a thread per document would start a new
    renderer process for every document (~70 ms each)."""

    def __init__(self, cfg: RendererConfig, workers: int, per_tenant: int | None = None):
        """``per_tenant``: workers one tenant's documents may hold at once (None: all of them)."""
        self.cfg = cfg
        self._slots = FairGate(workers, per_tenant=per_tenant, classes=1)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="padoc-render")
        self._local = threading.local()
        self._all: list[IsolatedRenderer] = []
        self._lock = threading.Lock()

    @property
    def renderers(self) -> tuple[IsolatedRenderer, ...]:
        """The workers' renderers started so far (for tests and diagnostics: their ``pid``)."""
        with self._lock:
            return tuple(self._all)

    @property
    def slots(self) -> FairGate:
        """The workers' turns by tenant (for tests and diagnostics: who holds and who waits)."""
        return self._slots

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

    async def render(self, data: bytes, name: str, choice: PageChoice, render_cfg, encoding: str, base: dict,
                     max_frames: int, count_only: bool = False, skip: frozenset[int] = frozenset(), *,
                     tenant: str | None = None) -> AsyncIterator[DocumentItem]:
        """Yields the document's items (:func:`padoc_ray.raster.document.document_rows`: a
        :class:`~padoc_ray.raster.document.DocumentOpened`, then a
        :class:`~padoc_ray.raster.document.PageRow` per page in order; or a single
        :class:`~padoc_ray.raster.DocFailed`). ``base``: the row fields of
        :func:`~padoc_ray.output.rows.base_row` but page_index and page_count. ``count_only``: open
        and check the selection, render nothing. ``tenant``: whose turn this is (see the class doc);
        None: a tenant of its own (callers that name none are not capped together).

        Waits for a worker first (a waiter that leaves gives up its place). Stopping early (aclose,
        cancellation: the client left, a deadline, the job was cancelled) abandons the document at
        once, mid-page too: its renderer process is killed, no row comes of the page it was rendering,
        the worker is free again when this returns, and the next document gets a fresh renderer."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue(maxsize=8)  # bounded: rendering waits for the engine side
        stop = threading.Event()
        done = object()
        used: list[IsolatedRenderer] = []  # the renderer of this document, once its worker has started

        def put(item) -> None:
            fut = asyncio.run_coroutine_threadsafe(q.put(item), loop)
            while not stop.is_set():
                try:
                    fut.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue
            fut.cancel()

        def work() -> None:
            renderer = self._renderer()
            used.append(renderer)  # before rendering: a stop from here on reaches it (stop, then interrupt)
            try:
                # closed at once when we stop early (its renderer is then killed and replaced)
                with contextlib.closing(document_rows(renderer, data, name, base, choice, render_cfg, encoding,
                                                      max_frames=max_frames, skip=skip, count_only=count_only,
                                                      cancel=stop)) as items:
                    for item in items:
                        if stop.is_set():
                            break
                        put(item)
                        if isinstance(item, DocFailed):
                            break
            except Exception as e:  # noqa: BLE001 - a bug in rendering is this document's failure
                put(DocFailed(RENDER_FAILED, f"{type(e).__name__}: {e}"))
            finally:
                put(done)

        turn = f"\x00document-{id(stop)}" if tenant is None else tenant  # no real tenant's name starts with NUL
        await self._slots.acquire(turn)
        try:
            job = loop.run_in_executor(self._executor, work)
        except BaseException:
            self._slots.release(turn)
            raise
        # the slot is the thread's: it frees when the thread does, even if we stop waiting for it
        job.add_done_callback(lambda _: self._slots.release(turn))
        try:
            while True:
                item = await q.get()
                if item is done:
                    return
                yield item
        finally:
            stop.set()
            for r in used:  # it may be mid-page: kill its process now, not after the page
                r.interrupt()
            while not q.empty():  # unblock a put() waiting on a full queue
                q.get_nowait()
            await asyncio.shield(job)  # the document's thread is free again before we return
