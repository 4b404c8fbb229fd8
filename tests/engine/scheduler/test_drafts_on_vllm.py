"""Drafts checked in one prefill on the real CPU vLLM engine (padoc_ray.scheduler.drafts): lossless.

A branch prompt (the page prompt with its image, a layout prefix, the branch start) decodes greedily
once, plainly. Its own output fed back as the draft is accepted whole; the same draft corrupted at
token k is accepted up to k, and the model's own token comes back there; either way the branch's tokens
are exactly the plain run's, in fewer engine steps. The check reads the cached image-and-prompt prefix
instead of computing it again."""

from __future__ import annotations

import dataclasses

import pytest
from PIL import Image, ImageDraw

from padoc_ray.engine.interface import GenRequest
from padoc_ray.scheduler.drafts import accept, drafted

pytestmark = pytest.mark.engine

BLOCK = 32  # the CPU engine's KV block (padoc_ray.engine.config.cpu_engine_config)
LIMIT = 48


def _page() -> Image.Image:
    img = Image.new("RGB", (400, 520), "white")
    d = ImageDraw.Draw(img)
    for i in range(12):
        d.text((20, 20 + 40 * i), f"line {i} of a page whose text the model reads", fill="black")
    return img


def _branch(mp, rid: str, *, salt: str, regions: int = 1) -> GenRequest:
    """A branch prompt after ``regions`` layout regions (1: 224 tokens, 7 full KV blocks; 2: 231)."""
    v = mp.vocab
    layout = [v.region_open, v.category_ids["title"], *(v.coord_ids[b] for b in (10, 20, 990, 80)),
              v.region_close] * regions
    return GenRequest(request_id=rid, prompt_ids=[*mp.prompt_ids("fork"), *layout, v.branch_start], image=_page(),
                      image_uuid=f"{salt}-page", cache_salt=salt, max_tokens=LIMIT,
                      stop_token_ids=(v.end_of_stream,))


async def _run(gen) -> tuple[list[int], list]:
    toks, deltas = [], []
    async for d in gen:
        toks.extend(d.token_ids)
        deltas.append(d)
    return toks, deltas


def _steps(engine) -> float:
    return engine.step_counters()["engine_steps"]


@pytest.mark.parametrize("regions", [1, 2], ids=["prompt-on-a-block-boundary", "prompt-mid-block"])
def test_a_self_draft_is_accepted_whole_and_a_corrupted_one_up_to_its_first_wrong_token(cpu_engine, model_protocol,
                                                                                       loop_thread, regions):
    """On a block boundary the whole branch prompt comes from the cache, so the check has no logits for
    the draft's first position: one decode step supplies the model's token there."""
    mp = model_protocol
    k = 9  # where the corrupted draft goes wrong

    async def warm(salt: str) -> None:  # the branch prompt computed (and cached) under salt, not its output
        await _run(cpu_engine.generate(dataclasses.replace(_branch(mp, f"warm-{salt}", salt=salt, regions=regions),
                                                           max_tokens=1)))

    def branch(rid: str, salt: str) -> GenRequest:
        return _branch(mp, rid, salt=f"{salt}-{regions}", regions=regions)

    async def go():
        s0 = _steps(cpu_engine)
        plain, plain_deltas = await _run(cpu_engine.generate(branch("plain", "d1")))
        s1 = _steps(cpu_engine)
        draft = [t for t in plain if t != mp.vocab.end_of_stream]
        # each salt its own cache: the plain run's blocks hold the draft's tokens, a check must not read them
        await warm(f"d2-{regions}")
        check = await cpu_engine.verify(branch("check", "d2"), draft)
        await warm(f"d3-{regions}")
        s2 = _steps(cpu_engine)
        own, own_deltas = await _run(drafted(cpu_engine, branch("self", "d3"), draft))
        s3 = _steps(cpu_engine)
        bad = list(draft)
        bad[k] = next(t for t in range(100, 200) if t != draft[k])
        await warm(f"d4-{regions}")
        bad_check = await cpu_engine.verify(branch("bad-check", "d4"), bad)
        await warm(f"d5-{regions}")
        corrupted, _ = await _run(drafted(cpu_engine, branch("corrupted", "d5"), bad))
        return plain, plain_deltas, s1 - s0, check, own, own_deltas, s3 - s2, corrupted, bad, bad_check

    plain, plain_deltas, plain_steps, check, own, own_deltas, own_steps, corrupted, bad, bad_check = \
        loop_thread.run(go(), timeout=300)
    assert len(plain) > k + 2, plain  # the random model writes enough to corrupt
    draft = [t for t in plain if t != mp.vocab.end_of_stream]
    # the check read the page's cached prefix (image and prompt) and computed the draft's positions
    prompt_len = plain_deltas[0].num_prompt_tokens
    assert (prompt_len % BLOCK == 0) == (regions == 1), prompt_len  # both cases, as the ids say
    assert check.num_prompt_tokens == prompt_len + len(draft)
    assert check.num_cached_tokens >= (prompt_len - 1) // BLOCK * BLOCK > 0
    if prompt_len % BLOCK:  # the prompt's last block is partial, so never cached: every draft position checked
        assert check.num_cached_tokens < prompt_len and list(check.greedy) == draft
    else:  # cached whole: the draft's first position unchecked (None, never agreement), the others checked
        assert check.num_cached_tokens == prompt_len and list(check.greedy) == [None, *draft[1:]]
    # lossless: the branch's tokens are the plain run's, to the last one, and its end too
    assert own == plain and own_deltas[-1].finish_reason == plain_deltas[-1].finish_reason
    assert own_steps < plain_steps, (own_steps, plain_steps)
    # corrupted at k: accepted up to k, the model's own token at k, and the same branch in the end
    if bad_check.greedy[0] is None:  # what drafted() asks the engine for then: the model's first token
        bad_check = dataclasses.replace(bad_check, greedy=(plain[0], *bad_check.greedy[1:]))
    acc = accept(bad, bad_check, stop_ids=(mp.vocab.end_of_stream,), limit=LIMIT)
    assert acc.agreed == k and acc.tokens == tuple(plain[:k + 1])
    assert corrupted == plain
    assert cpu_engine.num_unfinished_requests() == 0


def test_a_forced_branch_checks_its_draft_against_its_trace_without_the_engine(cpu_engine, model_protocol,
                                                                               loop_thread):
    """--replay: the truth is the reader; the branch is its trace whatever the draft says."""
    mp = model_protocol
    trace = [*mp.tokenizer.encode("Forced text of a region"), mp.vocab.end_of_stream]

    async def go():
        req = GenRequest(**{**_branch(mp, "forced", salt="f1").__dict__, "forced_tokens": trace})
        good, _ = await _run(drafted(cpu_engine, req, trace[:-1]))
        wrong = list(trace[:-1])
        wrong[2] = next(t for t in range(100, 200) if t != wrong[2])
        req2 = GenRequest(**{**req.__dict__, "request_id": "forced-2"})
        bad, _ = await _run(drafted(cpu_engine, req2, wrong))
        return good, bad

    good, bad = loop_thread.run(go(), timeout=120)
    assert good == trace and bad == trace
