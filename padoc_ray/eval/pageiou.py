"""PageIoU: coverage-based layout metrics (paper, "Evaluation Protocol" and Appendix B).

A page is compared as coverage over the unit square Omega = [0, 1]^2, without box matching. For an
evaluation class q (text, table, formula, image, full page), three pointwise counts are built:

    a(z) = ground-truth *include* boxes of q covering z     (Table 4, a check mark)
    b(z) = ground-truth *acceptable* boxes of q covering z  (Table 4, a circle)
    c(z) = predicted boxes mapped to q covering z

Count modes: ``binary`` clips each count to 1 (only the union of each group matters), ``countable``
keeps the multiplicity (duplicate or overlapping boxes are penalized). Category modes define the
area sums I, U, D_gt, D_pr (<f> = integral of f over Omega):

    acceptable:        I = <min(a+b, c)>   U = <max(a, c)>   D_gt = <max(a, min(a+b, c))>   D_pr = <c>
    ignore_acceptable: I = <min(a, c)>     U = <0 if a == 0 < b else max(a, c)>
                       D_gt = <a>          D_pr = <c - min(max(c - a, 0), b)>

Per page: IoU = rho(I, U), precision = rho(I, D_pr), recall = rho(I, D_gt) with rho(x, 0) = 1.
A page supports class q when it has at least one include, acceptable or mapped predicted box of q;
reported values are page-level macro averages over the supporting pages, F1 = 2PR / (P + R) from the
macro precision and recall (0 when both are 0), and Overall is the mean of the text, image, table
and formula values (each of IoU, F1, P, R), full page being reported on its own.

Backends: ``exact`` (default) compresses the coordinates of all box edges plus 0 and 1 into a grid of
cells on which every count is constant, fills the counts with a 2-D difference array and prefix
sums, and weights each cell by its exact area; ``raster`` rounds box edges onto a G x G grid
(G = 1000 by default) and applies the same equations per pixel, as a numerical cross-check. Both
live in :mod:`padoc_ray.eval.coverage`.

Boxes are clipped to Omega first. Per box, problems are recorded, never raised: an unknown category,
a non-finite or non-numeric coordinate, zero or negative extent, a box entirely outside the page
(dropped), a box partly outside (clipped, kept).

What this module ignores: file formats and page alignment (``layout.py``), OmniDocBench's ``ignore``
flag (every box counts), reading order and content. Pure: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from padoc_ray.eval.coverage import area_sums, coverage_exact, coverage_raster, triple_areas
from padoc_ray.knobs import knob

# ---- the protocol as data ------------------------------------------------------------------------

#: evaluation classes, in the paper's reporting order (Overall first, full page last)
CLASSES: tuple[str, ...] = ("text", "image", "table", "formula", "full_page")
#: classes whose values Overall macro-averages
OVERALL_CLASSES: tuple[str, ...] = ("text", "image", "table", "formula")
REPORT_CLASSES: tuple[str, ...] = ("overall",) + CLASSES
COUNT_MODES: tuple[str, ...] = ("binary", "countable")
CATEGORY_MODES: tuple[str, ...] = ("acceptable", "ignore_acceptable")
#: (count mode, category mode) pairs; the paper's headline protocol is countable/acceptable
SCORE_MODES: tuple[tuple[str, str], ...] = tuple((c, k) for c in COUNT_MODES for k in CATEGORY_MODES)
HEADLINE_MODE: tuple[str, str] = ("countable", "acceptable")
BACKENDS: tuple[str, ...] = ("exact", "raster")


def mode_key(count_mode: str, category_mode: str) -> str:
    """``"countable/acceptable"`` etc.: the key of a mode in reports."""
    return f"{count_mode}/{category_mode}"


@dataclass(frozen=True)
class ClassMembers:
    """Ground-truth categories of one evaluation class: core (include) and ambiguous (acceptable)."""

    include: frozenset[str]
    acceptable: frozenset[str]


def _members(include: str, acceptable: str) -> ClassMembers:
    return ClassMembers(frozenset(include.split()), frozenset(acceptable.split()))


#: Table 4: OmniDocBench ground-truth categories per evaluation class.
CATEGORY_MAPPING: Mapping[str, ClassMembers] = MappingProxyType({
    "text": _members(
        "text_block title reference list_group code_txt code_txt_caption",
        "header footer page_number page_footnote table_caption table_footnote figure_caption figure_footnote "
        "equation_caption algorithm_mask text_mask"),
    "table": _members("table", "table_caption table_footnote table_mask"),
    "formula": _members("equation_isolated",
                        "equation_caption equation_semantic equation_explanation organic_chemical_formula_mask"),
    "image": _members("figure", "figure_caption figure_footnote organic_chemical_formula_mask chart_mask"),
    "full_page": _members(
        "text_block title reference list_group code_txt code_txt_caption table equation_isolated figure",
        "header footer page_number page_footnote table_caption table_footnote figure_caption figure_footnote "
        "equation_caption algorithm_mask text_mask table_mask equation_semantic equation_explanation "
        "organic_chemical_formula_mask chart_mask abandon need_mask unknown_mask"),
})

#: every category Table 4 knows (28 OmniDocBench v1.6 categories)
KNOWN_CATEGORIES: frozenset[str] = frozenset().union(*(m.include | m.acceptable for m in CATEGORY_MAPPING.values()))

#: categories of padoc-ray's protocol (padoc_ray.protocol.spec) that Table 4 does not list, read as
#: the Table 4 row they correspond to
CATEGORY_ALIASES: Mapping[str, str] = MappingProxyType({
    "code_algorithm": "algorithm_mask",
    "code_algorithm_caption": "code_txt_caption",
})


def _pred_mapping(soft: bool) -> Mapping[str, tuple[str, ...]]:
    out = {}
    for cat in sorted(KNOWN_CATEGORIES):
        out[cat] = tuple(q for q in CLASSES if cat in CATEGORY_MAPPING[q].include
                         or (soft and cat in CATEGORY_MAPPING[q].acceptable))
    return MappingProxyType(out)


#: How predicted categories map to classes (the paper leaves this per parser). For a parser that
#: predicts OmniDocBench categories: ``soft`` (default) maps a category to every class that lists it
#: as include or acceptable (a predicted caption is acceptable coverage of text and of its figure or
#: table; every category feeds full page); ``include`` maps it only where it is an include category.
PRED_MAPPINGS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "soft": _pred_mapping(True),
    "include": _pred_mapping(False),
})

#: problem kinds recorded per box; the first three drop the box, ``clipped`` keeps it
PROBLEM_KINDS: Mapping[str, str] = MappingProxyType({
    "unknown_category": "category not in Table 4 (or the prediction mapping); box dropped",
    "bad_box": "coordinates missing, not numbers, or not finite; box dropped",
    "degenerate_box": "zero or negative width or height; box dropped",
    "outside_canvas": "box lies entirely outside the page; dropped",
    "clipped": "box extends beyond the page; clipped to it",
})


def canonical_category(name: Any) -> str | None:
    """The Table 4 category a label stands for (case-insensitive, aliases applied), or None."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    key = CATEGORY_ALIASES.get(key, key)
    return key if key in KNOWN_CATEGORIES else None


# ---- inputs ---------------------------------------------------------------------------------------


class LayoutBox(NamedTuple):
    """One labeled axis-aligned box, x1 y1 x2 y2 with origin top-left (normalized or pixels)."""

    category: str
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True)
class Problem:
    """Something wrong with one box (or, from ``layout.py``, one page)."""

    side: str  # "gt" | "pred" | "page"
    kind: str
    message: str
    index: int | None = None  # the box's position in its input list

    def to_dict(self) -> dict:
        return {"side": self.side, "kind": self.kind, "index": self.index, "message": self.message}


def as_layout_box(obj: Any) -> LayoutBox:
    """Accepts a :class:`LayoutBox`, ``(category, (x1, y1, x2, y2))``, ``(category, x1, y1, x2, y2)``,
    a mapping with ``category`` and ``bbox``, or an object with ``.category`` and ``.box`` (a
    :class:`padoc_ray.protocol.Region`). Coordinates are not validated here."""
    if isinstance(obj, LayoutBox):
        return obj
    if isinstance(obj, Mapping):
        cat, box = obj.get("category"), obj.get("bbox")
    elif hasattr(obj, "category") and hasattr(obj, "box"):
        cat, box = obj.category, obj.box
        box = box.as_tuple() if hasattr(box, "as_tuple") else box
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        cat, box = obj
    elif isinstance(obj, (tuple, list)) and len(obj) == 5:
        cat, box = obj[0], obj[1:]
    else:
        raise TypeError(f"not a labeled box: {obj!r:.80}")
    if not isinstance(box, (tuple, list)) or len(box) != 4:
        raise TypeError(f"box must have 4 coordinates: {box!r:.80}")
    return LayoutBox(cat, *box)


# ---- configuration and results -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PageIoUConfig:
    #: ``exact`` (coordinate compression; what reports use) or ``raster`` (cross-check)
    backend: str = knob("exact", choices=("exact", "raster"))
    grid: int = 1000  #: raster backend only: cells per side (the paper uses 1000 x 1000 for OmniDocBench)
    #: ``soft``, ``include`` (see :data:`PRED_MAPPINGS`) or a mapping predicted category -> classes
    pred_map: str | Mapping[str, Sequence[str]] = "soft"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not (isinstance(self.grid, int) and self.grid >= 1):
            raise ValueError(f"grid must be a positive integer, got {self.grid!r}")
        if isinstance(self.pred_map, str):
            if self.pred_map not in PRED_MAPPINGS:
                raise ValueError(f"pred_map must be one of {tuple(PRED_MAPPINGS)} or a mapping, got {self.pred_map!r}")
        else:
            for cat, classes in self.pred_map.items():
                if isinstance(classes, str) or not isinstance(cat, str) or any(q not in CLASSES for q in classes):
                    raise ValueError(f"pred_map[{cat!r}] must be a list of classes from {CLASSES}, got {classes!r}")
            object.__setattr__(self, "_custom", {k.strip().lower(): tuple(v) for k, v in self.pred_map.items()})

    def pred_classes(self, category: Any) -> tuple[str, ...] | None:
        """Classes a predicted label feeds, or None when the label is unknown."""
        if isinstance(self.pred_map, str):
            cat = canonical_category(category)
            return None if cat is None else PRED_MAPPINGS[self.pred_map][cat]
        if not isinstance(category, str):
            return None
        return self._custom.get(category.strip().lower())


@dataclass(frozen=True)
class PageScore:
    """One page, one class, one mode. Areas are fractions of the page (the exact sums I, U, D_gt, D_pr)."""

    iou: float
    precision: float
    recall: float
    support: bool
    intersection: float = 0.0
    union: float = 0.0
    gt_area: float = 0.0
    pred_area: float = 0.0


@dataclass
class PageResult:
    """All modes and classes of one page: ``scores[(count_mode, category_mode)][class]``."""

    scores: dict[tuple[str, str], dict[str, PageScore]]
    problems: list[Problem] = field(default_factory=list)

    @property
    def support(self) -> dict[str, bool]:
        first = self.scores[SCORE_MODES[0]]
        return {q: first[q].support for q in CLASSES}


def rho(x: float, y: float) -> float:
    """x / y, and 1 when y == 0 (agreement on an empty support is perfect)."""
    return 1.0 if y <= 0 else min(1.0, x / y)


# ---- box preparation -------------------------------------------------------------------------------


def _prepare(boxes: Iterable[Any], side: str, size: tuple[float, float] | None, classes_of,
             problems: list[Problem]) -> tuple[list[tuple[float, float, float, float]], list[list[int]]]:
    """Valid clipped rectangles and, per rectangle, the layer ids it counts in."""
    rects, layers = [], []
    sx, sy = (1.0, 1.0) if size is None else (float(size[0]), float(size[1]))
    for i, raw in enumerate(boxes):
        try:
            b = as_layout_box(raw)
            x1, y1, x2, y2 = (float(v) for v in b[1:])
        except (TypeError, ValueError) as e:
            problems.append(Problem(side, "bad_box", str(e), i))
            continue
        lay = classes_of(b.category)
        if lay is None:
            problems.append(Problem(side, "unknown_category", f"unknown category {b.category!r}", i))
            continue
        x1, x2, y1, y2 = x1 / sx, x2 / sx, y1 / sy, y2 / sy
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            problems.append(Problem(side, "bad_box", f"non-finite coordinates {(x1, y1, x2, y2)}", i))
            continue
        if not (x2 > x1 and y2 > y1):
            problems.append(Problem(side, "degenerate_box", f"zero or negative extent {(x1, y1, x2, y2)}", i))
            continue
        c = (min(max(x1, 0.0), 1.0), min(max(y1, 0.0), 1.0), min(max(x2, 0.0), 1.0), min(max(y2, 0.0), 1.0))
        if not (c[2] > c[0] and c[3] > c[1]):
            problems.append(Problem(side, "outside_canvas", f"box {(x1, y1, x2, y2)} lies outside the page", i))
            continue
        if c != (x1, y1, x2, y2):
            problems.append(Problem(side, "clipped", f"box {(x1, y1, x2, y2)} clipped to the page", i))
        rects.append(c)
        layers.append(lay)
    return rects, layers


# ---- the page metric --------------------------------------------------------------------------------


def evaluate_page(gt: Iterable[Any], pred: Iterable[Any], *, config: PageIoUConfig = PageIoUConfig(),
                  gt_size: tuple[float, float] | None = None,
                  pred_size: tuple[float, float] | None = None) -> PageResult:
    """Every mode and class of one page.

    ``gt`` and ``pred`` are labeled boxes (see :func:`as_layout_box`), normalized to [0, 1] unless
    ``gt_size`` / ``pred_size`` give the (width, height) of their pixel canvas. Each side is
    normalized by its own canvas. Bad boxes become :class:`Problem` entries and are skipped.
    """
    for size in (gt_size, pred_size):
        if size is not None and not all(math.isfinite(v) and v > 0 for v in map(float, size)):
            raise ValueError(f"canvas size must be two positive numbers, got {size!r}")
    problems: list[Problem] = []
    qi = {q: k for k, q in enumerate(CLASSES)}

    def gt_layers(cat):
        cat = canonical_category(cat)
        if cat is None:
            return None
        return [3 * k + (0 if cat in CATEGORY_MAPPING[q].include else 1) for q, k in qi.items()
                if cat in CATEGORY_MAPPING[q].include or cat in CATEGORY_MAPPING[q].acceptable]

    def pred_layers(cat):
        cls = config.pred_classes(cat)
        return None if cls is None else [3 * qi[q] + 2 for q in cls]

    g_rects, g_layers = _prepare(gt, "gt", gt_size, gt_layers, problems)
    p_rects, p_layers = _prepare(pred, "pred", pred_size, pred_layers, problems)
    rects = [r for r, lay in zip(g_rects + p_rects, g_layers + p_layers) for _ in lay]
    layer = np.array([x for lay in g_layers + p_layers for x in lay], dtype=np.int64)
    support = {q: bool(np.any(layer // 3 == k)) for q, k in qi.items()}
    scores = {m: {q: PageScore(1.0, 1.0, 1.0, False) for q in CLASSES} for m in SCORE_MODES}
    active = [q for q in CLASSES if support[q]]
    if active:
        # renumber layers so only supported classes are computed: class slot s -> layers 3s..3s+2
        slot = {qi[q]: s for s, q in enumerate(active)}
        layer = np.array([3 * slot[x // 3] + x % 3 for x in layer], dtype=np.int64)
        r = np.asarray(rects, dtype=np.float64).reshape(-1, 4)
        n_layers = 3 * len(active)
        if config.backend == "exact":
            counts, w = coverage_exact(r, layer, n_layers)
        else:
            counts, w = coverage_raster(r, layer, n_layers, config.grid)
        slot_of, a, b, c, area = triple_areas(counts, w)
        for count_mode in COUNT_MODES:
            abc = [np.minimum(x, 1) for x in (a, b, c)] if count_mode == "binary" else [a, b, c]
            sums = area_sums(slot_of, *abc, area, len(active))
            for category_mode, arr in sums.items():
                for s, q in enumerate(active):
                    i, u, dg, dp = (float(v) for v in arr[:, s])
                    scores[(count_mode, category_mode)][q] = PageScore(
                        rho(i, u), rho(i, dp), rho(i, dg), True, i, u, dg, dp)
    return PageResult(scores, problems)


def page_iou(gt_boxes: Iterable[Any], pred_boxes: Iterable[Any], *, count_mode: str = "countable",
             category_mode: str = "acceptable", backend: str = "exact", grid: int = 1000,
             pred_map: str | Mapping[str, Sequence[str]] = "soft", gt_size: tuple[float, float] | None = None,
             pred_size: tuple[float, float] | None = None) -> dict[str, PageScore]:
    """PageIoU of one page in one mode: ``{class: PageScore}`` for the five classes.

    Boxes as in :func:`evaluate_page` (normalized unless a ``*_size`` is given). Defaults are the
    paper's headline protocol (countable coverage, acceptable categories, exact areas). Problems
    with individual boxes are skipped silently here; use :func:`evaluate_page` to see them.
    """
    if (count_mode, category_mode) not in SCORE_MODES:
        raise ValueError(f"count_mode must be one of {COUNT_MODES} and category_mode one of {CATEGORY_MODES}")
    cfg = PageIoUConfig(backend=backend, grid=grid, pred_map=pred_map)
    res = evaluate_page(gt_boxes, pred_boxes, config=cfg, gt_size=gt_size, pred_size=pred_size)
    return res.scores[(count_mode, category_mode)]


# ---- aggregation --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassSummary:
    """Macro averages over the support pages; None when no page supports the class. ``support`` is
    the number of support pages (for ``overall``: the number of classes it averages)."""

    iou: float | None
    f1: float | None
    precision: float | None
    recall: float | None
    support: int

    def to_dict(self) -> dict:
        return {"iou": self.iou, "f1": self.f1, "precision": self.precision, "recall": self.recall}


def f1_score(p: float, r: float) -> float:
    return 0.0 if p + r <= 0 else 2 * p * r / (p + r)


class Aggregator:
    """Accumulates :class:`PageResult` s; :meth:`summary` gives ``{mode: {report class: ClassSummary}}``."""

    def __init__(self) -> None:
        self._sums = {m: {q: [0.0, 0.0, 0.0, 0] for q in CLASSES} for m in SCORE_MODES}
        self.pages = 0

    def add(self, result: PageResult) -> None:
        self.pages += 1
        for m in SCORE_MODES:
            for q, sc in result.scores[m].items():
                if sc.support:
                    acc = self._sums[m][q]
                    acc[0] += sc.iou
                    acc[1] += sc.precision
                    acc[2] += sc.recall
                    acc[3] += 1

    def support(self) -> dict[str, int]:
        return {q: self._sums[SCORE_MODES[0]][q][3] for q in CLASSES}

    def summary(self) -> dict[tuple[str, str], dict[str, ClassSummary]]:
        out = {}
        for m in SCORE_MODES:
            per: dict[str, ClassSummary] = {}
            for q in CLASSES:
                iou, p, r, n = self._sums[m][q]
                per[q] = ClassSummary(iou / n, f1_score(p / n, r / n), p / n, r / n, n) if n \
                    else ClassSummary(None, None, None, None, 0)
            have = [per[q] for q in OVERALL_CLASSES if per[q].support]
            if have:
                mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
                per = {"overall": ClassSummary(mean([c.iou for c in have]), mean([c.f1 for c in have]),
                                               mean([c.precision for c in have]), mean([c.recall for c in have]),
                                               len(have)), **per}
            else:
                per = {"overall": ClassSummary(None, None, None, None, 0), **per}
            out[m] = per
        return out


def aggregate(results: Iterable[PageResult]) -> dict[tuple[str, str], dict[str, ClassSummary]]:
    agg = Aggregator()
    for r in results:
        agg.add(r)
    return agg.summary()


def iter_scores(result: PageResult) -> Iterator[tuple[str, str, str, PageScore]]:
    """(count_mode, category_mode, class, score) for every mode and class of a page."""
    for (cm, km), per in result.scores.items():
        for q in CLASSES:
            yield cm, km, q, per[q]
