"""The layout grammar (pure): what it allows parses cleanly, what the serializer writes it accepts, limits hold."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings

from padoc_ray.protocol import LayoutGrammar, ProtocolSpec, StreamParser, Vocab, serialize_padoc
from padoc_ray.protocol.bytes_tokenizer import ByteTokenizer
from padoc_ray.protocol.codec import INVALID_BOX
from padoc_ray.protocol.grammar import Kind
from padoc_ray.protocol.spec import CoordinateSpec

from tests.unit.protocol.test_codec import pages

SPEC = ProtocolSpec()
V = Vocab.from_spec(SPEC, ByteTokenizer(SPEC))
G = LayoutGrammar(V)
# a spec whose fields come in another order (upper corners first, category in the middle), and few bins
ODD_SPEC = ProtocolSpec(coordinates=CoordinateSpec(bins=7, region_fields=("x2", "y2", "category", "y1", "x1")))
ODD_V = Vocab.from_spec(ODD_SPEC, ByteTokenizer(ODD_SPEC))


def walk(g: LayoutGrammar, rng: random.Random, *, max_regions=None, max_tokens=None, p_end=0.15) -> list[int]:
    """A random stream through the grammar: each token drawn from the allowed set."""
    cur = g.cursor(max_regions=max_regions, max_tokens=max_tokens)
    out: list[int] = []
    while not cur.ended:
        ids = cur.allowed_ids()
        assert ids, f"empty allowed set after {out}"
        eos = g.vocab.end_of_stream
        if eos in ids and len(ids) > 1:  # between regions: end now and then
            t = eos if rng.random() < p_end else next(i for i in ids if i != eos)
        else:
            t = rng.choice(sorted(ids))
        assert cur.advance(t)
        out.append(t)
        assert len(out) < 100_000
    return out


def parse_clean(vocab: Vocab, ids: list[int]):
    p = StreamParser(vocab)
    p.feed_many(ids)
    regions = p.finish()
    assert p.error_codes == [], (p.error_codes, ids)
    assert all(INVALID_BOX not in r.errors for r in regions)
    return regions


@pytest.mark.parametrize("vocab", [V, ODD_V], ids=["default", "odd-field-order"])
def test_random_walks_parse_without_errors(vocab):
    g = LayoutGrammar(vocab)
    rng = random.Random(7)
    sizes = []
    for _ in range(300):
        max_regions = rng.choice([None, 0, 1, 3, 40])
        max_tokens = rng.choice([None, 1, 7, 8, 15, 16, 50, 300])
        ids = walk(g, rng, max_regions=max_regions, max_tokens=max_tokens, p_end=rng.choice([0.02, 0.1, 0.5]))
        regions = parse_clean(vocab, ids)
        assert ids[-1] == vocab.end_of_stream
        if max_regions is not None:
            assert len(regions) <= max_regions
        if max_tokens is not None:
            assert len(ids) <= max_tokens
        sizes.append(len(regions))
    assert max(sizes) >= 20 and min(sizes) == 0  # the walks cover empty and long layouts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=pages)
def test_every_serialized_layout_is_accepted(page):
    layout = serialize_padoc(V, ByteTokenizer(SPEC), page).layout
    cur = G.cursor(max_regions=len(page.regions), max_tokens=len(layout))
    for t in layout:
        assert t in cur.allowed_ids()
        assert cur.advance(t)
    assert cur.ended and cur.allowed_ids() is None


def _region(cat="text_block", x1=10, y1=20, x2=30, y2=40) -> list[int]:
    c = V.coord_ids
    return [V.region_open, V.category_ids[cat], c[x1], c[y1], c[x2], c[y2], V.region_close]


def test_allowed_sets_step_by_step():
    cur = G.cursor()
    assert cur.allowed_ids() == {V.region_open, V.end_of_stream}  # end-of-stream: an empty page is fine
    cur.advance(V.region_open)
    assert cur.allowed_ids() == set(V.category_ids.values())
    cur.advance(V.category_ids["title"])
    assert cur.allowed_ids() == set(V.coord_ids)  # x1: any bin
    cur.advance(V.coord_ids[500])
    assert cur.allowed_ids() == set(V.coord_ids)  # y1: any bin
    cur.advance(V.coord_ids[900])
    assert cur.allowed().kind == Kind.COORD and cur.allowed_ids() == set(V.coord_ids[500:])  # x2 >= x1
    cur.advance(V.coord_ids[500])  # a zero-width box is allowed
    assert cur.allowed_ids() == set(V.coord_ids[900:])  # y2 >= y1
    cur.advance(V.coord_ids[999])
    assert cur.allowed_ids() == {V.region_close}
    cur.advance(V.region_close)
    assert cur.n_regions == 1 and cur.allowed_ids() == {V.region_open, V.end_of_stream}


def test_field_order_decides_which_corner_is_bounded():
    g, c = LayoutGrammar(ODD_V), ODD_V.coord_ids
    cur = g.cursor()
    cur.advance(ODD_V.region_open)
    assert cur.allowed_ids() == set(c)  # x2 first: any bin
    cur.advance(c[3])
    cur.advance(c[5])  # y2
    cur.advance(ODD_V.category_ids["table"])
    assert cur.allowed_ids() == set(c[:6])  # y1 <= y2
    cur.advance(c[5])
    assert cur.allowed_ids() == set(c[:4])  # x1 <= x2
    assert not cur.advance(c[4]) and cur.free


@pytest.mark.parametrize("bad_at, bad", [
    (0, 65),  # a content byte outside a region
    (1, "close"),  # a region closed before its category
    (2, "eos"),  # end-of-stream inside a region
    (4, "small_x2"),  # x2 < x1
    (6, "open"),  # a region opened inside a region
])
def test_tokens_outside_the_grammar_are_refused_and_release_the_stream(bad_at, bad):
    good = _region()
    tok = {"close": V.region_close, "eos": V.end_of_stream, "small_x2": V.coord_ids[9], "open": V.region_open}.get(bad, bad)
    cur = G.cursor()
    for t in good[:bad_at]:
        assert cur.advance(t)
    assert tok not in cur.allowed_ids()
    assert not cur.advance(tok)
    assert cur.free and cur.allowed_ids() is None and cur.allowed().kind == Kind.FREE
    assert not cur.advance(V.end_of_stream)  # free for good: nothing is checked any more


def test_region_limit_leaves_only_end_of_stream():
    cur = G.cursor(max_regions=2)
    for t in _region() + _region("figure"):
        assert cur.advance(t)
    assert cur.allowed_ids() == {V.end_of_stream}
    assert not cur.advance(V.region_open)
    zero = G.cursor(max_regions=0)
    assert zero.allowed_ids() == {V.end_of_stream}


def test_token_budget_only_opens_regions_that_fit_with_their_end():
    assert G.region_len == 7
    assert G.cursor(max_tokens=7).allowed_ids() == {V.end_of_stream}  # 7 region tokens + end = 8 > 7
    cur = G.cursor(max_tokens=8)
    assert V.region_open in cur.allowed_ids()
    for t in _region():
        cur.advance(t)
    assert cur.allowed_ids() == {V.end_of_stream}
    with pytest.raises(ValueError):
        G.cursor(max_tokens=0)
    with pytest.raises(ValueError):
        G.cursor(max_regions=-1)


def test_after_end_of_stream_anything_goes_and_is_flagged():
    cur = G.cursor()
    assert cur.advance(V.end_of_stream) and cur.ended
    assert cur.allowed_ids() is None
    assert not cur.advance(V.region_open) and cur.free
