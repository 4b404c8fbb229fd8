"""The draft decision (padoc_ray.scheduler.drafts), pure, and its flow on a scripted engine."""

from __future__ import annotations

import asyncio

import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.engine.interface import DraftCheck, GenRequest
from padoc_ray.scheduler.drafts import accept, drafted, truth_check

END = 2


def _check(greedy, nxt=None):
    return DraftCheck(greedy=tuple(greedy), next_token=nxt)


def test_the_agreed_prefix_then_the_models_own_token():
    assert accept([5, 6, 7], _check([5, 6, 7], 8)).tokens == (5, 6, 7, 8)  # whole draft, then the next token
    acc = accept([5, 6, 7], _check([5, 9, 7], 8))
    assert (acc.tokens, acc.agreed, acc.finish_reason) == ((5, 9), 1, None)  # the model's token at the first miss
    assert accept([5, 6], _check([4, 6])).tokens == (4,)


def test_an_unchecked_position_ends_the_agreement_and_is_never_agreement():
    acc = accept([5, 6, 7], _check([5, None, 7], 8))
    assert (acc.tokens, acc.agreed) == ((5,), 1)  # nothing after the unchecked position, not even the model's token
    assert accept([5, 6], _check([None, 6], 7)).tokens == ()
    assert accept([5, 6], _check([5, 6], None)).tokens == (5, 6)  # the next token unknown: decode on from here


def test_a_stop_token_ends_the_branch_and_the_limit_holds():
    acc = accept([5, 6], _check([5, END]), stop_ids=(END,))
    assert (acc.tokens, acc.finish_reason) == ((5, END), "stop")
    assert accept([5, 6], _check([5, 6], END), stop_ids=(END,)).finish_reason == "stop"
    acc = accept([5, 6, 7], _check([5, 6, 7], 8), limit=2)
    assert (acc.tokens, acc.agreed, acc.finish_reason) == ((5, 6), 2, "length")
    assert accept([5, 6], _check([5, 6], 8), limit=3).finish_reason == "length"  # 5, 6, 8: the budget is spent
    with pytest.raises(ValueError, match="covers 1 positions of a 2-token draft"):
        accept([5, 6], _check([5]))


def test_the_truth_checks_a_forced_draft():
    assert truth_check([5, 6, 7, END], [5, 9]) == _check([5, 6], 7)
    assert truth_check([5, END], [5, END, 3]) == _check([5, END, None], None)


def test_drafted_on_a_scripted_engine_gives_the_forced_trace_whatever_the_draft():
    trace = [5, 6, 7, 8, END]
    eng = ScriptedEngine()

    async def run(draft):
        req = GenRequest(request_id=f"r{len(eng.requests)}", prompt_ids=[1, 1, 1], max_tokens=50, forced_tokens=trace,
                         stop_token_ids=(END,))
        toks = []
        async for d in drafted(eng, req, draft):
            toks.extend(d.token_ids)
        return toks

    assert asyncio.run(run([5, 6, 7, 8])) == trace
    (cont,) = eng.requests  # the agreed tokens as prompt (their prefill stands for the check), the rest forced
    assert list(cont.prompt_ids) == [1, 1, 1, 5, 6, 7, 8] and list(cont.forced_tokens) == [END]
    assert asyncio.run(run([5, 9, 9])) == trace
    assert list(eng.requests[-1].prompt_ids) == [1, 1, 1, 5] and list(eng.requests[-1].forced_tokens) == [6, 7, 8, END]
    assert asyncio.run(run([])) == trace and list(eng.requests[-1].prompt_ids) == [1, 1, 1]  # no draft: as usual
