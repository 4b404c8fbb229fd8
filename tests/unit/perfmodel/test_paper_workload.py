"""The paper's 384-page workload, synthesized: its decode statistics, counted as the project counts
them, are those of the paper's Table 11(a) and the output lengths Tables 12-13 imply."""

from __future__ import annotations

import random

import pytest

from padoc_ray.perfmodel.plan import plan_page
from padoc_ray.perfmodel.workload import (
    PAGE_SIZES,
    PAPER_384,
    SEQUENTIAL_RUNAWAY_PAGES,
    image_tokens,
    paper384,
    paper384_traces,
    text_of_tokens,
    workload_stats,
)
from padoc_ray.protocol import Page, decode_depth, serialize_sequential
from padoc_ray.protocol.codec import content_tokens, region_layout_tokens
from padoc_ray.scheduler import SchedulerConfig

#: how close each statistic must come to the paper's: quartiles and medians of F_seq / F_PaDoc (relative),
#: their means, the step reduction (percentage points) and the tokens a fork page generates (relative)
TOLERANCE = {"quartile": 0.03, "mean": 0.05, "reduction_pp": 2.0, "output": 0.10}


@pytest.fixture(scope="module")
def pages(model_protocol):
    return paper384(model_protocol, seed=0)


def test_the_statistics_are_the_papers_within_tolerance(pages, model_protocol):
    got = workload_stats(pages, model_protocol)
    assert got["pages"] == PAPER_384["pages"] == 384
    for key in ("f_seq", "f_padoc"):
        for q in ("p25", "median", "p75"):
            assert got[key][q] == pytest.approx(PAPER_384[key][q], rel=TOLERANCE["quartile"]), (key, q)
        assert got[key]["mean"] == pytest.approx(PAPER_384[key]["mean"], rel=TOLERANCE["mean"]), key
    for q in ("p25", "median", "p75", "mean"):
        assert got["step_reduction_pct"][q] == pytest.approx(PAPER_384["step_reduction_pct"][q],
                                                             abs=TOLERANCE["reduction_pp"]), q
    assert got["padoc_output_tokens_per_page"] == pytest.approx(PAPER_384["padoc_output_tokens_per_page"],
                                                                rel=TOLERANCE["output"])


def test_the_stats_are_the_projects_own_decode_depth(pages, model_protocol):
    """workload_stats counts as host records do: decode_depth over the protocol's layout and content tokens."""
    _, page, _ = pages[7]
    ll = [len(region_layout_tokens(model_protocol.vocab, r)) for r in page.regions]
    cl = [len(content_tokens(model_protocol.tokenizer, r)) for r in page.regions]
    d = decode_depth(ll, cl)
    two = workload_stats([pages[7], pages[7]], model_protocol)
    assert two["f_seq"]["median"] == d.f_seq and two["f_padoc"]["median"] == d.f_padoc
    assert two["step_reduction_pct"]["median"] == pytest.approx(100 * d.step_reduction)


def test_pages_are_protocol_pages_with_their_image_tokens(pages):
    names = [n for n, _, _ in pages]
    assert len(set(names)) == len(names) == 384 and names[0] == "paper384-000"
    for _, page, tokens in pages:
        assert isinstance(page, Page) and page.regions
        assert tokens == image_tokens(page.width, page.height)
        assert all(0 <= r.box.y1 < r.box.y2 <= 1 for r in page.regions)
        assert all((r.content is None) == (r.content_format == "none") for r in page.regions)
    # A4 portrait / landscape and Letter at 200 dpi, in about the stated shares
    assert {(p.width, p.height) for _, p, _ in pages} == {(w, h) for _, w, h, _ in PAGE_SIZES}
    a4 = sum(1 for _, p, _ in pages if (p.width, p.height) == (1654, 2339))
    assert 0.6 < a4 / len(pages) < 0.8
    assert {t for _, _, t in pages} == {52 * 73, 53 * 69, 73 * 52}  # as Qwen3-VL's processor counts them


def test_page_sizes_can_come_from_a_ground_truths_page_info(model_protocol):
    sizes = [(2000, 1500), (729, 516)]
    got = paper384(model_protocol, seed=0, pages=16, page_sizes=sizes)
    assert {(p.width, p.height) for _, p, _ in got} == set(sizes)
    assert {t for _, _, t in got} == {image_tokens(2000, 1500), image_tokens(729, 516)}
    # the decode statistics do not depend on the image sizes
    plain = paper384(model_protocol, seed=0, pages=16)
    assert [p.regions for _, p, _ in got] == [p.regions for _, p, _ in plain]


def test_another_models_processor_counts_the_image_tokens(model_protocol):
    """bench model --gpu G --model-config hpd-1b: the same pages, their image tokens HPD-Parsing's tiles."""
    from padoc_ray.perfmodel.trace import PROCESSORS

    got = paper384(model_protocol, seed=0, pages=16, proc=PROCESSORS["hpd-1b"])
    plain = paper384(model_protocol, seed=0, pages=16)
    assert [(n, p) for n, p, _ in got] == [(n, p) for n, p, _ in plain]
    # A4 (4 x 6 tiles), Letter (4 x 5) and landscape A4 (4 x 3) at 200 dpi, each with the thumbnail
    want = {(1654, 2339): 256 * 25, (1700, 2200): 256 * 21, (2339, 1654): 256 * 13}
    assert all(t == want[(p.width, p.height)] for _, p, t in got)
    traces, _ = paper384_traces(model_protocol, seed=0, pages=4, max_tokens=1500, proc=PROCESSORS["hpd-1b"])
    assert len(traces) == 4 and {t.image_tokens for t in traces} <= set(want.values())


def test_runaway_pages_run_to_the_limit_in_sequential_mode_only(model_protocol):
    """The paper's 20-25 Sequential SFT pages that reached the 8,192-token generation limit: the same
    number (scaled to the pages taken) runs past max_tokens in sequential mode and is invalid, through
    the real PageState; their fork traces are the page's own and valid."""
    cfg = SchedulerConfig(max_tokens=1500)  # a lower limit keeps the test fast; the mechanism is the same
    traces, names = paper384_traces(model_protocol, seed=0, pages=48, max_tokens=cfg.max_tokens)
    assert len(traces) == 48 and len(names) == round(SEQUENTIAL_RUNAWAY_PAGES * 48 / 384) == 3
    plain = {n: p for n, p, _ in paper384(model_protocol, seed=0)[:48]}
    for t in traces:
        seq = plan_page(t, "sequential", model_protocol.vocab, cfg)
        fork = plan_page(t, "fork", model_protocol.vocab, cfg)
        want = serialize_sequential(model_protocol.vocab, model_protocol.tokenizer, plain[t.name])
        if t.name in names:
            assert len(t.sequential.main) > cfg.max_tokens
            assert (seq.status, seq.valid) == ("token_limit", False)
            assert seq.requests[0].output_tokens == cfg.max_tokens and seq.requests[0].finish_reason == "length"
            assert list(t.sequential.main[:50]) == list(want[:50])  # the page's own stream, then more prose
        else:
            assert list(t.sequential.main) == list(want)
        assert fork.valid, t.name
    again, names2 = paper384_traces(model_protocol, seed=0, pages=48, max_tokens=cfg.max_tokens)
    assert names2 == names and again == traces


def test_the_same_seed_gives_the_same_pages(model_protocol):
    a = paper384(model_protocol, seed=3, pages=8)
    assert a == paper384(model_protocol, seed=3, pages=8)
    assert a != paper384(model_protocol, seed=4, pages=8)
    with pytest.raises(ValueError, match="at least 4 pages"):
        paper384(model_protocol, pages=3)


def test_text_of_a_wanted_token_length_encodes_to_exactly_that(model_protocol):
    rng = random.Random(1)
    for n in (1, 2, 7, 64, 333, 1500):
        assert len(model_protocol.tokenizer.encode(text_of_tokens(model_protocol.tokenizer, n, rng))) == n


def test_image_tokens_follow_qwen3_vls_processor():
    assert image_tokens(1131, 1600) == 35 * 50  # sides rounded to 32 px: 1120 x 1600
    assert image_tokens(198, 256, min_pixels=4096, max_pixels=262144) == 6 * 8  # as vLLM counted it (tiny)
    assert image_tokens(4000, 4000, max_pixels=262144) == 16 * 16  # scaled into the budget
    assert image_tokens(20, 20) == 8 * 8  # scaled up to the minimum (65536 px)
