"""Drafts checked in one prefill on the real CPU vLLM engine (padoc_ray.scheduler.drafts): lossless.

A branch prompt (the page prompt with its image, a layout prefix, the branch start) decodes greedily
once, plainly. Its own output fed back as the draft is accepted whole; the same draft corrupted at
token k is accepted up to k, and the model's own token comes back there; either way the branch's tokens
are exactly the plain run's, in fewer engine steps. The check reads the cached image-and-prompt prefix
instead of computing it again."""

from __future__ import annotations

import asyncio
import dataclasses
import os

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
    # the CPU preset compiles nothing (torch_compile=False): vLLM's compiled logprob rank count would have had
    # inductor build its C++ header with g++ in the engine processes' temp folder at the first check
    assert not cpu_engine.cfg.torch_compile
    assert not [f for f in os.listdir(cpu_engine.temp_dir) if f.startswith("torchinductor")], \
        os.listdir(cpu_engine.temp_dir)


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


# ---- whole pages through the scheduler (run_page), with the examples' own text layers -------------------------
def _example_pages_with_layers():
    """(PageInput with the PDF's text layer, truth) for the examples' pages (born digital: real text layers)."""
    import glob
    import os

    from padoc_ray.groundtruth import load_truth
    from padoc_ray.inputs import load_pages
    from padoc_ray.pdf import open_pdf, page_text_layer
    from padoc_ray.scheduler import PageInput
    from tests.conftest import ROOT

    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    out = []
    for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf")))):
        p = it.page
        with open(os.path.join(ROOT, "examples", it.source), "rb") as f:
            layer = page_text_layer(open_pdf(f.read()), it.page_index)
        inp = PageInput(page_id=f"{p.doc_id[:16]}:{p.page_index}", image=p.image, width=p.image.width,
                        height=p.image.height, cache_salt=p.doc_id, page_no=p.page_index, image_path=it.source,
                        text_layer=layer)
        out.append((inp, truth[(it.source, it.page_index)]))
    return out


def test_pages_with_their_text_layers_are_parsed_identically_in_fewer_steps(cpu_engine, model_protocol, loop_thread):
    """Replayed (the truth reads perfectly): every page equals its truth with and without drafts, the
    text regions' drafts are accepted, and the engine decodes that many tokens fewer. Decoded freely (the random
    model writes noise, so the PDF's text is a wrong draft for it): the pages are byte-identical with
    and without drafts, each draft rejected at its first token."""
    from padoc_ray.protocol import quantized
    from padoc_ray.scheduler import replay_input, run_page

    mp = model_protocol
    pages = _example_pages_with_layers()

    async def run(inputs, **kw):  # the pages at once, and the tokens the engine decoded for them
        before = cpu_engine.generation_tokens()
        recs = await asyncio.gather(*(run_page(cpu_engine, mp, inp, mode="fork", **kw) for inp in inputs))
        return recs, cpu_engine.generation_tokens() - before

    def strip(inp, **changes):
        return dataclasses.replace(inp, **changes)

    async def go():
        forced = [replay_input(mp, t, strip(inp, cache_salt=f"{inp.cache_salt}-a"), "fork") for inp, t in pages]
        plain = [strip(f, text_layer=None, cache_salt=f"{f.cache_salt}-b") for f in forced]
        with_drafts, decoded_drafts = await run(forced)
        without, decoded_plain = await run(plain)
        from padoc_ray.scheduler import SchedulerConfig

        short = SchedulerConfig(max_tokens=40)  # free decoding of noise: a short budget per stream
        free = [strip(inp, cache_salt=f"{inp.cache_salt}-c") for inp, _ in pages]
        free_plain = [strip(inp, text_layer=None, cache_salt=f"{inp.cache_salt}-d") for inp, _ in pages]
        free_drafts, _ = await run(free, cfg=short)
        free_without, _ = await run(free_plain, cfg=short)
        return with_drafts, decoded_drafts, without, decoded_plain, free_drafts, free_without

    with_drafts, decoded_drafts, without, decoded_plain, free_drafts, free_without = loop_thread.run(go(), timeout=600)
    for (inp, truth), a, b in zip(pages, with_drafts, without):
        want = quantized(truth, mp.vocab)
        assert [r.content for r in a.page.regions] == [r.content for r in want.regions], inp.image_path
        assert a.page == b.page and a.status == b.status == "ok" and a.text_layer == "used"
        assert b.text_layer == "absent" and sum(b.region_draft_tokens) == 0
        text = [i for i, r in enumerate(a.page.regions) if r.content_format == "text" and r.content]
        assert text and all(a.region_accepted_tokens[i] == a.region_draft_tokens[i] > 0 for i in text), inp.image_path
    # the accepted tokens came from one prefill each, not a decode step each (the pages' steps barely move:
    # forked branches decode beside the layout stream, whose length the page's steps follow here)
    accepted = sum(sum(r.region_accepted_tokens) for r in with_drafts)
    assert decoded_drafts <= decoded_plain - accepted + len(with_drafts) * 4, (decoded_drafts, decoded_plain, accepted)
    for a, b in zip(free_drafts, free_without):
        assert a.page == b.page and a.output_tokens == b.output_tokens  # lossless: the model's own pages
        assert sum(a.region_draft_tokens) > 0 or not a.page.regions
        assert all(acc <= 1 for acc, d in zip(a.region_accepted_tokens, a.region_draft_tokens) if d)
    assert cpu_engine.num_unfinished_requests() == 0


class Counting:
    """The real engine, counting the draft checks and the requests it is given."""

    def __init__(self, inner):
        self.inner, self.checks, self.requests = inner, [], 0

    def generate(self, req):
        self.requests += 1
        return self.inner.generate(req)

    async def verify(self, req, draft):
        self.checks.append(len(draft))
        return await self.inner.verify(req, draft)

    async def abort(self, ids):
        await self.inner.abort(ids)

    def num_unfinished_requests(self):
        return self.inner.num_unfinished_requests()


def _invisible_text_pdf() -> bytes:
    """A page whose visible words are drawn as shapes (no text) and whose text layer, invisible (render
    mode 3, as OCR layers are), says something else at the same place."""
    import io

    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(612, 792), invariant=1)
    for i in range(8):
        c.rect(40, 700 - 60 * i, 500, 20, fill=1)
        t = c.beginText(40, 705 - 60 * i)
        t.setTextRenderMode(3)
        t.setFont("Helvetica", 14)
        t.textLine(f"an invisible layer that says something else, line {i}")
        c.drawText(t)
    c.showPage()
    c.save()
    return buf.getvalue()


def test_wrong_scanned_and_hostile_text_layers_change_nothing(cpu_engine, model_protocol, loop_thread):
    """Free decoding (the random model writes its own pages): a page whose invisible layer says something
    else gets one check per drafted branch and the same page as without; a scan and a broken layer send no
    check; a million characters in one box make a draft of at most MAX_DRAFT_TOKENS."""
    from padoc_ray.pdf import RenderConfig, open_pdf, page_text_layer, render_page
    from padoc_ray.protocol.text_layer import TextLayer, trust
    from padoc_ray.scheduler import PageInput, SchedulerConfig, run_page
    from padoc_ray.scheduler.drafts import MAX_DRAFT_TOKENS
    from tests.helpers.pdf_factory import image_only_pdf

    mp = model_protocol
    # a short budget per branch, and no re-fork of a branch that reaches it (a re-fork samples with a seed of
    # its page's id, which differs between these runs)
    cfg = SchedulerConfig(max_tokens=40, branch_retries=0)
    data = _invisible_text_pdf()
    invisible = page_text_layer(open_pdf(data), 0)
    assert trust(invisible) == "used" and "invisible layer" in invisible.text
    scan = page_text_layer(open_pdf(image_only_pdf()), 0)
    broken = TextLayer("\ue000" * 200, ((0.0, 0.0, 1.0, 1.0),) * 200)
    # a million characters in the box of the first line's fifth character: all inside the first region
    huge = TextLayer("word " * 200_000, (invisible.boxes[4],) * 1_000_000)
    image = render_page(open_pdf(data), 0, RenderConfig(longest_side=600)).image
    # the layout is forced (a text region over each line, as a trained model would find them); the branches
    # decode freely, so the drafts meet the model's own text
    from padoc_ray.protocol.page import Box, Page, Region

    lines = {}
    for ch, b in zip(invisible.text, invisible.boxes):
        if any(b):
            lines.setdefault(round((b[1] + b[3]) / 2 * 13), []).append(b)  # lines are 60 pt (1/13 page) apart
    regions = tuple(Region("text_block", Box(min(b[0] for b in bs) - 0.01, min(b[1] for b in bs) - 0.005,
                                             max(b[2] for b in bs) + 0.01, max(b[3] for b in bs) + 0.005), "x")
                    for _, bs in sorted(lines.items()))
    assert len(regions) == 8
    layout = mp.vocab.serialize_fork(mp.tokenizer, Page(image.width, image.height, regions)).layout

    def page(tag, layer):
        return PageInput(page_id=f"tl-{tag}:0", image=image, width=image.width, height=image.height,
                         cache_salt=f"tl-{tag}", text_layer=layer, forced_main=layout)

    async def go():
        out = {}
        for tag, layer in (("none", None), ("invisible", invisible), ("scan", scan), ("broken", broken),
                           ("huge", huge)):
            eng = Counting(cpu_engine)
            rec = await run_page(eng, mp, dataclasses.replace(page(tag, layer), cache_salt=f"tl-{tag}"), cfg=cfg)
            out[tag] = (rec, eng)
        return out

    got = loop_thread.run(go(), timeout=300)
    plain, _ = got["none"]
    assert plain.page.regions, "the random model's page has regions to draft for"
    for tag in ("invisible", "scan", "broken", "huge"):
        rec, eng = got[tag]
        assert rec.page == plain.page and rec.output_tokens == plain.output_tokens, tag  # nothing changed
    rec, eng = got["invisible"]
    drafted = [d for d in rec.region_draft_tokens if d]
    assert rec.text_layer == "used" and len(eng.checks) == len(drafted)  # one check per drafted branch
    assert got["scan"][0].text_layer == "absent" and got["scan"][1].checks == []
    assert got["broken"][0].text_layer == "untrusted" and got["broken"][1].checks == []
    huge_checks = got["huge"][1].checks
    assert huge_checks and max(huge_checks) <= MAX_DRAFT_TOKENS
