"""Consensus annotation of one page from several prediction sets (the paper's data curation).

Given N parses of the same page (other parsers, other padoc-ray runs), :func:`build_consensus`
keeps the regions on which at least ``min_agree`` of them agree:

1. **Clusters.** The sets are visited in the order given; each set's regions are matched one to
   one to the clusters found so far (greedy by box IoU against each cluster's median box, at least
   ``match_iou``, as :func:`padoc_ray.curation.agreement.match_regions` pairs regions); a region left
   over starts a new cluster. A cluster therefore holds at most one region per set.
2. **Support.** A cluster with members from at least ``min_agree`` sets becomes a consensus region:
   its box is the coordinate-wise median of the members' boxes, its category the members'
   majority (ties: the first set's), its content that of the member (of that category) whose
   content is closest to the other members' (the medoid under the agreement content distance).
3. **Reading order.** Consensus regions are ordered by majority: region A precedes B when more
   of the sets holding both put A first; the regions are sorted by how many others they precede
   (Copeland score), ties by mean relative position.

A page has a consensus when at least ``min_agree`` sets parsed it and either some cluster reached
that support or every parse is empty (a blank page). ``coverage`` is the share of all parsed
regions that ended in a consensus region: low coverage means the consensus is a partial
annotation. Pure: no ray/vllm/torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping

from padoc_ray.curation.agreement import content_distance, match_regions
from padoc_ray.protocol.page import Box, Page, Region


def default_min_agree(n_sets: int) -> int:
    """A strict majority of the prediction sets (2 of 2, 2 of 3, 3 of 4 ...); 1 for a single set."""
    return n_sets // 2 + 1


@dataclass(frozen=True)
class Consensus:
    page: Page | None  #: the consensus annotation (None: no consensus)
    reason: str | None  #: why there is none
    parsed: int  #: sets with a parse of this page
    support: tuple[int, ...]  #: per consensus region, how many sets agreed on it
    coverage: float  #: regions in consensus clusters / all parsed regions (1.0 for blank pages)
    sources: tuple[str, ...]  #: per consensus region, the set whose content was taken


def _usable(r: Region) -> bool:
    b = r.box
    return b.is_valid and b.x2 > b.x1 and b.y2 > b.y1


def _median_box(boxes: list[Box]) -> Box:
    return Box(*(statistics.median(v) for v in zip(*(b.as_tuple() for b in boxes))))


def _medoid(members: list[tuple[str, Region]]) -> tuple[str, Region]:
    if len(members) <= 2:
        return members[0]  # two members are equally close to each other: the earlier set's
    best, best_d = members[0], None
    for k, (name, r) in enumerate(members):
        d = sum(content_distance(r, o) for j, (_, o) in enumerate(members) if j != k) / (len(members) - 1)
        if best_d is None or d < best_d - 1e-12:
            best, best_d = (name, r), d
    return best


def build_consensus(pages: Mapping[str, Page], *, min_agree: int, match_iou: float = 0.5,
                    template: Page | None = None) -> Consensus:
    """The consensus of ``pages`` (set name -> its parse of one page; sets without a parse left out).

    ``template`` gives the consensus page its size, number and name (default: the first page).
    """
    if min_agree < 1:
        raise ValueError(f"min_agree must be at least 1, got {min_agree}")
    names = list(pages)
    if len(names) < min_agree:
        return Consensus(None, f"{len(names)} prediction set(s) parsed this page, fewer than min_agree={min_agree}",
                         len(names), (), 0.0, ())
    regions = {n: [r for r in pages[n].regions if _usable(r)] for n in names}
    total = sum(len(v) for v in regions.values())
    base = template or pages[names[0]]
    if total == 0:
        return Consensus(Page(width=base.width, height=base.height, page_no=base.page_no,
                              image_path=base.image_path, extra=dict(base.extra)), None, len(names), (), 1.0, ())
    clusters: list[dict[str, tuple[int, Region]]] = []
    for n in names:
        reps = [_median_box([r.box for _, r in c.values()]) for c in clusters]
        probes = [Region(category="", box=b) for b in reps]  # match_regions pairs regions by their boxes
        taken = set()
        for ci, ri, _ in match_regions(probes, regions[n], match_iou):
            clusters[ci][n] = (ri, regions[n][ri])
            taken.add(ri)
        for ri, r in enumerate(regions[n]):
            if ri not in taken:
                clusters.append({n: (ri, r)})
    kept = [c for c in clusters if len(c) >= min_agree]
    if not kept:
        return Consensus(None, f"no region was found by {min_agree} of the {len(names)} prediction sets",
                         len(names), (), 0.0, ())

    # reading order: pairwise majority (Copeland), ties by mean relative position
    def rel(c: dict, n: str) -> float:
        return c[n][0] / max(1, len(regions[n]) - 1)

    wins = [0] * len(kept)
    for a in range(len(kept)):
        for b in range(len(kept)):
            if a == b:
                continue
            both = [n for n in names if n in kept[a] and n in kept[b]]
            before = sum(kept[a][n][0] < kept[b][n][0] for n in both)
            if before * 2 > len(both):
                wins[a] += 1
    mean_pos = [sum(rel(c, n) for n in c) / len(c) for c in kept]
    order = sorted(range(len(kept)), key=lambda i: (-wins[i], mean_pos[i], i))

    out_regions, support, sources = [], [], []
    for i in order:
        c = kept[i]
        members = [(n, c[n][1]) for n in names if n in c]
        votes: dict[str, int] = {}
        for _, r in members:
            votes[r.category] = votes.get(r.category, 0) + 1
        top = max(votes.values())
        category = next(r.category for _, r in members if votes[r.category] == top)
        name, pick = _medoid([(n, r) for n, r in members if r.category == category])
        out_regions.append(Region(category=category, box=_median_box([r.box for _, r in members]),
                                  content=pick.content, content_format=pick.content_format))
        support.append(len(members))
        sources.append(name)
    covered = sum(len(c) for c in kept)
    page = Page(width=base.width, height=base.height, regions=tuple(out_regions), page_no=base.page_no,
                image_path=base.image_path, extra=dict(base.extra))
    return Consensus(page, None, len(names), tuple(support), covered / total, tuple(sources))
