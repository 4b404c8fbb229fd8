"""The dots family (dots.ocr's JSON layout answer and grounding branches) as pure code and on the scripted
engine: the incremental JSON parser, the resize rule, recognition, the grounding branch's prompt, replay in
both modes, statuses. The real engine's tests of the same family are in tests/engine/protocol/test_dots_on_vllm.py."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.protocol import Box, Page, Region
from padoc_ray.protocol.codec import BOX_OUTSIDE_PAGE, MALFORMED_REGION, TRUNCATED, UNEXPECTED_TOKEN
from padoc_ray.protocol.dots import DotsSpec, box_text, layout_cells, smart_resize
from padoc_ray.protocol.family import BRANCH_SHAPES, DOTS, recognize
from padoc_ray.protocol.json_cells import CellScanner
from padoc_ray.scheduler import PageInput, SchedulerConfig, replay_input, run_page

from tests.helpers.byte_protocol import ByteDotsProtocol, ByteHpdProtocol, ByteProtocol

D = ByteDotsProtocol()
DV = D.vocab
tok = D.tokenizer


def answer(cells, *, end=True) -> list[int]:
    """A layout answer as dots.ocr writes it (json.dumps of the cells), one byte per token."""
    text = cells if isinstance(cells, str) else json.dumps(cells, ensure_ascii=False)
    return tok.encode(text) + ([DV.end_of_stream] if end else [])


def truth_page() -> Page:
    regs = (
        Region(category="title", box=Box(0.1, 0.05, 0.9, 0.1), content="A title"),
        Region(category="text_block", box=Box(0.1, 0.12, 0.9, 0.3), content='Body {text} with "quotes" and ü, 中文.'),
        Region(category="figure", box=Box(0.2, 0.35, 0.8, 0.6), content=None, content_format="none"),
        Region(category="figure_caption", box=Box(0.2, 0.61, 0.8, 0.65), content="Figure 1: a plot."),
        Region(category="table", box=Box(0.1, 0.7, 0.9, 0.85), content="<table><tr><td>1</td></tr></table>",
               content_format="html"),
        Region(category="equation_isolated", box=Box(0.3, 0.86, 0.7, 0.9), content="E = m c^{2}",
               content_format="latex"),
        Region(category="header", box=Box(0.45, 0.95, 0.55, 0.98), content="7"),
    )
    return Page(width=1224, height=1584, regions=regs)


def run(engine, inp, mode="fork", proto=D, **cfg):
    return asyncio.run(run_page(engine, proto, inp, mode=mode, cfg=SchedulerConfig(**cfg)))


def base(page: Page) -> PageInput:
    return PageInput(page_id="p", image=None, width=page.width, height=page.height)


# ---- the JSON scanner and parser ---------------------------------------------------------------------------
def test_the_scanner_finds_every_cell_whatever_the_chunking():
    cells = [{"bbox": [1, 2, 3, 4], "category": "Text", "text": 'a } b { c "q" \\ ] ['},
             {"bbox": [5, 6, 7, 8], "category": "Table", "text": "<td>{x}</td>"}, {"bbox": [0, 0, 1, 1], "category": "Picture"}]
    text = json.dumps(cells)
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randrange(0, 40)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        sc, opened, closed, pos = CellScanner(), [], [], 0
        for c in chunks:
            ev = sc.feed(c)
            assert ev.stray is None
            opened += [pos + i for i in ev.opened]
            closed += [pos + i for i in ev.closed]
            pos += len(c)
        assert [json.loads(text[a:b + 1]) for a, b in zip(opened, closed)] == cells
        assert sc.list_closed and sc.depth == 0


def test_cells_split_across_bytes_give_regions_with_their_names_boxes_and_close_points():
    cells = [{"bbox": [10, 20, 300, 60], "category": "Title"}, {"bbox": [10, 70, 300, 400], "category": "Text"},
             {"bbox": [10, 410, 300, 600], "category": "Picture"}]
    ids = answer(cells)
    p = DV.parser()
    closed_at = [i for i, t in enumerate(ids) if p.feed(t) is not None]
    regions = p.finish()
    assert not p.issues
    assert [(r.label, r.category, r.bins) for r in regions] == [
        ("Title", "title", (10, 20, 300, 60)), ("Text", "text_block", (10, 70, 300, 400)),
        ("Picture", "figure", (10, 410, 300, 600))]
    # a cell closes on the token holding its "}", not later
    assert [ids[i] for i in closed_at] == [ord("}")] * 3
    assert [r.fork_point for r in regions] == [i + 1 for i in closed_at]
    assert [DV.has_branch(r) for r in regions] == [True, True, False]  # a Picture gets no branch


def test_strings_holding_braces_escaped_quotes_and_multibyte_text_read_back_exactly():
    text = 'He said "{not a cell}" \\ and ] [ 中文 ü'
    cells = [{"bbox": [1, 2, 30, 40], "category": "Text", "text": text}]
    regions = layout_cells(DV, answer(cells), sequential=True)
    assert [r.content_text for r in regions] == [text]


def test_a_truncated_last_cell_is_dropped_with_a_status_and_the_earlier_ones_kept():
    ids = answer('[{"bbox": [1, 2, 30, 40], "category": "Text"}, {"bbox": [5, 6, 7', end=False)
    p = DV.parser()
    p.feed_many(ids)
    assert [r.bins for r in p.finish()] == [(1, 2, 30, 40)]
    assert TRUNCATED in p.error_codes
    ids = answer('[{"bbox": [1, 2, 30, 40], "category": "Text"}, {"bbox": [5, 6, 7')  # ended inside a cell
    p = DV.parser()
    p.feed_many(ids)
    assert len(p.finish()) == 1 and MALFORMED_REGION in p.error_codes and TRUNCATED not in p.error_codes


@pytest.mark.parametrize("cell, why", [
    ('{"bbox": [1, 2, 3], "category": "Text"}', "four numbers"),
    ('{"bbox": [1, 2, 3, "x"], "category": "Text"}', "four numbers"),
    ('{"bbox": [1, 2, 3, 4], "category": 7}', "category"),
    ('{"bbox": [1, 2, 3, 4] "category": "Text"}', "not valid JSON"),
])
def test_a_cell_that_does_not_parse_is_dropped_with_a_clear_code(cell, why):
    ids = answer(f'[{cell}, {{"bbox": [1, 2, 3, 4], "category": "Title"}}]')
    p = DV.parser()
    p.feed_many(ids)
    assert [r.label for r in p.finish()] == ["Title"]
    assert [i.code for i in p.issues] == [MALFORMED_REGION] and why in p.issues[0].detail


def test_text_outside_the_cells_is_an_unexpected_token():
    p = DV.parser()
    p.feed_many(answer('Sure! [{"bbox": [1, 2, 3, 4], "category": "Text"}]'))
    assert len(p.finish()) == 1 and p.error_codes == [UNEXPECTED_TOKEN]


def test_a_layout_cell_past_its_token_cap_is_dropped_and_the_next_one_read():
    ids = answer('[{"bbox": [1, 2, 3, 4], "category": "' + "x{" * 200 + '"}, {"bbox": [5, 6, 7, 8], "category": "Text"}]')
    p = DV.parser()
    p.feed_many(ids)
    assert p.error_codes == [MALFORMED_REGION] and "past 256 tokens" in p.issues[0].detail
    assert [r.bins for r in p.finish()] == [(5, 6, 7, 8)]


def test_a_sequential_cell_holds_its_whole_text_however_long():
    """dots' own single request writes each region's text inside its cell: no cell cap (the stream's token
    limit bounds it), so a long paragraph or table is read whole, and the page reads back as written."""
    long = "A long paragraph, {braces} and \\ \"quotes\" " * 200
    table = "<table>" + "<tr><td>1</td><td>x</td></tr>" * 300 + "</table>"
    cells = [{"bbox": [1, 2, 300, 400], "category": "Text", "text": long},
             {"bbox": [1, 410, 300, 600], "category": "Table", "text": table},
             {"bbox": [1, 610, 300, 700], "category": "Picture"}]
    regions = layout_cells(DV, answer(cells), sequential=True)
    assert [r.content_text for r in regions] == [long, table, ""]  # a Picture has no text
    truth = truth_page()
    seq = DV.serialize_sequential(tok, truth)
    p = DV.parser(sequential=True)
    p.feed_many(seq)
    assert not p.issues and len(p.finish()) == len(truth.regions)


# ---- boxes, categories, the resize rule ---------------------------------------------------------------------
def test_smart_resize_keeps_sides_on_the_factor_and_the_area_in_budget():
    assert smart_resize(1584, 1224) == (1596, 1232)
    rng = random.Random(3)
    for _ in range(300):
        h, w = rng.randrange(20, 9000), rng.randrange(20, 9000)
        lo, hi = 4 * 28 * 28, rng.choice([300 * 28 * 28, 11289600])
        rh, rw = smart_resize(h, w, 28, lo, hi)
        assert rh % 28 == 0 and rw % 28 == 0 and rh * rw <= hi
        assert rh * rw >= lo or rh == 28 or rw == 28
        if lo <= (rh * rw) and 28 * 4 < min(h, w) and max(h, w) / min(h, w) < 10:
            assert abs(rh / rw - h / w) / (h / w) < 0.35


def test_a_box_outside_the_resized_image_is_kept_clipped_and_flagged():
    w, h = DV.spec.input_size(1224, 1584)
    cells = [{"bbox": [10, 10, w + 50, 100], "category": "Text"}, {"bbox": [10, 110, 200, 200], "category": "Text"}]
    layout = answer(cells)
    branches = [(DV.branch_start, *tok.encode("x"), DV.end_of_stream)] * 2
    from padoc_ray.protocol import parse_padoc

    page = parse_padoc(DV, tok, layout, branches, width=1224, height=1584, branches_have_start=True)
    assert page.regions[0].box.x2 == 1.0 and BOX_OUTSIDE_PAGE in page.regions[0].errors
    assert BOX_OUTSIDE_PAGE not in page.regions[1].errors and BOX_OUTSIDE_PAGE in page.errors


def test_unknown_categories_are_kept_as_written_and_counted():
    eng = ScriptedEngine(chunk=5)
    inp = PageInput(page_id="u", image=None, width=1000, height=1000,
                    forced_main=answer([{"bbox": [1, 2, 300, 400], "category": "Marginalia"}]),
                    forced_branches=[tok.encode("side note") + [DV.end_of_stream]])
    rec = run(eng, inp)
    assert rec.status == "ok"
    assert [(r.category, r.content) for r in rec.page.regions] == [("Marginalia", "side note")]
    assert rec.unknown_categories == ["Marginalia"]


# ---- recognition --------------------------------------------------------------------------------------------
def test_a_dots_config_is_recognized_with_its_image_processors_pixel_budget(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DotsOCRForCausalLM"], "model_type": "dots_ocr"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"min_pixels": 3136, "max_pixels": 300 * 28 * 28, "patch_size": 14, "merge_size": 2}))
    found = recognize(tmp_path)
    assert found.family == DOTS and BRANCH_SHAPES[found.family] == "grounding"
    assert (found.spec.max_pixels, found.spec.factor) == (300 * 28 * 28, 28)
    (tmp_path / "padoc_protocol.json").write_text(json.dumps({"family": "dots", "categories": {"Caption": "table_caption"}}))
    assert recognize(tmp_path).spec.category("Caption") == "table_caption"
    assert recognize(tmp_path).spec.max_pixels == 300 * 28 * 28


# ---- the grounding branch, on the scripted engine ------------------------------------------------------------
def test_replay_through_grounding_branches_reproduces_the_page_and_each_prompt_is_its_box():
    truth = truth_page()
    eng = ScriptedEngine(chunk=3)
    rec = run(eng, replay_input(D, truth, base(truth), "fork"))
    assert rec.status == "ok" and rec.page.errors == ()
    want = DV.quantized(truth)
    assert [(r.category, r.content) for r in rec.page.regions] == [(r.category, r.content) for r in want.regions]
    for got, exp in zip(rec.page.regions, want.regions):
        assert got.box.as_tuple() == pytest.approx(exp.box.as_tuple(), abs=1e-9)
    # six branches (the Picture has none); each prompt = the grounding prompt around its own box, no layout tokens
    reqs = [r for r in eng.requests if r.request_id != "p/main" and not r.request_id.endswith("/main")]
    assert len(reqs) == 6
    before, after = DV._grounding_ids
    layout = replay_input(D, truth, base(truth), "fork").forced_main
    boxes = [r.bins for r in layout_cells(DV, layout) if DV.has_branch(r)]
    for req, b in zip(sorted(reqs, key=lambda r: r.request_id), boxes):
        p = list(req.prompt_ids)
        assert p == [*before, *tok.encode(box_text(b)), *after]
        assert p[-1] == DV.branch_start
    assert len({tuple(r.prompt_ids[:len(before)]) for r in reqs}) == 1  # one shared image-and-prompt prefix


def test_sequential_is_dots_own_single_request_and_gives_the_same_page():
    truth = truth_page()
    fork = run(ScriptedEngine(chunk=4), replay_input(D, truth, base(truth), "fork"))
    seq_eng = ScriptedEngine(chunk=4)
    seq = run(seq_eng, replay_input(D, truth, base(truth), "sequential"), mode="sequential")
    assert seq.status == "ok" and len(seq_eng.requests) == 1
    assert list(seq_eng.requests[0].prompt_ids) == list(D.prompt_ids("sequential"))
    assert [(r.category, r.content, r.box) for r in seq.page.regions] == [
        (r.category, r.content, r.box) for r in fork.page.regions]
    assert seq.f_seq > fork.f_padoc and seq.f_padoc < seq.f_seq


def test_the_branch_shape_is_the_familys_and_prefix_fork_families_keep_theirs():
    assert {p.vocab.family: p.vocab.branch_prompt((1, 2), (5, 6, 7, 8), type("R", (), {"fork_point": 2})())
            for p in (ByteProtocol(), ByteHpdProtocol())} == {
        "padoc": [1, 2, 5, 6, ByteProtocol().vocab.branch_start],
        "hpd": [1, 2, 5, 6, ByteHpdProtocol().vocab.branch_start]}
    assert DotsSpec().prompt("fork").endswith("<|assistant|>")
