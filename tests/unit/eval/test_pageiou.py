"""PageIoU metric core (padoc_ray.eval.pageiou): hand-computed pages for every mode, the Table 4 data,
aggregation, bad boxes, and exact vs raster agreement on random layouts."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padoc_ray.eval.pageiou import (
    CATEGORY_MAPPING, CLASSES, KNOWN_CATEGORIES, SCORE_MODES, Aggregator, LayoutBox, PageIoUConfig, PageResult, PageScore,
    canonical_category, evaluate_page, page_iou, rho,
)

BA, BI, CA, CI = ("binary", "acceptable"), ("binary", "ignore_acceptable"), ("countable", "acceptable"), \
    ("countable", "ignore_acceptable")


def sums(score: PageScore) -> tuple[float, float, float, float]:
    return (score.intersection, score.union, score.gt_area, score.pred_area)


def assert_page(score: PageScore, i, u, dgt, dpr):
    assert sums(score) == pytest.approx((i, u, dgt, dpr), abs=1e-12)
    assert score.iou == pytest.approx(rho(i, u))
    assert score.precision == pytest.approx(rho(i, dpr))
    assert score.recall == pytest.approx(rho(i, dgt))


# ---- Table 4 as data -------------------------------------------------------------------------------------


def test_table4_mapping_matches_the_paper_row_by_row():
    # counts of check marks and circles per column of Table 4 (28 categories)
    expected = {"text": (6, 11), "table": (1, 3), "formula": (1, 4), "image": (1, 4), "full_page": (9, 19)}
    for q, (n_inc, n_acc) in expected.items():
        m = CATEGORY_MAPPING[q]
        assert (len(m.include), len(m.acceptable)) == (n_inc, n_acc), q
        assert not (m.include & m.acceptable), f"{q}: include and acceptable must be disjoint"
    assert len(KNOWN_CATEGORIES) == 28
    # full page covers every category; abandon / need_mask / unknown_mask only there
    assert CATEGORY_MAPPING["full_page"].include | CATEGORY_MAPPING["full_page"].acceptable == KNOWN_CATEGORIES
    for cat in ("abandon", "need_mask", "unknown_mask"):
        assert [q for q in CLASSES if cat in CATEGORY_MAPPING[q].include | CATEGORY_MAPPING[q].acceptable] == \
            ["full_page"]
    # spot checks against the table's rows
    assert "equation_caption" in CATEGORY_MAPPING["text"].acceptable & CATEGORY_MAPPING["formula"].acceptable
    assert "organic_chemical_formula_mask" in CATEGORY_MAPPING["image"].acceptable
    assert "table_mask" in CATEGORY_MAPPING["table"].acceptable and "figure" in CATEGORY_MAPPING["full_page"].include


def test_category_names_are_case_insensitive_and_padoc_aliases_resolve():
    assert canonical_category(" Text_Block ") == "text_block"
    assert canonical_category("code_algorithm") == "algorithm_mask"
    assert canonical_category("paragraph") is None and canonical_category(None) is None


# ---- hand-computed pages -------------------------------------------------------------------------------


def test_partial_overlap_with_an_acceptable_header_all_modes():
    # include text [0,.5]x[0,.5]; acceptable header [0,1]x[.9,1]; prediction shifted by .25 plus the header
    gt = [("text_block", (0, 0, 0.5, 0.5)), ("header", (0, 0.9, 1, 1))]
    pred = [("text_block", (0.25, 0, 0.75, 0.5)), ("header", (0, 0.9, 1, 1))]
    res = evaluate_page(gt, pred)
    for m in (BA, CA):  # overlap .125 + header .1; union .375 + .1
        assert_page(res.scores[m]["text"], 0.225, 0.475, 0.35, 0.35)
    for m in (BI, CI):  # the header is exclusively acceptable: removed from I, U, D_gt and pardoned in D_pr
        assert_page(res.scores[m]["text"], 0.125, 0.375, 0.25, 0.25)
    # full page: header acceptable there too, same numbers; image/table/formula have no support
    assert_page(res.scores[CA]["full_page"], 0.225, 0.475, 0.35, 0.35)
    for q in ("image", "table", "formula"):
        assert not res.scores[CA][q].support and res.scores[CA][q].iou == 1.0


def test_duplicate_prediction_only_costs_in_countable_mode():
    gt = [("table", (0.1, 0.1, 0.5, 0.3))]
    pred = [("table", (0.1, 0.1, 0.5, 0.3))] * 2
    res = evaluate_page(gt, pred)
    area = 0.4 * 0.2
    for m in (BA, BI):
        assert_page(res.scores[m]["table"], area, area, area, area)
    for m in (CA, CI):  # c = 2 where a = 1: I = a, U = c, D_pr = c
        assert_page(res.scores[m]["table"], area, 2 * area, area, 2 * area)
        assert res.scores[m]["table"].iou == pytest.approx(0.5)
        assert res.scores[m]["table"].recall == pytest.approx(1.0)


def test_include_and_acceptable_overlap_is_visible_only_in_countable_ignore_mode():
    # full-height strips: include [0,.5], acceptable [.25,.75], prediction [0,.75] plus the acceptable strip
    gt = [("text_block", (0, 0, 0.5, 1)), ("header", (0.25, 0, 0.75, 1))]
    only_core = [("text_block", (0, 0, 0.75, 1))]
    res = evaluate_page(gt, only_core)
    for m in (BA, CA):
        assert_page(res.scores[m]["text"], 0.75, 0.75, 0.75, 0.75)
    for m in (BI, CI):
        assert_page(res.scores[m]["text"], 0.5, 0.5, 0.5, 0.5)
    both = only_core + [("header", (0.25, 0, 0.75, 1))]
    res = evaluate_page(gt, both)
    # per .25-wide strip (a, b, c): (1,0,1) (1,1,2) (0,1,2) (0,0,0)
    assert_page(res.scores[BA]["text"], 0.75, 0.75, 0.75, 0.75)
    assert_page(res.scores[BI]["text"], 0.5, 0.5, 0.5, 0.5)
    assert_page(res.scores[CA]["text"], 0.25 * (1 + 2 + 1), 0.25 * (1 + 2 + 2), 0.25 * (1 + 2 + 1), 0.25 * 5)
    # ignore: I = <min(a,c)> = .5; U keeps the overlap strip at max(a,c) = 2 and drops the exclusive one
    assert_page(res.scores[CI]["text"], 0.5, 0.25 * (1 + 2), 0.5, 0.25 * (1 + 1 + 1))


def test_unpredicted_acceptable_region_costs_nothing_and_predicted_one_is_credited():
    gt = [("figure", (0, 0, 0.5, 0.5)), ("figure_caption", (0, 0.5, 0.5, 0.6))]
    res = evaluate_page(gt, [("figure", (0, 0, 0.5, 0.5))])
    assert res.scores[CA]["image"].iou == 1.0 and res.scores[CA]["image"].recall == 1.0
    # a prediction that also covers the caption as part of the figure is credited, not a false positive
    res = evaluate_page(gt, [("figure", (0, 0, 0.5, 0.6))])
    assert_page(res.scores[CA]["image"], 0.3, 0.3, 0.3, 0.3)
    # the ignore mode pardons it in precision but leaves it out of I and U
    assert_page(res.scores[CI]["image"], 0.25, 0.25, 0.25, 0.25)


def test_boxes_outside_the_canvas_are_clipped_or_dropped():
    gt = [("equation_isolated", (0.5, 0.5, 1.5, 1.5))]  # clipped to [.5,1]^2
    pred = [("equation_isolated", (0.5, 0.5, 1.0, 1.0)), ("equation_isolated", (1.2, 0.1, 1.4, 0.3))]
    res = evaluate_page(gt, pred)
    assert_page(res.scores[CA]["formula"], 0.25, 0.25, 0.25, 0.25)
    kinds = sorted((p.side, p.kind, p.index) for p in res.problems)
    assert kinds == [("gt", "clipped", 0), ("pred", "outside_canvas", 1)]
    # a page whose only box lies off the page has no support
    res = evaluate_page([("table", (-0.5, 0, -0.1, 1))], [])
    assert not any(res.support.values())


def test_empty_pages_and_one_sided_pages():
    res = evaluate_page([], [])
    assert not any(res.support.values())
    assert all(s == PageScore(1.0, 1.0, 1.0, False) for per in res.scores.values() for s in per.values())
    gt_only = evaluate_page([("title", (0, 0, 1, 0.1))], [])
    for m in SCORE_MODES:
        s = gt_only.scores[m]["text"]
        assert (s.iou, s.precision, s.recall, s.support) == (0.0, 1.0, 0.0, True)  # rho(0, 0) = 1 for precision
    pred_only = evaluate_page([], [("title", (0, 0, 1, 0.1))])
    for m in SCORE_MODES:
        s = pred_only.scores[m]["text"]
        assert (s.iou, s.precision, s.recall, s.support) == (0.0, 0.0, 1.0, True)
    # only an acceptable ground-truth box and no prediction: support, but nothing to miss
    acc_only = evaluate_page([("page_number", (0.4, 0.95, 0.6, 1))], [])
    assert acc_only.support["text"] and acc_only.scores[CA]["text"].iou == 1.0


def test_prediction_mapping_soft_vs_include():
    gt = [("text_block", (0, 0, 1, 0.5))]
    pred = [("text_block", (0, 0, 1, 0.5)), ("page_number", (0.4, 0.9, 0.6, 1.0))]
    soft = page_iou(gt, pred)  # page_number feeds text: a false positive area of .02
    assert soft["text"].precision == pytest.approx(0.5 / 0.52)
    incl = page_iou(gt, pred, pred_map="include")  # page_number feeds nothing
    assert incl["text"].precision == 1.0 and incl["full_page"].precision == 1.0
    custom = page_iou([("figure", (0, 0, 0.5, 0.5))], [("picture", (0, 0, 0.5, 0.5))], pred_map={"Picture": ["image"]})
    assert custom["image"].iou == 1.0 and not custom["text"].support


def test_pixel_boxes_are_normalized_per_side():
    gt = [LayoutBox("table", 20, 10, 120, 60)]  # on a 200x100 canvas
    pred = [LayoutBox("table", 200, 100, 1200, 600)]  # the same region on a 2000x1000 canvas
    s = page_iou(gt, pred, gt_size=(200, 100), pred_size=(2000, 1000))["table"]
    assert s.iou == pytest.approx(1.0) and s.intersection == pytest.approx(0.5 * 0.5)


def test_bad_boxes_are_reported_and_skipped():
    class Region:  # duck-typed like padoc_ray.protocol.Region
        category, box = "figure", (0.1, 0.1, 0.2, 0.2)

    gt = [("text_block", (0, 0, math.nan, 1)), ("mystery", (0, 0, 1, 1)), ("title", (0.5, 0.5, 0.5, 0.9)),
          ("title", (0.3, 0.2, 0.1, 0.4)), "garbage", ("title", ("a", 0, 1, 1)), Region()]
    res = evaluate_page(gt, [{"category": "figure", "bbox": [0.1, 0.1, 0.2, 0.2]}])
    kinds = [(p.kind, p.index) for p in res.problems]
    assert kinds == [("bad_box", 0), ("unknown_category", 1), ("degenerate_box", 2), ("degenerate_box", 3),
                     ("bad_box", 4), ("bad_box", 5)]
    assert res.scores[CA]["image"].iou == pytest.approx(1.0)
    assert not res.support["text"]


def test_config_validation():
    with pytest.raises(ValueError):
        PageIoUConfig(backend="gpu")
    with pytest.raises(ValueError):
        PageIoUConfig(grid=0)
    with pytest.raises(ValueError):
        PageIoUConfig(pred_map={"figure": ["picture"]})
    with pytest.raises(ValueError):
        page_iou([], [], count_mode="fuzzy")


# ---- aggregation ------------------------------------------------------------------------------------------


def _result(**per_class: tuple[float, float, float] | None) -> PageResult:
    scores = {}
    for m in SCORE_MODES:
        scores[m] = {q: PageScore(1.0, 1.0, 1.0, False) for q in CLASSES}
        for q, v in per_class.items():
            scores[m][q] = PageScore(v[0], v[1], v[2], True)
    return PageResult(scores)


def test_macro_averages_f1_from_macro_p_r_and_overall():
    agg = Aggregator()
    agg.add(_result(text=(0.5, 1.0, 0.5), image=(1.0, 1.0, 1.0)))
    agg.add(_result(text=(0.0, 0.0, 0.0)))  # no image here: not an image support page
    agg.add(_result())  # supports nothing
    summ = agg.summary()[CA]
    assert agg.support() == {"text": 2, "image": 1, "table": 0, "formula": 0, "full_page": 0}
    t = summ["text"]
    assert (t.iou, t.precision, t.recall) == (0.25, 0.5, 0.25)
    assert t.f1 == pytest.approx(2 * 0.5 * 0.25 / 0.75)  # from the macro P and R, not the mean of page F1s
    assert summ["table"].iou is None and summ["full_page"].f1 is None
    o = summ["overall"]  # classes with support only: text and image
    assert o.iou == pytest.approx((0.25 + 1.0) / 2) and o.f1 == pytest.approx((t.f1 + 1.0) / 2)
    assert o.support == 2
    agg.add(_result(formula=(0.0, 0.0, 0.0)))
    assert agg.summary()[CA]["formula"].f1 == 0.0  # both aggregated values zero


# ---- exact vs raster --------------------------------------------------------------------------------------

CATS = sorted(KNOWN_CATEGORIES)


def _boxes(coord):
    box = st.tuples(coord, coord, coord, coord).filter(lambda b: b[0] != b[2] and b[1] != b[3]).map(
        lambda b: (min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3])))
    return st.lists(st.tuples(st.sampled_from(CATS), box), max_size=7)


def test_raster_rounds_edges_to_the_nearest_grid_line():
    gt = [("table", (0.06, 0.0, 0.44, 1.0))]  # on a 10-line grid: x edges round to .1 and .4
    s = evaluate_page(gt, [], config=PageIoUConfig(backend="raster", grid=10)).scores[CA]["table"]
    assert s.gt_area == pytest.approx(0.3)
    assert evaluate_page(gt, []).scores[CA]["table"].gt_area == pytest.approx(0.38)


def _reference(gt, pred, n):
    """Brute force on an n x n grid of boxes aligned to it: the paper's equations cell by cell."""
    out = {}
    for cm, km in SCORE_MODES:
        for q in CLASSES:
            inc, acc = CATEGORY_MAPPING[q].include, CATEGORY_MAPPING[q].acceptable
            sums = [0.0] * 4
            for i in range(n):
                for j in range(n):
                    x, y = (i + 0.5) / n, (j + 0.5) / n
                    inside = lambda b: b[0] <= x <= b[2] and b[1] <= y <= b[3]  # noqa: E731
                    a = sum(1 for c, b in gt if c in inc and inside(b))
                    bb = sum(1 for c, b in gt if c in acc and inside(b))
                    c = sum(1 for cat, b in pred if (cat in inc or cat in acc) and inside(b))
                    if cm == "binary":
                        a, bb, c = min(a, 1), min(bb, 1), min(c, 1)
                    if km == "acceptable":
                        f = (min(a + bb, c), max(a, c), max(a, min(a + bb, c)), c)
                    else:
                        f = (min(a, c), 0 if a == 0 and bb > 0 else max(a, c), a, c - min(max(c - a, 0), bb))
                    sums = [s + v / n / n for s, v in zip(sums, f)]
            out[(cm, km), q] = sums
    return out


@settings(max_examples=40, deadline=None)
@given(_boxes(st.integers(0, 10).map(lambda v: v / 10)), _boxes(st.integers(0, 10).map(lambda v: v / 10)))
def test_exact_and_raster_match_a_brute_force_reference_on_grid_aligned_boxes(gt, pred):
    ref = _reference(gt, pred, 10)
    exact = evaluate_page(gt, pred)
    raster = evaluate_page(gt, pred, config=PageIoUConfig(backend="raster", grid=20))
    for (m, q), want in ref.items():
        assert sums(exact.scores[m][q]) == pytest.approx(tuple(want), abs=1e-9), (m, q)
        assert sums(raster.scores[m][q]) == pytest.approx(tuple(want), abs=1e-9), (m, q)


@settings(max_examples=40, deadline=None)
@given(_boxes(st.floats(-0.2, 1.2, allow_nan=False)), _boxes(st.floats(-0.2, 1.2, allow_nan=False)))
def test_exact_and_raster_agree_within_the_grid_resolution(gt, pred):
    grid = 200
    exact = evaluate_page(gt, pred)
    raster = evaluate_page(gt, pred, config=PageIoUConfig(backend="raster", grid=grid))
    for m in SCORE_MODES:
        for q in CLASSES:
            e, r = exact.scores[m][q], raster.scores[m][q]
            assert e.support == r.support
            assert max(abs(x - y) for x, y in zip(sums(e), sums(r))) <= _rounding_bound(gt, pred, m, q, grid), (m, q)


def _rounding_bound(gt, pred, mode, q, grid) -> float:
    """How far rounding box edges onto a grid can move a class's area sums (I, U, gt, pred).

    Each edge of a (page-clipped) box moves by at most 1 / (2 grid), so the area where the box's
    coverage changes is at most (w + h + 2 / grid) / grid. Where one count changes by one, every
    pointwise function of the protocol changes by at most 1, except the union of
    countable/ignore_acceptable, which drops from max(a, c) to 0 when the last include box leaves a
    point an acceptable box still covers (or an acceptable box arrives where no include box is):
    there a ground-truth box's change can move it by up to c, the number of predicted boxes of the
    class. So: sum over prediction boxes + (that factor) x sum over ground-truth boxes, counting only
    the boxes of the class (at most ~0.56 of a page for 7 + 7 boxes, typically far less)."""
    inc, acc = CATEGORY_MAPPING[q].include, CATEGORY_MAPPING[q].acceptable

    def moved(box):
        w = max(0.0, min(box[2], 1.0) - max(box[0], 0.0))
        h = max(0.0, min(box[3], 1.0) - max(box[1], 0.0))
        return (w + h + 2.0 / grid) / grid if w > 0 and h > 0 else 0.0

    g = [moved(b) for c, b in gt if c in inc or c in acc]
    p = [moved(b) for c, b in pred if c in inc or c in acc]
    factor = max(1, len(p)) if mode == ("countable", "ignore_acceptable") else 1
    return factor * sum(g) + sum(p) + 1e-9


def test_pure_module_imports_without_heavy_packages():
    code = ("import sys\n"
            "class B:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in {'ray', 'torch', 'vllm', 'pyarrow', 'transformers'}:\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, B())\n"
            "import padoc_ray.eval.pageiou\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
