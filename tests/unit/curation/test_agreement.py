"""Page agreement (corpus re-annotation): matching, layout and content agreement, consensus, difficulty,
and the comparison stage of the re-annotation job on hand-made prediction sets (no engine)."""

from __future__ import annotations

import json
import os

import pytest

from padoc_ray.curation.agreement import AgreementConfig, box_iou, compare_pages, difficulty, match_regions
from padoc_ray.protocol.page import Box, Page, Region


def R(cat, x1, y1, x2, y2, content=None, fmt="text", ignore=False):
    return Region(category=cat, box=Box(x1, y1, x2, y2), content=content, content_format=fmt, ignore=ignore)


def P(*regions):
    return Page(width=1000, height=1000, regions=tuple(regions))


def test_box_iou_by_hand():
    assert box_iou(R("t", 0, 0, 0.5, 0.5), R("t", 0.25, 0.25, 0.75, 0.75)) == pytest.approx(0.0625 / 0.4375)
    assert box_iou(R("t", 0, 0, 0.1, 0.1), R("t", 0.5, 0.5, 0.6, 0.6)) == 0.0


def test_matching_is_one_to_one_and_greedy_by_iou():
    ref = [R("t", 0, 0, 0.5, 0.1), R("t", 0, 0.2, 0.5, 0.3)]
    # hyp 0 overlaps ref 0 a little and ref 1 well; hyp 1 duplicates ref 1 exactly
    hyp = [R("t", 0, 0.21, 0.5, 0.3), R("t", 0, 0.2, 0.5, 0.3)]
    pairs = match_regions(ref, hyp, 0.5)
    assert [(i, j) for i, j, _ in pairs] == [(1, 1)]  # the exact duplicate wins ref 1; ref 0 has no partner


def test_identical_pages_agree_fully():
    page = P(R("title", 0.1, 0.05, 0.9, 0.1, "Title"), R("text_block", 0.1, 0.2, 0.9, 0.5, "Some words here."),
             R("table", 0.1, 0.55, 0.9, 0.8, "<table><tr><td>1</td><td>2</td></tr></table>", "html"),
             R("equation_isolated", 0.2, 0.85, 0.8, 0.9, "E = mc^2", "latex"), R("figure", 0.1, 0.9, 0.3, 0.99,
                                                                               None, "none"))
    a = compare_pages(page, page)
    assert a.layout_iou == pytest.approx(1.0) and a.matched == 5 and a.category_agreement == 1.0
    assert a.content_edit == pytest.approx(0.0) and a.content_pairs == 4 and a.consensus
    assert difficulty([a]) == pytest.approx(0.0)


def test_content_and_layout_disagreement_are_measured():
    ref = P(R("text_block", 0.1, 0.1, 0.5, 0.2, "abcd"), R("text_block", 0.1, 0.5, 0.5, 0.6, "kept"))
    # same first box, one character of four wrong; second region missing; an extra region elsewhere
    hyp = P(R("text_block", 0.1, 0.1, 0.5, 0.2, "abcx"), R("title", 0.6, 0.8, 0.9, 0.9, "extra"))
    a = compare_pages(ref, hyp)
    assert a.matched == 1 and a.ref_regions == 2 and a.hyp_regions == 2
    assert a.content_pairs == 3
    assert a.content_edit == pytest.approx((0.25 + 1 + 1) / 3)
    # full-page coverage: ref 0.08, hyp 0.04 + 0.03, overlap 0.04 -> IoU 0.04 / 0.11
    assert a.layout_iou == pytest.approx(0.04 / 0.11)
    assert not a.consensus
    assert difficulty([a]) == pytest.approx(((1 - 0.04 / 0.11) + (0.25 + 2) / 3) / 2)


def test_category_disagreement_and_thresholds():
    ref = P(R("text_block", 0.1, 0.1, 0.9, 0.9, "same"))
    hyp = P(R("title", 0.1, 0.1, 0.9, 0.9, "same"))
    a = compare_pages(ref, hyp)
    assert a.matched == 1 and a.category_agreement == 0.0 and a.content_edit == 0.0 and a.consensus
    shifted = P(R("text_block", 0.1, 0.1, 0.9, 0.8, "same"))
    assert not compare_pages(ref, shifted, AgreementConfig(consensus_iou=0.95)).consensus
    assert compare_pages(ref, shifted, AgreementConfig(consensus_iou=0.85)).consensus
    with pytest.raises(ValueError, match="match_iou"):
        AgreementConfig(match_iou=1.5)


def test_ignored_and_degenerate_regions_do_not_count():
    ref = P(R("text_block", 0.1, 0.1, 0.5, 0.2, "a"), R("abandon", 0.6, 0.6, 0.9, 0.9, "x", ignore=True))
    hyp = P(R("text_block", 0.1, 0.1, 0.5, 0.2, "a"), R("text_block", 0.7, 0.7, 0.7, 0.9, "zero width"))
    a = compare_pages(ref, hyp)
    assert a.ref_regions == 1 and a.hyp_regions == 1 and a.consensus


def test_empty_pages_agree():
    a = compare_pages(P(), P())
    assert a.layout_iou == 1.0 and a.content_edit == 0.0 and a.consensus and difficulty([]) is None


def test_comparison_stage_records_every_page(tmp_path):
    """The job's comparison stage on hand-made prediction sets: reasons for every page it cannot compare."""
    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.curation.reannotate import ReannotateConfig, compare, load_ground_truth

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.pdf").write_bytes(b"%PDF-1.4 placeholder")
    (tmp_path / "src" / "img.png").write_bytes(b"\x89PNG placeholder")
    det = {"category_type": "text_block", "poly": [10, 10, 50, 10, 50, 20, 10, 20], "text": "hello", "order": 1}
    gt = [
        {"page_info": {"image_path": "a_p0.jpg", "source_pdf": "a.pdf", "page_no": 0, "width": 100, "height": 100},
         "layout_dets": [det]},
        {"page_info": {"image_path": "img.png", "page_no": 7, "width": 100, "height": 100}, "layout_dets": [det]},
        {"page_info": {"image_path": "gone.jpg", "page_no": 0, "width": 100, "height": 100}, "layout_dets": [det]},
        {"page_info": {"image_path": "bad.jpg", "width": 100, "height": 100}, "layout_dets": "not a list"},
    ]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    cfg = ReannotateConfig(gt=str(tmp_path / "gt.json"), source=str(tmp_path / "src"), output=str(tmp_path / "o"),
                           batch=BatchConfig(input="", output="", model=""), modes=("fork", "sequential"))
    pages = load_ground_truth(cfg)
    assert [(os.path.basename(p.source_uri or ""), p.page_index, p.problem and p.problem[0]) for p in pages] == [
        ("a.pdf", 0, None), ("img.png", 0, None), ("", -1, "source_missing"), ("", -1, "invalid_ground_truth")]
    same = pages[0].gt
    sets = {"fork": {("a.pdf", 0): ("ok", same)},
            "sequential": {("a.pdf", 0): ("ok", P(R("text_block", 0.1, 0.1, 0.5, 0.2, "help")))}}
    table, consensus = compare(pages, sets, AgreementConfig(), "run1", min_agree=2)
    rows = [r for r in table if r["kind"] == "page"]
    assert [r["status"] for r in rows] == ["ok", "no_prediction", "source_missing", "invalid_ground_truth"]
    first = rows[0]
    pairs = [r for r in table if r["kind"] == "pair" and r["image_path"] == first["image_path"]]
    assert [(c["ref"], c["hyp"]) for c in pairs] == [("gt", "fork"), ("gt", "sequential"), ("fork", "sequential"),
                                                     ("gt", "consensus")]
    assert pairs[0]["agree"] and not pairs[1]["agree"]
    assert first["unanimous"] is False and 0 < first["difficulty"] < 1 and first["parsed"] == 2
    # the two parses agree on the region's box (the content differs): it is the consensus, with the
    # content of the first set (two members are equally close to each other)
    assert first["consensus"] and first["consensus_regions"] == 1 and len(consensus) == 1
    assert consensus[0].regions[0].content == "hello" and consensus[0].extra == {"source_pdf": "a.pdf"}
    assert rows[1]["prediction_status"] == {"fork": "missing", "sequential": "missing"}
    assert rows[1]["consensus"] is False and "fewer than min_agree" in rows[1]["consensus_reason"]
    assert rows[2]["reason"].startswith("gone.jpg not found")