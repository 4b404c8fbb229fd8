"""The token protocol: spec files, OmniDocBench conversion, both serial forms, tolerant parsing, depth."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from padoc_ray.protocol import (
    Box, Page, ProtocolError, ProtocolSpec, Region, StreamParser, Vocab, decode_depth, page_from_omnidocbench,
    page_to_omnidocbench, parse_branch, parse_padoc, parse_sequential, quantized, serialize_padoc,
    serialize_sequential, to_markdown,
)
from padoc_ray.protocol import codec
from padoc_ray.protocol.bytes_tokenizer import ByteTokenizer
from padoc_ray.protocol.page import PageFormatError
from padoc_ray.protocol.spec import DEFAULT_CATEGORIES

from tests.conftest import DEMO_DIR, require_demo_data  # noqa: E402

DEMO = os.path.join(DEMO_DIR, "OmniDocBench_demo.json")

SPEC = ProtocolSpec()
TOK = ByteTokenizer(SPEC)
V = Vocab.from_spec(SPEC, TOK)
BINS = SPEC.coordinates.bins


def kw(p: Page) -> dict:
    return dict(width=p.width, height=p.height, page_no=p.page_no, image_path=p.image_path)


# ---- strategies -------------------------------------------------------------------------------
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def regions(draw):
    cat = draw(st.sampled_from(sorted(DEFAULT_CATEGORIES)))
    fmt = DEFAULT_CATEGORIES[cat]
    x = sorted([draw(unit), draw(unit)])
    y = sorted([draw(unit), draw(unit)])
    content = None if fmt == "none" else draw(st.text(max_size=40))
    return Region(category=cat, box=Box(x[0], y[0], x[1], y[1]), content=content, content_format=fmt)


pages = st.builds(
    lambda regs, w, h: Page(width=w, height=h, regions=tuple(regs)),
    st.lists(regions(), max_size=12), st.integers(16, 4000), st.integers(16, 4000),
)


# ---- spec -------------------------------------------------------------------------------------
def test_spec_round_trips_through_its_json_file(tmp_path):
    path = SPEC.save(tmp_path)
    assert os.path.basename(path) == "padoc_protocol.json"
    assert ProtocolSpec.load(tmp_path) == SPEC
    data = json.load(open(path))
    assert [c["name"] for c in data["categories"]] == list(DEFAULT_CATEGORIES)
    assert data["coordinates"]["bins"] == 1000


def test_other_token_strings_work_without_code_changes(tmp_path):
    d = SPEC.to_dict()
    d["tokens"] = {"region_open": "<L>", "region_close": "</L>", "branch_start": "<FORK>", "end_of_stream": "<EOS>"}
    d["coordinates"]["token_format"] = "<bin{}>"
    d["coordinates"]["region_fields"] = ["x1", "y1", "x2", "y2", "category"]
    for c in d["categories"]:
        c["token"] = f"<{c['name'].upper()}>"
    (tmp_path / "padoc_protocol.json").write_text(json.dumps(d))
    spec = ProtocolSpec.load(tmp_path)
    tok = ByteTokenizer(spec)
    v = Vocab.from_spec(spec, tok)
    assert v.region_open == tok.token_to_id("<L>") and v.coord_ids[7] == tok.token_to_id("<bin7>")
    page = Page(width=100, height=100, regions=(Region(category="title", box=Box(0.1, 0.2, 0.3, 0.4), content="Hi"),))
    sample = serialize_padoc(v, tok, page)
    assert sample.layout[1] == tok.token_to_id("<bin100>")  # x1 first, category last
    assert sample.layout[5] == tok.token_to_id("<TITLE>")
    back = parse_padoc(v, tok, sample.layout, [b[1:] for b in sample.branches], **kw(page))
    assert back == quantized(page, v)


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda d: d["tokens"].update(branch_start=d["tokens"]["region_open"]), "distinct"),
        (lambda d: d["categories"][0].update(content_format="markdown"), "content_format"),
        (lambda d: d["coordinates"].update(token_format="<c>"), "{}"),
        (lambda d: d["coordinates"].update(region_fields=["x1", "y1", "x2", "y2"]), "permutation"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(bogus=1) or d["tokens"].update(extra="x"), "malformed"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(mutate, msg):
    d = SPEC.to_dict()
    mutate(d)
    with pytest.raises(ProtocolError, match=msg):
        ProtocolSpec.from_dict(d)


def test_missing_spec_and_tokenizer_without_tokens_are_clear_errors(tmp_path):
    with pytest.raises(ProtocolError, match="no protocol spec"):
        ProtocolSpec.load(tmp_path)

    class Bare:
        def token_to_id(self, t):
            return None

    with pytest.raises(ProtocolError, match="tokenizer lacks protocol tokens"):
        Vocab.from_spec(SPEC, Bare())


# ---- OmniDocBench conversion ------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_pages():
    require_demo_data()
    return json.load(open(DEMO))


def test_demo_pages_convert_and_round_trip_in_both_forms(demo_pages):
    assert len(demo_pages) == 18
    for obj in demo_pages:
        page = page_from_omnidocbench(obj)
        assert len(page.regions) == len(obj["layout_dets"])
        truth = quantized(page, V)
        s = serialize_padoc(V, TOK, page)
        assert parse_padoc(V, TOK, s.layout, [b[1:] for b in s.branches], **kw(page)) == truth
        assert parse_sequential(V, TOK, serialize_sequential(V, TOK, page), **kw(page)) == truth
        back = page_from_omnidocbench(page_to_omnidocbench(page))
        assert [r.content for r in back.regions] == [r.content for r in page.regions]


def test_reading_order_places_unordered_regions_by_position(demo_pages):
    for obj in demo_pages:
        regs = page_from_omnidocbench(obj).regions
        ordered = [d for d in obj["layout_dets"] if d.get("order") is not None]
        assert [r.order for r in regs if r.order is not None] == sorted(d["order"] for d in ordered)
        for i, r in enumerate(regs):  # an unordered region stands just before the first ordered one below it
            if r.order is None:
                assert all(q.box.y1 <= r.box.y1 for q in regs[:i] if q.order is not None)
                after = [q for q in regs[i + 1:] if q.order is not None]
                assert not after or after[0].box.y1 > r.box.y1
    # a synthetic page: header at the top, page number at the bottom
    obj = {
        "page_info": {"width": 100, "height": 100, "page_no": 0, "image_path": "x.png"},
        "layout_dets": [
            {"category_type": "page_number", "poly": [45, 95, 55, 95, 55, 99, 45, 99], "order": None, "text": "3"},
            {"category_type": "text_block", "poly": [10, 20, 90, 20, 90, 40, 10, 40], "order": 2, "text": "b"},
            {"category_type": "title", "poly": [10, 10, 90, 10, 90, 15, 10, 15], "order": 1, "text": "a"},
            {"category_type": "header", "poly": [10, 1, 90, 1, 90, 4, 10, 4], "order": None, "text": "h"},
        ],
    }
    assert [r.content for r in page_from_omnidocbench(obj).regions] == ["h", "a", "b", "3"]


@pytest.mark.parametrize(
    "obj, reason",
    [
        ({}, "page_info"),
        ({"page_info": {"width": 0, "height": 10}, "layout_dets": []}, "not positive"),
        ({"page_info": {"width": 10, "height": 10}}, "layout_dets"),
        ({"page_info": {"width": 10, "height": 10}, "layout_dets": [{"category_type": "cat", "poly": [0] * 8}]}, "unknown category"),
        ({"page_info": {"width": 10, "height": 10}, "layout_dets": [{"category_type": "title", "poly": [0, 1]}]}, "poly"),
        ({"page_info": {"width": 10, "height": 10}, "layout_dets": [{"category_type": "title", "poly": ["a"] * 8}]}, "non-number"),
    ],
)
def test_malformed_ground_truth_gets_a_specific_reason(obj, reason):
    with pytest.raises(PageFormatError, match=reason):
        page_from_omnidocbench(obj)


# ---- properties ---------------------------------------------------------------------------------
def _close_within_a_bin(a: Page, b: Page) -> bool:
    for ra, rb in zip(a.regions, b.regions, strict=True):
        if abs(ra.box.x1 - rb.box.x1) > 1 / BINS or abs(ra.box.y2 - rb.box.y2) > 1 / BINS:
            return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages)
def test_round_trip_property_both_forms(page):
    s = serialize_padoc(V, TOK, page)
    fork = parse_padoc(V, TOK, s.layout, [b[1:] for b in s.branches], **kw(page))
    seq = parse_sequential(V, TOK, serialize_sequential(V, TOK, page), **kw(page))
    truth = quantized(page, V)
    assert fork == truth and seq == truth
    assert fork.errors == () and seq.errors == ()
    assert [r.category for r in fork.regions] == [r.category for r in page.regions]
    assert _close_within_a_bin(fork, page)
    assert [r.content for r in fork.regions] == [None if r.content_format == "none" else (r.content or "") for r in page.regions]


@settings(max_examples=60, deadline=None)
@given(pages, st.data())
def test_every_prefix_parses_with_at_most_truncated(page, data):
    s = serialize_padoc(V, TOK, page)
    seq = serialize_sequential(V, TOK, page)
    for stream, sequential in ((s.layout, False), (seq, True)):
        n = data.draw(st.integers(0, len(stream) - 1))
        p = StreamParser(V, sequential=sequential)
        p.feed_many(stream[:n])
        p.finish()
        assert set(p.error_codes) <= {codec.TRUNCATED}
        assert p.error_codes == [codec.TRUNCATED]
    for b in s.branches:
        k = data.draw(st.integers(1, len(b) - 1))
        assert parse_branch(V, b[:k], has_start=True).errors == [codec.TRUNCATED]


@settings(max_examples=150, deadline=None)
@given(pages)
def test_padoc_depth_never_exceeds_sequential(page):
    s = serialize_padoc(V, TOK, page)
    d = decode_depth([7] * len(page.regions), [len(b) - 2 for b in s.branches])
    assert d.f_padoc <= d.f_seq
    assert d.f_seq == len(serialize_sequential(V, TOK, page))
    assert 0.0 <= d.step_reduction < 1.0


def test_depth_by_hand():
    # two regions of 7 layout tokens, contents of 10 and 3 tokens
    d = decode_depth([7, 7], [10, 3])
    assert d.f_seq == 7 + 7 + 1 + 10 + 3  # 28
    # layout alone: 15 steps; branch 1 ends at 7 + 10 + 1 = 18; branch 2 at 14 + 3 + 1 = 18
    assert d.f_padoc == 18
    assert d.step_reduction == pytest.approx(1 - 18 / 28)


# ---- tolerant parsing of malformed streams -------------------------------------------------------
def _region_toks(cat="title", box=(1, 2, 3, 4)):
    return [V.region_open, V.category_ids[cat], *(V.coord_ids[b] for b in box), V.region_close]


@pytest.mark.parametrize(
    "stream, n_regions, codes",
    [
        ([*_region_toks(), V.end_of_stream], 1, []),
        ([*_region_toks()[:4], V.region_close, V.end_of_stream], 0, [codec.MALFORMED_REGION]),
        ([V.region_open, V.coord_ids[1], V.coord_ids[2], *_region_toks(), V.end_of_stream], 1, [codec.MALFORMED_REGION, codec.UNEXPECTED_TOKEN]),
        ([ord("x"), *_region_toks(), V.end_of_stream], 1, [codec.UNEXPECTED_TOKEN]),
        ([*_region_toks(), V.end_of_stream, ord("x")], 1, [codec.TRAILING_TOKENS]),
        ([*_region_toks()[:3], *_region_toks(), V.end_of_stream], 1, [codec.MALFORMED_REGION]),
        ([*_region_toks()[:3], V.end_of_stream], 0, [codec.MALFORMED_REGION]),
        (_region_toks() + _region_toks()[:2], 1, [codec.TRUNCATED]),
        ([], 0, [codec.TRUNCATED]),
    ],
)
def test_malformed_layout_streams_give_codes_not_exceptions(stream, n_regions, codes):
    p = StreamParser(V)
    closed = p.feed_many(stream)
    regs = p.finish()
    assert len(regs) == n_regions == len(closed)
    assert p.error_codes == codes


def test_invalid_box_is_kept_sorted_and_flagged():
    p = StreamParser(V)
    p.feed_many([*_region_toks(box=(500, 600, 100, 700)), V.end_of_stream])
    page = parse_padoc(V, TOK, [*_region_toks(box=(500, 600, 100, 700)), V.end_of_stream], [[V.end_of_stream]],
                       width=10, height=10)
    r = page.regions[0]
    assert r.box.x1 < r.box.x2 and codec.INVALID_BOX in r.errors


def test_region_close_reports_the_fork_point():
    p = StreamParser(V)
    stream = _region_toks() + _region_toks("text_block")
    closes = [(i, r.fork_point) for i, t in enumerate(stream) if (r := p.feed(t)) is not None]
    assert closes == [(6, 6), (13, 13)]  # fork point = tokens before the close


def test_branch_errors_and_missing_branches():
    assert parse_branch(V, [ord("a"), V.region_open, ord("b"), V.end_of_stream]).errors == [codec.CONTROL_IN_CONTENT]
    assert parse_branch(V, [ord("a"), V.end_of_stream, ord("b")]).errors == [codec.TRAILING_TOKENS]
    layout = [*_region_toks(), *_region_toks("text_block"), V.end_of_stream]
    page = parse_padoc(V, TOK, layout, [[ord("h"), ord("i"), V.end_of_stream], None], width=10, height=10)
    assert page.regions[0].content == "hi" and page.regions[1].content is None
    assert page.errors == (codec.MISSING_BRANCH,)


def test_garbage_never_raises():
    import random

    rng = random.Random(0)
    ids = list(range(256)) + sorted(V.control_ids)
    for _ in range(300):
        stream = [rng.choice(ids) for _ in range(rng.randint(0, 80))]
        parse_sequential(V, TOK, stream, width=5, height=5)
        parse_padoc(V, TOK, stream, [stream[:5]] * 3, width=5, height=5)


# ---- rendering ------------------------------------------------------------------------------------
def test_markdown_rendering_follows_reading_order_and_formats():
    page = Page(width=10, height=10, regions=(
        Region(category="header", box=Box(0, 0, 1, .05), content="Running head"),
        Region(category="title", box=Box(0, .1, 1, .2), content="Results"),
        Region(category="text_block", box=Box(0, .2, 1, .3), content="Some text."),
        Region(category="equation_isolated", box=Box(0, .3, 1, .4), content="E = m c^{2}", content_format="latex"),
        Region(category="table", box=Box(0, .4, 1, .5), content="<table><tr><td>1</td></tr></table>", content_format="html"),
        Region(category="figure", box=Box(0, .5, 1, .6), content=None, content_format="none"),
    ))
    md = to_markdown(page)
    assert md.splitlines()[0] == "# Results"
    assert "$$\nE = m c^{2}\n$$" in md and "<table><tr><td>1</td></tr></table>" in md
    assert "Running head" not in md and "Running head" in to_markdown(page, include_furniture=True)
    delimited = Page(width=1, height=1, regions=(Region(category="equation_isolated", box=Box(0, 0, 1, 1),
                                                        content="$$\nx^{2}\n$$", content_format="latex"),))
    assert to_markdown(delimited) == "$$\nx^{2}\n$$\n"  # OmniDocBench's own delimiters are not doubled
    assert md.index("Some text.") < md.index("$$") < md.index("<table>") < md.index("![figure")


def test_swapped_page_size_is_detected_on_the_demo_pages():
    """10 of the 18 OmniDocBench demo pages list a portrait image's size as landscape; reading them
    transposed puts every box on the page (the images' real sizes agree)."""
    import json

    from PIL import Image

    from padoc_ray.protocol.page import page_from_omnidocbench

    root = require_demo_data()
    objs = json.load(open(os.path.join(root, "OmniDocBench_demo.json")))
    swapped = 0
    for o in objs:
        page = page_from_omnidocbench(o)
        real = Image.open(os.path.join(root, "images", o["page_info"]["image_path"])).size
        assert (page.width, page.height) == real
        assert all(r.box.x2 <= 1.02 and r.box.y2 <= 1.02 for r in page.regions)
        swapped += bool(page.extra.get("size_swapped"))
        raw = page_from_omnidocbench(o, fix_swapped=False)
        assert (raw.width, raw.height) == (o["page_info"]["width"], o["page_info"]["height"])
    assert swapped == 10
