"""Token-length profile of ground-truth pages under the PaDoc protocol of one checkpoint.

For each GT file (OmniDocBench JSON, every region kept as the replay benchmark keeps it) and the
checkpoint's tokenizer and spec it reports: regions per page; content tokens per region (regions
with a content format, i.e. figures excluded; the branch's end-of-stream not counted); layout
tokens per page; sequential decode steps per page ``F_seq`` and PaDoc decode depth ``F_PaDoc``
(``padoc_ray.protocol.decode_depth``), with median, P90 (nearest rank) and max, plus the median
per-page step reduction. Comparing a generated corpus with real pages this way is how the corpus
is tuned to look like real documents to the scheduler. Figures depend on the tokenizer: the tiny
test checkpoint's byte-level BPE spends about three tokens per English word where Qwen's spends
about 1.3, so compare sets under the same model, not against numbers measured with another one.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from padoc_ray.protocol import decode_depth, page_from_omnidocbench
from padoc_ray.protocol.codec import content_tokens, region_layout_tokens


def _dist(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None, "mean": None}
    s = sorted(values)
    p90 = s[max(0, math.ceil(0.9 * len(s)) - 1)]
    return {"n": len(s), "median": statistics.median(s), "p90": p90, "max": s[-1],
            "mean": round(sum(s) / len(s), 2)}


def label_of(path: str) -> str:
    base = os.path.basename(path)
    if base in ("gt.json", "ground_truth.json"):
        return os.path.basename(os.path.dirname(os.path.abspath(path))) or base
    return os.path.splitext(base)[0]


def profile_pages(objs: list[dict], model_protocol) -> dict:
    """Statistics of OmniDocBench page objects under ``model_protocol`` (a ModelProtocol: spec, tokenizer, vocab)."""
    regions, tokens, layout, f_seq, f_padoc, reduction = [], [], [], [], [], []
    by_cat: dict[str, list[int]] = {}
    for obj in objs:
        page = page_from_omnidocbench(obj, model_protocol.spec)
        ll = [len(region_layout_tokens(model_protocol.vocab, r)) for r in page.regions]
        cl = [len(content_tokens(model_protocol.tokenizer, r)) for r in page.regions]
        d = decode_depth(ll, cl)
        regions.append(len(page.regions))
        layout.append(sum(ll) + 1)
        f_seq.append(d.f_seq)
        f_padoc.append(d.f_padoc)
        reduction.append(d.step_reduction)
        for r, n in zip(page.regions, cl):
            if r.content_format != "none":
                tokens.append(n)
                by_cat.setdefault(r.category, []).append(n)
    return {
        "pages": len(objs),
        "regions_per_page": _dist(regions),
        "content_tokens_per_region": _dist(tokens),
        "layout_tokens_per_page": _dist(layout),
        "f_seq": _dist(f_seq),
        "f_padoc": _dist(f_padoc),
        "step_reduction_median": round(statistics.median(reduction), 4) if reduction else None,
        "content_tokens_by_category": {k: {"regions": len(v), "median": statistics.median(v), "max": max(v)}
                                       for k, v in sorted(by_cat.items())},
    }


def load_gt(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        objs = json.load(f)
    if not isinstance(objs, list):
        raise ValueError(f"{path}: expected a JSON list of OmniDocBench pages")
    return objs


def profile_files(paths: list[str], model_dir: str) -> dict:
    from padoc_ray.tokenizer import ModelProtocol

    model_protocol = ModelProtocol(model_dir)
    sets = []
    for p in paths:
        stats = profile_pages(load_gt(p), model_protocol)
        sets.append({"label": label_of(p), "path": p, **stats})
    return {"model": model_dir, "percentile": "nearest rank", "sets": sets}


def _fmt(d: dict, keys=("median", "p90", "max")) -> str:
    def one(v):
        if v is None:
            return "-"
        return f"{v:g}" if isinstance(v, (int, float)) and float(v).is_integer() else f"{v:.1f}"

    return " / ".join(one(d[k]) for k in keys)


def format_report(rep: dict) -> str:
    """A fixed-width table, one column per GT set."""
    sets = rep["sets"]
    rows = [
        ("pages", lambda s: str(s["pages"])),
        ("regions/page (median/P90/max)", lambda s: _fmt(s["regions_per_page"])),
        ("content tokens/region (median/P90/max)", lambda s: _fmt(s["content_tokens_per_region"])),
        ("layout tokens/page (median/P90/max)", lambda s: _fmt(s["layout_tokens_per_page"])),
        ("F_seq steps/page (median/P90/max)", lambda s: _fmt(s["f_seq"])),
        ("F_PaDoc steps/page (median/P90/max)", lambda s: _fmt(s["f_padoc"])),
        ("step reduction 1-F_PaDoc/F_seq (median)", lambda s: "-" if s["step_reduction_median"] is None
         else f"{s['step_reduction_median']:.3f}"),
    ]
    labels = [s["label"] for s in sets]
    w0 = max(len(r[0]) for r in rows)
    ws = [max(len(lab), *(len(f(s)) for _, f in rows)) for lab, s in zip(labels, sets)]
    lines = [f"token-length profile under {rep['model']}",
             " " * w0 + "  " + "  ".join(lab.rjust(w) for lab, w in zip(labels, ws))]
    for name, f in rows:
        lines.append(name.ljust(w0) + "  " + "  ".join(f(s).rjust(w) for s, w in zip(sets, ws)))
    return "\n".join(lines)
