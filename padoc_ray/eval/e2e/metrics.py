"""Metrics of the OmniDocBench v1.6 end-to-end protocol, per region and per page.

- Normalized edit distance: Levenshtein distance / length of the longer string, on normalized
  strings (:func:`normalized_edit_distance`).
- TEDS (Tree-Edit-Distance-based Similarity, Zhong et al. 2020): ``1 - TED(a, b) / max(nodes)``
  over the HTML table trees; cells are compared by the edit distance of their character tokens,
  a cell with a different tag, colspan or rowspan costs 1; TEDS-S ignores cell text
  (:func:`teds`). Tree edit distance by APTED.
- Page scores (:func:`page_edit`, :func:`mean`): how OmniDocBench turns region scores into the
  reported numbers (the run-level averaging is described in :mod:`.evaluate`).
"""

from __future__ import annotations

import math

from apted import APTED, Config
from lxml import html
from rapidfuzz.distance import Levenshtein

from padoc_ray.eval.e2e.normalize import normalized_formula, normalized_html_table, normalized_text

KINDS = ("text", "formula", "table", "raw")


def normalize(s: str, kind: str = "text") -> str:
    """``s`` in the form the protocol compares ``kind`` in (``raw``: unchanged)."""
    if kind == "text":
        return normalized_text(s)
    if kind == "formula":
        return normalized_formula(s)
    if kind == "table":
        return normalized_html_table(s) if "<table" in str(s).lower() else str(s)
    if kind == "raw":
        return str(s)
    raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")


def edit_ratio(a: str, b: str) -> float:
    """Edit distance divided by the longer length: 0 identical (or both empty), 1 when one is empty."""
    if not a and not b:
        return 0.0
    if not a or not b:
        return 1.0
    return Levenshtein.distance(a, b) / max(len(a), len(b))


def normalized_edit_distance(a: str, b: str, kind: str = "text") -> float:
    """:func:`edit_ratio` of ``a`` and ``b`` after the ``kind`` normalization: 0 identical, 1 nothing
    in common; 0 when both normalize to empty."""
    return edit_ratio(normalize(a, kind), normalize(b, kind))


# --------------------------------------------------------------------------------------------------
# TEDS

class _Node:
    __slots__ = ("tag", "colspan", "rowspan", "tokens", "children")

    def __init__(self, tag, colspan=None, rowspan=None, tokens=None):
        self.tag, self.colspan, self.rowspan, self.tokens, self.children = tag, colspan, rowspan, tokens, []


class _TedsConfig(Config):
    def rename(self, a: _Node, b: _Node) -> float:
        if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
            return 1.0
        if a.tag == "td" and (a.tokens or b.tokens):
            return Levenshtein.distance(a.tokens, b.tokens) / max(len(a.tokens), len(b.tokens))
        return 0.0

    def children(self, node: _Node) -> list:
        return node.children


def _cell_tokens(el, out: list[str]) -> None:
    """``<tag>``, the text characters, the children, ``</tag>`` and (except for cells) the tail."""
    out.append(f"<{el.tag}>")
    if el.text is not None:
        out.extend(el.text)
    for child in el:
        _cell_tokens(child, out)
    if el.tag != "unk":
        out.append(f"</{el.tag}>")
    if el.tag != "td" and el.tail is not None:
        out.extend(el.tail)


def _span(el, name: str) -> int:
    return int(el.attrib.get(name, "1"))


def _tree(el, structure_only: bool) -> _Node:
    if el.tag == "td":
        tokens: list[str] = []
        if not structure_only:
            _cell_tokens(el, tokens)
            tokens = tokens[1:-1]
        return _Node("td", _span(el, "colspan"), _span(el, "rowspan"), tokens)
    node = _Node(el.tag)
    node.children = [_tree(child, structure_only) for child in el]
    return node


def _table_root(markup: str):
    root = html.fromstring(markup, parser=html.HTMLParser(remove_comments=True, encoding="utf-8"))
    tables = root.xpath("body/table")
    return tables[0] if tables else None


def teds_normalized(pred: str, gt: str, structure_only: bool = False) -> float:
    """TEDS of two already normalized tables (0 when either is empty or has no ``body/table``)."""
    if not pred or not gt:
        return 0.0
    a, b = _table_root(pred), _table_root(gt)
    if a is None or b is None:
        return 0.0
    n_nodes = max(len(a.xpath(".//*")), len(b.xpath(".//*")))
    distance = APTED(_tree(a, structure_only), _tree(b, structure_only), _TedsConfig()).compute_edit_distance()
    return 1.0 - float(distance) / n_nodes


def teds(html_a: str, html_b: str, structure_only: bool = False, normalize_tables: bool = True) -> float:
    """TEDS similarity (1 identical, 0 unrelated) of two HTML tables, after the protocol's table
    normalization unless ``normalize_tables`` is False (then each must be a full
    ``<html><body><table>`` document). ``structure_only``: TEDS-S."""
    if normalize_tables:
        html_a, html_b = normalized_html_table(html_a), normalized_html_table(html_b)
    return teds_normalized(html_a, html_b, structure_only)


# --------------------------------------------------------------------------------------------------
# per-sample and per-page

def sample_edit(row: dict) -> tuple[int, int] | None:
    """``(edit operations, longer length)`` of a match row on its normalized strings (the raw ones
    where a normalized string is empty, as upstream); None when both are empty."""
    gt = row.get("norm_gt") or row.get("gt") or ""
    pred = row.get("norm_pred") or row.get("pred") or ""
    if not gt and not pred:
        return None
    return Levenshtein.distance(pred, gt), max(len(pred), len(gt))


def page_edit(samples: list[tuple[int, int] | None]) -> float | None:
    """One page's Edit: sum of edit operations / sum of longer lengths over its samples (so long
    blocks weigh more); None if the page has no non-empty sample."""
    ops = sum(s[0] for s in samples if s)
    total = sum(s[1] for s in samples if s)
    return ops / total if total else None


def mean(values) -> float | None:
    """Mean of the values that are not None/NaN; None if there are none."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else None
