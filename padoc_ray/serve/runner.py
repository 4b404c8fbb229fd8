"""One document through the online service, apart from HTTP and Ray: render, then one engine call per
page, admitted by engine capacity, as a stream of typed items.

:class:`DocumentRunner` yields a :class:`~padoc_ray.raster.document.DocumentOpened` and then one
finished page row per page, in the order pages finish; a document that fails as a whole raises a
:class:`~padoc_ray.serve.errors.Refusal` with its document code. Pages wait for a slot of the
:class:`FairGate` sized to what the engine replicas accept (interactive pages ahead of job pages,
tenants in turn), so a 5,000-page job waits for capacity instead of flooding the engine and failing
as ``overloaded``; only a request refused at admission (too many interactive pages already waiting)
gets ``overloaded``. Rendering waits for the gate too: a document has at most one rendered page
waiting for a slot, so memory is bounded by the slots, not by the document.

The engine is anything with :class:`EngineClient`'s methods: the Ray adapter
(:mod:`padoc_ray.serve.engine`) or a scripted engine in tests. A run may ask for the pages' region
events (``RunOptions.on_event``, for ``stream=regions``): its pages then go through the engine's
event stream instead, and each event reaches the sink as the engine makes it, before its page's row
is yielded. The gate, fairness and retries are the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from padoc_ray import metrics, status
from padoc_ray.output import rows
from padoc_ray.pdf import doc_id_of
from padoc_ray.raster import DocFailed
from padoc_ray.raster.document import DocumentOpened, PageRow
from padoc_ray.serve.documents import document_status, page_choice, png_data_url, row_json
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.fair import FairGate

logger = logging.getLogger("padoc_ray.serve")

INTERACTIVE = 0  #: /v1/parse and chat pages: the engine runs them first
BATCH = 1  #: job pages


class EngineBusy(Exception):
    """Every engine replica is at capacity: try again shortly (the page lost nothing)."""


class EngineClient(Protocol):
    async def parse_page(self, row: dict, image: bytes, *, tenant: str, salt: str, priority: int) -> dict:
        """The finished page row of a rendered page row. Raises :class:`EngineBusy`, or anything
        else when the engine failed (a replica died); cancellation cancels the engine's work."""
        ...

    def stream_page(self, row: dict, image: bytes, *, tenant: str, salt: str,
                    priority: int) -> AsyncIterator[dict]:
        """:meth:`parse_page` as events: the page's region events (:meth:`padoc_ray.host.PageHost.events`)
        as they happen, then ``{"event": "row", "row": <the finished row>}``. Raises as parse_page does
        (:class:`EngineBusy` before the first event); closing it early cancels the engine's work."""
        ...


#: receives each region event of a run's pages (an event dict of PageHost.events), once, as it happens
EventSink = Callable[[dict], None]


@dataclass(frozen=True)
class Document:
    data: bytes
    name: str  #: a label (the upload's file name): picks the replay truth, never a path


@dataclass(frozen=True)
class RunOptions:
    wanted: tuple[int, ...] | None  #: 0-based pages (None: all)
    mode: str
    max_pages: int  #: the selection's cap (too_many_pages past it)
    tenant: str
    salt: str  #: cache namespace: requests with different salts share no prefix blocks
    run_id: str
    klass: int = INTERACTIVE
    skip: frozenset[int] = frozenset()  #: pages already done (a job taken over)
    on_event: EventSink | None = None  #: the pages' region events go here (None: the engine makes none)
    images: bool = False  #: each finished row gets ``image_url``: its page image as a PNG data URL


class DocumentRunner:
    """``pages()`` for one document at a time, many at once, on shared render pools and one gate.

    ``pools``: the :class:`~padoc_ray.serve.documents.RenderPool` of each class (interactive and job
    documents render in separate renderer processes, so jobs never hold the renderers a one-page
    request needs). ``max_waiting``: interactive pages that may wait for a slot before a new request
    is refused (503 ``overloaded``). A page that finds every engine replica busy waits ``busy_backoff_s``,
    then twice as long each time, at most ``busy_backoff_max_s``; a replica that failed is tried once
    more after ``retry_wait_s``."""

    def __init__(self, cfg, engine: EngineClient, pools: dict[int, Any], gate: FairGate, *, max_waiting: int,
                 busy_backoff_s: float = 0.5, busy_backoff_max_s: float = 5.0, retry_wait_s: float = 1.0):
        self.cfg, self.engine, self.pools, self.gate = cfg, engine, pools, gate
        self.max_waiting = max_waiting
        #: interactive pages admitted (their document opened) and not finished: at most the gate's slots
        #: plus max_waiting, so that a burst of requests is refused at once instead of queueing long
        self.reserved = 0
        self.busy_backoff_s, self.busy_backoff_max_s = busy_backoff_s, busy_backoff_max_s
        self.retry_wait_s = retry_wait_s
        #: how pages are rendered: the service's settings, with text layers only where its drafts use them
        self._render = cfg.render.with_text_layer(cfg.host.scheduler.text_layer)

    def admit(self) -> None:
        """Refuse a new interactive request while too many interactive pages wait already."""
        if self.gate.waiting(INTERACTIVE) >= self.max_waiting:
            raise _overloaded()

    def _reserve(self, n: int) -> None:
        """Admit an opened interactive document's ``n`` pages, or refuse it (none of its pages ran). A
        document larger than the whole allowance is admitted when nothing else is (or it never could be)."""
        if self.reserved and self.reserved + n > self.gate.capacity + self.max_waiting:
            raise _overloaded()
        self.reserved += n

    async def _call(self, rp: PageRow, opt: RunOptions) -> dict:
        """The page's finished row: waits out a busy engine, tries a failed replica's page once more."""
        backoff = self.busy_backoff_s
        failures = 0
        sent: set[tuple[str, int]] = set()  # (event, order) passed on: a retried page's are not sent again
        while True:
            try:
                if opt.on_event is None:
                    return await self.engine.parse_page(rp.row, rp.image, tenant=opt.tenant, salt=opt.salt,
                                                        priority=opt.klass)
                return await self._stream(rp, opt, sent)
            except EngineBusy:  # another ingress replica filled it: wait, do not fail the page
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.busy_backoff_max_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the replica failed (died, restarting)
                failures += 1
                logger.warning("page %d of %s: engine call failed (%s), try %d", rp.row["page_index"],
                               rp.row.get("source_uri"), type(e).__name__, failures)
                if failures >= 2:
                    metrics.get().page_unrun(status.ENGINE_UNAVAILABLE)
                    return rows.error_row(rp.row, status.ENGINE_UNAVAILABLE, "the engine failed while parsing "
                                                                             "this page")
                await asyncio.sleep(self.retry_wait_s)

    async def _stream(self, rp: PageRow, opt: RunOptions, sent: set[tuple[str, int]]) -> dict:
        """The page's row from the engine's event stream, each event not ``sent`` yet passed to the sink."""
        row = None
        events = self.engine.stream_page(rp.row, rp.image, tenant=opt.tenant, salt=opt.salt, priority=opt.klass)
        async with contextlib.aclosing(events):
            async for ev in events:
                if ev["event"] == "row":
                    row = ev["row"]
                elif (ev["event"], ev["order"]) not in sent:
                    sent.add((ev["event"], ev["order"]))
                    opt.on_event(ev)
        if row is None:
            raise RuntimeError("the engine's event stream ended without the page's row")
        return row

    async def pages(self, doc: Document, opt: RunOptions) -> AsyncIterator[DocumentOpened | dict]:
        """Yields the :class:`DocumentOpened` (its ``pages``: those selected, less ``opt.skip``) then one
        finished page row per page as pages finish. Leaving early cancels the rendering (its renderer
        is killed) and the engine work of every page still running."""
        cfg = self.cfg
        base = dict(run_id=opt.run_id, uri=doc.name, doc_id=doc_id_of(doc.data), mode=opt.mode,
                    model_id=cfg.served_model_id)
        out: asyncio.Queue = asyncio.Queue()
        done = object()
        tasks: set[asyncio.Task] = set()
        held = 0  # of self.reserved: this document's interactive pages not yet finished

        async def run(rp: PageRow) -> None:
            row = await self._call(rp, opt)
            if opt.images:
                row = {**row, "image_url": await asyncio.to_thread(png_data_url, rp.image)}
            await out.put(row)

        def release(_t: asyncio.Task) -> None:  # a done callback: runs even for a task cancelled unstarted
            self.gate.release(opt.tenant, opt.klass)

        async def feed() -> None:
            try:
                render = self.pools[opt.klass].render(
                    doc.data, doc.name, page_choice(opt.wanted, opt.max_pages), self._render, cfg.image_encoding,
                    base, max_frames=cfg.limits.max_image_frames, skip=opt.skip, tenant=opt.tenant)
                async with contextlib.aclosing(render) as items:
                    async for item in items:
                        if isinstance(item, PageRow) and item.rendered:
                            await self.gate.acquire(opt.tenant, opt.klass)
                            t = asyncio.create_task(run(item))
                            tasks.add(t)
                            t.add_done_callback(tasks.discard)
                            t.add_done_callback(release)
                        elif isinstance(item, PageRow):  # its rendering failed: its row, counted once here
                            metrics.get().render_failed(item.row["status"])
                            await out.put(item.row)
                        else:  # the document opened, or failed
                            await out.put(item)
                await asyncio.gather(*list(tasks))
            except Exception as e:  # noqa: BLE001 - a bug in rendering is this document's failure
                logger.exception("document %s: rendering failed", doc.name)
                await out.put(DocFailed(status.RENDER_FAILED, type(e).__name__))
            finally:
                await out.put(done)

        feeder = asyncio.create_task(feed())
        try:
            while True:
                item = await out.get()
                if item is done:
                    break
                if isinstance(item, DocFailed):
                    metrics.get().document_error(item.code)
                    raise Refusal(item.code, item.message)
                if opt.klass == INTERACTIVE:
                    if isinstance(item, DocumentOpened):
                        self._reserve(len(item.pages))
                        held = len(item.pages)
                    elif held:
                        self.reserved -= 1
                        held -= 1
                yield item
        finally:
            self.reserved -= held
            feeder.cancel()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(feeder, *list(tasks), return_exceptions=True)

    async def parse_all(self, doc: Document, opt: RunOptions) -> tuple[list[dict], int | None]:
        """Every selected page's row (by page index) and the document's page count."""
        got, count = [], None
        async with contextlib.aclosing(self.pages(doc, opt)) as gen:
            async for item in gen:
                if isinstance(item, DocumentOpened):
                    count = item.page_count
                else:
                    got.append(item)
        return sorted(got, key=lambda r: r["page_index"]), count

    async def count_pages(self, doc: Document, wanted, max_pages: int, tenant: str) -> DocumentOpened:
        """Open the document (nothing rendered): its page count and selection, or its error."""
        opened = None
        async with contextlib.aclosing(self.pools[BATCH].render(
                doc.data, doc.name, page_choice(wanted, max_pages), self._render, self.cfg.image_encoding, {},
                max_frames=self.cfg.limits.max_image_frames, count_only=True, tenant=tenant)) as items:
            async for item in items:
                if isinstance(item, DocFailed):
                    raise Refusal(item.code, item.message)
                if isinstance(item, DocumentOpened):
                    opened = item
        if opened is None:
            raise Refusal(status.RENDER_FAILED, "the document could not be opened")
        return opened


#: seconds a request refused as ``overloaded`` is told to wait (its Retry-After)
OVERLOADED_RETRY_S = 2


def _overloaded() -> Refusal:
    return Refusal(status.OVERLOADED, "every engine replica is at capacity; retry later",
                   retry_after=OVERLOADED_RETRY_S)


def result(served_model: str, name: str, page_rows: list[dict], count: int | None, mode: str) -> dict:
    """The JSON answer of /v1/parse (and of a job's result)."""
    ok = sum(r["status"] == status.OK for r in page_rows)
    return {
        "status": document_status(page_rows), "model": served_model, "mode": mode,
        "document": {"name": name, "doc_id": page_rows[0]["doc_id"] if page_rows else None, "page_count": count,
                     "pages_selected": len(page_rows), "pages_ok": ok, "pages_failed": len(page_rows) - ok},
        "pages": [row_json(r) for r in page_rows],
    }


def markdown(result_: dict) -> str:
    """A result as one Markdown text, each page after a comment with its number and status."""
    return "\n\n".join(f"<!-- page {p['page_index'] + 1}: {p['status']} -->\n\n{p.get('markdown') or ''}"
                       for p in result_["pages"])
