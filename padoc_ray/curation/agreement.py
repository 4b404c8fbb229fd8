"""Agreement between two annotations of one page: the measure behind corpus re-annotation.

Given a reference page and a hypothesis page (existing annotation vs a new parse, or two parses),
:func:`compare_pages` reports

* layout agreement: PageIoU of the hypothesis against the reference (the paper's headline
  countable-acceptable protocol; ``layout_iou`` is the full-page coverage IoU),
* region matching: one-to-one pairs of regions by box IoU (greedy, highest IoU first, at least
  ``match_iou``), and the share of matched pairs whose categories agree,
* content agreement: for every matched pair with content, a distance in [0, 1] (text and LaTeX:
  normalized edit distance; HTML tables: 1 - TEDS); a region with content that has no partner
  counts 1. ``content_edit`` is their mean (0 when neither page has content).

and a ``consensus`` flag (layout IoU >= ``consensus_iou`` and content distance <= ``consensus_edit``).
:func:`difficulty` turns several comparisons into one score in [0, 1]: the mean over pairs of
``((1 - layout_iou) + content_edit) / 2``; how often training then draws the page is the trainer's
(:func:`padoc_ray.trainer.packing.sample_weight`). Pure: numpy only (through the metric modules).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from padoc_ray.protocol.page import Page, Region


@dataclass(frozen=True, kw_only=True)
class AgreementConfig:
    match_iou: float = 0.5  #: two regions pair up when their box IoU is at least this
    consensus_iou: float = 0.9  #: consensus needs this much full-page layout IoU ...
    consensus_edit: float = 0.1  #: ... and at most this mean content distance

    def __post_init__(self) -> None:
        for name in ("match_iou", "consensus_iou", "consensus_edit"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")


@dataclass(frozen=True)
class PageAgreement:
    layout_iou: float
    layout_precision: float
    layout_recall: float
    ref_regions: int
    hyp_regions: int
    matched: int
    category_agreement: float  # matched pairs with the same category / matched (1 when none matched)
    content_edit: float
    content_pairs: int  # distances averaged into content_edit
    consensus: bool

    def to_dict(self) -> dict:
        return asdict(self)


def box_iou(a: Region, b: Region) -> float:
    ax1, ay1, ax2, ay2 = a.box.as_tuple()
    bx1, by1, bx2, by2 = b.box.as_tuple()
    iw, ih = min(ax2, bx2) - max(ax1, bx1), min(ay2, by2) - max(ay1, by1)
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def match_regions(ref: Iterable[Region], hyp: Iterable[Region], min_iou: float) -> list[tuple[int, int, float]]:
    """One-to-one (ref index, hyp index, iou) pairs, greedily by descending IoU (ties: reading order)."""
    ref, hyp = list(ref), list(hyp)
    cands = sorted(((box_iou(r, h), i, j) for i, r in enumerate(ref) for j, h in enumerate(hyp)),
                   key=lambda t: (-t[0], t[1], t[2]))
    used_r, used_h, out = set(), set(), []
    for iou, i, j in cands:
        if iou < min_iou or iou <= 0.0:
            break
        if i in used_r or j in used_h:
            continue
        used_r.add(i)
        used_h.add(j)
        out.append((i, j, iou))
    return sorted(out)


def _has_area(r: Region) -> bool:
    """A finite box with positive area (degenerate or NaN boxes take no part in the comparison)."""
    b = r.box
    return b.is_valid and b.x2 > b.x1 and b.y2 > b.y1


def _has_content(r: Region) -> bool:
    return r.content_format != "none" and bool((r.content or "").strip())


def content_distance(a: Region, b: Region) -> float:
    """Distance in [0, 1] between two regions' contents, by the reference's content format."""
    from padoc_ray.eval.e2e.metrics import normalized_edit_distance, teds

    if not _has_content(a) and not _has_content(b):
        return 0.0
    if not _has_content(a) or not _has_content(b):
        return 1.0
    if a.content_format == "html" and b.content_format == "html":
        return 1.0 - teds(a.content, b.content)
    kind = "formula" if a.content_format == "latex" else "text"
    return normalized_edit_distance(a.content, b.content, kind=kind)


def compare_pages(ref: Page, hyp: Page, cfg: AgreementConfig = AgreementConfig()) -> PageAgreement:
    from padoc_ray.eval.pageiou import page_iou

    rr = [r for r in ref.regions if not r.ignore and _has_area(r)]
    hr = [r for r in hyp.regions if _has_area(r)]
    full = page_iou(rr, hr)["full_page"]
    pairs = match_regions(rr, hr, cfg.match_iou)
    same_cat = sum(rr[i].category == hr[j].category for i, j, _ in pairs)
    dists = [content_distance(rr[i], hr[j]) for i, j, _ in pairs if _has_content(rr[i]) or _has_content(hr[j])]
    paired_r, paired_h = {i for i, _, _ in pairs}, {j for _, j, _ in pairs}
    dists += [1.0 for i, r in enumerate(rr) if i not in paired_r and _has_content(r)]
    dists += [1.0 for j, h in enumerate(hr) if j not in paired_h and _has_content(h)]
    edit = sum(dists) / len(dists) if dists else 0.0
    return PageAgreement(
        layout_iou=full.iou, layout_precision=full.precision, layout_recall=full.recall,
        ref_regions=len(rr), hyp_regions=len(hr), matched=len(pairs),
        category_agreement=same_cat / len(pairs) if pairs else 1.0,
        content_edit=edit, content_pairs=len(dists),
        consensus=full.iou >= cfg.consensus_iou and edit <= cfg.consensus_edit,
    )


def difficulty(agreements: Iterable[PageAgreement]) -> float | None:
    """Mean over comparisons of ((1 - layout IoU) + content distance) / 2; None with no comparison."""
    vals = [((1.0 - a.layout_iou) + a.content_edit) / 2 for a in agreements]
    return sum(vals) / len(vals) if vals else None

