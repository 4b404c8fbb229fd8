"""The layout-grammar logits processor on the real CPU vLLM engine (tiny random Qwen3-VL)."""

from __future__ import annotations

import asyncio
import re

import pytest
from PIL import Image

from padoc_ray.engine.interface import GenRequest
from padoc_ray.protocol import StreamParser, page_from_omnidocbench
from padoc_ray.scheduler import PageInput, SchedulerConfig, replay_input, run_page

from tests.conftest import demo_image
from tests.engine.engine.test_forced_tokens import _collect
from tests.engine.scheduler.test_run_page_on_vllm import Recording

pytestmark = pytest.mark.engine


def _req(mp, rid, *, regions=None, forced=None, temperature=1.0, seed=None, max_tokens=60, salt="lc"):
    return GenRequest(
        request_id=rid, prompt_ids=mp.prompt_ids("fork"), image=Image.new("RGB", (400, 520), "white"),
        image_uuid="lc-page", cache_salt=salt, max_tokens=max_tokens, forced_tokens=forced,
        stop_token_ids=(mp.vocab.end_of_stream,), temperature=temperature, seed=seed,
        constrain_layout_regions=regions,
    )


def _errors(vocab, ids):
    p = StreamParser(vocab)
    p.feed_many(ids)
    regions = p.finish()
    return p.error_codes + [e for r in regions for e in r.errors], regions


def test_sampled_layout_streams_stay_in_the_grammar(cpu_engine, model_protocol, loop_thread):
    mp, v = model_protocol, model_protocol.vocab
    # (regions cap, max_tokens): a token budget that forces an early end, and a region cap
    cases = [(None, 60), (255, 60), (255, 17), (2, 200), (0, 30), (255, 60), (255, 60)]

    async def go():
        alone = await _collect(cpu_engine, _req(mp, "lc-free-alone", seed=5))
        runs = await asyncio.gather(
            _collect(cpu_engine, _req(mp, "lc-free-mixed", seed=5)),
            *[_collect(cpu_engine, _req(mp, f"lc-{i}", regions=r, max_tokens=m, seed=i))
              for i, (r, m) in enumerate(cases) if r is not None])
        return alone, runs

    (alone, _), ((mixed, _), *constrained) = loop_thread.run(go(), timeout=300)
    assert mixed == alone  # unconstrained requests in the same batch are untouched
    assert _errors(v, alone)[0]  # the random model, unconstrained, writes no valid layout
    for (toks, last), (cap, max_tokens) in zip(constrained, [c for c in cases if c[0] is not None]):
        errs, regions = _errors(v, toks)
        assert errs == [], (cap, max_tokens, toks)
        assert last.finish_reason == "stop" and toks[-1] == v.end_of_stream
        assert len(toks) <= max_tokens and len(regions) <= cap
    assert any(len(_errors(v, t)[1]) >= 3 for t, _ in constrained)  # real layouts, not just an early end


def test_forced_tokens_win_over_the_grammar(cpu_engine, model_protocol, loop_thread):
    mp, v = model_protocol, model_protocol.vocab
    c = v.coord_ids
    # an inverted box, then content text in the layout stream: both outside the grammar
    trace = [v.region_open, v.category_ids["title"], c[500], c[20], c[10], c[80], v.region_close,
             *mp.tokenizer.encode("free text"), v.end_of_stream]
    toks, last = loop_thread.run(_collect(cpu_engine, _req(mp, "lc-forced", regions=255, forced=trace, seed=1)),
                                 timeout=120)
    assert toks == trace and last.finish_reason == "stop"


@pytest.fixture(scope="module")
def demo_pages(demo_gt):
    out = []
    for i, obj in enumerate(demo_gt):
        truth = page_from_omnidocbench(obj)
        img = demo_image(truth.image_path)
        out.append((PageInput(page_id=f"lc-demo{i}:0", image=img, width=img.width, height=img.height,
                              cache_salt=f"lc-demo{i}", image_path=truth.image_path), truth))
    return out


def test_free_running_constrained_pages_never_end_malformed(demo_pages, cpu_engine, model_protocol, loop_thread):
    mp = model_protocol
    cfg = SchedulerConfig(max_tokens=40, max_branches=3)
    eng = Recording(cpu_engine)
    pages = [inp for inp, _ in demo_pages[:6]]

    async def go(constrain):
        c = SchedulerConfig(max_tokens=cfg.max_tokens, max_branches=cfg.max_branches, constrain_layout=constrain)
        return await asyncio.gather(*(run_page(eng, mp, inp, mode="fork", cfg=c) for inp in pages))

    free = loop_thread.run(go(False), timeout=300)
    constrained = loop_thread.run(go(True), timeout=300)
    # what the constraint is for: the random model's own layout streams do not parse (their status may
    # show a worse problem first, e.g. token_limit, but the stream's errors are in the message)
    assert all("stream errors" in r.message for r in free)
    for r in constrained:
        assert r.status != "malformed_layout" and "stream errors" not in r.message, (r.status, r.message)
        assert r.finish_reasons["main"] == "stop" and r.main_tokens <= cfg.max_tokens
        assert r.n_branches <= cfg.max_branches
    assert sum(len(r.page.regions) for r in constrained) > 0
    # layout streams: each page's first, and the retries of one the loop detector stopped ("/main.r1",
    # from its last closed region: the grammar then allows the regions left)
    is_main = [bool(re.search(r"/main(\.r\d+)?$", q.request_id)) for q in eng.requests]
    mains = [q for q, m in zip(eng.requests, is_main, strict=True) if m]
    branches = [q for q, m in zip(eng.requests, is_main, strict=True) if not m]
    firsts = [q for q in mains if q.request_id.endswith("/main")]
    assert sum(q.constrain_layout_regions == cfg.max_branches for q in firsts) == len(pages)
    assert all(q.constrain_layout_regions is None or q.constrain_layout_regions <= cfg.max_branches for q in mains)
    assert branches and all(q.constrain_layout_regions is None for q in branches)


def test_teacher_forced_pages_are_unchanged_by_the_constraint(demo_pages, cpu_engine, model_protocol, loop_thread):
    mp = model_protocol
    small = sorted(demo_pages, key=lambda p: len(p[1].regions))[:3]

    async def go(constrain):
        c = SchedulerConfig(constrain_layout=constrain)
        return await asyncio.gather(*(run_page(cpu_engine, mp, replay_input(mp, t, inp, "fork"), mode="fork", cfg=c)
                                      for inp, t in small))

    plain = loop_thread.run(go(False), timeout=300)
    constrained = loop_thread.run(go(True), timeout=300)
    for a, b in zip(plain, constrained):
        assert a.status == b.status == "ok" and a.valid and b.valid
        assert a.page == b.page and a.main_tokens == b.main_tokens and a.branch_tokens == b.branch_tokens


def test_processor_masks_rows_wherever_the_batch_moves_them(tiny_model_dir, model_protocol):
    """The processor alone, on random logits: every row samples an allowed token, through batch moves,
    a forced row and an unconstrained row."""
    import types

    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from padoc_ray.engine.forcing import FORCED_TOKENS_KEY
    from padoc_ray.engine.layout_constraint import CONSTRAIN_LAYOUT_KEY, LayoutGrammarProcessor
    from padoc_ray.protocol import LayoutGrammar

    v = model_protocol.vocab
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(model=tiny_model_dir, tokenizer=tiny_model_dir))
    proc = LayoutGrammarProcessor(cfg, torch.device("cpu"), False)
    width = 9216 + 64  # wider than the tokenizer, as padded LM heads are
    forced = [v.region_open, 5, 6, 7]  # content ids where a category must stand: forcing wins
    outs = [[] for _ in range(4)]
    params = [SamplingParams(max_tokens=40, extra_args={CONSTRAIN_LAYOUT_KEY: 3}),
              SamplingParams(max_tokens=40),  # unconstrained
              SamplingParams(max_tokens=40, extra_args={CONSTRAIN_LAYOUT_KEY: 3, FORCED_TOKENS_KEY: forced}),
              SamplingParams(max_tokens=15, extra_args={CONSTRAIN_LAYOUT_KEY: 255})]
    proc.update_state(BatchUpdate(batch_size=4, removed=[], moved=[],
                                  added=[(i, p, None, outs[i]) for i, p in enumerate(params)]))
    order = [0, 1, 2, 3]  # batch row -> request
    for step in range(40):
        if step in (5, 17):  # the batch is condensed / reordered: rows 0 and 3 swap
            proc.update_state(BatchUpdate(batch_size=4, removed=[], added=[],
                                          moved=[(0, 3, MoveDirectionality.SWAP)]))
            order[0], order[3] = order[3], order[0]
        logits = torch.randn(4, width, generator=torch.Generator().manual_seed(step))
        ref = logits.clone()
        out = proc.apply(logits)
        for row, req in enumerate(order):
            o = outs[req]
            if req == 2 and len(o) < len(forced):
                tok = forced[len(o)]
                assert torch.equal(out[row], ref[row])  # untouched: the forcing processor decides
            else:
                assert torch.isfinite(out[row]).any()
                tok = int(out[row].argmax())
            if req == 1:
                assert torch.equal(out[row], ref[row])
            if not (o and o[-1] == v.end_of_stream):
                o.append(tok)
    g = LayoutGrammar(v)
    for req in (0, 3):
        errs, regions = _errors(v, outs[req])
        assert errs == [] and outs[req][-1] == v.end_of_stream
        assert len(regions) <= 3 and len(outs[req]) <= params[req].max_tokens
    cur = g.cursor()
    assert [cur.advance(t) for t in outs[2][:2]] == [True, False]  # the forced off-grammar token went through
