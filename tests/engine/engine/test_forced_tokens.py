"""The real CPU vLLM engine with the forced-token logits processor (teacher-forced replay)."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from padoc_ray.engine.interface import GenRequest

pytestmark = pytest.mark.engine


async def _collect(engine, req: GenRequest):
    toks, last = [], None
    async for d in engine.generate(req):
        toks.extend(d.token_ids)
        last = d
    return toks, last


def _req(mp, rid, forced=None, temperature=0.0, salt="doc", max_tokens=40, seed=None):
    return GenRequest(
        request_id=rid, prompt_ids=mp.prompt_ids("fork"), image=Image.new("RGB", (400, 520), "white"),
        image_uuid="page-1", cache_salt=salt, max_tokens=max_tokens, forced_tokens=forced,
        stop_token_ids=(mp.vocab.end_of_stream,), temperature=temperature, seed=seed,
    )


def _trace(mp):
    v, tok = mp.vocab, mp.tokenizer
    return [v.region_open, v.category_ids["title"], *(v.coord_ids[b] for b in (10, 20, 990, 80)), v.region_close,
            *tok.encode("Forced 文本"), v.end_of_stream]


def test_forced_sequence_comes_back_exactly(cpu_engine, model_protocol, loop_thread):
    trace = _trace(model_protocol)

    async def go():
        greedy = await _collect(cpu_engine, _req(model_protocol, "f-greedy", trace))
        sampled = await _collect(cpu_engine, _req(model_protocol, "f-sampled", trace, temperature=1.0, seed=3))
        return greedy, sampled

    (g, g_last), (s, s_last) = loop_thread.run(go(), timeout=120)
    assert g == trace and s == trace
    assert g_last.finish_reason == "stop" and s_last.finish_reason == "stop"


def test_forcing_does_not_disturb_other_requests(cpu_engine, model_protocol, loop_thread):
    trace = _trace(model_protocol)

    async def go():
        alone, _ = await _collect(cpu_engine, _req(model_protocol, "free-alone", salt="other", max_tokens=24))
        results = await asyncio.gather(
            _collect(cpu_engine, _req(model_protocol, "free-mixed", salt="other", max_tokens=24)),
            *[_collect(cpu_engine, _req(model_protocol, f"forced-{i}", trace)) for i in range(4)],
        )
        return alone, results

    alone, results = loop_thread.run(go(), timeout=120)
    (mixed, _), *forced = results
    assert mixed == alone and len(alone) == 24
    assert all(toks == trace for toks, _ in forced)
    assert alone[: len(trace)] != trace


def test_same_page_requests_share_the_prefix_cache(cpu_engine, model_protocol, loop_thread):
    async def go():
        _, first = await _collect(cpu_engine, _req(model_protocol, "c1", [model_protocol.vocab.end_of_stream], salt="s1"))
        _, second = await _collect(cpu_engine, _req(model_protocol, "c2", [model_protocol.vocab.end_of_stream], salt="s1"))
        _, salted = await _collect(cpu_engine, _req(model_protocol, "c3", [model_protocol.vocab.end_of_stream], salt="s2"))
        return first, second, salted

    first, second, salted = loop_thread.run(go(), timeout=120)
    block = 32
    assert second.num_cached_tokens >= (second.num_prompt_tokens - 1) // block * block > 0
    assert salted.num_cached_tokens == 0  # another document's salt shares nothing
    assert cpu_engine.num_unfinished_requests() == 0


def test_the_engine_registers_its_runners_processors_and_ends_a_forced_request_with_its_trace(
        cpu_engine, model_protocol, loop_thread):
    """On this CPU vLLM picks its V1 runner; a trace without a stop token ends with it ("length"),
    exactly as vLLM's trace replay ends it under Model Runner V2."""
    from padoc_ray.engine.runners import V1_PROCESSORS

    assert cpu_engine.runner == "v1"
    mc = cpu_engine.llm.vllm_config.model_config
    assert list(mc.logits_processors) == list(V1_PROCESSORS) and not mc.enable_trace_replay
    trace = _trace(model_protocol)[:-1]  # no end-of-stream
    toks, last = loop_thread.run(_collect(cpu_engine, _req(model_protocol, "f-open", trace, max_tokens=40)),
                                 timeout=120)
    assert toks == trace and last.finish_reason == "length"
