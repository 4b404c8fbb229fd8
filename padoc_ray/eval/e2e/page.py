"""One page of the OmniDocBench v1.6 end-to-end protocol: predicted Markdown + ground-truth
elements -> the scored pairs (text blocks, display formulas, tables) and the reading-order pair.

Steps (as upstream): extract the Markdown; match ground-truth tables to predicted tables; match
ground-truth text blocks and display formulas to predicted text blocks and formulas together; when
a formula was matched to text (or the reverse) compare both as text; retry badly matched titles and
long text blocks against short runs of neighbouring predictions; choose the best display-formula
assignment among several segmentations (:mod:`.formula_match`); drop the ignored text categories
(headers, footers, captions, ...) from the text pairs; pair ground-truth reading orders with the
order of the matched predictions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from padoc_ray.eval.e2e.formula_match import formula_pool, match_display_formulas
from padoc_ray.eval.e2e.markdown import extract_markdown
from padoc_ray.eval.e2e.match import IGNORED_TEXT, TEXT_CATEGORIES, match_quick, sort_preds
from padoc_ray.eval.e2e.metrics import edit_ratio
from padoc_ray.eval.e2e.normalize import (normalized_text, strip_formula_delimiters,
                                          text_with_normalized_inline_formulas, text_with_unicode_math)
from padoc_ray.eval.e2e.table_match import match_tables

#: ground-truth categories matched against predicted text and formulas, in upstream's order
MIXED_GT = TEXT_CATEGORIES + ("equation_isolated",)
_FORMULA = ("equation_isolated", "equation_inline")


@dataclass
class PageMatch:
    """The scored pairs of one page (rows as produced by :mod:`.match`)."""

    name: str
    text: list[dict] = field(default_factory=list)
    formula: list[dict] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)
    order: dict | None = None  # {"gt": [...], "pred": [...]} or None when both are empty


def by_order(items: list[dict]) -> list[dict]:
    return sorted(items, key=lambda it: it["order"] if it.get("order") else 0)


def match_page(elements: dict[str, list[dict]], markdown: str, name: str) -> PageMatch:
    """Score-ready pairs of one page; ``elements`` from :func:`.gt.page_elements`."""
    pred = extract_markdown(markdown)
    pred_mix = [it for cat, items in pred.items() if cat not in ("html_table", "latex_table", "formula_rescue")
                for it in items]
    gt_mix = by_order([it for cat in MIXED_GT for it in elements.get(cat, [])])

    # LaTeX tables cannot be converted without latexmlc: they stay as empty table predictions
    tables = list(pred.get("html_table", [])) + [dict(it, content="", category_type="html_table")
                                                 for it in pred.get("latex_table", [])]
    table_rows = []
    if elements.get("table"):
        table_rows = [r for r in match_tables(by_order(elements["table"]), tables, name) if r["gt_idx"] != [""]]

    rows = [_cross_category(r) for r in match_quick(gt_mix, pred_mix, name)]
    rows = _local_span_fallback(rows, pred_mix)
    text = [r for r in rows if r.get("gt_category_type") in TEXT_CATEGORIES]
    formula = [r for r in rows if r.get("gt_category_type") == "equation_isolated" and r["gt_idx"] != [""]]
    gt_formula = by_order(elements.get("equation_isolated", []))
    pool = formula_pool(pred)
    if gt_formula or pool:
        formula = match_display_formulas(gt_formula, pool, formula, name)
    text = [r for r in text if r["gt_category_type"] not in IGNORED_TEXT]
    return PageMatch(name, text, formula, table_rows, reading_order(text + formula + table_rows))


def reading_order(rows: list[dict]) -> dict | None:
    """Ground-truth orders of all matched rows, in ground-truth order vs in prediction order.
    Quirk kept: falsy orders (0, missing) are dropped."""
    matched = [(r["gt_position"], r["pred_position"]) for r in rows
               if r["gt_position"] != [""] and r["pred_position"] != ""]
    gt = sorted(x for r in rows if r["gt_position"] != [""] for x in r["gt_position"] if x)
    pred = [x for pos, _ in sorted(matched, key=lambda m: m[1]) for x in pos if x]
    if not gt and not pred:
        return None
    return {"gt": gt, "pred": pred}


# --------------------------------------------------------------------------------------------------
# formula <-> text

def _is_formula(category: str) -> bool:
    return category in _FORMULA


def _as_text(category: str, text: str) -> str:
    text = str(text or "")
    return text_with_unicode_math(strip_formula_delimiters(text) if _is_formula(category) else text)


def _cross_category(row: dict) -> dict:
    """A formula matched to text (or text to a formula) is compared as text on both sides."""
    g, p = row.get("gt_category_type", ""), row.get("pred_category_type", "")
    if not g or not p or _is_formula(g) == _is_formula(p):
        return row
    row["gt"], row["pred"] = _as_text(g, row.get("gt", "")), _as_text(p, row.get("pred", ""))
    row["norm_gt"], row["norm_pred"] = normalized_text(row["gt"]), normalized_text(row["pred"])
    row["edit"] = edit_ratio(row["norm_gt"], row["norm_pred"])
    return row


# --------------------------------------------------------------------------------------------------
# local retry of badly matched titles / long text blocks

_FORMULA_HINT = re.compile(r"\$[^$]+\$|\\\([^)]*\\\)")
_HINT_COMMANDS = ("\\frac", "\\sum", "\\int", "\\sqrt", "\\left", "\\right")


def _formula_hint(text: str) -> bool:
    text = str(text or "")
    if not text:
        return False
    if _FORMULA_HINT.search(text) or any(t in text for t in _HINT_COMMANDS):
        return True
    return ("^" in text or "_" in text) and ("$" in text or "\\" in text)


def _pool(pred_mix: list[dict]) -> list[dict]:
    return [{"category": it.get("category_type"), "raw": str(it.get("content", "") or ""),
             "text": _as_text(it.get("category_type"), str(it.get("content", "") or "")), "item": it}
            for _, it in sort_preds(pred_mix) if it.get("category_type") in ("text_all", "equation_isolated")]


def _owned(row: dict, pool: list[dict]) -> list[int]:
    """Pool entries a row uses: its prediction indices when they fit the pool, else the entries
    whose span contains its prediction position."""
    idx = sorted({int(k) for k in row.get("pred_idx", []) or [] if isinstance(k, int) and 0 <= k < len(pool)})
    if idx:
        return idx
    pos = row.get("pred_position")
    if pos in ([""], "", None):
        return []
    out = []
    for k, entry in enumerate(pool):
        span = entry["item"].get("position", ["", ""])
        if not isinstance(span, list) or len(span) < 2:
            continue
        try:
            if float(span[0]) <= float(pos) <= float(span[1]):
                out.append(k)
        except (TypeError, ValueError):
            continue
    return out


def _should_retry(row: dict) -> bool:
    if row.get("gt_idx") == [""] or row.get("gt_category_type") not in ("title", "text_block"):
        return False
    try:
        if float(row.get("edit", 1)) <= 0.45:
            return False
    except (TypeError, ValueError):
        return False
    if row["gt_category_type"] == "title":
        return True
    return _formula_hint(row.get("gt", "")) or len(str(row.get("norm_gt", "") or "")) >= 80


def _best_span(row: dict, pool: list[dict], blocked: set[int]) -> dict | None:
    gt_raw, cat = str(row.get("gt", "") or ""), row.get("gt_category_type", "")
    hint = _formula_hint(gt_raw)
    target = normalized_text(text_with_normalized_inline_formulas(gt_raw) if hint and not _is_formula(cat)
                             else _as_text(cat, gt_raw))
    if not target:
        return None
    try:
        current = float(row.get("edit", 1))
    except (TypeError, ValueError):
        current = 1.0
    owned = _owned(row, pool)
    lo, hi = (max(0, min(owned) - 8), min(len(pool) - 1, max(owned) + 8)) if owned else (0, len(pool) - 1)
    allowed = {"text_all", "equation_isolated"} if hint else {"text_all"}
    max_span, max_edit = (8, 0.45) if hint else (4, 0.35)
    best = None
    for s in range(lo, hi + 1):
        if pool[s]["category"] not in allowed or s in blocked:
            continue
        raw, text = [], []
        for e in range(s, min(hi + 1, s + max_span)):
            if pool[e]["category"] not in allowed or e in blocked:
                break
            raw.append(pool[e]["raw"])
            text.append(pool[e]["text"])
            norm = normalized_text("".join(text))
            if not norm:
                continue
            cand = {"pred_idx": list(range(s, e + 1)), "pred": "".join(raw),
                    "pred_position": pool[s]["item"]["position"][0], "pred_category_type": "text_block",
                    "norm_pred": norm, "edit": edit_ratio(target, norm), "span": e - s + 1,
                    "distance": abs(s - owned[0]) if owned else 0}
            if best is None or cand["edit"] + 1e-12 < best["edit"]:
                best = cand
            elif cand["edit"] <= best["edit"] + 1e-12 and (cand["span"] < best["span"] or (
                    cand["span"] == best["span"] and cand["distance"] < best["distance"])):
                best = cand
    if not best or best["edit"] >= current - 0.2 or best["edit"] > max_edit:
        return None
    return best


def _local_span_fallback(rows: list[dict], pred_mix: list[dict]) -> list[dict]:
    if not rows:
        return rows
    pool = _pool(pred_mix)
    if not pool:
        return rows
    rows = [dict(r) for r in rows]
    found = []
    for k, row in enumerate(rows):
        if not _should_retry(row):
            continue
        blocked = set()
        for o, other in enumerate(rows):
            if o != k and other.get("gt_idx") != [""]:
                blocked.update(_owned(other, pool))
        cand = _best_span(row, pool, blocked)
        if cand:
            found.append((float(row.get("edit", 1)) - cand["edit"], k, cand))
    used: set[int] = set()
    for _, k, cand in sorted(found, key=lambda f: f[0], reverse=True):
        span = set(cand["pred_idx"])
        if span & used:
            continue
        rows[k].update({key: cand[key] for key in ("pred_idx", "pred", "pred_position", "pred_category_type",
                                                   "norm_pred", "edit")})
        used.update(span)
    return rows
