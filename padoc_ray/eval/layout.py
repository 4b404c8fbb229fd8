"""Layout evaluation runs: load ground truth and predictions into per-page box lists, align pages,
score them with :mod:`padoc_ray.eval.pageiou`, and write the reports (JSON, per-page CSV, Markdown).

Inputs
- Ground truth: OmniDocBench JSON, a list of pages ``{"layout_dets": [{"category_type", "poly"}],
  "page_info": {"image_path", "width", "height", ["source_pdf", "page_no"]}}``; polys in pixels of
  page_info's width x height, turned into axis-aligned boxes by their min/max.
- Predictions: the same OmniDocBench format (each page normalized by its own page_info size, or
  by the ground truth's when it has none), or padoc-ray batch Parquet (a folder holding
  ``pages/*.parquet`` or ``*.parquet``, or one file) whose region bboxes are already normalized.

Pages are aligned by image basename. A Parquet row from an image file matches by the file's
basename; a row from a PDF matches ``<pdf basename>_<page_index>.<jpg|png>`` (OmniDocBench's naming)
or a ground-truth page with ``page_info.source_pdf`` and ``page_no`` equal to the PDF's basename and
the row's 0-based page index (padoc-ray's synthetic corpus). A ground-truth page without a
prediction is scored against an empty layout.

Nothing here raises on bad content: each unreadable page, box or row becomes a :class:`Problem`
with a kind and a reason, and the run goes on. Only an unreadable *file* raises
:class:`LayoutInputError`.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from padoc_ray.eval.pageiou import (
    CLASSES,
    REPORT_CLASSES,
    SCORE_MODES,
    Aggregator,
    ClassSummary,
    LayoutBox,
    PageIoUConfig,
    PageResult,
    Problem,
    evaluate_page,
    iter_scores,
    mode_key,
)
from padoc_ray.groundtruth import TruthIndex, match_rows, pdf_source, row_label
from padoc_ray.output.reader import RowsInputError, read_rows
from padoc_ray.output.rows import page_from_row
from padoc_ray.protocol.page import size_is_swapped
from padoc_ray.status import OK

#: page-level problem kinds (box-level kinds are in pageiou.PROBLEM_KINDS)
PAGE_PROBLEM_KINDS = {
    "bad_page": "page entry unreadable (not an object, no page_info, no usable size, no layout_dets); skipped",
    "no_image_path": "page_info.image_path missing; the page cannot be aligned and is skipped",
    "duplicate_page": "a second entry for the same page; the first (JSON) or the latest (Parquet) is used",
    "missing_prediction": "ground-truth page with no prediction; scored as an empty layout",
    "unmatched_prediction": "prediction for a page the ground truth does not have; not scored",
    "swapped_size": "page_info width/height evidently exchanged (boxes fit only the transposed canvas); "
                    "the transposed size is used",
    "no_pred_size": "prediction page without width/height; normalized by the ground-truth page size",
    "pred_status": "prediction row whose status is not ok; its regions (often none) are scored",
    "document_error": "document-level error row in the Parquet output; no page to score",
}


class LayoutInputError(Exception):
    """A ground-truth or prediction file that cannot be read at all (usage error)."""


@dataclass
class PageBoxes:
    """One page's boxes in a side's own coordinates; ``size`` is the (width, height) of the pixel
    canvas, or None when the boxes are normalized."""

    key: str
    boxes: list[Any]
    size: tuple[float, float] | None
    status: str | None = None  #: a Parquet row's status
    source: tuple[str, int] | None = None  #: ground truth: (source_pdf basename, page_no) when given
    needs_size: bool = False  #: a JSON prediction page without width/height (the ground truth's is used)


@dataclass
class Side:
    pages: dict[str, PageBoxes] = field(default_factory=dict)
    problems: list[tuple[str, Problem]] = field(default_factory=list)  # (page key or "?", problem)


# ---- reading ----------------------------------------------------------------------------------------


def _read_json(path: str, what: str) -> Any:
    if not os.path.isfile(path):
        raise LayoutInputError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutInputError(f"cannot read {what} JSON {path}: {e}") from None


def _size(info: Any) -> tuple[float, float] | None:
    try:
        w, h = float(info["width"]), float(info["height"])
    except (KeyError, TypeError, ValueError):
        return None
    return (w, h) if w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h) else None


def _dets_to_boxes(dets: list, side: str, key: str, out: Side) -> list[Any]:
    """``layout_dets`` -> labeled pixel boxes; structural problems recorded (values checked later)."""
    boxes = []
    for i, det in enumerate(dets):
        if not isinstance(det, dict):
            out.problems.append((key, Problem(side, "bad_box", "layout_dets entry is not an object", i)))
            continue
        poly = det.get("poly")
        if not isinstance(poly, list) or len(poly) < 4 or len(poly) % 2:
            msg = f"poly must be a flat list of x,y pairs: {poly!r:.60}"
            out.problems.append((key, Problem(side, "bad_box", msg, i)))
            continue
        try:
            xs, ys = [float(v) for v in poly[0::2]], [float(v) for v in poly[1::2]]
        except (TypeError, ValueError):
            out.problems.append((key, Problem(side, "bad_box", f"poly has a non-number: {poly!r:.60}", i)))
            continue
        if not all(math.isfinite(v) for v in xs + ys):
            out.problems.append((key, Problem(side, "bad_box", f"poly has a non-finite value: {poly!r:.60}", i)))
            continue
        boxes.append(LayoutBox(det.get("category_type"), min(xs), min(ys), max(xs), max(ys)))
    return boxes


def _omnidocbench_pages(data: Any, side: str, what: str, fix_swapped: bool = True) -> Side:
    if not isinstance(data, list):
        raise LayoutInputError(f"{what} must be a JSON list of OmniDocBench pages, got {type(data).__name__}")
    out = Side()
    for n, page in enumerate(data):
        info = page.get("page_info") if isinstance(page, dict) else None
        if not isinstance(info, dict):
            out.problems.append(("?", Problem("page", "bad_page", f"{what} entry {n}: page_info missing")))
            continue
        path = info.get("image_path")
        if not isinstance(path, str) or not path:
            out.problems.append(("?", Problem("page", "no_image_path", f"{what} entry {n}: no page_info.image_path")))
            continue
        key = os.path.basename(path)
        dets = page.get("layout_dets")
        size = _size(info)
        if not isinstance(dets, list) or (size is None and side == "gt"):
            why = "layout_dets missing or not a list" if not isinstance(dets, list) else "no positive width/height"
            out.problems.append((key, Problem("page", "bad_page", f"{what} entry {n}: {why}")))
            continue
        if key in out.pages:
            out.problems.append((key, Problem("page", "duplicate_page", f"{what} entry {n} repeats {key}; ignored")))
            continue
        boxes = _dets_to_boxes(dets, side, key, out)
        if size is not None and fix_swapped and _swapped(boxes, size):
            out.problems.append((key, Problem("page", "swapped_size",
                                              f"{what} entry {n}: boxes reach beyond page_info {size[0]:g}x{size[1]:g} "
                                              f"but fit {size[1]:g}x{size[0]:g}; using the latter")))
            size = (size[1], size[0])
        out.pages[key] = PageBoxes(key, boxes, size, source=pdf_source(info), needs_size=size is None)
    return out


def _swapped(boxes: list[LayoutBox], size: tuple[float, float]) -> bool:
    """See :func:`padoc_ray.protocol.page.size_is_swapped` (one definition for every reader)."""
    try:
        mx = max((b.x2 for b in boxes), default=0.0)
        my = max((b.y2 for b in boxes), default=0.0)
    except TypeError:
        return False
    return size_is_swapped(size[0], size[1], mx, my)


def load_ground_truth(path: str, fix_swapped: bool = True) -> Side:
    """``fix_swapped``: use width and height exchanged where page_info's are evidently swapped (see
    :func:`_swapped`; recorded as a ``swapped_size`` problem)."""
    return _omnidocbench_pages(_read_json(path, "ground-truth"), "gt", "ground truth", fix_swapped)


def _read_parquet_rows(path: str) -> list[dict]:
    try:
        return read_rows(path, None, ["source_uri", "page_index", "status", "regions", "processed_at", "error_code"],
                         required=["source_uri", "regions"], must_exist=True).to_pylist()
    except RowsInputError as e:
        raise LayoutInputError(str(e)) from None


def load_parquet_predictions(path: str, gt: Side) -> Side:
    rows = _read_parquet_rows(path)
    m = match_rows(rows, TruthIndex((key, page.source) for key, page in gt.pages.items()))
    out = Side()
    for row in m.document_errors:
        code = row.get("error_code") or row.get("status")
        out.problems.append((row_label(row), Problem("page", "document_error",
                                                     f"{row.get('source_uri')}: document error {code}")))
    for row in m.unmatched:
        out.problems.append((row_label(row), Problem("page", "unmatched_prediction",
                                                     f"row {row_label(row)} matches no ground-truth page")))
    for key in m.duplicated:
        out.problems.append((key, Problem("page", "duplicate_page", f"several rows for {key}; using the latest "
                                                                    "processed_at")))
    chosen = m.rows
    for key, row in chosen.items():
        def bad(i, _reg, msg, key=key):
            out.problems.append((key, Problem("pred", "bad_box", msg, i)))

        page = page_from_row(row, on_bad_region=bad)  # the one row -> Page converter
        boxes = [LayoutBox(r.category, *r.box.as_tuple()) for r in page.regions]
        status = row.get("status")
        if status is not None and status != OK:
            out.problems.append((key, Problem("page", "pred_status", f"prediction status {status!r}")))
        out.pages[key] = PageBoxes(key, boxes, None, status)
    return out


def _is_parquet(path: str) -> bool:
    if os.path.isdir(path):
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def load_predictions(path: str, gt: Side, fix_swapped: bool = True) -> Side:
    """OmniDocBench JSON or padoc-ray Parquet (a file or an output folder), detected from the content."""
    if not os.path.exists(path):
        raise LayoutInputError(f"prediction path not found: {path}")
    try:
        parquet = _is_parquet(path)
    except OSError as e:
        raise LayoutInputError(f"cannot read predictions {path}: {e}") from None
    if parquet:
        return load_parquet_predictions(path, gt)
    return _omnidocbench_pages(_read_json(path, "prediction"), "pred", "predictions", fix_swapped)


# ---- the run --------------------------------------------------------------------------------------------


@dataclass
class LayoutReport:
    config: PageIoUConfig
    pages: dict[str, PageResult]
    summary: dict[tuple[str, str], dict[str, ClassSummary]]
    support: dict[str, int]
    problems: list[tuple[str, Problem]]
    counts: dict[str, int]

    def problem_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(p.kind for _, p in self.problems).items()))


def evaluate_layout(gt: Side, pred: Side, config: PageIoUConfig = PageIoUConfig()) -> LayoutReport:
    problems = list(gt.problems) + list(pred.problems)
    agg = Aggregator()
    results: dict[str, PageResult] = {}
    missing = 0
    for key, g in gt.pages.items():
        p = pred.pages.get(key)
        if p is None:
            missing += 1
            problems.append((key, Problem("page", "missing_prediction", f"no prediction for {key}; empty layout")))
            p = PageBoxes(key, [], None)
        psize = p.size
        if p.needs_size:
            psize = g.size
        if p.needs_size and p.boxes:
            problems.append((key, Problem("page", "no_pred_size", "prediction page has no width/height; "
                                                                  "using the ground truth's")))
        res = evaluate_page(g.boxes, p.boxes, config=config, gt_size=g.size, pred_size=psize)
        problems.extend((key, pr) for pr in res.problems)
        results[key] = res
        agg.add(res)
    unmatched = [k for k in pred.pages if k not in gt.pages]
    for k in unmatched:
        problems.append((k, Problem("page", "unmatched_prediction", f"prediction page {k} is not in the ground truth")))
    counts = {"evaluated": len(results), "ground_truth": len(gt.pages), "predictions": len(pred.pages),
              "missing_prediction": missing,
              "unmatched_prediction": sum(1 for _, p in problems if p.kind == "unmatched_prediction")}
    return LayoutReport(config, results, agg.summary(), agg.support(), problems, counts)


# ---- outputs ----------------------------------------------------------------------------------------------


def report_json(rep: LayoutReport) -> dict:
    """``{"<count>/<category>": {"<class>": {"iou", "f1", "precision", "recall"}}}`` for the four modes,
    plus ``support`` (support pages per class), ``pages`` (page counts), ``problems`` (counts by kind
    and every item) and ``config``."""
    out: dict[str, Any] = {}
    for m in SCORE_MODES:
        out[mode_key(*m)] = {q: rep.summary[m][q].to_dict() for q in REPORT_CLASSES}
    out["support"] = dict(rep.support)
    out["pages"] = dict(rep.counts)
    out["problems"] = {"counts": rep.problem_counts(),
                       "items": [{"page": k, **p.to_dict()} for k, p in rep.problems]}
    pm = rep.config.pred_map
    out["config"] = {"backend": rep.config.backend, "grid": rep.config.grid if rep.config.backend == "raster" else None,
                     "pred_map": pm if isinstance(pm, str) else {k: list(v) for k, v in pm.items()}}
    return out


CSV_FIELDS = ("page", "count_mode", "category_mode", "class", "support", "iou", "precision", "recall",
              "intersection", "union", "gt_area", "pred_area")


def write_pages_csv(rep: LayoutReport, path: str) -> None:
    """One row per page x mode x class; areas are fractions of the page."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for key, res in rep.pages.items():
            for cm, km, q, s in iter_scores(res):
                w.writerow([key, cm, km, q, int(s.support), f"{s.iou:.6f}", f"{s.precision:.6f}", f"{s.recall:.6f}",
                            f"{s.intersection:.8f}", f"{s.union:.8f}", f"{s.gt_area:.8f}", f"{s.pred_area:.8f}"])


def pages_csv_path(json_path: str) -> str:
    root, ext = os.path.splitext(json_path)
    return (root if ext.lower() == ".json" else json_path) + ".pages.csv"


_TITLES = {"overall": "Overall", "text": "Text", "image": "Image", "table": "Table", "formula": "Formula",
           "full_page": "Full page"}


def format_markdown(rep: LayoutReport) -> str:
    """The paper's table layout: one row per protocol (headline first), IoU F1 P R per class, in %."""
    order = [("countable", "acceptable")] + [m for m in SCORE_MODES if m != ("countable", "acceptable")]
    head = ["Protocol"] + [f"{_TITLES[q]} {m}" for q in REPORT_CLASSES for m in ("IoU", "F1", "P", "R")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v: "n/a" if v is None else f"{100 * v:.2f}"  # noqa: E731
    for m in order:
        cells = [mode_key(*m)]
        for q in REPORT_CLASSES:
            s = rep.summary[m][q]
            cells += [fmt(s.iou), fmt(s.f1), fmt(s.precision), fmt(s.recall)]
        lines.append("| " + " | ".join(cells) + " |")
    sup = ", ".join(f"{_TITLES[q].lower()} {rep.support[q]}" for q in CLASSES)
    lines.append("")
    lines.append(f"Percentages; page-level macro averages over support pages ({sup}); "
                 f"{rep.counts['evaluated']} pages, backend {rep.config.backend}.")
    return "\n".join(lines)


def problems_summary(rep: LayoutReport, limit: int = 5) -> str:
    counts = rep.problem_counts()
    if not counts:
        return "no input problems"
    parts = [f"{n} {k}" for k, n in counts.items()]
    pages = len({k for k, p in rep.problems if p.kind != "clipped"})
    lines = [f"input problems: {', '.join(parts)} (on {pages} pages; details in the JSON 'problems' section)"]
    shown = [(k, p) for k, p in rep.problems if p.kind != "clipped"][:limit]
    for k, p in shown:
        where = f"{p.side}[{p.index}]" if p.index is not None else p.side
        lines.append(f"  {k}: {p.kind} ({where}): {p.message}")
    return "\n".join(lines)
