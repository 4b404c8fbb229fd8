"""Matching a page's ground-truth tables to its predicted tables (OmniDocBench v1.6): a Hungarian
assignment on the edit distance of the normalized HTML; one row per ground-truth table, the
unmatched ones with an empty prediction (TEDS 0). Rows are those of :mod:`.match`.

Quirks kept (they change scores): ground-truth/prediction items are looked up with indices of the
filtered line lists (tables whose HTML normalizes to empty are dropped from the lines only), and a
table matched to the first prediction (index 0) gets no prediction position (so it takes no part in
the reading order) and no category.
"""

from __future__ import annotations

from scipy.optimize import linear_sum_assignment

from padoc_ray.eval.e2e.match import gt_position, ned_matrix, pred_category, row
from padoc_ray.eval.e2e.normalize import normalized_html_table


def match_tables(gt_items: list[dict], pred_items: list[dict], img_name: str) -> list[dict]:
    """Hungarian assignment of ground-truth tables to predicted tables on normalized-HTML edit
    distance; one row per ground-truth table (unmatched ones with an empty prediction)."""
    gt = []
    for item in gt_items:
        raw = str(item["content"]) if item.get("content") else str(item.get("html", ""))
        gt.append((raw, _table_text(raw), item.get("fine_category_type") or item["category_type"]))
    gt = [g for g in gt if g[0] and g[1]]
    pred = [(str(p["content"]), _table_text(str(p["content"]))) for p in pred_items]
    pred = [p for p in pred if p[0] and p[1]]
    rows = []
    if not gt:
        return rows
    if not pred:
        for i, (raw, norm, cat) in enumerate(gt):
            rows.append(row([i], raw, norm, cat, [gt_position(gt_items[i])], [gt_items[i].get("attribute", {})],
                            [""], "", "", "", "", 1, img_name))
        return rows
    cost = ned_matrix([g[1] for g in gt], [p[1] for p in pred])
    r_ind, c_ind = linear_sum_assignment(cost)
    assigned = dict(zip(r_ind.tolist(), c_ind.tolist()))
    for i, (raw, norm, cat) in enumerate(gt):
        j = assigned.get(i)
        if j is None:
            j, praw, pnorm, edit = "", "", "", 1
        else:
            praw, pnorm, edit = pred[j][0], pred[j][1], cost[i][j]
        # quirk: upstream tests ``if pred_idx`` -- the first prediction (0) gets no category/position
        pcat = pred_category(j, pred_items) if j else ""
        ppos = pred_items[j]["position"][0] if j else ""
        rows.append(row([i], raw, norm, cat, [gt_position(gt_items[i])], [gt_items[i].get("attribute", {})],
                        [j], praw, pnorm, pcat, ppos, edit, img_name))
    return rows


def _table_text(text: str) -> str:
    return normalized_html_table(text) if "<table" in text.lower() else text
