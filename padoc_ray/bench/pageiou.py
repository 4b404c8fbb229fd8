"""PageIoU speed: the exact backend (coordinate compression) against the raster cross-check.

``padoc-ray bench pageiou`` prints what :func:`run` returns.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

from padoc_ray.bench import UsageError, write_json
from padoc_ray.knobs import knob


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


def run(*, pages: int, boxes: int, seed: int, gt: str | None, grid: int, raster_pages: int,
        min_seconds: float) -> list[dict]:
    """Results per page set (random layouts, and a jittered copy of ``gt``). Raises
    :class:`padoc_ray.eval.layout.LayoutInputError` for an unreadable ``gt``."""
    from padoc_ray.eval import layout as L

    rng = random.Random(seed)
    sets = [("random", [(*random_layout(rng, boxes), None) for _ in range(pages)])]
    if gt:
        truth = L.load_ground_truth(gt)
        jittered = []
        for pg in truth.pages.values():
            w, h = pg.size
            pred = []
            for b in pg.boxes:  # the ground truth with edges jittered by ~0.5% of the page
                j = [b.x1 + rng.gauss(0, 0.005) * w, b.y1 + rng.gauss(0, 0.005) * h,
                     b.x2 + rng.gauss(0, 0.005) * w, b.y2 + rng.gauss(0, 0.005) * h]
                pred.append(type(b)(b.category, min(j[0], j[2]), min(j[1], j[3]), max(j[0], j[2]), max(j[1], j[3])))
            jittered.append((pg.boxes, [type(b)(b.category, b.x1 / w, b.y1 / h, b.x2 / w, b.y2 / h) for b in pred],
                             pg.size))
        sets.append((os.path.basename(gt), jittered))
    return [_bench_set(name, pages, grid, raster_pages, min_seconds) for name, pages in sets]


@dataclass(frozen=True, kw_only=True)
class PageIoUBenchConfig:
    """Time PageIoU's exact backend against the raster cross-check on random layouts and, with --gt, on a
    jittered copy of a ground-truth file, and report pages/s (all modes and classes of a page per evaluation)
    and the largest per-page metric difference between the backends."""

    pages: int = 200  #: random pages
    boxes: int = 30  #: ground-truth boxes per random page
    seed: int = 0  #: random seed
    gt: str | None = knob(None, metavar="GT.json", help="also bench on this OmniDocBench ground truth")
    grid: int = 1000  #: raster grid
    raster_pages: int = 10  #: pages per set the raster backend is timed on (it is slow)
    min_seconds: float = 1.0  #: time each backend at least this long
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")


def main(cfg: PageIoUBenchConfig) -> int:
    from padoc_ray.eval.layout import LayoutInputError

    try:
        res = run(pages=cfg.pages, boxes=cfg.boxes, seed=cfg.seed, gt=cfg.gt, grid=cfg.grid,
                  raster_pages=cfg.raster_pages, min_seconds=cfg.min_seconds)
    except LayoutInputError as e:
        raise UsageError(str(e)) from None
    print("| set | pages | boxes/page | exact pages/s | raster pages/s | exact/raster | max metric diff "
          "| max area diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['set']} | {r['pages']} | {r['boxes_per_page']} | {r['exact_pages_per_s']:.1f} | "
              f"{r['raster_pages_per_s']:.2f} | {r['speedup']:.0f}x | {r['max_metric_diff']:.2e} "
              f"| {r['max_area_diff']:.2e} |")
    print(f"(raster timed on the first {cfg.raster_pages} pages of each set, grid {cfg.grid}; one process, all four "
          "protocols and five classes per page; diffs are the largest per-page differences between the backends, "
          "areas as fractions of the page)")
    write_json(cfg.json, res, announce=False)
    return 0
