"""The paper's 384-page workload, synthesized: its decode statistics, counted as the project counts
them, are those of the paper's Table 11(a) and the output lengths Tables 12-13 imply."""

from __future__ import annotations

import random

import pytest

from padoc_ray.bench.model.workload import PAPER_384, image_tokens, paper384, text_of_tokens, workload_stats
from padoc_ray.protocol import Page, decode_depth
from padoc_ray.protocol.codec import content_tokens, region_layout_tokens

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
    assert {max(p.width, p.height) for _, p, _ in pages} == {1600}


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
