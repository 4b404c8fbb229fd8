"""`padoc-ray eval layout` (PageIoU, paper App. B) and `padoc-ray bench pageiou` (exact vs raster speed).

Argument parsing and printing only; the metric is :mod:`padoc_ray.eval.pageiou`, file handling
:mod:`padoc_ray.eval.layout`.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

DESCRIPTION = (
    "Score predicted layouts against OmniDocBench ground truth with PageIoU (paper App. B): coverage-based "
    "IoU, F1, precision and recall per class (text, image, table, formula, full page; Overall = mean of the "
    "first four), page-level macro averages, in all four protocols (binary|countable x acceptable|"
    "ignore_acceptable; countable/acceptable is the headline). PRED is OmniDocBench JSON or padoc-ray batch "
    "Parquet (an output folder with pages/*.parquet, or a .parquet file). Prints a Markdown table, writes "
    "OUT.json and a per-page CSV beside it (OUT.pages.csv), and summarizes input problems on stderr. Exit 0 "
    "when the evaluation ran (bad pages are reported, not fatal), 2 on usage errors.")


def _err(msg: str) -> int:
    print(f"padoc-ray: error: {msg}", file=sys.stderr)
    return 2


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
    from padoc_ray.eval import layout as L
    from padoc_ray.eval.pageiou import PageIoUConfig

    try:
        pm = _pred_map(args.pred_map)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        return _err(f"--pred-map {args.pred_map}: {e}")
    try:
        cfg = PageIoUConfig(backend=args.backend, grid=args.grid, pred_map=pm)
    except ValueError as e:
        return _err(str(e))
    out_dir = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(out_dir):
        return _err(f"folder for --json does not exist: {out_dir}")
    try:
        gt = L.load_ground_truth(args.gt, fix_swapped=not args.keep_page_size)
        pred = L.load_predictions(args.pred, gt, fix_swapped=not args.keep_page_size)
    except L.LayoutInputError as e:
        return _err(str(e))
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


def add_parser(esub) -> None:
    p = esub.add_parser("layout", help="PageIoU layout metrics (paper App. B) against OmniDocBench ground truth",
                        description=DESCRIPTION)
    p.add_argument("--gt", required=True, metavar="GT.json", help="OmniDocBench ground-truth JSON (a list of pages)")
    p.add_argument("--pred", required=True, metavar="PRED",
                   help="predictions: OmniDocBench JSON, a padoc-ray batch output folder, or a .parquet file")
    p.add_argument("--json", required=True, metavar="OUT.json",
                   help="write the summary here ({'<count>/<category>': {'<class>': {iou, f1, precision, recall}}} "
                        "plus support, pages, problems, config); the per-page CSV goes beside it")
    p.add_argument("--backend", choices=("exact", "raster"), default="exact",
                   help="exact: coordinate-compressed exact areas (what results use); raster: a GRID x GRID "
                        "pixel cross-check (default exact)")
    p.add_argument("--grid", type=int, default=1000, help="raster backend: cells per side (default 1000)")
    p.add_argument("--pred-map", default="soft", metavar="soft|include|FILE.json",
                   help="how predicted categories map to classes: soft (include or acceptable category of the "
                        "class; default), include (include categories only), or a JSON file "
                        "{category: [classes]} for another parser's labels")
    p.add_argument("--keep-page-size", action="store_true",
                   help="trust page_info width/height even where the boxes only fit them exchanged (by default such "
                        "pages, e.g. 10 of the 18 OmniDocBench demo pages, use the exchanged size; reported as "
                        "swapped_size)")
    p.set_defaults(func=cmd_eval_layout)


# ---- bench pageiou ------------------------------------------------------------------------------------------


def random_layout(rng: random.Random, n_boxes: int) -> tuple[list, list]:
    """A random page: ground-truth boxes of random Table 4 categories, and predictions made from them by
    jittering edges, dropping about 10%, duplicating about 5% and adding a few spurious boxes."""
    from padoc_ray.eval.pageiou import KNOWN_CATEGORIES, LayoutBox

    cats = sorted(KNOWN_CATEGORIES)
    gt = []
    for _ in range(n_boxes):
        x, y = rng.random(), rng.random()
        w, h = rng.uniform(0.02, 0.6), rng.uniform(0.01, 0.2)
        gt.append(LayoutBox(rng.choice(cats), x, y, min(1.0, x + w), min(1.0, y + h)))
    pred = []
    for b in gt:
        if rng.random() < 0.1:
            continue
        j = [v + rng.gauss(0, 0.01) for v in b[1:]]
        nb = LayoutBox(b.category, min(j[0], j[2]), min(j[1], j[3]), max(j[0], j[2]) + 1e-3, max(j[1], j[3]) + 1e-3)
        pred.append(nb)
        if rng.random() < 0.05:
            pred.append(nb)
    for _ in range(max(1, n_boxes // 10)):
        x, y = rng.random(), rng.random()
        pred.append(LayoutBox(rng.choice(cats), x, y, min(1.0, x + 0.1), min(1.0, y + 0.05)))
    return gt, pred


def _time_backend(pages, cfg, min_s: float) -> tuple[float, list]:
    from padoc_ray.eval.pageiou import evaluate_page

    results, n, t0 = [], 0, time.perf_counter()
    while True:
        for gt, pred, gsize in pages:
            r = evaluate_page(gt, pred, config=cfg, gt_size=gsize)
            if len(results) < len(pages):
                results.append(r)
            n += 1
        took = time.perf_counter() - t0
        if took >= min_s:
            return n / took, results


def _max_diff(a: list, b: list) -> tuple[float, float]:
    """Largest per-page difference between two backends: of a metric, and of an area sum (page fraction)."""
    from padoc_ray.eval.pageiou import iter_scores

    d = da = 0.0
    for ra, rb in zip(a, b):
        for (_, _, _, sa), (_, _, _, sb) in zip(iter_scores(ra), iter_scores(rb)):
            d = max(d, abs(sa.iou - sb.iou), abs(sa.precision - sb.precision), abs(sa.recall - sb.recall))
            da = max(da, abs(sa.intersection - sb.intersection), abs(sa.union - sb.union),
                     abs(sa.gt_area - sb.gt_area), abs(sa.pred_area - sb.pred_area))
    return d, da


def _bench_set(name: str, pages: list, grid: int, raster_pages: int, min_s: float) -> dict:
    from padoc_ray.eval.pageiou import PageIoUConfig

    exact_ps, exact_res = _time_backend(pages, PageIoUConfig(), min_s)
    sub = pages[:raster_pages]
    raster_ps, raster_res = _time_backend(sub, PageIoUConfig(backend="raster", grid=grid), min_s)
    boxes = sum(len(g) + len(p) for g, p, _ in pages) / max(1, len(pages))
    d, da = _max_diff(exact_res, raster_res)
    return {"set": name, "pages": len(pages), "boxes_per_page": round(boxes, 1), "exact_pages_per_s": exact_ps,
            "raster_pages_per_s": raster_ps, "raster_pages_timed": len(sub), "grid": grid,
            "speedup": exact_ps / raster_ps, "max_metric_diff": d, "max_area_diff": da}


def cmd_bench_pageiou(args) -> int:
    from padoc_ray.eval import layout as L

    rng = random.Random(args.seed)
    sets = [("random", [(*random_layout(rng, args.boxes), None) for _ in range(args.pages)])]
    if args.gt:
        try:
            gt = L.load_ground_truth(args.gt)
        except L.LayoutInputError as e:
            return _err(str(e))
        pages = []
        for pg in gt.pages.values():
            w, h = pg.size
            pred = []
            for b in pg.boxes:  # the ground truth with edges jittered by ~0.5% of the page
                j = [b.x1 + rng.gauss(0, 0.005) * w, b.y1 + rng.gauss(0, 0.005) * h,
                     b.x2 + rng.gauss(0, 0.005) * w, b.y2 + rng.gauss(0, 0.005) * h]
                pred.append(type(b)(b.category, min(j[0], j[2]), min(j[1], j[3]), max(j[0], j[2]), max(j[1], j[3])))
            pages.append((pg.boxes, [type(b)(b.category, b.x1 / w, b.y1 / h, b.x2 / w, b.y2 / h) for b in pred],
                          pg.size))
        sets.append((os.path.basename(args.gt), pages))
    res = [_bench_set(name, pages, args.grid, args.raster_pages, args.min_seconds) for name, pages in sets]
    print("| set | pages | boxes/page | exact pages/s | raster pages/s | exact/raster | max metric diff "
          "| max area diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['set']} | {r['pages']} | {r['boxes_per_page']} | {r['exact_pages_per_s']:.1f} | "
              f"{r['raster_pages_per_s']:.2f} | {r['speedup']:.0f}x | {r['max_metric_diff']:.2e} "
              f"| {r['max_area_diff']:.2e} |")
    print(f"(raster timed on the first {args.raster_pages} pages of each set, grid {args.grid}; "
          "one process, all four protocols and five classes per page; diffs are the largest per-page differences "
          "between the backends, areas as fractions of the page)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def add_bench_parser(bsub) -> None:
    p = bsub.add_parser("pageiou", help="PageIoU pages/s: exact (coordinate compression) vs raster backend",
                        description="Time PageIoU's exact backend against the raster cross-check on random "
                                    "layouts and, with --gt, on a jittered copy of a ground-truth file, and report "
                                    "pages/s (all modes and classes of a page per evaluation) and the largest "
                                    "per-page metric difference between the backends.")
    p.add_argument("--pages", type=int, default=200, help="random pages (default 200)")
    p.add_argument("--boxes", type=int, default=30, help="ground-truth boxes per random page (default 30)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--gt", default=None, metavar="GT.json", help="also bench on this OmniDocBench ground truth")
    p.add_argument("--grid", type=int, default=1000, help="raster grid (default 1000)")
    p.add_argument("--raster-pages", type=int, default=10, help="pages per set the raster backend is timed on "
                                                                "(it is slow; default 10)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="time each backend at least this long (default 1)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_pageiou)
