"""NDJSON answers of ``POST /v1/parse?stream=true``: a ``document`` line once the document is open, a
``page`` line per page as it finishes, and a final ``result`` line.

``stream=regions`` adds the pages' region events (:meth:`padoc_ray.host.PageHost.events`), each as
its own line as the engine makes it: ``{"event": "region", "page_index", "order", "bbox",
"category"}`` when the layout stream closes a region, ``{"event": "content", "page_index", "order",
"markdown"}`` when its branch finishes. A page's event lines come before its page line.

A document that cannot be parsed gets its error status before anything is streamed (the first item
is awaited before the response starts). Pages not finished by the request's deadline get
``request_timeout`` lines, so every selected page has a line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import AsyncIterator

from padoc_ray import metrics, status
from padoc_ray.serve import errors
from padoc_ray.serve.documents import document_status, row_json
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.runner import Document, DocumentRunner, RunOptions


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


#: ``stream=`` values: FastAPI's spellings of a bool (no stream / a line per page), and ``regions``
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
PAGES, REGIONS = "pages", "regions"


def stream_mode(value: str | None) -> str | None:
    """``stream=`` of a request: None (one JSON answer), :data:`PAGES` or :data:`REGIONS`."""
    v = (value or "false").strip().lower()
    if v in _FALSE:
        return None
    if v in _TRUE:
        return PAGES
    if v == REGIONS:
        return REGIONS
    raise Refusal(errors.INVALID_REQUEST, "stream is true, false or regions")


async def page_lines(runner: DocumentRunner, doc: Document, opt: RunOptions, budget: float, *,
                     regions: bool = False) -> AsyncIterator[str]:
    """Opens the document (raising its :class:`~padoc_ray.serve.errors.Refusal` before the first line),
    then returns the lines (with the region event lines when ``regions``)."""
    items: asyncio.Queue = asyncio.Queue()  # ("event", dict) | ("row", dict) | ("error", exc) | ("end", None)
    if regions:
        opt = dataclasses.replace(opt, on_event=lambda ev: items.put_nowait(("event", ev)))
    gen = runner.pages(doc, opt)
    deadline = time.monotonic() + budget
    try:
        first = await asyncio.wait_for(anext(gen), budget)
    except BaseException:
        await gen.aclose()
        raise

    async def pump() -> None:
        """The rows after the first item into ``items``, behind the events the sink put there before them."""
        try:
            async for row in gen:
                items.put_nowait(("row", row))
        except Exception as e:  # noqa: BLE001 - re-raised by lines()
            items.put_nowait(("error", e))
        items.put_nowait(("end", None))

    async def lines() -> AsyncIterator[str]:
        got: list[dict] = []
        pumping = asyncio.create_task(pump())
        try:
            yield line({"type": "document", "name": doc.name, "page_count": first.page_count,
                        "pages_selected": len(first.pages)})
            while True:
                try:
                    kind, item = await asyncio.wait_for(items.get(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    seen = {r["page_index"] for r in got}
                    for i in first.pages:
                        if i not in seen:
                            r = {"page_index": i, "status": status.REQUEST_TIMEOUT,
                                 "error_code": status.REQUEST_TIMEOUT,
                                 "error_message": f"not finished within {budget:g} s", "markdown": None}
                            metrics.get().page_unrun(status.REQUEST_TIMEOUT)
                            got.append(r)
                            yield line({"type": "page", **r})
                    break
                if kind == "end":
                    break
                if kind == "error":
                    raise item
                if kind == "event":
                    yield line(item)
                    continue
                got.append(item)
                yield line({"type": "page", **row_json(item)})
            yield line({"type": "result", "status": document_status(got), "pages": len(got)})
        finally:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            await gen.aclose()

    return lines()
