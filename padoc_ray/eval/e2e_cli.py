"""`padoc-ray eval e2e`: OmniDocBench v1.6 end-to-end metrics of predicted Markdown.

Argument parsing and printing only; the protocol lives in :mod:`padoc_ray.eval.e2e`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

DESCRIPTION = (
    "Score predicted Markdown against OmniDocBench ground truth with the OmniDocBench v1.6 end-to-end protocol: "
    "Text Edit, Formula Edit (CDM itself needs a TeX toolchain: pass a CDM computed elsewhere with --cdm or "
    "--cdm-file, otherwise Overall uses (1 - Formula Edit) x 100 and is flagged as a proxy), Table TEDS and "
    "TEDS-S, Reading Order Edit and Overall, all as page averages the way OmniDocBench reports them. Predictions "
    "are a folder of <image stem>.md files (--pred-md) or padoc-ray batch output (--pred: a folder with "
    "pages/*.parquet or a .parquet file; rows are matched to pages by image basename, or by "
    "<pdf basename>_<page_index> / page_info.source_pdf + page_no for PDFs). Prints a Markdown table, writes "
    "OUT.json, a per-page CSV beside it (OUT.pages.csv) and the matched formula pairs (OUT.formulas.json, for an "
    "external CDM run); input problems are reported per page and summarized on stderr. Exit 0 when the "
    "evaluation ran (bad pages are reported, not fatal), 2 on usage errors.")


def _err(msg: str) -> int:
    print(f"padoc-ray: error: {msg}", file=sys.stderr)
    return 2


def read_cdm_file(path: str) -> float:
    """Formula CDM in percent from a JSON file: a number (percent), ``{"formula_cdm": percent}``, or the
    upstream evaluator's ``*_metric_result.json`` (display_formula.page.CDM.ALL, 0-1) or
    ``*_run_summary.json`` (notebook value, percent)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    value = None
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        value = float(data)
    elif isinstance(data, dict):
        if isinstance(data.get("formula_cdm"), (int, float)):
            value = float(data["formula_cdm"])
        elif isinstance(data.get("display_formula"), dict):
            raw = data["display_formula"].get("page", {}).get("CDM", {}).get("ALL")
            value = float(raw) * 100.0 if isinstance(raw, (int, float)) else None
        elif isinstance(data.get("notebook_metric_summary"), dict):
            metrics = data["notebook_metric_summary"].get("metrics", {})
            raw = metrics.get("display_formula_CDM", {}).get("notebook_value")
            value = float(raw) if isinstance(raw, (int, float)) else None
    if value is None or not math.isfinite(value):
        raise ValueError("no Formula CDM found (expected a number, {\"formula_cdm\": ...}, or an upstream "
                         "*_metric_result.json / *_run_summary.json with a CDM result)")
    return value


def cmd_eval_e2e(args) -> int:
    from padoc_ray.eval.e2e import E2EConfig, E2EInputError, evaluate, load_ground_truth
    from padoc_ray.eval.e2e import predictions as P
    from padoc_ray.eval.e2e import report as R

    cdm = args.cdm
    if args.cdm_file:
        try:
            cdm = read_cdm_file(args.cdm_file)
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            return _err(f"--cdm-file {args.cdm_file}: {e}")
    try:
        cfg = E2EConfig(formula_cdm=cdm)
    except ValueError as e:
        return _err(str(e))
    out_dir = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(out_dir):
        return _err(f"folder for --json does not exist: {out_dir}")
    t = time.perf_counter()
    try:
        pages, problems = load_ground_truth(args.gt)
        if args.pred_md:
            preds, more = P.load_markdown_dir(args.pred_md, pages)
        else:
            preds, more = P.load_parquet(args.pred, pages)
    except E2EInputError as e:
        return _err(str(e))
    if not pages:
        return _err(f"no usable ground-truth page in {args.gt}")
    rep = evaluate(pages, preds, cfg, problems + more)
    took = time.perf_counter() - t
    inputs = {"gt": os.path.abspath(args.gt), "pred": os.path.abspath(args.pred_md or args.pred),
              "pred_format": "markdown" if args.pred_md else "parquet",
              "formula_cdm_source": args.cdm_file or ("--cdm" if args.cdm is not None else None)}
    csv_path, pairs_path = R.pages_csv_path(args.json), R.formulas_path(args.json)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(R.report_json(rep, inputs), f, indent=2, ensure_ascii=False)
    R.write_pages_csv(rep, csv_path)
    R.write_formula_pairs(rep, pairs_path)
    print(R.format_markdown(rep, args.label))
    print(R.problems_summary(rep), file=sys.stderr)
    print(f"scored {rep.counts['pages_evaluated']} pages in {took:.1f}s; wrote {args.json}, {csv_path} and "
          f"{pairs_path}", file=sys.stderr)
    return 0


def _percent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not (math.isfinite(v) and 0.0 <= v <= 100.0):
        raise ValueError(f"must be a percentage in [0, 100]: {text!r}")
    return v


def add_parser(esub) -> None:
    import argparse

    def percent(text: str) -> float:
        try:
            return _percent(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p = esub.add_parser("e2e", description=DESCRIPTION,
                        help="OmniDocBench v1.6 end-to-end metrics (Text/Formula Edit, TEDS, Read Order, Overall)")
    p.add_argument("--gt", required=True, metavar="GT.json", help="OmniDocBench ground-truth JSON (a list of pages)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pred-md", metavar="DIR", help="folder of predicted Markdown, one <image stem>.md per page")
    src.add_argument("--pred", metavar="PARQUET",
                     help="padoc-ray batch output: a folder with pages/*.parquet, or a .parquet file")
    p.add_argument("--json", required=True, metavar="OUT.json",
                   help="summary JSON to write; OUT.pages.csv and OUT.formulas.json are written beside it")
    cdm = p.add_mutually_exclusive_group()
    cdm.add_argument("--cdm", type=percent, metavar="PERCENT",
                     help="Formula CDM computed elsewhere, in percent (0-100); makes Overall the real one")
    cdm.add_argument("--cdm-file", metavar="FILE",
                     help="JSON holding the Formula CDM: a number (percent), {\"formula_cdm\": percent}, or the "
                          "upstream evaluator's *_metric_result.json or *_run_summary.json")
    p.add_argument("--label", default="this run", help="row label of the printed table (default: %(default)s)")
    p.set_defaults(func=cmd_eval_e2e)
