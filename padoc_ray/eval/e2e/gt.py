"""OmniDocBench ground truth for the end-to-end evaluation: loading, checking, per-page elements.

A page is ``{"layout_dets": [...], "page_info": {"image_path", ...}, "extra": {"relation": [...]}}``;
each layout item has ``category_type``, ``order``, ``anno_id``, ``ignore`` and its content (``text``
for text categories, ``latex`` for ``equation_isolated``, ``html`` for ``table``).

:func:`page_elements` groups a page's items by category the way the v1.6 evaluator does: items
flagged ``ignore`` are left out; blocks linked by ``truncated`` relations (a paragraph split across
columns or pages) are merged into one block (texts concatenated in reading order, category, order
and id of the first); a merged group with any ignored member is left out entirely.

Bad input never raises here: :func:`load_ground_truth` returns the usable pages and a list of
:class:`Problem` (unreadable page, missing field, unknown category, duplicate page, ...). Only an
unreadable *file* raises :class:`E2EInputError`.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

from padoc_ray.groundtruth import pdf_source
from padoc_ray.eval.e2e.match import TEXT_CATEGORIES
from padoc_ray.protocol.spec import DEFAULT_CATEGORIES

KNOWN_CATEGORIES = frozenset(DEFAULT_CATEGORIES)
#: the content field each scored category needs (figure and abandon items are never read)
_CONTENT_FIELD = {cat: "text" for cat in TEXT_CATEGORIES}
_CONTENT_FIELD.update({"equation_isolated": "latex", "table": "html"})


class E2EInputError(Exception):
    """An input file that cannot be used at all (missing, not JSON, not a list of pages)."""


@dataclass(frozen=True)
class Problem:
    """Something wrong with one page (or one item of it): recorded, counted, never fatal."""

    page: str
    kind: str  # gt_page | gt_item | prediction | missing_prediction | extra_prediction | evaluation
    reason: str

    def to_dict(self) -> dict:
        return {"page": self.page, "kind": self.kind, "reason": self.reason}


@dataclass
class GtPage:
    name: str  #: image basename, the page's key
    elements: dict[str, list[dict]]  #: by category, after ignore flags and truncation merging
    source: tuple[str, int] | None = None  #: (source_pdf basename, page_no) when page_info has them
    categories: dict[str, int] = field(default_factory=dict)  #: usable items per category

    @property
    def has_tables(self) -> bool:
        return bool(self.categories.get("table"))

    @property
    def has_formulas(self) -> bool:
        return bool(self.categories.get("equation_isolated"))


def page_elements(page: dict) -> dict[str, list[dict]]:
    """Items of one (already checked) page by category, ignore flags applied and truncated blocks
    merged. Order of the lists is upstream's: plain items in file order, then merged groups."""
    groups: list[set] = []
    truncated: dict = {}
    for rel in (page.get("extra") or {}).get("relation") or []:
        if not isinstance(rel, dict) or rel.get("relation_type") != "truncated":
            continue
        if not all(isinstance(rel.get(k), (int, str)) for k in ("source_anno_id", "target_anno_id")):
            continue
        pair = {rel.get("source_anno_id"), rel.get("target_anno_id")}
        truncated.update(dict.fromkeys(pair, None))
        merged, rest = set(pair), []
        for g in groups:
            if g & merged:
                merged |= g
            else:
                rest.append(g)
        groups = rest + [merged]
    out: dict[str, list[dict]] = defaultdict(list)
    for item in page["layout_dets"]:
        if item.get("anno_id") in truncated:
            truncated[item["anno_id"]] = item
        elif not item.get("ignore", False):
            out[item["category_type"]].append(item)
    for group in groups:
        blocks = [truncated[k] for k in group if truncated.get(k)]
        if not blocks or any(b.get("ignore", False) for b in blocks):
            continue
        blocks = sorted(blocks, key=lambda b: b["order"] if b.get("order") is not None else 0)
        first = blocks[0]
        out[first["category_type"]].append({
            "category_type": first["category_type"], "order": first.get("order"), "anno_id": first.get("anno_id"),
            "text": "".join(str(b.get("text", "") or "") for b in blocks), "merge_list": blocks})
    return dict(out)


def _check_item(i: int, item, name: str, problems: list[Problem]) -> dict | None:
    if not isinstance(item, dict):
        problems.append(Problem(name, "gt_item", f"layout_dets[{i}] is not an object"))
        return None
    cat = item.get("category_type")
    if cat not in KNOWN_CATEGORIES:
        problems.append(Problem(name, "gt_item", f"layout_dets[{i}]: unknown category {cat!r} (item skipped)"))
        return None
    key = _CONTENT_FIELD.get(cat)
    if key == "html":
        if not isinstance(item.get("html", ""), str):
            problems.append(Problem(name, "gt_item", f"layout_dets[{i}] ({cat}): html is not a string (item skipped)"))
            return None
    elif key and not isinstance(item.get(key), str) and not item.get("ignore", False):
        problems.append(Problem(name, "gt_item", f"layout_dets[{i}] ({cat}): missing {key} (item skipped)"))
        return None
    if item.get("anno_id") is not None and not isinstance(item.get("anno_id"), (int, str)):
        problems.append(Problem(name, "gt_item", f"layout_dets[{i}] ({cat}): anno_id {item.get('anno_id')!r} is not "
                                                  "an id (treated as missing)"))
        item = dict(item, anno_id=None)
    order = item.get("order")
    if order is not None and (isinstance(order, bool) or not isinstance(order, (int, float))):
        problems.append(Problem(name, "gt_item", f"layout_dets[{i}] ({cat}): order {order!r} is not a number "
                                                  "(treated as missing)"))
        item = dict(item, order=None)
    return item


def check_page(obj, index: int, problems: list[Problem]) -> tuple[str, dict] | None:
    """``(page name, cleaned page)`` or None (with a problem recorded)."""
    label = f"#{index}"
    if not isinstance(obj, dict):
        problems.append(Problem(label, "gt_page", "page is not a JSON object"))
        return None
    info = obj.get("page_info")
    path = info.get("image_path") if isinstance(info, dict) else None
    if not isinstance(path, str) or not path.strip():
        problems.append(Problem(label, "gt_page", "page_info.image_path missing"))
        return None
    name = os.path.basename(path.strip())
    dets = obj.get("layout_dets")
    if not isinstance(dets, list):
        problems.append(Problem(name, "gt_page", "layout_dets missing or not a list (page skipped)"))
        return None
    items = [c for i, it in enumerate(dets) if (c := _check_item(i, it, name, problems)) is not None]
    extra = obj.get("extra") if isinstance(obj.get("extra"), dict) else {}
    return name, {"layout_dets": items, "page_info": info, "extra": extra}


def load_ground_truth(path: str) -> tuple[list[GtPage], list[Problem]]:
    """Pages in file order (duplicates after the first are dropped) and the problems found."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise E2EInputError(f"ground-truth file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise E2EInputError(f"cannot read ground truth {path}: {e}") from None
    if not isinstance(data, list):
        raise E2EInputError(f"ground truth {path} is not a JSON list of OmniDocBench pages")
    problems: list[Problem] = []
    pages: list[GtPage] = []
    seen: set[str] = set()
    for i, obj in enumerate(data):
        checked = check_page(obj, i, problems)
        if checked is None:
            continue
        name, page = checked
        if name in seen:
            problems.append(Problem(name, "gt_page", f"duplicate page (entry #{i} ignored)"))
            continue
        seen.add(name)
        counts: dict[str, int] = defaultdict(int)
        for item in page["layout_dets"]:
            if not item.get("ignore", False):
                counts[item["category_type"]] += 1
        pages.append(GtPage(name, page_elements(page), pdf_source(page["page_info"]), dict(counts)))
    return pages, problems
