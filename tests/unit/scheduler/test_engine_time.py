"""Engine time per page (issue 29): the engine's busy time split among the requests in it, a page's
``engine_s`` the sum of its requests' shares, the page rows' column and the batch summary's cost
figures. On the scripted engine with a scripted clock, so every figure is exact."""

from __future__ import annotations

import asyncio
import contextlib

import pyarrow as pa
import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.host import HostConfig, PageHost, PageRequest, error_record
from padoc_ray.output import rows
from padoc_ray.pipeline import ledger
from padoc_ray.pipeline.config import BatchConfig, OutputsConfig
from padoc_ray.pipeline.job import cost_summary
from padoc_ray.protocol import Box, Page, Region
from padoc_ray.scheduler import PageRecord, SchedulerConfig
from padoc_ray.scheduler.meter import EngineMeter

from tests.unit.scheduler.test_run_page import P, page


class Clock:
    """A scripted clock: time moves only when a test (or :class:`ClockedEngine`) moves it."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ClockedEngine:
    """A :class:`ScriptedEngine` on a scripted clock: each delta it delivers takes one unit per token
    (at least one), one delta at a time, however many requests are in it. Every unit passes while
    the request it belongs to is in the engine, so the busy time is exactly :attr:`worked`."""

    def __init__(self, clock: Clock, **kw):
        self.clock, self.inner, self.worked = clock, ScriptedEngine(**kw), 0.0

    async def generate(self, req):
        async with contextlib.aclosing(self.inner.generate(req)) as gen:
            async for d in gen:
                dt = float(max(1, len(d.token_ids)))
                self.clock.t += dt
                self.worked += dt
                yield d

    async def abort(self, request_ids):
        await self.inner.abort(request_ids)

    def num_unfinished_requests(self) -> int:
        return self.inner.num_unfinished_requests()

    def shutdown(self) -> None:
        self.inner.shutdown()


def clocked_host(clock: Clock, truth: dict, engine=None, **cfg) -> PageHost:
    h = PageHost("unused", HostConfig(**cfg), truth=truth, engine=engine or ClockedEngine(clock, chunk=2),
                 model_protocol=P)
    h.meter = EngineMeter(clock)
    asyncio.run(h.start())
    return h


def request(name: str, index: int = 0, mode: str | None = None) -> PageRequest:
    return PageRequest(doc_id=name.ljust(64, "0"), page_index=index, image="unused", width=80, height=100,
                       source_name=name, mode=mode)


# ---- the meter, by hand --------------------------------------------------------------------------------
def test_shares_split_each_interval_equally_among_the_requests_in_it():
    """A in the engine over [0, 10], B over [2, 4], C over [3, 8]: A alone 2 s, A+B 1 s, A+B+C 1 s,
    A+C 4 s, A alone 2 s."""
    clock = Clock()
    m = EngineMeter(clock)
    share = {}
    for t, what, rid in [(0, "begin", "A"), (2, "begin", "B"), (3, "begin", "C"), (4, "end", "B"),
                         (8, "end", "C"), (10, "end", "A")]:
        clock.t = t
        if what == "begin":
            m.begin(rid)
        else:
            share[rid] = m.end(rid)
    assert share["A"] == pytest.approx(2 + 1 / 2 + 1 / 3 + 4 / 2 + 2)
    assert share["B"] == pytest.approx(1 / 2 + 1 / 3)
    assert share["C"] == pytest.approx(1 / 3 + 4 / 2)
    assert sum(share.values()) == pytest.approx(m.busy_s()) and m.busy_s() == 10 and m.live == 0


def test_idle_time_is_nobody_s_and_busy_time_counts_the_open_interval():
    clock = Clock()
    m = EngineMeter(clock)
    m.begin("a")
    clock.t = 1.5
    assert m.end("a") == 1.5
    clock.t = 5.0  # idle: nobody is charged, the engine is not busy
    m.begin("b")
    clock.t = 6.0
    assert m.busy_s() == 2.5 and m.live == 1  # b's open second counts already
    clock.t = 7.0
    assert m.end("b") == 2.0 and m.busy_s() == 3.5


def test_the_meter_refuses_a_request_twice_and_one_it_never_had():
    m = EngineMeter(Clock())
    m.begin("x")
    with pytest.raises(ValueError, match="request x is already in the engine meter"):
        m.begin("x")
    m.end("x")
    with pytest.raises(ValueError, match="request x is not in the engine meter"):
        m.end("x")


# ---- pages on the scripted engine ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_a_page_alone_uses_all_the_engine_time(mode):
    clock = Clock()
    h = clocked_host(clock, {("a.pdf", 0): page(5)})
    rec = asyncio.run(h.parse(request("a.pdf", mode=mode)))
    assert rec.status == "ok" and rec.engine_s > 0
    assert rec.engine_s == pytest.approx(h.engine.worked, rel=1e-12) == pytest.approx(clock.t, rel=1e-12)
    assert h.stats()["engine_busy_s"] == pytest.approx(clock.t)


def test_concurrent_pages_engine_time_sums_to_the_engine_s_busy_time():
    """Twelve pages of 1 to 8 regions, both modes, eight in flight, at most five live branches, a
    token cap that some streams reach: the pages' engine_s add up to the engine's busy time, and an
    idle gap between two waves is in neither."""
    clock = Clock()
    truth = {(f"d{i}.pdf", 0): page(1 + i % 8, "text %d" + " more" * (i % 4)) for i in range(12)}
    h = clocked_host(clock, truth, pages_in_flight=8, max_live_branches=5,
                     scheduler=SchedulerConfig(max_tokens=40))

    async def wave(names):
        return await asyncio.gather(*(h.parse(request(n, mode="sequential" if k % 3 == 0 else None))
                                      for k, n in enumerate(names)))

    recs = asyncio.run(wave([f"d{i}.pdf" for i in range(6)]))
    clock.t += 100.0  # the engine idles
    recs += asyncio.run(wave([f"d{i}.pdf" for i in range(6, 12)]))
    assert h.meter.live == 0 and all(r.engine_s > 0 for r in recs)
    assert {r.status for r in recs} >= {"ok"} and any(r.status != "ok" for r in recs)  # some hit max_tokens
    busy = h.meter.busy_s()
    assert busy == pytest.approx(h.engine.worked, rel=1e-12) and clock.t == pytest.approx(busy + 100.0)
    assert sum(r.engine_s for r in recs) == pytest.approx(busy, rel=1e-9)
    assert h.engine.inner.max_live > 1  # requests overlapped
    by_regions = sorted(recs[6:], key=lambda r: r.n_branches)
    assert by_regions[-1].engine_s > by_regions[0].engine_s  # more branches, more engine time


def test_retried_and_stopped_requests_are_the_page_s_too():
    """A branch forced to loop and forked again: every attempt is in the page's engine_s. A page
    stopped at its branch cap: the requests aborted mid-stream are in it too."""
    clock = Clock()
    h = clocked_host(clock, {("a.pdf", 0): page(3)}, inject_loops=1.0,
                     scheduler=SchedulerConfig(max_tokens=200, branch_retries=1))
    rec = asyncio.run(h.parse(request("a.pdf")))
    assert rec.retries >= 1 and rec.engine_s == pytest.approx(clock.t, rel=1e-12) == pytest.approx(h.engine.worked)
    clock = Clock()
    h = clocked_host(clock, {("a.pdf", 0): page(8)}, engine=ClockedEngine(clock, chunk=1),
                     scheduler=SchedulerConfig(max_branches=2))
    rec = asyncio.run(h.parse(request("a.pdf")))
    assert rec.status == "branch_limit" and h.engine.inner.aborted  # live requests were stopped
    assert rec.engine_s == pytest.approx(clock.t, rel=1e-12) == pytest.approx(h.engine.worked)


def test_a_page_that_never_reached_the_engine_has_no_engine_time():
    clock = Clock()
    h = clocked_host(clock, {})
    rec = asyncio.run(h.parse(PageRequest(doc_id="e" * 64, page_index=0, image_bytes=b"not an image",
                                          source_name="x.png")))
    assert rec.status == "image_unreadable" and rec.engine_s is None and h.meter.busy_s() == 0


# ---- rows and the batch summary ------------------------------------------------------------------------
def _base(run_id="r", index=0) -> dict:
    return rows.base_row(run_id=run_id, uri="u.pdf", doc_id="d", page_index=index, page_count=3, mode="fork",
                         model_id="m")


def test_page_rows_carry_engine_s_and_an_unrun_page_has_none():
    page_ = Page(width=10, height=10, regions=(Region(category="title", box=Box(0.1, 0.2, 0.3, 0.4), content="T"),))
    ran = rows.page_row(_base(), PageRecord(page_id="p", mode="fork", status="ok", valid=True, page=page_,
                                            engine_s=0.25))
    unrun = rows.page_row(_base(index=1), error_record("p1", "fork", "image_unreadable", "bad"))
    t = rows.to_table([ran, unrun])
    assert t.schema.field("engine_s").type == pa.float32()
    assert t.column("engine_s").to_pylist() == [0.25, None]


def test_the_ledger_sums_this_run_s_engine_time_over_pages_that_reached_the_engine():
    rs = [{**_base("me", 0), "status": "ok", "engine_s": 1.5},
          {**_base("me", 1), "status": "ok", "engine_s": 2.5},
          {**_base("me", 2), "status": "image_unreadable"},  # never reached the engine: not a page that ran
          {**_base("me", -1), "status": "ok", "engine_s": 9.0},  # a document-level row is no page
          {**_base("earlier", 0), "source_uri": "v.pdf", "status": "ok", "engine_s": 7.0}]  # an earlier run's
    book = ledger.from_table(rows.to_table(rs), pa.array(["u.pdf", "v.pdf"]), run_id="me")
    assert (book.run_engine_pages, book.run_engine_s) == (2, 4.0)
    old = ledger.from_table(rows.to_table(rs).drop_columns(["engine_s"]), pa.array(["u.pdf"]), run_id="me")
    assert (old.run_engine_pages, old.run_engine_s) == (0, 0.0)  # an output written before the column


def test_cost_summary_prices_engine_seconds_per_page():
    assert cost_summary(4.0, 2, None) == {"engine_seconds": 4.0, "engine_seconds_per_page": 2.0}
    # 2 engine-s a page at $1.80 per GPU hour: 2 / 3600 * 1.8 = $0.001 a page, $1000 a million
    assert cost_summary(4.0, 2, 1.8) == {"engine_seconds": 4.0, "engine_seconds_per_page": 2.0,
                                         "usd_per_million_pages": 1000.0}
    assert cost_summary(0.0, 0, 1.8) == {"engine_seconds": 0.0, "engine_seconds_per_page": None,
                                         "usd_per_million_pages": None}


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_gpu_hour_price_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="gpu_hour_usd is a price per GPU hour > 0"):
        OutputsConfig(gpu_hour_usd=bad)


def test_gpu_hour_usd_flag_reaches_the_batch_config_and_its_summary_layout():
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.batch import config_from_args

    args = build_parser().parse_args(["parse", "--input", "in", "--output", "out", "--model", "m",
                                      "--gpu-hour-usd", "2.5"])
    cfg = config_from_args(args)
    assert cfg.outputs.gpu_hour_usd == 2.5 and cfg.flat()["gpu_hour_usd"] == 2.5
    assert BatchConfig.from_flat(input="in", output="out", model="m", gpu_hour_usd=2.5).outputs.gpu_hour_usd == 2.5
    plain = config_from_args(build_parser().parse_args(["parse", "--input", "in", "--output", "out", "--model", "m"]))
    assert plain.outputs.gpu_hour_usd is None


def test_serve_page_results_carry_engine_s():
    """/v1/parse's and a job's result: each page's JSON has the row's engine_s."""
    from padoc_ray.serve.runner import result

    page_ = Page(width=10, height=10)
    row = rows.page_row(_base(), PageRecord(page_id="p", mode="fork", status="ok", valid=True, page=page_,
                                            engine_s=0.125))
    (out,) = result("tiny", "u.pdf", [row], 1, "fork")["pages"]
    assert out["engine_s"] == 0.125
