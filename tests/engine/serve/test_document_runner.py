"""The online service's document runner and fair gate, in-process (no Ray, no HTTP): real renderer
processes, a real PageHost on the no-op engine behind the EngineClient interface, and faults
(a busy engine, a failing one, a slow one) wrapped around it; region events (``on_event``) on the
real CPU engine, teacher-forced."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import os

import pytest

from padoc_ray import status
from padoc_ray.groundtruth import load_truth
from padoc_ray.host import HostConfig, PageHost, parse_row, stream_row
from padoc_ray.protocol.render import SEPARATOR
from padoc_ray.raster import RendererConfig
from padoc_ray.raster.document import DocumentOpened
from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve.documents import RenderPool
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.fair import FairGate
from padoc_ray.serve.runner import BATCH, INTERACTIVE, Document, DocumentRunner, EngineBusy, RunOptions
from tests.helpers.pdf_factory import text_pdf

from tests.conftest import ROOT


# ---- the gate ---------------------------------------------------------------------------------------------
def _order(gate: FairGate, arrivals: list[tuple[str, int]]) -> list[str]:
    """Who gets the gate's single slot, in order, when ``arrivals`` (tenant, class) all wait at once."""
    got: list[str] = []

    async def go():
        await gate.acquire("holder")  # hold the only slot while everyone queues

        async def one(tenant, klass, i):
            async with gate.slot(tenant, klass):
                got.append(f"{tenant}{i}")
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(one(t, k, i)) for i, (t, k) in enumerate(arrivals)]
        await asyncio.sleep(0)
        gate.release("holder")
        await asyncio.gather(*tasks)

    asyncio.run(go())
    return got


def test_gate_takes_tenants_in_turn_and_interactive_first():
    arrivals = [("a", BATCH)] * 4 + [("b", BATCH)] * 2 + [("c", INTERACTIVE)]
    got = _order(FairGate(1), arrivals)
    # c's interactive page first; then a and b alternate, whatever the arrival order
    assert got == ["c6", "a0", "b4", "a1", "b5", "a2", "a3"]


def test_gate_caps_a_tenant_and_loses_no_slot_to_cancelled_waiters():
    async def go():
        gate = FairGate(3, per_tenant=2)
        await gate.acquire("a")
        await gate.acquire("a")
        blocked = asyncio.create_task(gate.acquire("a"))  # a is at its cap: waits though a slot is free
        await asyncio.sleep(0)
        assert not blocked.done() and gate.held == 2
        await asyncio.wait_for(gate.acquire("b"), 1)  # b is not held up by a's waiter
        waiters = [asyncio.create_task(gate.acquire("c")) for _ in range(20)]
        await asyncio.sleep(0)
        for w in waiters[::2]:
            w.cancel()
        gate.release("a")  # a's waiter, first in line, gets it
        await asyncio.wait_for(blocked, 1)
        gate.release("b")  # then the c waiters one by one
        got = 0
        for w in waiters[1::2]:
            await asyncio.wait_for(w, 1)
            got += 1
            gate.release("c")
        await asyncio.gather(*waiters, return_exceptions=True)
        assert got == 10 and gate.waiting() == 0 and gate.held == 2  # a's two

    asyncio.run(go())


# ---- the runner ---------------------------------------------------------------------------------------------
class HostEngine:
    """EngineClient over an in-process PageHost (no-op engine), recording every call, with faults."""

    def __init__(self, host: PageHost, *, busy: int = 0, fail: int = 0, hold: asyncio.Event | None = None,
                 die_after: int | None = None):
        """``die_after``: the first event stream fails (the replica died) after that many events."""
        self.host, self.busy, self.fail, self.hold, self.die_after = host, busy, fail, hold, die_after
        self.calls: list[tuple[str, int, int]] = []  # (tenant, page, priority) in call order
        self.running = self.most = self.cancelled = 0

    async def parse_page(self, row, image, *, tenant, salt, priority):
        if self.busy > 0:
            self.busy -= 1
            raise EngineBusy()
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("replica died")
        self.calls.append((tenant, row["page_index"], priority))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if self.hold is not None:
                await self.hold.wait()
            return await parse_row(self.host, row, image, tenant=tenant, salt=salt, priority=priority)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def stream_page(self, row, image, *, tenant, salt, priority):
        if self.busy > 0:
            self.busy -= 1
            raise EngineBusy()
        self.calls.append((tenant, row["page_index"], priority))
        n = 0
        async with contextlib.aclosing(stream_row(self.host, row, image, tenant=tenant, salt=salt,
                                                  priority=priority)) as events:
            async for ev in events:
                if n == self.die_after:
                    self.die_after = None
                    raise RuntimeError("replica died mid-page")
                n += 1
                yield ev


@pytest.fixture
def harness(tiny_model_dir):
    """(make_runner, engine) on one event loop per test: make_runner(engine, capacity, max_waiting)."""
    cfg = ServeConfig(model=tiny_model_dir, host=HostConfig(engine="noop"))
    pools = {INTERACTIVE: RenderPool(RendererConfig(), 1), BATCH: RenderPool(RendererConfig(), 1)}

    def make(engine, capacity: int = 4, max_waiting: int = 64) -> DocumentRunner:
        return DocumentRunner(cfg, engine, pools, FairGate(capacity), max_waiting=max_waiting, busy_backoff_s=0.01,
                              busy_backoff_max_s=0.04, retry_wait_s=0.01)

    yield cfg, make
    for p in pools.values():
        p.close()


async def _host(cfg) -> PageHost:
    return await PageHost.from_config(cfg.model, cfg.host)


def _opt(tenant="t", klass=INTERACTIVE, pages=None, max_pages=100, skip=frozenset()) -> RunOptions:
    return RunOptions(wanted=pages, mode="fork", max_pages=max_pages, tenant=tenant, salt="s", run_id="r",
                      klass=klass, skip=skip)


def test_pages_wait_for_a_busy_engine_instead_of_failing_overloaded(harness):
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        engine = HostEngine(host, busy=25)  # Serve's backpressure on 25 calls
        rows, count = await make(engine, capacity=2).parse_all(Document(text_pdf(12), "doc.pdf"), _opt())
        host.shutdown()
        return rows, count, engine

    rows, count, engine = asyncio.run(go())
    assert count == 12 and [r["page_index"] for r in rows] == list(range(12))
    assert {r["status"] for r in rows} == {status.OK}  # none `overloaded`
    assert engine.most <= 2  # never more pages at the engine than the gate's capacity
    assert engine.busy == 0  # every one of the 25 busy answers was waited out


def test_a_burst_is_refused_at_admission_and_every_admitted_page_finishes(harness):
    """Capacity 1 + 1 waiting: two one-page requests are admitted (their documents opened), a third
    is refused `overloaded` before any of its pages runs, and the admitted ones all end ok. A
    document larger than the whole allowance is admitted once nothing else holds it."""
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        hold = asyncio.Event()
        engine = HostEngine(host, hold=hold)
        runner = make(engine, capacity=1, max_waiting=1)
        a = asyncio.create_task(runner.parse_all(Document(text_pdf(1), "a.pdf"), _opt("a")))
        b = asyncio.create_task(runner.parse_all(Document(text_pdf(1), "b.pdf"), _opt("b")))
        while runner.reserved < 2:
            await asyncio.sleep(0.01)
        refused = []
        for doc in (Document(text_pdf(1), "c.pdf"), Document(text_pdf(5), "big.pdf")):
            with pytest.raises(Refusal) as e:
                await runner.parse_all(doc, _opt("c"))
            refused.append(e.value)
        calls_while_full = list(engine.calls)
        hold.set()
        got = await asyncio.gather(a, b)
        alone, _ = await runner.parse_all(Document(text_pdf(5), "big.pdf"), _opt("c"))
        host.shutdown()
        return refused, calls_while_full, got, alone, runner.reserved

    refused, calls, got, alone, reserved = asyncio.run(go())
    assert [(e.code, e.status) for e in refused] == [(status.OVERLOADED, 503)] * 2
    assert {c[0] for c in calls} <= {"a", "b"}  # nothing of the refused requests reached the engine
    assert all(r["status"] == status.OK for rows, _ in got for r in rows)
    assert [r["status"] for r in alone] == [status.OK] * 5 and reserved == 0


def test_an_interactive_page_overtakes_a_waiting_job(harness):
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        hold = asyncio.Event()
        engine = HostEngine(host, hold=hold)
        runner = make(engine, capacity=1)
        job = asyncio.create_task(runner.parse_all(Document(text_pdf(6), "job.pdf"), _opt("a", BATCH)))
        while not engine.calls:
            await asyncio.sleep(0.01)
        while runner.gate.waiting(BATCH) < 1:  # the job's next page waits for the slot
            await asyncio.sleep(0.01)
        one = asyncio.create_task(runner.parse_all(Document(text_pdf(1), "one.pdf"), _opt("b", INTERACTIVE)))
        while runner.gate.waiting(INTERACTIVE) < 1:
            await asyncio.sleep(0.01)
        hold.set()
        await asyncio.gather(job, one)
        host.shutdown()
        return engine.calls

    calls = asyncio.run(go())
    # the job's first page held the slot; b's page came next, before the job's 5 others
    assert calls[0][:1] == ("a",) and calls[1] == ("b", 0, INTERACTIVE)
    assert [c[0] for c in calls[2:]] == ["a"] * 5 and all(c[2] == BATCH for c in calls if c[0] == "a")


def test_a_failed_replica_gets_one_more_try_then_the_page_says_so(harness):
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        once = await make(HostEngine(host, fail=1), capacity=1).parse_all(Document(text_pdf(1), "a.pdf"), _opt())
        twice = await make(HostEngine(host, fail=2), capacity=1).parse_all(Document(text_pdf(1), "b.pdf"), _opt())
        host.shutdown()
        return once[0], twice[0]

    once, twice = asyncio.run(go())
    assert once[0]["status"] == status.OK
    assert twice[0]["status"] == status.ENGINE_UNAVAILABLE


def test_a_page_that_fails_inside_a_request_makes_the_document_partial(harness):
    """Page 1 of 2 loses its replica twice (ENGINE_UNAVAILABLE), page 2 parses: /v1/parse's answer says
    ``partial``, with one page ok and one failed, each page row carrying its own status."""
    from padoc_ray.serve.runner import result

    cfg, make = harness

    async def go():
        host = await _host(cfg)
        rows, count = await make(HostEngine(host, fail=2), capacity=1).parse_all(Document(text_pdf(2), "a.pdf"),
                                                                                   _opt())
        host.shutdown()
        return rows, count

    rows, count = asyncio.run(go())
    answer = result("m", "a.pdf", rows, count, "fork")
    assert answer["status"] == status.DOC_PARTIAL
    assert answer["document"] | {"doc_id": None} == {"name": "a.pdf", "doc_id": None, "page_count": 2,
                                                     "pages_selected": 2, "pages_ok": 1, "pages_failed": 1}
    assert sorted(p["status"] for p in answer["pages"]) == sorted([status.OK, status.ENGINE_UNAVAILABLE])


def test_leaving_early_cancels_the_engine_work_and_frees_the_slots(harness):
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        hold = asyncio.Event()
        engine = HostEngine(host, hold=hold)
        runner = make(engine, capacity=3)
        seen = []
        async with contextlib.aclosing(runner.pages(Document(text_pdf(10), "a.pdf"), _opt())) as gen:
            async for item in gen:
                seen.append(item)
                while engine.running < 3:
                    await asyncio.sleep(0.01)
                break  # the client went away with 3 pages at the engine and 7 to go
        assert isinstance(seen[0], DocumentOpened)
        held = runner.gate.held
        later = await make(HostEngine(host), capacity=3).parse_all(Document(text_pdf(2), "b.pdf"), _opt())
        host.shutdown()
        return engine, held, later[0]

    engine, held, later = asyncio.run(go())
    assert engine.cancelled == 3 and engine.running == 0 and len(engine.calls) == 3
    assert held == 0  # every slot back
    assert [r["status"] for r in later] == [status.OK, status.OK]


def test_a_job_taken_over_parses_only_its_missing_pages(harness):
    cfg, make = harness

    async def go():
        host = await _host(cfg)
        engine = HostEngine(host)
        got = [item async for item in make(engine).pages(Document(text_pdf(5), "a.pdf"),
                                                         _opt(klass=BATCH, skip=frozenset({0, 2})))]
        host.shutdown()
        return got, engine

    got, engine = asyncio.run(go())
    assert isinstance(got[0], DocumentOpened) and list(got[0].pages) == [1, 3, 4]
    assert sorted(r["page_index"] for r in got[1:]) == [1, 3, 4]
    assert sorted(c[1] for c in engine.calls) == [1, 3, 4]


def test_job_pages_never_take_more_than_their_share_of_the_engine():
    """A class cap: with 4 slots and job pages capped at 2, a job's pages hold 2 slots at most, and
    interactive pages get the other 2 at once."""
    async def go():
        gate = FairGate(4, class_caps={BATCH: 2})
        for _ in range(2):
            await asyncio.wait_for(gate.acquire("a", BATCH), 1)
        third = asyncio.create_task(gate.acquire("a", BATCH))
        await asyncio.sleep(0)
        assert not third.done() and gate.held == 2  # free slots, but not for job pages
        for _ in range(2):
            await asyncio.wait_for(gate.acquire("b", INTERACTIVE), 1)
        gate.release("a", BATCH)
        await asyncio.wait_for(third, 1)
        assert gate.held == 4

    asyncio.run(go())


def test_job_pages_shrink_to_their_yield_cap_while_interactive_pages_come_and_grow_back_after_the_hold():
    """8 slots, jobs capped at 6 alone and at 2 beside interactive pages, a 0.2 s hold: a job fills 6;
    once an interactive page comes, freed job slots are not refilled past 2 (none is taken away);
    0.2 s after the last interactive page, the job's waiters get their 6 again without any release."""
    now = [0.0]

    async def go():
        gate = FairGate(8, class_caps={BATCH: 6}, yield_caps={BATCH: 2}, yield_hold_s=0.2, clock=lambda: now[0])
        for _ in range(6):
            await asyncio.wait_for(gate.acquire("a", BATCH), 1)
        assert gate.cap(BATCH) == 6
        await asyncio.wait_for(gate.acquire("b", INTERACTIVE), 1)  # a free slot at once
        assert gate.cap(BATCH) == 2 and gate.held == 7
        waiters = [asyncio.create_task(gate.acquire("a", BATCH)) for _ in range(6)]
        for _ in range(4):  # four job pages finish: 2 still held, so no waiter gets a slot
            gate.release("a", BATCH)
        await asyncio.sleep(0)
        assert gate.held == 2 + 1 and not any(w.done() for w in waiters)
        gate.release("a", BATCH)  # one job page left: a waiter takes the second of the job's 2
        await asyncio.sleep(0)
        assert sum(w.done() for w in waiters) == 1
        gate.release("b", INTERACTIVE)  # the interactive page finished: the hold starts
        now[0] += 0.1
        gate.release("a", BATCH)
        await asyncio.sleep(0)
        assert sum(w.done() for w in waiters) == 2 and gate.cap(BATCH) == 2  # still within the hold
        now[0] += 0.2  # the hold is over; the gate's own timer grants (no slot frees meanwhile)
        await asyncio.wait_for(asyncio.gather(*waiters), 2)
        assert gate.cap(BATCH) == 6 and gate.held == 6

    asyncio.run(go())


def test_a_yield_cap_is_refused_for_the_first_class_and_below_one():
    with pytest.raises(ValueError, match="class 0 goes first"):
        FairGate(4, yield_caps={INTERACTIVE: 1})
    with pytest.raises(ValueError, match="class caps must be >= 1"):
        FairGate(4, yield_caps={BATCH: 0})
    with pytest.raises(ValueError, match="yield_hold_s"):
        FairGate(4, yield_caps={BATCH: 1}, yield_hold_s=-1)


# ---- region events and page images --------------------------------------------------------------------------
def test_a_streamed_run_without_regions_and_page_images(harness):
    """The no-op engine's pages have no regions: a run with a sink gets no event and every row (after
    Serve's backpressure); ``images`` gives each row its page image as a PNG data URL of its size."""
    from PIL import Image

    cfg, make = harness

    async def go():
        host = await _host(cfg)
        engine = HostEngine(host, busy=3)
        events = []
        opt = dataclasses.replace(_opt(), on_event=events.append, images=True)
        rows, _ = await make(engine).parse_all(Document(text_pdf(2), "a.pdf"), opt)
        host.shutdown()
        return rows, events, engine

    rows, events, engine = asyncio.run(go())
    assert [r["status"] for r in rows] == [status.OK] * 2 and events == [] and len(engine.calls) == 2
    for r in rows:
        head, data = r["image_url"].split(",", 1)
        assert head == "data:image/png;base64"
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        assert img.format == "PNG" and img.size == (r["image_width"], r["image_height"])


@pytest.mark.engine
def test_region_events_reach_the_sink_once_each_before_their_page(harness, cpu_engine, model_protocol, loop_thread,
                                                                  tiny_model_dir):
    """report.pdf on the real engine, teacher-forced, with the replica dying mid-page on the first
    try: every region's box once, before its content, once; a page's events all before its row; the
    blocks rebuild the row's Markdown; the retried page sends nothing twice."""
    cfg, make = harness
    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    host = PageHost(tiny_model_dir, HostConfig(), truth=truth, engine=cpu_engine, model_protocol=model_protocol)
    with open(os.path.join(ROOT, "examples", "report.pdf"), "rb") as f:
        doc = Document(f.read(), "report.pdf")
    seen: list[tuple[str, dict]] = []  # ("event" | "row", item), in the order the client sees them
    engine = HostEngine(host, die_after=3)

    async def go():
        await host.start()
        opt = dataclasses.replace(_opt(), on_event=lambda ev: seen.append(("event", ev)))
        async for item in make(engine).pages(doc, opt):
            if isinstance(item, dict):
                seen.append(("row", item))

    loop_thread.run(go(), timeout=600)
    rows = [item for kind, item in seen if kind == "row"]
    assert sorted(r["page_index"] for r in rows) == [0, 1] and all(r["status"] == status.OK for r in rows)
    assert len(engine.calls) == 3  # one page was tried twice
    for row in rows:
        i = row["page_index"]
        at_row = seen.index(("row", row))
        mine = [(k, ev) for k, (kind, ev) in enumerate(seen) if kind == "event" and ev["page_index"] == i]
        assert mine and all(k < at_row for k, _ in mine)  # every event of the page before its row
        keys = [(ev["event"], ev["order"]) for _, ev in mine]
        assert len(keys) == len(set(keys))  # nothing twice, the retried page's neither
        n = len(row["regions"])
        assert n > 0 and sorted(o for e, o in keys if e == "region") == list(range(n))
        assert sorted(o for e, o in keys if e == "content") == list(range(n))
        assert all(keys.index(("region", o)) < keys.index(("content", o)) for o in range(n))
        blocks = {ev["order"]: ev["markdown"] for _, ev in mine if ev["event"] == "content"}
        text = [blocks[o] for o in range(n) if blocks[o] is not None]
        assert SEPARATOR.join(text) + "\n" == row["markdown"]
