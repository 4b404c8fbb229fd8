"""An end-to-end evaluation run: ground-truth pages + predicted Markdown -> per-page and overall
OmniDocBench v1.6 metrics.

Averaging, exactly as OmniDocBench reports its numbers (all are *page* averages):

- ``text_edit``, ``formula_edit``, ``table_edit``: per page, the sum of edit operations over the
  sum of longer lengths of that page's pairs (long blocks weigh more inside a page); then the
  plain mean over the pages that have at least one pair of that kind.
- ``table_teds``, ``table_teds_s``: per page, the plain mean of its tables' TEDS; then the mean over
  every page whose ground truth has a (non-ignored) table; such a page with no scorable pair counts 0.
- ``reading_order_edit``: per page, edit distance between the ground-truth reading orders of the
  matched blocks sorted by ground truth and sorted by prediction position, divided by the longer
  length; mean over pages with any matched block.
- ``overall`` = ((1 - text_edit) x 100 + formula_cdm + table_teds) / 3 with ``formula_cdm`` given
  from outside (CDM needs a TeX toolchain); without it ``(1 - formula_edit) x 100`` stands in and
  ``overall_is_proxy`` is true.

Edits are on a 0-1 scale (lower is better); TEDS, CDM and Overall on 0-100.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rapidfuzz.distance import Levenshtein

from padoc_ray.eval.e2e.gt import GtPage, Problem
from padoc_ray.eval.e2e.metrics import mean, page_edit, sample_edit, teds_normalized
from padoc_ray.eval.e2e.normalize import normalized_html_table
from padoc_ray.eval.e2e.page import PageMatch, match_page

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class E2EConfig:
    """Options of a run.

    formula_cdm: Formula CDM computed elsewhere (percent, 0-100, e.g. by the upstream evaluator with
        its TeX toolchain); None -> Overall uses (1 - Formula Edit) x 100 and is flagged as a proxy.
    """

    formula_cdm: float | None = None

    def __post_init__(self) -> None:
        if self.formula_cdm is not None and not (0.0 <= self.formula_cdm <= 100.0):
            raise ValueError(f"formula_cdm must be a percentage in [0, 100], not {self.formula_cdm}")


@dataclass
class PageResult:
    """Scores of one page (None where the page has nothing of that kind)."""

    name: str
    status: str = "ok"  # ok | empty_prediction | failed
    text_edit: float | None = None
    text_ops: int = 0
    text_len: int = 0
    n_text: int = 0
    formula_edit: float | None = None
    formula_ops: int = 0
    formula_len: int = 0
    n_formula: int = 0
    table_teds: float | None = None
    table_teds_s: float | None = None
    table_edit: float | None = None
    n_table: int = 0
    has_gt_table: bool = False
    reading_order_edit: float | None = None
    order_ops: int = 0
    order_len: int = 0


@dataclass
class E2EReport:
    pages: list[PageResult]
    metrics: dict
    counts: dict
    problems: list[Problem] = field(default_factory=list)
    formula_pairs: list[dict] = field(default_factory=list)


def _edits(rows: list[dict]) -> tuple[float | None, int, int, int]:
    samples = [sample_edit(r) for r in rows]
    ops = sum(s[0] for s in samples if s)
    total = sum(s[1] for s in samples if s)
    return page_edit(samples), ops, total, len(rows)


def _tables(result: PageResult, rows: list[dict], problems: list[Problem]) -> None:
    teds, teds_s = [], []
    for row in rows:
        gt, pred = normalized_html_table(row["gt"]), normalized_html_table(row["pred"])
        row["norm_gt"], row["norm_pred"] = gt, pred
        try:
            teds.append(teds_normalized(pred or row["pred"], gt or row["gt"]))
            teds_s.append(teds_normalized(pred or row["pred"], gt or row["gt"], structure_only=True))
        except Exception as e:  # malformed spans, empty tables...: upstream scores the pair 0 as well
            teds.append(0.0)
            teds_s.append(0.0)
            problems.append(Problem(result.name, "evaluation", f"TEDS of table {row['gt_idx']} failed "
                                                               f"({type(e).__name__}: {e}); scored 0"))
    if rows:
        result.table_teds = 100.0 * sum(teds) / len(teds)
        result.table_teds_s = 100.0 * sum(teds_s) / len(teds_s)
    elif result.has_gt_table:
        result.table_teds = result.table_teds_s = 0.0
    result.table_edit = _edits(rows)[0]
    result.n_table = len(rows)


def score_page(match: PageMatch, result: PageResult, problems: list[Problem]) -> None:
    result.text_edit, result.text_ops, result.text_len, result.n_text = _edits(match.text)
    result.formula_edit, result.formula_ops, result.formula_len, result.n_formula = _edits(match.formula)
    _tables(result, match.table, problems)
    if match.order:
        gt, pred = match.order["gt"], match.order["pred"]
        result.order_ops, result.order_len = Levenshtein.distance(pred, gt), max(len(pred), len(gt))
        result.reading_order_edit = result.order_ops / result.order_len


def summarize(pages: list[PageResult], cfg: E2EConfig) -> dict:
    ok = [p for p in pages if p.status != "failed"]
    text = mean(p.text_edit for p in ok)
    formula = mean(p.formula_edit for p in ok)
    teds = mean(p.table_teds for p in ok if p.has_gt_table)
    teds_s = mean(p.table_teds_s for p in ok if p.has_gt_table)
    formula_score = cfg.formula_cdm if cfg.formula_cdm is not None else (
        None if formula is None else (1.0 - formula) * 100.0)
    overall = None
    if text is not None and formula_score is not None and teds is not None:
        overall = ((1.0 - text) * 100.0 + formula_score + teds) / 3.0
    return {"overall": overall, "overall_is_proxy": cfg.formula_cdm is None, "text_edit": text,
            "formula_cdm": cfg.formula_cdm, "formula_edit": formula, "table_teds": teds, "table_teds_s": teds_s,
            "table_edit": mean(p.table_edit for p in ok), "reading_order_edit": mean(p.reading_order_edit for p in ok)}


def evaluate(gt_pages: list[GtPage], predictions: dict[str, str | None], cfg: E2EConfig = E2EConfig(),
             problems: list[Problem] | None = None) -> E2EReport:
    """Score every ground-truth page (a missing/unreadable prediction counts as an empty page)."""
    problems = list(problems or [])
    results, pairs = [], []
    for page in gt_pages:
        md = predictions.get(page.name)
        result = PageResult(page.name, "ok" if md is not None else "empty_prediction", has_gt_table=page.has_tables)
        try:
            match = match_page(page.elements, md or "", page.name)
            score_page(match, result, problems)
        except Exception as e:  # a bug or an input we did not foresee: report it, keep the run going
            logger.exception("page %s failed", page.name)
            result = PageResult(page.name, "failed", has_gt_table=page.has_tables)
            problems.append(Problem(page.name, "evaluation", f"page could not be evaluated ({type(e).__name__}: {e}); "
                                                             "left out of every average"))
        else:
            pairs.extend({"img_id": page.name, "gt_idx": r["gt_idx"], "gt": r["gt"], "pred": r["pred"],
                          "edit": float(r["edit"])} for r in match.formula)
        results.append(result)
    counts = {
        "gt_pages": len(gt_pages),
        "pages_evaluated": sum(r.status != "failed" for r in results),
        "pages_failed": sum(r.status == "failed" for r in results),
        "pages_without_prediction": sum(r.status == "empty_prediction" for r in results),
        "text_pairs": sum(r.n_text for r in results),
        "formula_pairs": sum(r.n_formula for r in results),
        "table_pairs": sum(r.n_table for r in results),
        "pages_with_text": sum(r.text_edit is not None for r in results),
        "pages_with_formulas": sum(r.formula_edit is not None for r in results),
        "pages_with_gt_tables": sum(r.has_gt_table and r.status != "failed" for r in results),
        "pages_with_reading_order": sum(r.reading_order_edit is not None for r in results),
        "problems": len(problems),
    }
    return E2EReport(results, summarize(results, cfg), counts, problems, pairs)
