"""The hpd family (HPD-Parsing's text blocks) as pure code and on the scripted engine: its tile grid, its
stream parser, its fork rule, replay, statuses, loops and re-fork. The real engine's tests of the same
family are in test_hpd_engine.py."""

from __future__ import annotations

import asyncio

import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.protocol import Box, Page, Region, hpd_tile_grid, parse_padoc, quantized, to_markdown
from padoc_ray.protocol.codec import CONTROL_IN_CONTENT, MALFORMED_REGION, UNEXPECTED_TOKEN
from padoc_ray.protocol.family import check_mode
from padoc_ray.protocol.hpd import HpdSpec, block_regions
from padoc_ray.protocol.hpd_image import hpd_image_request, hpd_image_tokens
from padoc_ray.scheduler import PageInput, SchedulerConfig, replay_input, run_page

from tests.helpers.byte_protocol import ByteHpdProtocol, ByteProtocol

H = ByteHpdProtocol()
HV = H.vocab
tok = H.tokenizer


def layout(*blocks: str, end=True) -> list[int]:
    """An HPD layout stream from block texts; a trailing '|' on a block means it forks."""
    out = []
    for b in blocks:
        out.append(HV.region_open)
        out += tok.encode(b.rstrip("|"))
        if b.endswith("|"):
            out.append(HV.region_close)
    return out + ([HV.end_of_stream] if end else [])


def truth_page() -> Page:
    regs = (
        Region(category="title", box=Box(0.1, 0.05, 0.9, 0.1), content="A title"),
        Region(category="text_block", box=Box(0.1, 0.12, 0.9, 0.3), content="Body text, one paragraph."),
        Region(category="figure", box=Box(0.2, 0.35, 0.8, 0.6), content=None, content_format="none"),
        Region(category="figure_caption", box=Box(0.2, 0.61, 0.8, 0.65), content="Figure 1: a plot."),
        Region(category="table", box=Box(0.1, 0.7, 0.9, 0.85), content="<table><tr><td>1</td></tr></table>",
               content_format="html"),
        Region(category="equation_isolated", box=Box(0.3, 0.86, 0.7, 0.9), content="E = m c^{2}",
               content_format="latex"),
        Region(category="page_number", box=Box(0.45, 0.95, 0.55, 0.98), content="7"),
    )
    return Page(width=1224, height=1584, regions=regs)


def base(pid="doc:0") -> PageInput:
    return PageInput(page_id=pid, image=None, width=1224, height=1584, cache_salt="doc")


def run(engine, inp, proto=H, mode="fork", **cfg):
    return asyncio.run(run_page(engine, proto, inp, mode=mode, cfg=SchedulerConfig(**cfg)))


# ---- the tile grid ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size,grid", [((514, 64), (8, 1)), ((760, 865), (2, 2)), ((248, 193), (5, 4)),
                                       ((720, 1150), (2, 3))])
def test_hpd_tile_grid_gives_the_released_rules_choices(size, grid):
    assert hpd_tile_grid(*size) == grid
    (w, h), kw = hpd_image_request(*size)
    assert (w, h) == (grid[0] * 448, grid[1] * 448) and kw == {"max_dynamic_patch": grid[0] * grid[1]}


def test_hpd_tile_grid_refuses_an_empty_page_and_stays_within_25_slots():
    with pytest.raises(ValueError, match="positive"):
        hpd_tile_grid(0, 10)
    for w, h in [(1, 5000), (5000, 1), (100000, 100000), (3, 3)]:
        c, r = hpd_tile_grid(w, h)
        assert 1 <= c * r <= 25
    assert hpd_image_tokens(1, 1) == 256 and hpd_image_tokens(2, 3) == 7 * 256


def test_vllms_internvl_tiling_cuts_hpds_grid_from_the_pre_resized_image():
    """Over a sweep of page sizes, stock vLLM's own InternVL tiling (its pixel path: ratios resolved without
    the thumbnail slot), given the pre-resized image and the request's max_dynamic_patch, picks HPD's
    grid; on the original image its own rule would differ on many sizes (why the pre-resize exists)."""
    internvl = pytest.importorskip("vllm.transformers_utils.processors.internvl")
    from PIL import Image

    def stock(w, h, max_patch):
        lo, hi = internvl.resolve_internvl_min_max_num(min_dynamic_patch=1, max_dynamic_patch=max_patch,
                                                       dynamic_image_size=True, use_thumbnail=False)
        ratios = internvl.get_internvl_target_ratios(lo, hi)
        blocks, tw, th = internvl.calculate_internvl_targets(orig_width=w, orig_height=h, target_ratios=ratios,
                                                             image_size=448, use_thumbnail=True)
        return (tw // 448, th // 448), blocks

    sizes = [(w, h) for w in range(120, 3200, 103) for h in range(90, 4300, 137)]
    differs = 0
    for w, h in sizes:
        grid = hpd_tile_grid(w, h)
        (pw, ph), kw = hpd_image_request(w, h)
        got, blocks = stock(pw, ph, kw["max_dynamic_patch"])
        assert got == grid, (w, h)
        assert blocks == grid[0] * grid[1] + (grid[0] * grid[1] > 1)
        differs += stock(w, h, 24)[0] != grid
    assert differs > len(sizes) // 10  # the pre-resize matters: stock's rule alone picks other grids
    # the crops themselves, for a few sizes: tiles of 448 plus the thumbnail
    for w, h in [(612, 792), (1654, 2339), (300, 2000)]:
        (pw, ph), kw = hpd_image_request(w, h)
        lo, hi = internvl.resolve_internvl_min_max_num(min_dynamic_patch=1, max_dynamic_patch=kw["max_dynamic_patch"],
                                                       dynamic_image_size=True, use_thumbnail=False)
        tiles = internvl.dynamic_preprocess_internvl(Image.new("RGB", (pw, ph)),
                                                     target_ratios=internvl.get_internvl_target_ratios(lo, hi),
                                                     image_size=448, use_thumbnail=True)
        n = kw["max_dynamic_patch"]
        assert len(tiles) == n + (n > 1) and all(t.size == (448, 448) for t in tiles)


# ---- the stream parser -----------------------------------------------------------------------------------
def test_blocks_with_fork_are_regions_with_branches_and_blocks_without_have_none():
    ids = layout("text [10,20,500,80]|", "image [0,100,1000,600]", "title [10,610,990,650]|")
    p = HV.parser()
    closed = [(i, r) for i, t in enumerate(ids) if (r := p.feed(t)) is not None]
    regions = p.finish()
    assert p.error_codes == [] and p.ended
    assert [(r.category, r.label, r.bins, r.has_branch) for r in regions] == [
        ("text_block", "text", (10, 20, 500, 80), True), ("figure", "image", (0, 100, 1000, 600), False),
        ("title", "title", (10, 610, 990, 650), True)]
    # a forked block closes at its <FORK> (fork point = the tokens before it); a picture at the next <BLOCK>
    forks = [i for i, t in enumerate(ids) if t == HV.region_close]
    assert [i for i, _ in closed] == [forks[0], ids.index(HV.region_open, forks[0] + 2), forks[1]]
    assert [r.fork_point for r in regions] == [forks[0], closed[1][0], forks[1]]
    assert HV.box(regions[1]) == Box(0.0, 0.1, 1.0, 0.6)


def test_a_block_that_does_not_parse_is_dropped_with_a_clear_code():
    ids = layout("text [10,20,500,80]|", "text 10,20,500|", "title [1,2,3]|", "text [5,5,6,6]|")
    regions = block_regions(HV, ids)
    p = HV.parser()
    p.feed_many(ids)
    p.finish()
    assert [r.bins for r in regions] == [(10, 20, 500, 80), (5, 5, 6, 6)]
    assert p.error_codes == [MALFORMED_REGION]
    assert any("not 'name [x1,y1,x2,y2]'" in i.detail for i in p.issues)
    assert any("four numbers" in i.detail for i in p.issues)
    # text outside any block, a stray <FORK>, and a stream without its end
    p = HV.parser()
    p.feed_many(tok.encode("hello") + [HV.region_close])
    p.finish()
    assert p.error_codes == [UNEXPECTED_TOKEN, "truncated"]


def test_a_block_that_never_closes_is_cut_at_its_token_cap():
    p = HV.parser()
    p.feed_many([HV.region_open] + tok.encode("x" * 200) + layout("text [1,2,3,4]|"))
    assert [r.bins for r in p.finish()] == [(1, 2, 3, 4)] and MALFORMED_REGION in p.error_codes


def test_unknown_names_are_kept_and_boxes_follow_the_box_space():
    regions = block_regions(HV, layout("seal [0,0,500,500]|", "Text [0,0,10,10]|"))
    assert [(r.category, HV.known_category(r)) for r in regions] == [("figure", True), ("text_block", True)]
    odd = block_regions(HV, layout("marginalia [0,0,500,250]|"))[0]
    assert odd.category == "marginalia" and not HV.known_category(odd) and HV.region_format(odd) == "text"
    px = ByteHpdProtocol(box_space="pixels").vocab
    r = block_regions(px, layout("text [0,0,448,672]|"))[0]
    assert px.box(r, 720, 1150) == Box(0.0, 0.0, 0.5, 0.5)  # a 2x3 grid: 896 x 1344 pixels as sent
    with pytest.raises(ValueError, match="box_space"):
        HpdSpec(box_space="inches")


# ---- the scheduler on the scripted engine -------------------------------------------------------------------
def test_replay_through_the_fork_reproduces_the_page_and_forks_only_blocks_with_content():
    truth = truth_page()
    eng = ScriptedEngine(chunk=3)
    rec = run(eng, replay_input(H, truth, base(), "fork"))
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page == quantized(truth, HV)
    assert rec.n_branches == 6 and len(eng.requests) == 7  # the figure has no <FORK>: no branch
    s = HV.serialize_fork(tok, truth)
    main, *children = eng.requests
    by_index = {int(r.request_id.rsplit("/b", 1)[1]): r for r in children}
    assert sorted(by_index) == [0, 1, 3, 4, 5, 6]
    for k, req in by_index.items():  # page prompt + the layout before this region's <FORK> + <CHILD>
        assert s.layout[s.fork_points[k]] == HV.region_close
        assert list(req.prompt_ids) == [*H.prompt_ids("fork"), *s.layout[:s.fork_points[k]], HV.branch_start]
    assert s.layout[s.fork_points[2]] == HV.region_open  # the figure closes at the next <BLOCK>
    assert rec.region_finish == ["stop", "stop", "skipped", "stop", "stop", "stop", "stop"]


def test_the_same_truth_gives_the_same_markdown_and_regions_in_both_families():
    truth = truth_page()
    P = ByteProtocol()
    a = run(ScriptedEngine(chunk=4), replay_input(P, truth, base(), "fork"), proto=P)
    b = run(ScriptedEngine(chunk=4), replay_input(H, truth, base(), "fork"))
    assert a.status == b.status == "ok"
    assert to_markdown(a.page) == to_markdown(b.page)
    for ra, rb in zip(a.page.regions, b.page.regions, strict=True):
        assert (ra.category, ra.content, ra.content_format) == (rb.category, rb.content, rb.content_format)
        # padoc snaps to the centre of 1/1000 bins, hpd to 1/1000 marks: within one bin of each other
        assert all(abs(x - y) <= 1e-3 + 1e-9 for x, y in zip(ra.box.as_tuple(), rb.box.as_tuple()))


def test_a_fork_token_inside_a_branch_gets_a_status():
    truth = truth_page()
    inp = replay_input(H, truth, base(), "fork")
    bad = list(inp.forced_branches[1])
    bad.insert(3, HV.region_close)
    inp = inp.__class__(**{**inp.__dict__, "forced_branches": [*inp.forced_branches[:1], bad,
                                                                *inp.forced_branches[2:]]})
    rec = run(ScriptedEngine(chunk=2), inp)
    assert not rec.valid and CONTROL_IN_CONTENT in rec.page.regions[1].errors
    assert CONTROL_IN_CONTENT in rec.page.errors and rec.page.regions[1].content == "Body text, one paragraph."


def test_a_malformed_block_makes_the_page_malformed_layout_and_keeps_the_rest():
    truth = truth_page()
    inp = replay_input(H, truth, base(), "fork")
    broken = layout("text [1,2,3,4]|", "oops|") + []
    inp = inp.__class__(**{**inp.__dict__, "forced_main": broken, "forced_branches": [[HV.end_of_stream]] * 2})
    rec = run(ScriptedEngine(chunk=2), inp)
    assert rec.status == "malformed_layout" and len(rec.page.regions) == 1


def test_a_looping_branch_in_hpds_format_is_caught_and_re_forked():
    truth = truth_page()
    inp = replay_input(H, truth, base(), "fork")
    loop = tok.encode("<td>1</td>" * 200)[:600]
    inp = inp.__class__(**{**inp.__dict__, "forced_first_attempt": {4: loop}})
    rec = run(ScriptedEngine(chunk=8), inp, branch_stream_interval=16)
    assert rec.status == "ok" and rec.retries == 1 and rec.retry_outcomes == ["recovered"], rec.message
    assert rec.page == quantized(truth, HV)


def test_a_looping_layout_of_repeated_blocks_is_caught_and_retried_from_its_last_block():
    truth = truth_page()
    inp = replay_input(H, truth, base(), "fork")
    first = list(inp.forced_main[: inp.forced_main.index(HV.region_close) + 1])
    rep = layout("text [10,10,20,20]|", end=False) * 30
    inp = inp.__class__(**{**inp.__dict__, "forced_main": first + rep})
    rec = run(ScriptedEngine(chunk=4), inp)
    assert rec.status == "layout_unrecovered" and rec.layout_retries == 1, rec.message
    assert "loops" in rec.message and "repeated_region" in rec.message


def test_sequential_mode_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="no meaning for an HPD-Parsing checkpoint"):
        check_mode("hpd", "sequential")
    with pytest.raises(ValueError, match="no sequential"):
        HV.parser(sequential=True)


def test_the_hpd_form_round_trips_through_the_parser():
    truth = truth_page()
    s = HV.serialize_fork(tok, truth)
    page = parse_padoc(HV, tok, s.layout, _branches_by_region(truth, s), width=truth.width, height=truth.height)
    assert page == quantized(truth, HV)


def _branches_by_region(truth: Page, s) -> list:
    """One branch per region, as the scheduler records them (a contentless region's is never run: empty)."""
    return [list(b)[1:] for b in s.branches]


def test_an_unknown_category_name_is_kept_rendered_as_text_and_counted():
    from tests.unit.scheduler.test_refork import recording_recorder

    inp = base()
    main = layout("marginalia [100,100,900,200]|", "text [100,300,900,400]|", "stamp [0,0,10,10]")
    branches = [tok.encode("A side note.") + [HV.end_of_stream], tok.encode("Body.") + [HV.end_of_stream],
                [HV.end_of_stream]]
    inp = inp.__class__(**{**inp.__dict__, "forced_main": main, "forced_branches": branches})
    rec = run(ScriptedEngine(chunk=3), inp)
    assert rec.status == "ok" and rec.valid, rec.message
    assert [(r.category, r.content_format, r.content) for r in rec.page.regions] == [
        ("marginalia", "text", "A side note."), ("text_block", "text", "Body."), ("stamp", "text", "")]
    assert to_markdown(rec.page).startswith("A side note.\n\nBody.")
    assert rec.family == "hpd" and rec.unknown_categories == ["marginalia", "stamp"]
    r = recording_recorder()
    r.page(rec)
    assert r._m["padoc_unknown_categories"].calls == [(1.0, {"family": "hpd", "category": "marginalia"}),
                                                     (1.0, {"family": "hpd", "category": "stamp"})]


# ---- recognizing the family, and what it asks of the engine ---------------------------------------------------
def _checkpoint(tmp_path, config: dict, spec: dict | None = None) -> str:
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    if spec is not None:
        (tmp_path / "padoc_protocol.json").write_text(json.dumps(spec))
    return str(tmp_path)


HPD_CONFIG = {"architectures": ["InternVLChatModel"], "fork_token_id": 151679, "child_token_id": 151680}


def test_the_family_is_recognized_from_the_checkpoint_and_a_spec_file_overrides_it(tmp_path):
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.protocol.family import recognize

    (tmp_path / "a").mkdir()
    found = recognize(_checkpoint(tmp_path / "a", HPD_CONFIG))
    assert found.family == "hpd" and found.spec.box_space == "norm1000" and "fork_token_id 151679" in found.how
    (tmp_path / "b").mkdir()
    found = recognize(_checkpoint(tmp_path / "b", HPD_CONFIG, {"family": "hpd", "box_space": "pixels",
                                                                "categories": {"marginalia": "abandon"}}))
    assert found.family == "hpd" and found.spec.box_space == "pixels" and found.how.startswith("padoc_protocol.json")
    assert found.spec.category("marginalia") == "abandon" and found.spec.category("text") == "text_block"
    (tmp_path / "c").mkdir()  # an InternVL checkpoint without the fork tokens is not HPD-Parsing
    with pytest.raises(ProtocolError, match="not a checkpoint padoc-ray knows.*InternVLChatModel"):
        recognize(_checkpoint(tmp_path / "c", {"architectures": ["InternVLChatModel"]}))
    (tmp_path / "d").mkdir()
    with pytest.raises(ProtocolError, match="unknown family 'mineru'"):
        recognize(_checkpoint(tmp_path / "d", {}, {"family": "mineru"}))


def test_the_family_sets_its_engine_and_scheduler_needs_and_refuses_what_it_cannot_do(tmp_path):
    from padoc_ray.host import HostConfig, check_family, family_host_config, model_problem
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.scheduler import SchedulerConfig

    model = _checkpoint(tmp_path, HPD_CONFIG)
    cfg = HostConfig(preset="cpu").engine_config(model)
    assert cfg.trust_remote_code and cfg.max_model_len >= 16384 and cfg.enable_prefix_caching
    assert HostConfig(preset="cpu", engine_overrides={"max_model_len": 20000}).engine_config(model).max_model_len == 20000
    with pytest.raises(ProtocolError, match="no speculative decoding"):
        HostConfig(preset="cpu", engine_overrides={"extra": {"speculative_config": {"method": "medusa"}}}
                   ).engine_config(model)
    assert family_host_config(HostConfig(), "hpd").scheduler.max_tokens == 8000
    assert family_host_config(HostConfig(scheduler=SchedulerConfig(max_tokens=300)), "hpd").scheduler.max_tokens == 300
    assert family_host_config(HostConfig(), "padoc").scheduler.max_tokens == SchedulerConfig.max_tokens
    with pytest.raises(ProtocolError, match="--constrain-layout"):
        check_family("hpd", HostConfig(scheduler=SchedulerConfig(constrain_layout=True)))
    assert "no meaning" in model_problem(model, HostConfig(mode="sequential"))
    assert model_problem(model, HostConfig()) is None and model_problem("s3://b/m", HostConfig(mode="sequential")) is None


def test_the_repetition_penalty_reaches_vllms_sampling_params():
    from padoc_ray.engine.interface import GenRequest

    vllm_engine = pytest.importorskip("padoc_ray.engine.vllm_engine")
    pytest.importorskip("vllm")
    req = GenRequest(request_id="r", prompt_ids=[1, 2], max_tokens=4, repetition_penalty=1.05)
    assert vllm_engine.sampling_params(req, "v1").repetition_penalty == 1.05
    with pytest.raises(ValueError, match="repetition_penalty"):
        SchedulerConfig(repetition_penalty=0)
