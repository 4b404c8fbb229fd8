"""Display-formula matching of OmniDocBench v1.6 ("multi-granularity adaptive matching").

The ground truth is kept as it is; on the prediction side several segmentations are tried and the
page-level assignment with the lowest total edit distance wins. Candidates: the formula rows of
the mixed text/formula match, a formula-only quick match, a Hungarian assignment, a dynamic
programme that lets consecutive predicted formulas (or rows of a split multi-line prediction) merge
into one ground-truth formula (with and without gaps), every way of re-grouping the rows of
multi-line predictions, and all of these again after rewriting logic-style ``cases`` blocks.
Ties are broken by a weighted edit distance, unmatched predictions, mean edit, and so on
(:func:`_total_key`).

Reproduces upstream, including which list a row's prediction indices are looked up in (they do not
always correspond; this only affects tie-breaking, as upstream).
"""

from __future__ import annotations

import numpy as np
from rapidfuzz.distance import Levenshtein
from scipy.optimize import linear_sum_assignment

from padoc_ray.eval.e2e.formula_split import (merge_segment, merged_content, normalize_logic_brace_formula, partitions,
                                              split_gt_formulas, split_pred_formulas)
from padoc_ray.eval.e2e.match import item_lines, match_quick
from padoc_ray.eval.e2e.metrics import edit_ratio

RESCUE_TYPES = ("text_formula", "image_formula", "formula_rescue", "table_formula_rescue")
_ALLOWED_PRED = {"", "equation_inline", "equation_isolated"}


def _span(item: dict):
    pos = item.get("position", [""])
    if isinstance(pos, list) and len(pos) >= 2:
        return pos[0], pos[1]
    start = pos[0] if pos else ""
    return start, start


def _pred_type(item: dict) -> str:
    t = item.get("fine_category_type") or item.get("category_type") or "equation_isolated"
    return "equation_isolated" if t in RESCUE_TYPES else t


def _plain_types(rows: list[dict] | None) -> list[dict]:
    out = []
    for row in rows or []:
        row = dict(row)
        if row.get("pred_category_type") in RESCUE_TYPES:
            row["pred_category_type"] = "equation_isolated"
        out.append(row)
    return out


def formula_pool(pred: dict[str, list[dict]]) -> list[dict]:
    """Predicted display formulas plus the rescue candidates (as display formulas), de-duplicated."""
    pool, seen = [], set()
    for item, force in [(i, False) for i in pred.get("equation_isolated", [])] + \
                       [(i, True) for i in pred.get("formula_rescue", [])]:
        cand = dict(item)
        if force:
            cand["category_type"] = "equation_isolated"
            cand["fine_category_type"] = cand.get("fine_category_type") or "formula_rescue"
        key = _source_key(cand)
        if key not in seen:
            seen.add(key)
            pool.append(cand)
    return pool


def _source_key(item: dict) -> tuple:
    start, end = _span(item)
    return start, end, item.get("content", ""), item.get("fine_category_type", ""), item.get("category_type", "")


def _annotated(items: list[dict]) -> list[dict]:
    out = []
    for item in items or []:
        item = dict(item)
        item.setdefault("source_formula_key", _source_key(item))
        out.append(item)
    return out


def _ordered(items: list[dict]) -> list[dict]:
    return sorted(items, key=lambda it: (_span(it)[0], _pred_type(it) == "equation_inline", _span(it)[1]))


class _Prepared:
    """Ground truth and one predicted segmentation, as lines."""

    def __init__(self, gt_formula: list[dict], pred_formula: list[dict], split_pred: bool):
        self.gt_items = split_gt_formulas(gt_formula)
        self.raw = _ordered(_annotated(pred_formula))
        self.pred_items = split_pred_formulas(self.raw) if split_pred else self.raw
        self.gt_lines, self.norm_gt, self.gt_cats, self.pred_lines, self.norm_pred = item_lines(self.gt_items,
                                                                                                self.pred_items)
        self.gt_count, self.pred_count = len(self.gt_lines), len(self.pred_lines)
        self.was_split = len(self.pred_items) > len(self.raw)
        # quirk: upstream counts rescue predictions by a type that has already been mapped away: always 0
        self.rescue_count = 0

    def row(self, i: int, img_name: str, seq=None) -> dict:
        gt_item = self.gt_items[i]  # quirk: filtered line index into the unfiltered item list
        order = gt_item.get("order")
        gt_pos = order if order is not None else gt_item.get("position", [""])[0]
        if seq:
            seq = [int(s) for s in seq]
            parts = [self.pred_lines[k] for k in seq]
            pred = merged_content(parts) if len(seq) >= 2 else parts[0]
            norm_pred = " ".join(self.norm_pred[k] for k in seq).strip()
            pcat = "equation_isolated" if len(seq) >= 2 else _pred_type(self.pred_items[seq[0]])
            ppos, edit, pidx = self.pred_items[seq[0]]["position"][0], edit_ratio(self.norm_gt[i], norm_pred), seq
        else:
            pred = norm_pred = pcat = ppos = ""
            edit, pidx = 1, [""]
        return {"gt_idx": [i], "gt": self.gt_lines[i], "pred_idx": pidx, "pred": pred, "gt_position": [gt_pos],
                "pred_position": int(ppos) if isinstance(ppos, np.integer) else ppos, "norm_gt": self.norm_gt[i],
                "norm_pred": norm_pred, "gt_category_type": self.gt_cats[i], "pred_category_type": pcat,
                "gt_attribute": [gt_item.get("attribute", {})], "edit": edit, "img_id": img_name}


def _max_merge(gt_count: int, pred_count: int) -> int:
    if pred_count <= 0:
        return 0
    if gt_count <= 1:
        return min(pred_count, 10)
    return min(pred_count, 12 if abs(gt_count - pred_count) >= 2 else 10)


def _sequences(n: int, start: int, max_items: int, max_span: int, max_skips: int) -> list[tuple[int, ...]]:
    """Increasing index runs from ``start`` (depth-first order) of at most ``max_items`` items within
    ``max_span`` positions, skipping at most ``max_skips`` indices in total."""
    if start >= n:
        return []
    limit, out = min(n, start + max_span), []

    def grow(seq: list[int], skips: int) -> None:
        out.append(tuple(seq))
        if len(seq) >= max_items:
            return
        for nxt in range(seq[-1] + 1, limit):
            gap = nxt - seq[-1] - 1
            if gap <= skips:
                grow(seq + [nxt], skips - gap)

    grow([start], max_skips)
    return out


def _mergeable(p: _Prepared, seq) -> bool:
    if len(seq) < 2 or len({p.pred_items[k].get("source_formula_key") for k in seq}) == 1:
        return True
    if seq[-1] - seq[0] + 1 != len(seq):
        return False
    return all(_pred_type(p.pred_items[k]) == "equation_isolated" for k in seq)


_INF = (10 ** 9, 10 ** 9, 10 ** 9, 10 ** 9)


def _better_state(new, old) -> bool:
    """(total edit, edit chars, upper length, inline hits): lower edit, then lower char edit rate,
    then fewer inline formulas."""
    if old == _INF or new[0] + 1e-12 < old[0]:
        return True
    if new[0] > old[0] + 1e-12:
        return False
    if new[2] > 0 and old[2] > 0:
        left, right = new[1] * old[2], old[1] * new[2]
        if left != right:
            return left < right
    elif new[2] > 0:
        return True
    elif old[2] > 0:
        return False
    return new[3] < old[3]


def _dp_rows(p: _Prepared, img_name: str, gaps: bool = False) -> list[dict] | None:
    """Monotone alignment of ground-truth formulas to runs of predicted ones (skipping either side
    costs 1)."""
    g, n = p.gt_count, p.pred_count
    if g <= 0 or n <= 0:
        return None
    mm = _max_merge(g, n)
    span = min(n, mm + 2) if gaps else mm
    skips = 0
    if gaps:
        if abs(g - n) >= 1 or p.rescue_count > 0 or n >= 4:
            skips = 1
        if abs(g - n) >= 3:
            skips = 2
    segments = {}
    for s in range(n):
        segments[s] = [(seq, " ".join(p.norm_pred[k] for k in seq).strip(),
                        "equation_isolated" if len(seq) >= 2 else _pred_type(p.pred_items[seq[0]]))
                       for seq in _sequences(n, s, mm, span, skips)]
    dp = [[_INF] * (n + 1) for _ in range(g + 1)]
    parent = [[None] * (n + 1) for _ in range(g + 1)]
    dp[0][0] = (0.0, 0, 0, 0)
    for i in range(g + 1):
        for j in range(n + 1):
            cur = dp[i][j]
            if cur == _INF:
                continue
            if j < n:
                nxt = (cur[0] + 1.0, cur[1], cur[2], cur[3])
                if _better_state(nxt, dp[i][j + 1]):
                    dp[i][j + 1], parent[i][j + 1] = nxt, (i, j, None)
            if i >= g:
                continue
            nxt = (cur[0] + 1.0, cur[1], cur[2], cur[3])
            if _better_state(nxt, dp[i + 1][j]):
                dp[i + 1][j], parent[i + 1][j] = nxt, (i, j, "skip_gt")
            if j >= n:
                continue
            for seq, norm_pred, ptype in segments[j]:
                if not _mergeable(p, seq) or not norm_pred:
                    continue
                norm_gt = p.norm_gt[i]
                upper = max(len(norm_gt), len(norm_pred))
                chars = Levenshtein.distance(norm_gt, norm_pred) if upper > 0 else 0
                nxt = (cur[0] + edit_ratio(norm_gt, norm_pred), cur[1] + chars, cur[2] + upper,
                       cur[3] + (1 if ptype == "equation_inline" else 0))
                end = seq[-1] + 1
                if _better_state(nxt, dp[i + 1][end]):
                    dp[i + 1][end], parent[i + 1][end] = nxt, (i, j, list(seq))
    if parent[g][n] is None:
        return None
    rows, i, j = [], g, n
    while i > 0 or j > 0:
        prev = parent[i][j]
        if prev is None:
            return None
        pi, pj, action = prev
        if action == "skip_gt":
            rows.append(p.row(pi, img_name))
        elif action is not None:
            rows.append(p.row(pi, img_name, action))
        i, j = pi, pj
    rows.reverse()
    return rows if len(rows) == g else None


def _hungarian_rows(p: _Prepared, img_name: str) -> list[dict]:
    g, n = p.gt_count, p.pred_count
    if g <= 0:
        return []
    if n <= 0:
        return [p.row(i, img_name) for i in range(g)]
    cost = np.ones((g + n, g + n))
    cost[g:, n:] = 0.0
    for i in range(g):
        for j in range(n):
            cost[i, j] = edit_ratio(p.norm_gt[i], p.norm_pred[j])
    r_ind, c_ind = linear_sum_assignment(cost)
    assigned = dict(zip(r_ind.tolist(), c_ind.tolist()))
    return [p.row(i, img_name, [assigned[i]]) if assigned.get(i) is not None and assigned[i] < n else p.row(i, img_name)
            for i in range(g)]


def _regroupings(pred_formula: list[dict], max_candidates: int = 128, max_lines: int = 8) -> list[list[dict]]:
    """Every prediction list obtained by re-grouping the rows of each multi-line predicted formula
    (at most ``max_candidates`` lists; none if no formula splits)."""
    options, total, any_split = [], 1, False
    for item in _ordered(_annotated(pred_formula)):
        rows = split_pred_formulas([item])
        if len(rows) <= 1 or len(rows) > max_lines:
            options.append([[dict(item)]])
            continue
        any_split = True
        choice = [[merge_segment(seg) for seg in part] for part in partitions(rows)]
        total *= max(1, len(choice))
        if total > max_candidates:
            return []
        options.append(choice)
    if not any_split:
        return []
    out: list[list[dict]] = []

    def pick(k: int, cur: list[dict]) -> None:
        if k >= len(options):
            out.append([dict(it) for it in cur])
            return
        for option in options[k]:
            cur.extend(option)
            pick(k + 1, cur)
            del cur[-len(option):]

    pick(0, [])
    return out


def _candidate(name, rows, p: _Prepared, items=None, raw_count=None, logic=0) -> dict:
    items = p.raw if items is None else items
    return {"name": name, "rows": _plain_types(rows), "pred_count": len(items), "pred_items": items,
            "raw_pred_count": len(p.raw) if raw_count is None else raw_count, "logic": logic}


def _regrouped_hungarian(gt_formula, pred_formula, img_name) -> list[dict]:
    out, seen = [], set()
    for cand_pred in _regroupings(pred_formula):
        p = _Prepared(gt_formula, cand_pred, split_pred=False)
        rows = _hungarian_rows(p, img_name)
        if not rows:
            continue
        key = tuple((tuple(r.get("gt_position") or []), tuple(r.get("pred_idx") or []),
                     round(float(r.get("edit", 1)), 6)) for r in rows)
        if key in seen:
            continue
        seen.add(key)
        out.append(_candidate("split_hungarian", rows, p, raw_count=len(_annotated(pred_formula))))
    return out


def _split_dp(gt_formula, pred_formula, img_name) -> list[dict]:
    p = _Prepared(gt_formula, pred_formula, split_pred=True)
    if not p.was_split:
        return []
    out = []
    for name, gaps in (("split_dp", False), ("split_dp_allow_gaps", True)):
        rows = _dp_rows(p, img_name, gaps)
        if rows:
            out.append(_candidate(name, rows, p, items=p.pred_items))
    return out


def _complete(rows, expected: int) -> bool:
    if expected <= 0:
        return True
    if not rows or len(rows) != expected:
        return False
    seen = set()
    for row in rows:
        g = row.get("gt_idx", [])
        if not isinstance(g, list) or len(g) != 1 or g[0] in ("", None) or g[0] in seen:
            return False
        seen.add(g[0])
        if row.get("pred_category_type", "") not in _ALLOWED_PRED:
            return False
    return len(seen) == expected


def _quick_rows(gt_formula, pred_formula, img_name) -> list[dict]:
    rows = match_quick(gt_formula, pred_formula, img_name, split_pred=False)
    return _plain_types([dict(r) for r in rows if r.get("gt_idx") != [""]])


def _unsplit_candidates(gt_formula, pred_formula, img_name, prefix: str = "", logic: int = 0) -> list[dict]:
    p = _Prepared(gt_formula, pred_formula, split_pred=False)
    out = []
    quick = _quick_rows(gt_formula, pred_formula, img_name)
    if _complete(quick, p.gt_count):
        out.append(_candidate(prefix + "quick_unsplit", quick, p, logic=logic))
    hung = _hungarian_rows(p, img_name)
    if _complete(hung, p.gt_count):
        out.append(_candidate(prefix + "hungarian_unsplit", hung, p, logic=logic))
    for name, gaps in (("dp_unsplit", False), ("dp_unsplit_allow_gaps", True)):
        rows = _dp_rows(p, img_name, gaps)
        if _complete(rows, p.gt_count):
            out.append(_candidate(prefix + name, rows, p, logic=logic))
    regrouped = _regrouped_hungarian(gt_formula, pred_formula, img_name)
    for cand in regrouped + _split_dp(gt_formula, pred_formula, img_name):
        cand["name"], cand["logic"] = prefix + cand["name"], logic
        out.append(cand)
    return out


def _logic_candidates(gt_formula, pred_formula, img_name) -> list[dict]:
    changed, normalized = 0, []
    for item in _annotated(pred_formula):
        item = dict(item)
        if item.get("category_type") == "equation_isolated":
            raw = str(item.get("content", ""))
            new = normalize_logic_brace_formula(raw)
            if new != raw:
                item["content"] = new
                changed += 1
        normalized.append(item)
    if changed <= 0:
        return []
    return _unsplit_candidates(gt_formula, normalized, img_name, prefix="logic_norm_", logic=changed)


def _stats(rows: list[dict]) -> dict:
    rows = [r for r in rows if r.get("gt_idx") != [""]]
    if not rows:
        return {"weighted_edit": None, "avg_edit": None, "unmatched_hits": 0}
    edits, upper = 0, 0
    for r in rows:
        if r.get("pred_idx", []) in ([""], ""):
            continue
        g, q = str(r.get("norm_gt", "") or ""), str(r.get("norm_pred", "") or "")
        u = max(len(g), len(q))
        upper += u
        if u > 0:
            edits += Levenshtein.distance(g, q)
    return {"weighted_edit": edits / upper if upper else 0,
            "avg_edit": sum(float(r.get("edit", 1)) for r in rows) / len(rows),
            "unmatched_hits": sum(1 for r in rows if r.get("pred_idx") in ([""], ""))}


def _total_key(cand: dict) -> tuple:
    stats = cand["stats"]
    total = sum(float(r.get("edit", 1)) for r in cand["rows"] if r.get("gt_idx") != [""])
    used, items = set(), cand.get("pred_items") or []
    for r in cand["rows"]:
        idx = r.get("pred_idx", [])
        if idx in ([""], ""):
            continue
        for k in idx:
            if k in ("", None):
                continue
            try:
                key = items[int(k)].get("source_formula_key")
            except (TypeError, ValueError, IndexError):
                continue
            if key is not None:
                used.add(key)
    unmatched_raw = max(0, int(cand.get("raw_pred_count", len(items))) - len(used))
    inf = float("inf")
    return (total, inf if stats["weighted_edit"] is None else float(stats["weighted_edit"]), unmatched_raw,
            inf if stats["avg_edit"] is None else float(stats["avg_edit"]), -int(cand.get("logic", 0)),
            int(stats.get("unmatched_hits", 0)))


def _better(a: dict, b: dict) -> bool:
    for x, y in zip(_total_key(a), _total_key(b)):
        if isinstance(x, float) or isinstance(y, float):
            if x + 1e-12 < y:
                return True
            if x > y + 1e-12:
                return False
        elif x != y:
            return x < y
    return False


def match_display_formulas(gt_formula: list[dict], pred_formula: list[dict], current: list[dict],
                           img_name: str) -> list[dict]:
    """The best complete assignment of the page's ground-truth display formulas (``current``: the
    formula rows of the mixed text/formula match)."""
    p = _Prepared(gt_formula, pred_formula, split_pred=False)
    candidates = []
    cur = _plain_types([dict(r) for r in current if r.get("gt_idx") != [""]])
    if _complete(cur, p.gt_count):
        candidates.append(_candidate("current_match", cur, p))
    candidates += _unsplit_candidates(gt_formula, pred_formula, img_name)
    candidates += _logic_candidates(gt_formula, pred_formula, img_name)
    best = None
    for cand in candidates:
        cand["stats"] = _stats(cand["rows"])
        if best is None or _better(cand, best):
            best = cand
    return list(best["rows"]) if best else []
