"""NDJSON answers of ``POST /v1/parse?stream=true``: a ``document`` line once the document is open, a
``page`` line per page as it finishes, and a final ``result`` line.

A document that cannot be parsed gets its error status before anything is streamed (the first item
is awaited before the response starts). Pages not finished by the request's deadline get
``request_timeout`` lines, so every selected page has a line.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator

from padoc_ray import metrics, status
from padoc_ray.serve.documents import document_status, row_json
from padoc_ray.serve.runner import Document, DocumentRunner, RunOptions


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def page_lines(runner: DocumentRunner, doc: Document, opt: RunOptions, budget: float) -> AsyncIterator[str]:
    """Opens the document (raising its BadRequest before the first line), then returns the lines."""
    gen = runner.pages(doc, opt)
    deadline = time.monotonic() + budget
    try:
        first = await asyncio.wait_for(anext(gen), budget)
    except BaseException:
        await gen.aclose()
        raise

    async def lines() -> AsyncIterator[str]:
        got: list[dict] = []
        try:
            yield line({"type": "document", "name": doc.name, "page_count": first.page_count,
                        "pages_selected": len(first.pages)})
            while True:
                try:
                    row = await asyncio.wait_for(anext(gen), max(0.0, deadline - time.monotonic()))
                except StopAsyncIteration:
                    break
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
                got.append(row)
                yield line({"type": "page", **row_json(row)})
            yield line({"type": "result", "status": document_status(got), "pages": len(got)})
        finally:
            await gen.aclose()

    return lines()
