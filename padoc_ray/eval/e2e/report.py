"""Reports of an end-to-end run: the JSON summary, the per-page CSV, the Markdown table (the
layout of the paper's Table 2) and the formula pairs for an external CDM run."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter

from padoc_ray.eval.e2e.evaluate import E2EReport

#: the evaluation settings these figures follow (the report keeps its JSON key "protocol")
EVAL_SETTINGS = ("OmniDocBench v1.6 end-to-end (quick_match), reimplemented; checked against upstream "
                 "opendatalab/OmniDocBench 147cd5a (README 'update README to v1.6', 2026-04-10)")
SCALES = {"text_edit": "0-1, lower is better", "formula_edit": "0-1, lower is better",
          "table_edit": "0-1, lower is better", "reading_order_edit": "0-1, lower is better",
          "table_teds": "0-100", "table_teds_s": "0-100", "formula_cdm": "0-100 (given, not computed)",
          "overall": "0-100"}
AVERAGING = ("Page averages as OmniDocBench reports them. Edits: per page sum(edit ops)/sum(max length) over its "
             "pairs, then the mean over pages having such pairs. TEDS/TEDS-S: per page the mean over its tables, "
             "then the mean over pages whose ground truth has a table (0 for such a page without a scorable "
             "pair). Reading order: per page edit distance of the matched blocks' ground-truth orders, mean over "
             "pages. Overall = ((1 - text_edit)*100 + formula_cdm + table_teds)/3; without a given CDM, "
             "(1 - formula_edit)*100 replaces formula_cdm and overall_is_proxy is true.")
CSV_FIELDS = ("page", "status", "text_edit", "text_ops", "text_len", "n_text", "formula_edit", "formula_ops",
              "formula_len", "n_formula", "table_teds", "table_teds_s", "table_edit", "n_table", "has_gt_table",
              "reading_order_edit", "order_ops", "order_len", "problems")


def pages_csv_path(json_path: str) -> str:
    root, ext = os.path.splitext(json_path)
    return (root if ext.lower() == ".json" else json_path) + ".pages.csv"


def formulas_path(json_path: str) -> str:
    root, ext = os.path.splitext(json_path)
    return (root if ext.lower() == ".json" else json_path) + ".formulas.json"


def report_json(rep: E2EReport, inputs: dict | None = None) -> dict:
    by_kind = Counter(p.kind for p in rep.problems)
    return {**rep.metrics, "scales": SCALES, "averaging": AVERAGING, "protocol": EVAL_SETTINGS, "inputs": inputs or {},
            "counts": rep.counts,
            "problems": {"count": len(rep.problems), "by_kind": dict(sorted(by_kind.items())),
                         "items": [p.to_dict() for p in rep.problems]}}


def write_pages_csv(rep: E2EReport, path: str) -> None:
    per_page = Counter(p.page for p in rep.problems)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rep.pages:
            vals = [r.name, r.status, r.text_edit, r.text_ops, r.text_len, r.n_text, r.formula_edit, r.formula_ops,
                    r.formula_len, r.n_formula, r.table_teds, r.table_teds_s, r.table_edit, r.n_table,
                    int(r.has_gt_table), r.reading_order_edit, r.order_ops, r.order_len, per_page.get(r.name, 0)]
            w.writerow(["" if v is None else (repr(v) if isinstance(v, float) else v) for v in vals])


def write_formula_pairs(rep: E2EReport, path: str) -> None:
    """The matched display-formula pairs (ground-truth LaTeX, predicted LaTeX) for a CDM run."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rep.formula_pairs, f, ensure_ascii=False, indent=1)


def _fmt(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def format_markdown(rep: E2EReport, label: str = "this run") -> str:
    m = rep.metrics
    proxy = m["overall_is_proxy"]
    formula = m["formula_cdm"] if not proxy else (None if m["formula_edit"] is None else (1 - m["formula_edit"]) * 100)
    f_head = "Formula CDM↑" if not proxy else "Formula (1-Edit)×100↑ †"
    o_head = "Overall↑" if not proxy else "Overall↑ †"
    lines = [f"| Model | {o_head} | Text Edit↓ | {f_head} | Table TEDS↑ | Table TEDS-S↑ | Read Order Edit↓ |",
             "|---|---|---|---|---|---|---|",
             f"| {label} | {_fmt(m['overall'], 2)} | {_fmt(m['text_edit'], 3)} | {_fmt(formula, 2)} | "
             f"{_fmt(m['table_teds'], 2)} | {_fmt(m['table_teds_s'], 2)} | {_fmt(m['reading_order_edit'], 3)} |"]
    c = rep.counts
    lines.append("")
    lines.append(f"{c['pages_evaluated']} of {c['gt_pages']} pages scored; Formula Edit "
                 f"{_fmt(m['formula_edit'], 3)} over {c['pages_with_formulas']} pages; Table TEDS over "
                 f"{c['pages_with_gt_tables']} pages.")
    if proxy:
        lines.append("† proxy: CDM was not supplied (it needs a TeX toolchain), so (1 - Formula Edit) x 100 stands in "
                     "for Formula CDM; pass --cdm/--cdm-file for the real Overall.")
    return "\n".join(lines)


def problems_summary(rep: E2EReport, limit: int = 10) -> str:
    if not rep.problems:
        return "no input problems"
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(Counter(p.kind for p in rep.problems).items()))
    out = [f"{len(rep.problems)} input problems ({kinds}):"]
    out += [f"  {p.page}: [{p.kind}] {p.reason}" for p in rep.problems[:limit]]
    if len(rep.problems) > limit:
        out.append(f"  ... {len(rep.problems) - limit} more in the JSON 'problems' section")
    return "\n".join(out)
