"""Re-fork of a looping content branch and one retry of a looping layout stream (issue 31, items 2-3),
on the scripted engine: the scheduler's decisions, what the runner sends, and what the record says."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.output.rows import page_row, to_table
from padoc_ray.protocol import quantized, serialize_padoc
from padoc_ray.scheduler import SchedulerConfig, replay_input, run_page
from padoc_ray.scheduler.state import retry_seed

from tests.unit.scheduler.test_run_page import P, V, base, page

EOS = V.end_of_stream
PHRASE = [*b"the cat sat on the mat. "]


def run(engine, inp, **cfg):
    return asyncio.run(run_page(engine, P, inp, mode="fork", cfg=SchedulerConfig(**cfg)))


def contents(rec):
    return [r.content for r in rec.page.regions]


def _rid(req) -> str:
    return req.request_id.rsplit("/", 1)[1]


def looping(branch: str, *, until: int | None = None):
    """A script: branch ``branch`` (e.g. "b1") repeats PHRASE on its attempts before ``until`` (None: on
    every attempt); every other request replays its forced trace."""

    def script(req):
        rid = _rid(req)
        name, _, r = rid.partition(".r")
        attempt = int(r or 0)
        if name == branch and (until is None or attempt < until):
            return PHRASE * 400
        return list(req.forced_tokens or ())

    return script


def test_a_looping_branch_is_reforked_and_recovers_on_attempt_2():
    truth = page(4)
    inp = replay_input(P, truth, base(), "fork")
    clean = run(ScriptedEngine(chunk=4), inp)
    injected = dataclasses.replace(inp, forced_first_attempt={1: PHRASE * 400})  # 9600 tokens of loop
    eng = ScriptedEngine(chunk=4)
    rec = run(eng, injected)
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page == quantized(truth, V) and contents(rec) == contents(clean)
    assert rec.region_attempts == [1, 2, 0, 1] and rec.region_finish == ["stop", "stop", "skipped", "stop"]
    assert rec.retries == 1 and rec.retry_outcomes == ["recovered"] and rec.layout_retries == 0
    # streamed in chunks of 64: the loop is cut soon after the detector's window, not at max_tokens (8192)
    first = rec.region_tokens[1] - clean.region_tokens[1]
    assert 256 <= first <= 256 + 64
    assert rec.output_tokens == clean.output_tokens + first
    reqs = {_rid(r): r for r in eng.requests}
    assert set(reqs) == {"main", "b0", "b1", "b1.r1", "b3"} and "b1" in [_rid(r) for r in eng.requests]
    r0, r1 = reqs["b1"], reqs["b1.r1"]
    assert r1.prompt_ids == r0.prompt_ids  # the same prefix (still cached)
    assert r0.temperature == 0.0 and r0.seed is None and r1.temperature == 0.3
    assert r1.seed == retry_seed("doc:0", 1, 1, 0)
    assert all(r.stream and r.stream_interval == 64 for k, r in reqs.items() if k != "main")
    assert eng.num_unfinished_requests() == 0 and any(a.endswith("/b1") for a in eng.aborted)


def test_a_final_only_branch_is_judged_at_its_end_and_reforked():
    truth = page(4)
    inp = dataclasses.replace(replay_input(P, truth, base(), "fork"), forced_first_attempt={1: PHRASE * 100})
    eng = ScriptedEngine(chunk=4)
    rec = run(eng, inp, branch_stream_interval=0, max_tokens=1000)
    assert rec.status == "ok" and rec.valid and rec.page == quantized(truth, V)
    assert rec.region_attempts[1] == 2 and rec.region_tokens[1] > 1000  # the first attempt ran to max_tokens
    assert all(not r.stream for r in eng.requests[1:])


def test_a_branch_that_never_recovers_costs_its_region_only():
    truth = page(4)
    inp = replay_input(P, truth, base(), "fork")
    clean = run(ScriptedEngine(chunk=4), inp)
    eng = ScriptedEngine(looping("b1"), chunk=4)
    rec = run(eng, inp)
    assert rec.status == "branch_unrecovered" and not rec.valid
    assert "branch 1 did not recover (loop; after 3 attempts)" in rec.message
    assert rec.region_attempts[1] == 3 and rec.region_finish[1] == "loop" and rec.retry_outcomes == ["exhausted"]
    got, want = contents(rec), contents(clean)
    assert [got[i] for i in (0, 2, 3)] == [want[i] for i in (0, 2, 3)]  # byte-equal
    assert [_rid(r) for r in eng.requests].count("b3") == 1 and len(eng.requests) == 6
    temps = {_rid(r): r.temperature for r in eng.requests}
    assert (temps["b1"], temps["b1.r1"], temps["b1.r2"]) == (0.0, 0.3, 0.6)
    assert eng.num_unfinished_requests() == 0


def test_retries_off_give_today_s_statuses():
    inp = replay_input(P, page(4), base(), "fork")
    rec = run(ScriptedEngine(looping("b1"), chunk=4), inp, branch_retries=0)
    assert rec.status == "runaway" and rec.region_attempts[1] == 1 and rec.region_finish[1] == "loop"
    long = replay_input(P, page(2, content="x" * 100 + "%d"), base(), "fork")
    rec = run(ScriptedEngine(chunk=5), long, max_tokens=50, branch_retries=0)
    assert rec.status == "token_limit" and rec.region_finish[1] == "length" and rec.retries == 0


def test_a_token_limit_branch_is_retried():
    truth = page(4)
    inp = dataclasses.replace(replay_input(P, truth, base(), "fork"),
                              forced_first_attempt={3: [*b"0123456789"] * 40})  # no end-of-stream
    rec = run(ScriptedEngine(chunk=8), inp, max_tokens=300)
    assert rec.status == "ok" and rec.valid and rec.page == quantized(truth, V)
    assert rec.region_attempts[3] == 2 and rec.region_finish[3] == "stop"


def test_the_page_retry_budget_bounds_the_cost():
    def script(req):
        return [ord("x")] * 1000 if _rid(req).startswith("b1") else list(req.forced_tokens or ())

    inp = replay_input(P, page(4), base(), "fork")
    rec = run(ScriptedEngine(script, chunk=8), inp, max_tokens=100, branch_retries=5, retry_token_budget=150)
    assert rec.status == "branch_unrecovered" and "budget" in rec.message
    assert rec.region_attempts[1] == 3 and rec.retry_outcomes == ["budget"] and rec.retries == 2
    rec = run(ScriptedEngine(script, chunk=8), inp, max_tokens=100, branch_retries=5, retry_token_budget=0)
    assert rec.region_attempts[1] == 1 and rec.retry_outcomes == ["budget"]
    rec = run(ScriptedEngine(script, chunk=8), inp, max_tokens=100, branch_retries=5, retry_token_budget=None)
    assert rec.region_attempts[1] == 6 and rec.retry_outcomes == ["exhausted"]


def test_the_same_seed_gives_the_same_result():
    def script(req):  # a "sampler": what a retry writes depends on its seed alone
        rid = _rid(req)
        if rid == "b1":
            return PHRASE * 100
        if rid.startswith("b1."):
            return [*f"seed {req.seed % 997}".encode(), EOS]
        return list(req.forced_tokens or ())

    inp = replay_input(P, page(4), base(), "fork")
    a, b = (run(ScriptedEngine(script, chunk=4), inp) for _ in range(2))
    c = run(ScriptedEngine(script, chunk=4), inp, retry_seed=1)
    assert a.status == b.status == c.status == "ok"
    keep = ("page", "region_attempts", "region_finish", "region_tokens", "output_tokens", "retry_outcomes")
    assert all(getattr(a, k) == getattr(b, k) for k in keep)
    assert a.page.regions[1].content == f"seed {retry_seed('doc:0', 1, 1, 0) % 997}"
    assert c.page.regions[1].content != a.page.regions[1].content


def _layout(truth):
    s = serialize_padoc(V, P.tokenizer, truth)
    return s, list(s.layout)


def test_a_stalled_layout_stream_is_retried_from_its_last_region_boundary():
    truth = page(5)
    s, layout = _layout(truth)
    cut = s.fork_points[1] + 1  # just after region 1's close
    inp = replay_input(P, truth, base(), "fork")

    def script(req):
        if _rid(req) == "main":
            return [*layout[:cut], *([ord("z")] * 300)]  # then babble without closing a region
        return list(req.forced_tokens or ())  # main.r1 continues as the truth: forced_main[cut:]

    eng = ScriptedEngine(script, chunk=4)
    rec = run(eng, inp)
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page == quantized(truth, V) and rec.layout_retries == 1 and rec.retries == 1
    reqs = {_rid(r): r for r in eng.requests}
    assert list(reqs["main.r1"].prompt_ids) == [*P.prompt_ids("fork"), *layout[:cut]]
    assert list(reqs["main.r1"].forced_tokens) == layout[cut:] and reqs["main.r1"].temperature == 0.3
    assert sorted(k for k in reqs if k.startswith("b")) == ["b0", "b1", "b3", "b4"]  # each region forked once
    assert rec.main_tokens == len(layout) and rec.output_tokens > sum(rec.branch_tokens) + len(layout)


def test_a_layout_stream_that_loops_again_ends_the_page_with_its_regions():
    truth = page(5)
    s, layout = _layout(truth)
    cut = s.fork_points[1] + 1
    region1 = layout[s.fork_points[0] + 1:cut]  # region 1's tokens, open to close

    def script(req):
        if _rid(req).startswith("main"):  # the same region again and again, on the retry too
            return [*layout[:cut], *region1 * 40] if _rid(req) == "main" else region1 * 40
        return list(req.forced_tokens or ())

    eng = ScriptedEngine(script, chunk=4)
    rec = run(eng, replay_input(P, truth, base(), "fork"))
    assert rec.status == "layout_unrecovered" and not rec.valid and rec.layout_retries == 1
    assert "repeated_region" in rec.message
    # regions 0 and 1, and the copies of region 1 closed before a detector tripped (their forks stay)
    assert [r.category for r in rec.page.regions[:2]] == [truth.regions[0].category, truth.regions[1].category]
    assert all(r.box == rec.page.regions[1].box for r in rec.page.regions[1:])
    assert rec.page.regions[0].content == quantized(truth, V).regions[0].content
    assert eng.num_unfinished_requests() == 0
    assert run(ScriptedEngine(script, chunk=4), replay_input(P, truth, base(), "fork"),
               layout_retries=0).status == "runaway"


def test_rows_carry_attempts_and_finish():
    inp = dataclasses.replace(replay_input(P, page(4), base(), "fork"), forced_first_attempt={1: PHRASE * 400})
    rec = run(ScriptedEngine(chunk=4), inp)
    row = page_row({"page_index": 0}, rec)
    regs = row["regions"]
    assert [r["attempts"] for r in regs] == [1, 2, 0, 1] and [r["finish"] for r in regs] == rec.region_finish
    assert [r["finish_reason"] for r in regs] == ["stop", "stop", "skipped", "stop"]
    assert row["output_tokens"] == rec.output_tokens
    from padoc_ray.output.rows import base_row
    t = to_table([{**base_row(run_id="r", uri="u", doc_id="d", page_index=0, page_count=1, mode="fork",
                              model_id="m"), **row}])
    assert t.column("regions").to_pylist()[0][1]["attempts"] == 2


def test_a_looping_sequential_stream_is_stopped_early_as_runaway():
    truth = page(4)
    s = replay_input(P, truth, base(), "sequential")

    def script(req):
        return [*list(s.forced_main)[:20], *PHRASE * 400]

    rec = asyncio.run(run_page(ScriptedEngine(script, chunk=4), P, base(), mode="sequential", cfg=SchedulerConfig()))
    assert rec.status == "runaway" and "main stream loops (token_loop" in rec.message
    assert rec.main_tokens < 20 + 256 + 8 and rec.retries == 0  # no retry in sequential mode


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: where the real one would wait for its next timer, this one moves its
    clock to that timer at once. Time passes only by what the code awaits (the scripted engine's token
    delays, the page deadline), never by how fast the machine runs the code in between."""

    def __init__(self):
        super().__init__()
        self._virtual_now = 0.0
        select = self._selector.select

        def jump_to_the_next_timer(timeout=None):
            if timeout is not None and timeout > 0:
                self._virtual_now += timeout
                timeout = 0
            return select(timeout)

        self._selector.select = jump_to_the_next_timer

    def time(self) -> float:
        return self._virtual_now


def run_on_virtual_time(engine, inp, **cfg):
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(run_page(engine, P, inp, mode="fork", cfg=SchedulerConfig(**cfg)))


def test_a_deadline_during_retries_leaves_nothing_live(monkeypatch):
    """A 0.4 s deadline against 1 ms a token, on virtual time: the deadline falls after the same tokens on
    any machine (b1's first attempt, cut as a loop after 5 deltas of 64 tokens, then its re-fork, cut by the
    deadline before its first delta), as the same run with every delta costing 20 ms more of real time shows."""
    def deadline_run():
        eng = ScriptedEngine(looping("b1"), chunk=4, token_delay_s=0.001)
        rec = run_on_virtual_time(eng, replay_input(P, page(4), base(), "fork"), deadline_s=0.4,
                                  retry_token_budget=None, branch_retries=100)
        assert rec.status == "deadline" and eng.num_unfinished_requests() == 0
        assert rec.region_attempts[1] >= 2
        return rec

    rec = deadline_run()
    real_sleep, generate = time.sleep, ScriptedEngine.generate

    async def slow_generate(self, req):  # a loaded machine: every delta takes 20 ms of real time more
        async for delta in generate(self, req):
            real_sleep(0.02)
            yield delta

    monkeypatch.setattr(ScriptedEngine, "generate", slow_generate)
    slow = deadline_run()
    assert (slow.region_attempts, slow.region_tokens, slow.output_tokens) == (
        rec.region_attempts, rec.region_tokens, rec.output_tokens)


def test_the_flags_set_the_retry_fields():
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.flags import scheduler_from_args

    p = build_parser()
    argv = ["parse-page", "x.pdf", "--model", "m"]
    assert scheduler_from_args(p.parse_args(argv)) == SchedulerConfig()
    cfg = scheduler_from_args(p.parse_args([*argv, "--branch-retries", "0", "--retry-temperatures", "0.0,0.5",
                                            "--retry-token-budget", "-1", "--layout-retries", "0",
                                            "--no-loop-detection", "--branch-stream-interval", "0",
                                            "--retry-seed", "7"]))
    assert cfg == SchedulerConfig(branch_retries=0, retry_temperatures=(0.0, 0.5), retry_token_budget=None,
                                  layout_retries=0, loop_detection=False, branch_stream_interval=0, retry_seed=7)
    assert SchedulerConfig(temperature=0.4).attempt_temperature(0) == 0.4
    assert [SchedulerConfig().attempt_temperature(i) for i in range(5)] == [0.0, 0.3, 0.6, 0.6, 0.6]


def recording_recorder():
    """A RayRecorder whose metrics keep every call (``r._m[name].calls``) instead of reaching Ray."""
    from padoc_ray import metrics

    class Counter:
        def __init__(self):
            self.calls = []

        def inc(self, value, tags=None):
            self.calls.append((value, tags))

        observe = set = inc

    r = object.__new__(metrics.RayRecorder)
    r._m = {m.name: Counter() for m in metrics.METRICS}
    r._warned, r._host = False, "h"
    return r


def test_the_metric_counts_branch_retries_by_outcome():
    r = recording_recorder()
    inp = replay_input(P, page(4), base(), "fork")
    rec = run(ScriptedEngine(looping("b1"), chunk=4), inp)
    r.page(rec)
    assert r._m["padoc_branch_retries"].calls == [(1.0, {"outcome": "exhausted"})]


def test_a_layout_retry_respects_the_budget_and_the_layout_grammar():
    truth = page(5)
    s, layout = _layout(truth)
    cut = s.fork_points[1] + 1

    def script(req):
        if _rid(req) == "main":
            return [*layout[:cut], *([ord("z")] * 300)]
        return list(req.forced_tokens or ())

    inp = replay_input(P, truth, base(), "fork")
    rec = run(ScriptedEngine(script, chunk=4), inp, retry_token_budget=0)
    assert rec.status == "layout_unrecovered" and "budget" in rec.message and rec.layout_retries == 0
    assert len(rec.page.regions) == 2 and rec.main_tokens == cut  # the regions closed before the loop
    eng = ScriptedEngine(script, chunk=4)
    rec = run(eng, inp, constrain_layout=True, max_branches=10)
    assert rec.status == "ok" and rec.page == quantized(truth, V)
    reqs = {_rid(r): r for r in eng.requests}
    assert reqs["main"].constrain_layout_regions == 10 and reqs["main.r1"].constrain_layout_regions == 8


def test_the_loop_detectors_settings_are_scheduler_fields():
    """n, count, window and the longest period of the token loop detector come from SchedulerConfig
    (flags --loop-ngram, --loop-count, --loop-window, --loop-max-period); a bad one is refused."""
    from padoc_ray.scheduler.loops import LoopConfig

    assert SchedulerConfig().loop_config == LoopConfig()
    cfg = SchedulerConfig(loop_ngram=8, loop_count=4, loop_window=200, loop_max_period=256).loop_config
    assert (cfg.n, cfg.count, cfg.window, cfg.max_period, cfg.max_break) == (8, 4, 200, 256, 9)
    with pytest.raises(ValueError, match="loop detector"):
        SchedulerConfig(loop_ngram=1)
