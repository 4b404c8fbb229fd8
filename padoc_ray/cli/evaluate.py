"""``eval layout`` (PageIoU, paper App. B) and ``eval e2e`` (OmniDocBench v1.6 end-to-end metrics).

Argument parsing and printing only: the metrics live in :mod:`padoc_ray.eval` (``pageiou``,
``layout``, ``e2e``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from padoc_ray.cli.common import add_command, die, group_help

LAYOUT_DESCRIPTION = (
    "Score predicted layouts against OmniDocBench ground truth with PageIoU (paper App. B): coverage-based "
    "IoU, F1, precision and recall per class (text, image, table, formula, full page; Overall = mean of the "
    "first four), page-level macro averages, in all four protocols (binary|countable x acceptable|"
    "ignore_acceptable; countable/acceptable is the headline). PRED is OmniDocBench JSON or padoc-ray batch "
    "Parquet (an output folder with pages/*.parquet, or a .parquet file). Prints a Markdown table, writes "
    "OUT.json and a per-page CSV beside it (OUT.pages.csv), and summarizes input problems on stderr. Exit 0 "
    "when the evaluation ran (bad pages are reported, not fatal), 2 on usage errors.")


def _pred_map(text: str):
    from padoc_ray.eval.pageiou import PRED_MAPPINGS

    if text in PRED_MAPPINGS:
        return text
    with open(text, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError("a --pred-map file must hold a JSON object: category -> list of classes")
    return data


def cmd_eval_layout(args) -> int:
    from padoc_ray.cli.flags import from_args
    from padoc_ray.eval import layout as L
    from padoc_ray.eval.pageiou import PageIoUConfig

    try:
        pm = _pred_map(args.pred_map)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        return die(f"--pred-map {args.pred_map}: {e}", exit=False)
    try:
        cfg = from_args(PageIoUConfig, args, pred_map=pm)
    except ValueError as e:
        return die(str(e), exit=False)
    out_dir = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(out_dir):
        return die(f"folder for --json does not exist: {out_dir}", exit=False)
    try:
        gt = L.load_ground_truth(args.gt, fix_swapped=not args.keep_page_size)
        pred = L.load_predictions(args.pred, gt, fix_swapped=not args.keep_page_size)
    except L.LayoutInputError as e:
        return die(str(e), exit=False)
    t = time.perf_counter()
    rep = L.evaluate_layout(gt, pred, cfg)
    took = time.perf_counter() - t
    csv_path = L.pages_csv_path(args.json)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(L.report_json(rep), f, indent=2)
    L.write_pages_csv(rep, csv_path)
    print(L.format_markdown(rep))
    print(L.problems_summary(rep), file=sys.stderr)
    print(f"scored {rep.counts['evaluated']} pages in {took:.2f}s; wrote {args.json} and {csv_path}", file=sys.stderr)
    return 0


def _register_layout(esub) -> None:
    p = add_command(esub, "layout", help="PageIoU layout metrics (paper App. B) against OmniDocBench ground truth",
                        description=LAYOUT_DESCRIPTION)
    p.add_argument("--gt", required=True, metavar="GT.json", help="OmniDocBench ground-truth JSON (a list of pages)")
    p.add_argument("--pred", required=True, metavar="PRED",
                   help="predictions: OmniDocBench JSON, a padoc-ray batch output folder, or a .parquet file")
    p.add_argument("--json", required=True, metavar="OUT.json",
                   help="write the summary here ({'<count>/<category>': {'<class>': {iou, f1, precision, recall}}} "
                        "plus support, pages, problems, config); the per-page CSV goes beside it")
    from padoc_ray.cli.flags import add_fields
    from padoc_ray.eval.pageiou import PageIoUConfig

    add_fields(p, PageIoUConfig, ("backend", "grid"))
    p.add_argument("--pred-map", default="soft", metavar="soft|include|FILE.json",
                   help="how predicted categories map to classes: soft (include or acceptable category of the "
                        "class; default), include (include categories only), or a JSON file "
                        "{category: [classes]} for another parser's labels")
    p.add_argument("--keep-page-size", action="store_true",
                   help="trust page_info width/height even where the boxes only fit them exchanged (by default such "
                        "pages, e.g. 10 of the 18 OmniDocBench demo pages, use the exchanged size; reported as "
                        "swapped_size)")
    p.set_defaults(func=cmd_eval_layout)


# ---- eval e2e ------------------------------------------------------------------------------------
E2E_DESCRIPTION = (
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
            return die(f"--cdm-file {args.cdm_file}: {e}", exit=False)
    try:
        cfg = E2EConfig(formula_cdm=cdm)
    except ValueError as e:
        return die(str(e), exit=False)
    out_dir = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(out_dir):
        return die(f"folder for --json does not exist: {out_dir}", exit=False)
    t = time.perf_counter()
    try:
        pages, problems = load_ground_truth(args.gt)
        if args.pred_md:
            preds, more = P.load_markdown_dir(args.pred_md, pages)
        else:
            preds, more = P.load_parquet(args.pred, pages)
    except E2EInputError as e:
        return die(str(e), exit=False)
    if not pages:
        return die(f"no usable ground-truth page in {args.gt}", exit=False)
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


def _register_e2e(esub) -> None:
    import argparse

    def percent(text: str) -> float:
        try:
            return _percent(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p = add_command(esub, "e2e", description=E2E_DESCRIPTION,
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


def register(sub) -> None:
    ev = add_command(sub, "eval", help="evaluate predictions against OmniDocBench-format ground truth",
                        description="Evaluate parser output. `layout`: PageIoU (paper App. B). "
                                    "`e2e`: OmniDocBench v1.6 end-to-end metrics.")
    esub = ev.add_subparsers(dest="eval_command", metavar="EVAL")
    _register_layout(esub)
    _register_e2e(esub)
    group_help(ev)
