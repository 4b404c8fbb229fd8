"""The service's render pool (issue 28): fair turns between tenants (its
:class:`~padoc_ray.serve.fair.FairGate`, tested on its own in test_serve_runner), and a consumer that leaves
mid-page kills its renderer at once. In-process (asyncio, renderer processes, no Ray).

The "draw bomb" is a small PDF of nested form XObjects (:func:`tests.pdf_factory.form_bomb_pdf`):
about 600,000 draws a page, under the default page draw limit, so each page renders for seconds."""

from __future__ import annotations

import asyncio
import contextlib

import psutil
import pytest

from padoc_ray.pdf import RenderConfig
from padoc_ray.raster import DocFailed, RendererConfig
from padoc_ray.raster.document import DocumentOpened, PageChoice, PageRow
from padoc_ray.serve.documents import RenderPool

from tests.helpers.pdf_factory import annotation_bomb_page, drawn_pdf, form_bomb_pdf, text_pdf

BASE = dict(run_id="request", uri="x.pdf", doc_id=None, mode="layout", model_id="tiny")
BOMB = form_bomb_pdf(pages=3, depth=6, fanout=9)  # 9 + 81 + ... + 9**6 draws a page, a 2 KB file


def _render(pool: RenderPool, data: bytes, tenant: str):
    return pool.render(data, "x.pdf", PageChoice(), RenderConfig(), "zstd", BASE, max_frames=10, tenant=tenant)


async def _until(cond, what: str, tries: int = 6000) -> None:
    """Wait for ``cond()`` (a state the test drives to), failing with ``what`` if it never comes."""
    for _ in range(tries):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _statuses(items) -> list:
    return [i.row["status"] if isinstance(i, PageRow) else type(i).__name__ for i in items]


# ---- the pool, with renderer processes ------------------------------------------------------------------
def test_one_tenants_bombs_do_not_hold_up_another_tenants_page():
    """2 workers, 1 per tenant: tenant a's two bombs take one worker (the second waits its turn),
    and b's one-page document renders on the other and is done while a's are not."""
    async def go():
        pool = RenderPool(RendererConfig(), 2, per_tenant=1)
        finished: list[str] = []
        seen: dict[str, list] = {"a1": [], "a2": [], "b": []}

        async def doc(name: str, data: bytes, tenant: str) -> None:
            async with contextlib.aclosing(_render(pool, data, tenant)) as items:
                async for item in items:
                    seen[name].append(item)
            finished.append(name)

        try:
            bombs = [asyncio.create_task(doc(n, BOMB, "a")) for n in ("a1", "a2")]
            await _until(lambda: seen["a1"] and pool.slots.waiting() == 1 and pool.slots.held_by("a") == 1,
                         "a1 renders, a2 waits")
            await asyncio.wait_for(doc("b", text_pdf(1), "b"), 120)
            assert finished == ["b"]  # neither of a's bombs had finished
            assert _statuses(seen["b"]) == ["DocumentOpened", None]
            assert seen["a2"] == []  # a's second bomb never started: a held its one worker
            for t in bombs:
                t.cancel()
            await asyncio.gather(*bombs, return_exceptions=True)
            assert pool.slots.held == 0 and pool.slots.waiting() == 0
        finally:
            pool.close()

    asyncio.run(go())


def test_two_tenants_annotation_bombs_are_refused_and_a_third_tenants_page_does_not_wait():
    """The review's repro on the pool Serve renders with: tenants b and c each send a page whose annotation
    appearance draws a 6-level form tree (1,111,111 draws, none in the page's content; it rendered 5 s a
    page and held both renderers, so tenant a's one-page memo took 10.3 s instead of 0.03 s). The draw
    counter now counts appearance streams: both bombs get page_too_complex without being rendered, and a's
    page renders on a renderer they freed."""
    from functools import partial

    bomb = drawn_pdf(partial(annotation_bomb_page, depth=6))

    async def go():
        pool = RenderPool(RendererConfig(), 2, per_tenant=1)
        try:
            async def doc(data: bytes, tenant: str) -> list:
                async with contextlib.aclosing(_render(pool, data, tenant)) as items:
                    return [i async for i in items]

            b, c, a = await asyncio.wait_for(asyncio.gather(doc(bomb, "b"), doc(bomb, "c"), doc(text_pdf(1), "a")),
                                             120)
            assert _statuses(b) == _statuses(c) == ["DocumentOpened", "page_too_complex"]
            assert "appearance" in b[1].row["error_message"]
            assert _statuses(a) == ["DocumentOpened", None]
            assert all(r.restarts == 0 for r in pool.renderers)  # refused, not killed at a deadline
        finally:
            pool.close()

    asyncio.run(go())


def test_a_consumer_that_leaves_mid_page_kills_its_renderer_and_the_next_document_renders():
    async def go():
        pool = RenderPool(RendererConfig(), 1)
        try:
            got = []
            gen = _render(pool, BOMB, "a")
            got.append(await gen.__anext__())
            assert isinstance(got[0], DocumentOpened)  # page 0 is rendering now, for seconds
            (renderer,) = pool.renderers
            pid = renderer.pid
            assert psutil.Process(pid).is_running()
            await gen.aclose()  # the client left
            # the page's process was killed, not left to finish the page: nothing runs it any more
            assert renderer.cancels == 1 and renderer.pid is None and not psutil.pid_exists(pid)
            assert renderer.restarts == 0  # a cancel is neither a crash nor a time-out
            assert pool.slots.held == 0

            async with contextlib.aclosing(_render(pool, text_pdf(2), "b")) as items:
                rows = [i async for i in items]
            assert _statuses(rows) == ["DocumentOpened", None, None]
            assert pool.renderers == (renderer,) and renderer.pid not in (None, pid)  # a fresh process

            # the same when the consumer's task is cancelled (a deadline, a cancelled job)
            async def consume():
                async with contextlib.aclosing(_render(pool, BOMB, "a")) as items:
                    async for item in items:
                        got.append(item)

            task = asyncio.create_task(consume())
            await _until(lambda: len(got) == 2, "the second bomb opened")
            pid = renderer.pid
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert renderer.cancels == 2 and not psutil.pid_exists(pid)
            assert [type(i) for i in got] == [DocumentOpened, DocumentOpened]  # no row of a killed page
        finally:
            pool.close()

    asyncio.run(go())


def test_a_waiter_cancelled_in_the_pool_does_not_leak_its_worker():
    async def go():
        pool = RenderPool(RendererConfig(), 1)
        try:
            hog = _render(pool, BOMB, "a")
            assert isinstance(await hog.__anext__(), DocumentOpened)
            waiter = asyncio.create_task(_render(pool, text_pdf(1), "b").__anext__())
            await _until(lambda: pool.slots.waiting() == 1, "b waits for the one worker")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert pool.slots.waiting() == 0
            await hog.aclose()
            assert pool.slots.held == 0
            for tenant in ("b", "c"):  # the worker serves one document after another
                async with contextlib.aclosing(_render(pool, text_pdf(1), tenant)) as items:
                    assert _statuses([i async for i in items]) == ["DocumentOpened", None]
            assert pool.slots.held == 0
        finally:
            pool.close()

    asyncio.run(go())


def test_a_document_refused_before_rendering_frees_its_worker():
    async def go():
        pool = RenderPool(RendererConfig(), 1, per_tenant=1)
        try:
            for _ in range(2):
                async with contextlib.aclosing(_render(pool, b"not a pdf", "a")) as items:
                    got = [i async for i in items]
                assert len(got) == 1 and isinstance(got[0], DocFailed)
            assert pool.slots.held == 0
        finally:
            pool.close()

    asyncio.run(go())


def test_documents_of_no_named_tenant_are_not_capped_together():
    async def go():
        pool = RenderPool(RendererConfig(), 2, per_tenant=1)
        gens = [pool.render(BOMB, "x.pdf", PageChoice(), RenderConfig(), "zstd", BASE, max_frames=10)
                for _ in range(2)]
        try:
            for g in gens:  # both open at once: each is a tenant of its own
                assert isinstance(await asyncio.wait_for(g.__anext__(), 120), DocumentOpened)
            assert pool.slots.held == 2 and pool.slots.waiting() == 0
        finally:
            for g in gens:
                await g.aclose()
            pool.close()
        assert pool.slots.held == 0

    asyncio.run(go())
