"""Matching predicted items to ground-truth items on one page (OmniDocBench v1.6 "quick match").

Ground-truth text blocks and display formulas are matched against the predicted text blocks and
formulas of the same page together: an edit-distance cost matrix, a greedy search that lets several
consecutive predicted blocks stand for one truncated ground-truth block, a Hungarian assignment,
then fuzzy substring matching that lets one long prediction cover several ground-truth blocks.
Ground truth in the "ignored" categories (headers, footers, captions, page numbers, ...) is matched
first with a tight threshold so that the predictions that reproduce them are not counted as extra
text. (Tables are matched separately: :mod:`.table_match`.)

A match row is a dict: ``gt_idx``/``pred_idx`` (lists; ``[""]`` for none), ``gt``/``pred`` (raw),
``norm_gt``/``norm_pred`` (normalized), ``gt_position`` (ground-truth reading orders),
``pred_position`` (predicted character offset), ``gt_category_type``, ``pred_category_type``,
``gt_attribute``, ``edit`` and ``img_id``.

This reproduces upstream result for result. Index quirks kept on purpose (they change scores):
rows index the ground-truth/prediction *item* lists with indices of the *filtered* line lists
(items whose normalized text is empty are dropped from the lines only), """

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist
from scipy.optimize import linear_sum_assignment

from padoc_ray.eval.e2e.formula_split import split_gt_formulas, split_pred_formulas
from padoc_ray.eval.e2e.normalize import normalized_formula, normalized_text, strip_formula_delimiters

TEXT_CATEGORIES = ("text_block", "title", "code_txt", "code_txt_caption", "reference", "equation_caption",
                   "figure_caption", "figure_footnote", "table_caption", "table_footnote", "code_algorithm",
                   "code_algorithm_caption", "header", "footer", "page_footnote", "page_number")
#: ground-truth categories matched first and then left out of the text score
IGNORED_TEXT = ("figure_caption", "figure_footnote", "table_caption", "table_footnote", "code_algorithm",
                "code_algorithm_caption", "header", "footer", "page_footnote", "page_number", "equation_caption")
MAX_TRUNCATED_MERGE = 160


def ned(a, b) -> float:
    """Levenshtein distance / max length; 0 for two empty sequences."""
    if not a and not b:
        return 0.0
    return Levenshtein.distance(a, b) / max(len(a), len(b))


def ned_matrix(rows: list[str], cols: list[str]) -> np.ndarray:
    out = np.zeros((len(rows), len(cols)))
    if rows and cols:
        dist = cdist(rows, cols, scorer=Levenshtein.distance, dtype=np.int64)
        lens = np.array([[max(len(r), len(c)) for c in cols] for r in rows], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(lens > 0, dist / np.where(lens > 0, lens, 1), 0.0)
    return out


def gt_position(item: dict):
    return item.get("order") if item.get("order") else item.get("position", [""])[0]


def pred_category(idx: int, items: list[dict]) -> str:
    item = items[idx]
    return item["fine_category_type"] if item.get("fine_category_type") else item["category_type"]


def item_lines(gt_items: list[dict], pred_items: list[dict]):
    """``(gt_lines, norm_gt, gt_cats, pred_lines, norm_pred)`` for text/formula matching, with
    entries whose raw or normalized form is empty dropped."""
    pred = []
    for item in pred_items:
        content = str(item["content"])
        if item["category_type"] == "text_all":
            pred.append((content, normalized_text(content)))
        elif item["category_type"] == "equation_isolated":
            pred.append((content, normalized_formula(content)))
        else:
            pred.append((content, content))
    gt = []
    for item in gt_items:
        cat = item["fine_category_type"] if item.get("fine_category_type") else item["category_type"]
        if item.get("content"):
            raw = str(item["content"])
            gt.append((raw, normalized_text(raw) if item["category_type"] == "text_all" else item["content"], cat))
        elif item["category_type"] in TEXT_CATEGORIES:
            gt.append((str(item["text"]), normalized_text(str(item["text"])), cat))
        elif item["category_type"] == "equation_isolated":
            gt.append((str(item["latex"]), normalized_formula(str(item["latex"])), cat))
    gt = [g for g in gt if g[0] and g[1]]
    pred = [p for p in pred if p[0] and p[1]]
    return ([g[0] for g in gt], [g[1] for g in gt], [g[2] for g in gt], [p[0] for p in pred], [p[1] for p in pred])


def row(gt_idx, gt, norm_gt, gt_cat, gt_pos, gt_attr, pred_idx, pred, norm_pred, pred_cat, pred_pos, edit, img):
    return {"gt_idx": gt_idx, "gt": gt, "norm_gt": norm_gt, "gt_category_type": gt_cat, "gt_position": gt_pos,
            "gt_attribute": gt_attr, "pred_idx": pred_idx, "pred": pred, "norm_pred": norm_pred,
            "pred_category_type": pred_cat, "pred_position": pred_pos, "edit": edit, "img_id": img}


def sort_preds(items: list[dict]) -> list[tuple[int, dict]]:
    """By start offset, inline formulas last, ties in list order."""
    return sorted(enumerate(items), key=lambda p: (p[1].get("fine_category_type") == "equation_inline",
                                                   p[1]["position"][0], p[0]))


# --------------------------------------------------------------------------------------------------
# the quick match

def match_quick(gt_items: list[dict], pred_items: list[dict], img_name: str, split_pred: bool = True) -> list[dict]:
    """Match ground-truth text/formula items to predicted ones (see the module docstring)."""
    gt_items = split_gt_formulas(gt_items)
    pred_items = [p for _, p in sort_preds(pred_items)]
    if split_pred:
        pred_items = split_pred_formulas(pred_items)
    gt_lines, norm_gt, gt_cats, pred_lines, norm_pred = item_lines(gt_items, pred_items)

    if not norm_gt:
        return [row([""], "", "", "", [""], [{}], [j], pred_lines[j], norm_pred[j], pred_category(j, pred_items),
                    pred_items[j]["position"][0], 1, img_name) for j in range(len(norm_pred))]
    if not norm_pred:
        return [row([i], gt_lines[i], norm_gt[i], gt_cats[i], [gt_position(gt_items[i])],
                    [gt_items[i].get("attribute", {})], [""], "", "", "", "", 1, img_name)
                for i in range(len(norm_gt))]
    if len(norm_gt) == 1 and len(norm_pred) == 1:
        return [row([0], gt_lines[0], norm_gt[0], gt_cats[0], [gt_position(gt_items[0])],
                    [gt_items[0].get("attribute", {})], [0], pred_lines[0], norm_pred[0], pred_category(0, pred_items),
                    pred_items[0]["position"][0], ned(norm_gt[0], norm_pred[0]), img_name)]

    ign = [i for i in range(len(norm_gt)) if gt_cats[i] in IGNORED_TEXT]
    keep = [i for i in range(len(norm_gt)) if gt_cats[i] not in IGNORED_TEXT]
    ignored_rows, ignored_pred = _match_ignored(ign, gt_lines, norm_gt, gt_cats, gt_items, pred_lines, norm_pred,
                                                pred_items, img_name)
    kept_pred = [j for j in range(len(norm_pred)) if j not in ignored_pred]
    # quirk: items are looked up with indices of the filtered line lists
    side = _Side([norm_gt[i] for i in keep], [gt_lines[i] for i in keep], [gt_cats[i] for i in keep],
                 [gt_items[i] for i in keep], [norm_pred[j] for j in kept_pred], [pred_lines[j] for j in kept_pred],
                 [pred_items[j] for j in kept_pred])
    cost = ned_matrix(side.norm_gt, side.norm_pred)
    col_idx, row_ind, costs = _final_assignment(cost, side.norm_gt, side.norm_pred)
    matches, unmatched_gt = _accept(col_idx, row_ind, costs, len(side.norm_gt))
    fuzzy = _fuzzy_cover(unmatched_gt, side.norm_gt, side.norm_pred, side.gt_cats)
    final = _merge_matches(matches, fuzzy)
    _recompute_edits(final, side.norm_gt, side.norm_pred)
    rows = _dedup_add_unmatched(_convert(final, side.norm_gt, side.norm_pred), side.norm_gt, side.raw_gt)
    rows = _finish(rows, side, img_name, multiline_formulas=True)
    for r in rows:
        if r["gt_idx"] != [""]:
            r["gt_idx"] = [keep[i] for i in r["gt_idx"]]
        if r["pred_idx"] != [""]:
            r["pred_idx"] = [int(kept_pred[j]) for j in r["pred_idx"]]
    return rows + ignored_rows


class _Side:
    """The ground truth and predictions one matching pass works on."""

    def __init__(self, norm_gt, raw_gt, gt_cats, gt_items, norm_pred, raw_pred, pred_items):
        self.norm_gt, self.raw_gt, self.gt_cats, self.gt_items = norm_gt, raw_gt, gt_cats, gt_items
        self.norm_pred, self.raw_pred, self.pred_items = norm_pred, raw_pred, pred_items


def _match_ignored(ign, gt_lines, norm_gt, gt_cats, gt_items, pred_lines, norm_pred, pred_items, img_name):
    """Ground truth of ignored categories matched to predictions closer than 0.25."""
    if not ign:
        return [], []
    cost = ned_matrix([norm_gt[i] for i in ign], norm_pred)
    hits = np.argwhere(cost < 0.25)
    pred_used = [int(h[1]) for h in hits]  # may repeat: one prediction can match several ground truths
    # a ground truth with several hits keeps the last one
    matches = {int(h[0]): {"pred_indices": [k], "edit_distance": cost[h[0]][h[1]]} for k, h in enumerate(hits)}
    side = _Side([norm_gt[i] for i in ign], [gt_lines[i] for i in ign], [gt_cats[i] for i in ign],
                 [gt_items[i] for i in ign], [norm_pred[j] for j in pred_used], [pred_lines[j] for j in pred_used],
                 [pred_items[j] for j in pred_used])
    final = _merge_matches(matches, {})
    _recompute_edits(final, side.norm_gt, side.norm_pred)
    rows = _dedup_add_unmatched(_convert(final, side.norm_gt, side.norm_pred), side.norm_gt, side.raw_gt)
    rows = _finish(rows, side, img_name, multiline_formulas=False)
    for r in rows:
        if isinstance(r["gt_idx"], list) and r["gt_idx"] != [""]:
            r["gt_idx"] = [ign[i] for i in r["gt_idx"]]
        if isinstance(r["pred_idx"], list) and r["pred_idx"] != [""]:
            r["pred_idx"] = [int(pred_used[j]) for j in r["pred_idx"]]
    return rows, pred_used


def _finish(rows: list[dict], side: _Side, img_name: str, multiline_formulas: bool) -> list[dict]:
    """Fill the row fields from the side's lists. Quirk kept: an unmatched prediction that is an
    inline formula is removed *while the list is being iterated*, so the row after it is skipped
    (left without its fields; it is then ignored downstream)."""
    for r in rows:
        if r["gt_idx"] != [""]:
            cats = [side.gt_cats[i] for i in r["gt_idx"]]
            clean = [c for c in cats if c not in IGNORED_TEXT]
            r["gt_category_type"] = Counter(clean or cats).most_common(1)[0][0]
        else:
            r["gt_category_type"] = ""
            pcat = pred_category(r["pred_idx"][0], side.pred_items) if r["pred_idx"] != [""] else ""
            r["pred_category_type"] = pcat
            if pcat == "equation_inline":
                rows.remove(r)
        if not isinstance(r["gt_idx"], list):
            r["gt_idx"] = [r["gt_idx"]]
        if not isinstance(r["pred_idx"], list):
            r["pred_idx"] = [r["pred_idx"]]
        g, p = r["gt_idx"], r["pred_idx"]
        r["gt_position"] = [gt_position(side.gt_items[i]) for i in g] if g != [""] else [""]
        r["pred_position"] = side.pred_items[p[0]]["position"][0] if p != [""] else ""
        if multiline_formulas and r["gt_category_type"] == "equation_isolated" and len(g) > 1:
            r["gt"] = _as_array([side.raw_gt[i] for i in g])
        else:
            r["gt"] = "".join(side.raw_gt[i] for i in g) if g != [""] else ""
        r["pred_category_type"] = pred_category(p[0], side.pred_items) if p != [""] else ""
        r["gt_attribute"] = [side.gt_items[i].get("attribute", {}) for i in g] if g != [""] else [{}]
        r["img_id"] = img_name
        if multiline_formulas and "equation" in r["pred_category_type"] and len(p) > 1:
            r["pred"] = _as_array([side.raw_pred[j] for j in p])
        else:
            r["pred"] = "".join(side.raw_pred[j] for j in p) if p != [""] else ""
        r["norm_gt"] = "".join(side.norm_gt[i] for i in g) if g != [""] else ""
        r["norm_pred"] = "".join(side.norm_pred[j] for j in p) if p != [""] else ""
    return rows


def _as_array(formulas: list[str]) -> str:
    body = " \\\\ ".join("{" + strip_formula_delimiters(f) + "}" for f in formulas)
    return "\\begin{array}{l} " + body + " \\end{array}"


# --------------------------------------------------------------------------------------------------
# steps of the quick match

def _window_distance(long: str, short: str) -> float | bool:
    """Smallest Levenshtein distance / len(short) between ``short`` and a same-length window of
    ``long``; False when ``short`` is empty or longer."""
    n, m = len(long), len(short)
    if not (n >= m > 0):
        return False
    best = None
    for i in range(n - m + 1):
        d = Levenshtein.distance(long[i:i + m], short, score_cutoff=best)
        if best is None or d < best:
            best = d
            if best == 0:
                break
    return best / m


def _merge_helps(gt: str, preds: list[str], threshold: float = 0.6) -> tuple[bool, bool]:
    """Should the last of ``preds`` join the run, and may the run grow further?"""
    if len(preds) == 1:
        return False, False
    cur, merged = " ".join(preds[:-1]), " ".join(preds)
    if ned(gt, merged) > ned(gt, cur):
        return False, False
    for p in preds[:-1]:
        d = _window_distance(gt, p)
        if d is False or d > threshold:
            return False, False
    d = _window_distance(gt, preds[-1])
    if d is False:
        return False, False
    return d < threshold, len(merged) <= len(gt)


def _merge_truncated(cost: np.ndarray, norm_gt: list[str], norm_pred: list[str]):
    """For each ground truth with no close prediction, the best run of consecutive predictions;
    compatible runs become merged prediction columns."""
    close = np.argwhere(cost < 0.25)
    close_gt = [int(c[0]) for c in close]
    close_pred = [int(c[1]) for c in close]
    free_gt = [i for i in range(cost.shape[0]) if i not in close_gt]
    free_pred = [j for j in range(cost.shape[1]) if j not in close_pred]
    runs, run_costs = [], []
    for i in free_gt:
        best_run, best = None, None
        for j in free_pred:
            step, merged = 1, [norm_pred[j]]
            while step < MAX_TRUNCATED_MERGE and j + step not in close_pred and j + step < len(norm_pred):
                merged.append(norm_pred[j + step])
                ok, more = _merge_helps(norm_gt[i], merged)
                if not ok:
                    break
                step += 1
                if not more:
                    break
            line = " ".join(norm_pred[k] for k in range(j, j + step))
            d = Levenshtein.distance(norm_gt[i], line) / max(len(line), len(norm_gt[i]))
            if best is None or d < best:
                best, best_run = d, list(range(j, j + step))
        if best_run:
            runs.append(best_run)
            run_costs.append(best)
    chosen = _choose_runs(runs, run_costs)
    if not chosen:
        return cost, norm_pred, range(len(norm_pred))
    columns: list = list(range(len(norm_pred)))
    for run in chosen:
        at = columns.index(run[0])
        for _ in run:
            columns.pop(at)
        columns.insert(at, run)
    lines = [" ".join(norm_pred[c[0]:c[-1] + 1]) if isinstance(c, list) else norm_pred[c] for c in columns]
    return ned_matrix(norm_gt, lines), lines, columns


def _choose_runs(runs: list[list[int]], costs: list[float]) -> list[list[int]]:
    """Among overlapping candidate runs keep a set of pairwise-disjoint ones with the lowest mean
    cost (the upstream greedy path construction, reproduced as is)."""
    if not runs or not costs:
        return []
    pairs = sorted(zip(runs, costs), key=lambda p: p[0][0])
    groups = [[pairs[0]]]
    for pair in pairs[1:]:
        if any(k in member[0] for member in groups[-1] for k in pair[0]):
            groups[-1].append(pair)
        else:
            groups.append([pair])
    out = []
    for group in groups:
        if len(group) == 1:
            out.append(group[0][0])
            continue
        paths: dict[int, list] = defaultdict(list)
        paths[0].append(group[0])
        for pair in group[1:]:
            new_path = True
            for key, path in paths.items():
                dup = same = False
                for member in path:  # quirk kept: ``path`` may change while it is iterated
                    if member[0] == pair[0]:
                        dup = same = True
                        if member[1] > pair[1]:
                            path.pop(path.index(member))
                            path.append(pair)
                    elif any(a == b for a in member[0] for b in pair[0]):
                        dup = True
                if not dup:
                    path.append(pair)
                    new_path = False
                if same:
                    new_path = False
            if new_path:
                paths[len(paths)].append(pair)
        best, best_cost = [], float("inf")
        for path in paths.values():
            mean = sum(p[1] for p in path) / len(path)
            if mean < best_cost:
                best, best_cost = [p[0] for p in path], mean
        out.extend(best)
    return out


def _final_assignment(cost, norm_gt, norm_pred):
    cost, _, columns = _merge_truncated(cost, norm_gt, norm_pred)
    r_ind, c_ind = linear_sum_assignment(cost)
    return [columns[c] for c in c_ind], r_ind, [cost[r][c] for r, c in zip(r_ind, c_ind)]


def _accept(col_idx, row_ind, costs, n_gt):
    """Assignments with cost <= 0.7 are matches; the rest leave their ground truth unmatched."""
    matches, unmatched_gt = {}, []
    rows = list(row_ind)
    for i in range(n_gt):
        if i not in rows:
            unmatched_gt.append(i)
            continue
        k = rows.index(i)
        col = col_idx[k]
        span = list(range(col[0], col[-1] + 1)) if isinstance(col, list) else [col]
        if costs[k] > 0.7:
            unmatched_gt.append(i)
        else:
            matches[i] = {"pred_indices": span, "edit_distance": costs[k]}
    return matches, unmatched_gt


def _fuzzy_cover(unmatched_gt, norm_gt, norm_pred, gt_cats):
    """Every prediction that contains an unmatched (non-formula) ground truth as a near substring
    (window distance < 0.4) claims it."""
    claims = {}
    for j, pred in enumerate(norm_pred):
        hits = []
        for i in unmatched_gt:
            if gt_cats and gt_cats[i] == "equation_isolated":
                continue
            d = _window_distance(pred, norm_gt[i])
            if (1 if d is False else d) < 0.4:
                hits.append(i)
        if hits:
            claims[j] = hits
    return claims


def _merge_matches(matches: dict, claims: dict) -> dict:
    final, done = {}, set()
    for i, info in matches.items():
        key = tuple(sorted(info["pred_indices"]))
        if key in final:
            if i not in done:
                final[key]["gt_indices"].append(i)
                done.add(i)
        else:
            final[key] = {"gt_indices": [i], "edit_distance": info["edit_distance"]}
            done.add(i)
    for j, gts in claims.items():
        key = (j,)
        if key in final:
            for i in gts:
                if i not in done:
                    final[key]["gt_indices"].append(i)
                    done.add(i)
        else:
            final[key] = {"gt_indices": [i for i in gts if i not in done], "edit_distance": None}
            done.update(final[key]["gt_indices"])
    return final


def _recompute_edits(final: dict, norm_gt: list[str], norm_pred: list[str]) -> None:
    for key, info in final.items():
        gts = sorted(set(info["gt_indices"]))
        if not gts:
            info["edit_distance"] = 1
        elif len(gts) > 1:
            # quirk: several ground truths on one key are compared with the key's first prediction only
            merged = "".join(norm_gt[i] for i in gts)
            pred = norm_pred[key[0]] if isinstance(key[0], int) else ""
            info["edit_distance"] = Levenshtein.distance(merged, pred) / max(len(merged), len(pred))
        else:
            pred = " ".join(norm_pred[j] for j in key if isinstance(j, int))
            info["edit_distance"] = Levenshtein.distance(norm_gt[gts[0]], pred) / max(len(norm_gt[gts[0]]), len(pred))


def _convert(final: dict, norm_gt: list[str], norm_pred: list[str]) -> list[dict]:
    """One entry per (prediction key, ground truth); leftovers paired by a Hungarian assignment
    (edit 1) or collected into one unmatched-prediction entry. Set iteration order matters for ties
    and is kept as upstream builds the sets."""
    out = []
    for key, info in final.items():
        pred = " ".join(norm_pred[j] for j in key if isinstance(j, int))
        for i in sorted(set(info["gt_indices"])):
            out.append({"gt_idx": int(i), "gt": norm_gt[i], "pred_idx": list(key), "pred": pred,
                        "edit": info["edit_distance"]})
    matched_gt = set().union(*[set(info["gt_indices"]) for info in final.values()])
    free_gt = set(range(len(norm_gt))) - matched_gt
    free_pred = set(range(len(norm_pred))) - set(j for key in final for j in key if isinstance(j, int))
    if free_pred:
        if free_gt:
            gl, pl = list(free_gt), list(free_pred)
            r_ind, c_ind = linear_sum_assignment([[ned(norm_gt[i], norm_pred[j]) for j in pl] for i in gl])
            for r, c in zip(r_ind, c_ind):
                out.append({"gt_idx": int(gl[r]), "gt": norm_gt[gl[r]], "pred_idx": [pl[c]], "pred": norm_pred[pl[c]],
                            "edit": 1})
        else:
            out.append({"gt_idx": "", "gt": "", "pred_idx": list(free_pred),
                        "pred": " ".join(norm_pred[j] for j in free_pred), "edit": 1})
    else:
        for i in free_gt:
            out.append({"gt_idx": int(i), "gt": norm_gt[i], "pred_idx": "", "pred": "", "edit": 1})
    return out


def _dedup_add_unmatched(entries: list[dict], norm_gt: list[str], raw_gt: list[str]) -> list[dict]:
    """Entries sharing a prediction key merged into one row; ground truths in no row added unmatched."""
    out, seen_pred, seen_gt = [], set(), set()
    for entry in entries:
        key = tuple(entry["pred_idx"]) if isinstance(entry["pred_idx"], list) else (entry["pred_idx"],)
        if key in seen_pred or key == ("",):
            continue
        row = {"gt_idx": [entry["gt_idx"]], "gt": entry["gt"], "pred_idx": entry["pred_idx"], "pred": entry["pred"],
               "edit": entry["edit"]}
        for other in entries:
            other_key = tuple(other["pred_idx"]) if isinstance(other["pred_idx"], list) else (other["pred_idx"],)
            if other_key == key and other is not entry:
                row["gt_idx"].append(other["gt_idx"])
                row["gt"] += other["gt"]
                seen_gt.add(other["gt_idx"])
        out.append(row)
        seen_pred.add(key)
        seen_gt.add(entry["gt_idx"])
    for i in range(len(norm_gt)):
        if i not in seen_gt:
            out.append({"gt_idx": [i], "gt": raw_gt[i], "pred_idx": [""], "pred": "", "edit": 1})
    return out
