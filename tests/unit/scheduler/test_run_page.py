"""Fast unit tests of the layout-fork scheduler on the scripted engine (the real engine has its own tests)."""

from __future__ import annotations

import asyncio

import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.engine.interface import EngineDeadError, EngineError
from padoc_ray.protocol import Box, Page, Region, quantized, serialize_padoc
from padoc_ray.scheduler import PageInput, SchedulerConfig, replay_input, run_page
from padoc_ray.scheduler.state import is_periodic

from tests.helpers.byte_protocol import ByteProtocol

P = ByteProtocol()
V = P.vocab


def page(n=4, content="region text %d") -> Page:
    regs = []
    for i in range(n):
        y = i / (n + 1)
        cat = "figure" if i == 2 else ("title" if i == 0 else "text_block")
        fmt = "none" if cat == "figure" else "text"
        regs.append(Region(category=cat, box=Box(0.1, y, 0.9, y + 0.05), content=None if fmt == "none" else content % i,
                           content_format=fmt))
    return Page(width=800, height=1000, regions=tuple(regs))


def base(pid="doc:0") -> PageInput:
    return PageInput(page_id=pid, image=None, width=800, height=1000, cache_salt="doc")


def run(engine, inp, mode="fork", **cfg):
    return asyncio.run(run_page(engine, P, inp, mode=mode, cfg=SchedulerConfig(**cfg)))


@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_replay_reproduces_the_page(mode):
    truth = page(6)
    eng = ScriptedEngine(chunk=3)
    rec = run(eng, replay_input(P, truth, base(), mode), mode)
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page == quantized(truth, V)
    if mode == "fork":
        assert rec.n_branches == 5  # the figure gets no branch (contentless)
        assert len(eng.requests) == 6
        assert rec.f_padoc < rec.f_seq
    else:
        assert rec.n_branches == 0 and len(eng.requests) == 1
    assert eng.num_unfinished_requests() == 0


def test_child_prompts_hold_exactly_the_ancestor_prefix():
    truth = page(5, content="SIBLING-%d")
    eng = ScriptedEngine(chunk=2)
    run(eng, replay_input(P, truth, base(), "fork"), "fork")
    s = serialize_padoc(V, P.tokenizer, truth)
    main, *children = eng.requests
    assert list(main.prompt_ids) == list(P.prompt_ids("fork"))
    by_index = {int(r.request_id.rsplit("/b", 1)[1]): r for r in children}
    for k, req in by_index.items():
        expect = [*P.prompt_ids("fork"), *s.layout[: s.fork_points[k]], V.branch_start]
        assert list(req.prompt_ids) == expect
        text = bytes(t for t in req.prompt_ids if t < 256)
        assert b"SIBLING" not in text  # no sibling content ...
        assert V.region_close not in req.prompt_ids[len(P.prompt_ids("fork")) + s.fork_points[k]:]  # ... no later layout
        assert req.image_uuid == main.image_uuid and req.cache_salt == main.cache_salt


def test_branch_limit_stops_the_page_and_leaves_nothing_live():
    eng = ScriptedEngine(chunk=1, token_delay_s=0.001)
    rec = run(eng, replay_input(P, page(8), base(), "fork"), "fork", max_branches=3)
    assert rec.status == "branch_limit" and not rec.valid
    assert rec.n_branches == 3 and len(eng.requests) == 4
    assert eng.num_unfinished_requests() == 0


def test_token_limit_on_a_branch():
    truth = page(2, content="x" * 100 + "%d")
    rec = run(ScriptedEngine(chunk=5), replay_input(P, truth, base(), "fork"), "fork", max_tokens=50, branch_retries=0)
    assert rec.status == "token_limit" and not rec.valid
    assert rec.finish_reasons["b1"] == "length" and rec.branch_tokens[1] == 50
    # re-forks on (the default): the branch is tried 3 times, every token counts, the page says which region
    rec = run(ScriptedEngine(chunk=5), replay_input(P, truth, base(), "fork"), "fork", max_tokens=50)
    assert rec.status == "branch_unrecovered" and not rec.valid and "branch 1 did not recover" in rec.message
    assert rec.region_attempts[1] == 3 and rec.region_finish[1] == "length" and rec.region_tokens[1] == 150


def test_sequential_token_limit_keeps_what_was_read():
    rec = run(ScriptedEngine(chunk=7), replay_input(P, page(4), base(), "sequential"), "sequential", max_tokens=30)
    assert rec.status == "token_limit" and rec.main_tokens == 30
    assert 1 <= len(rec.page.regions) < 4 and "truncated" in rec.page.errors


def test_runaway_branch_is_stopped():
    def script(req):
        if req.request_id.endswith("/b1"):
            return [ord("a"), ord("b")] * 2000
        return list(req.forced_tokens or ())

    # branch_retries=0: today's behaviour (the page is a runaway); loop_detection off: the runaway guard alone
    rec = run(ScriptedEngine(script, chunk=8), replay_input(P, page(3), base(), "fork"), "fork", runaway_window=128,
              stream_branches=True, branch_retries=0, loop_detection=False)
    assert rec.status == "runaway" and "branch 1 repeats" in rec.message
    assert rec.branch_tokens[1] < 400  # stopped early
    eng = ScriptedEngine(script, chunk=8)
    rec = run(eng, replay_input(P, page(3), base(), "fork"), "fork", runaway_window=128, max_tokens=1000,
              branch_retries=0, branch_stream_interval=0)
    assert rec.status == "runaway" and rec.branch_tokens[1] == 1000  # final-only: flagged at the end
    assert all(r.stream is False for r in eng.requests[1:]) and eng.requests[0].stream


def test_layout_stall_is_a_runaway():
    garbage = [ord("z")] * 200
    rec = run(ScriptedEngine(lambda r: garbage, chunk=4), base(), "fork", layout_stall_tokens=40, layout_retries=0)
    assert rec.status == "runaway" and rec.main_tokens <= 48
    # the default: one retry from the last region boundary (here: the page's start), then the page ends
    eng = ScriptedEngine(lambda r: garbage, chunk=4)
    rec = run(eng, base(), "fork", layout_stall_tokens=40)
    assert rec.status == "layout_unrecovered" and rec.layout_retries == 1 and not rec.valid
    assert [r.request_id.rsplit("/", 1)[1] for r in eng.requests] == ["main", "main.r1"]
    assert rec.main_tokens == 0 and 80 < rec.output_tokens <= 96


def test_malformed_layout_gives_a_status_and_the_recoverable_regions():
    good = serialize_padoc(V, P.tokenizer, page(2)).layout
    bad = [V.region_open, V.coord_ids[3], V.region_close, *good]  # one broken region, then two good ones
    rec = run(ScriptedEngine(lambda r: bad if r.request_id.endswith("/main") else [ord("t"), V.end_of_stream]),
              base(), "fork")
    assert rec.status == "malformed_layout" and len(rec.page.regions) == 2
    assert "malformed_region" in rec.page.errors and not rec.valid


def test_deadline_aborts_everything():
    eng = ScriptedEngine(chunk=1, token_delay_s=0.01)
    rec = run(eng, replay_input(P, page(6, content="long content " * 20 + "%d"), base(), "fork"), "fork", deadline_s=0.3)
    assert rec.status == "deadline" and eng.num_unfinished_requests() == 0
    # cut when its deadline passed, not before (the page's own clock), its live requests aborted; in engine
    # steps: the scripted engine waits 0.01 s before each token, so by the deadline a stream has had at most
    # 0.3 / 0.01 of them, however slow the machine (slower only means fewer), and one more in flight
    assert rec.e2e_s >= 0.3 and eng.aborted
    assert max(rec.main_tokens, *rec.branch_tokens) <= round(0.3 / 0.01) + 1, (rec.main_tokens, rec.branch_tokens)


def test_cancel_mid_page_aborts_every_request():
    eng = ScriptedEngine(chunk=1, token_delay_s=0.01)

    async def go():
        t = asyncio.create_task(run_page(eng, P, replay_input(P, page(6, "c" * 200 + "%d"), base(), "fork")))
        while len(eng.requests) < 3:
            await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(go())
    assert eng.num_unfinished_requests() == 0 and len(eng.aborted) >= 2


def test_engine_error_on_a_branch_is_a_page_status():
    eng = ScriptedEngine(chunk=2, fail=lambda r: EngineError("too long") if r.request_id.endswith("/b1") else None)
    rec = run(eng, replay_input(P, page(4), base(), "fork"), "fork")
    assert rec.status == "engine_error" and "too long" in rec.message
    assert eng.num_unfinished_requests() == 0


class _FinishAs(ScriptedEngine):
    """The scripted engine, but branch 1 ends with another finish reason (vLLM's own, or none)."""

    def __init__(self, reason):
        super().__init__(chunk=2)
        self.reason = reason

    async def generate(self, req):
        async for d in super().generate(req):
            if d.finished and req.request_id.endswith("/b1"):
                d.finish_reason = self.reason
            yield d


@pytest.mark.parametrize("reason, status", [("abort", "engine_error"), ("error", "engine_error"),
                                            (None, "engine_error"), ("something_new", "engine_error"),
                                            ("repetition", "runaway"), ("length", "token_limit")])
def test_every_finish_reason_of_vllm_has_a_page_status(reason, status):
    """vLLM 0.32's finish reasons are stop, length, abort, error, repetition: only stop leaves a page ok,
    so a page is never 'ok' but invalid (re-forks off: with them a length / repetition branch is retried,
    tests/unit/scheduler/test_refork.py)."""
    rec = run(_FinishAs(reason), replay_input(P, page(4), base(), "fork"), "fork", branch_retries=0)
    assert rec.status == status and not rec.valid
    assert rec.finish_reasons["b1"] == reason and "branch 1" in rec.message
    assert run(_FinishAs("stop"), replay_input(P, page(4), base(), "fork"), "fork").status == "ok"


def test_engine_death_propagates():
    eng = ScriptedEngine(chunk=2, fail=lambda r: EngineDeadError("gone") if r.request_id.endswith("/b0") else None)
    with pytest.raises(EngineDeadError):
        run(eng, replay_input(P, page(4), base(), "fork"), "fork")


def test_many_pages_in_flight_share_one_engine():
    eng = ScriptedEngine(chunk=2, token_delay_s=0.0005)
    truths = [page(3 + i % 5, content=f"p{i} " + "%d") for i in range(20)]

    async def go():
        return await asyncio.gather(*(run_page(eng, P, replay_input(P, t, base(f"d{i}:0"), "fork"))
                                      for i, t in enumerate(truths)))

    recs = asyncio.run(go())
    assert all(r.status == "ok" and r.page == quantized(t, V) for r, t in zip(recs, truths))
    assert eng.max_live >= 20 and eng.num_unfinished_requests() == 0


def test_periodicity_detector():
    assert is_periodic([1, 2, 3] * 10, 3) and is_periodic([5] * 9, 1)
    assert not is_periodic([1, 2, 3] * 10, 2) and not is_periodic(list(range(30)), 16)


def test_bad_scheduler_config_is_refused():
    with pytest.raises(ValueError):
        SchedulerConfig(max_tokens=0)
    with pytest.raises(ValueError):
        SchedulerConfig(runaway_window=10, runaway_max_period=16)
    with pytest.raises(ValueError, match="mode"):
        run(ScriptedEngine(), base(), "diagonal")
