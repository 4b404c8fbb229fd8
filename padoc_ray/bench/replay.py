"""Serving benchmark: fork vs sequential on the same engine, teacher-forced with ground-truth pages.

For each concurrency C, each mode runs every page once through a closed loop of C workers (a
worker takes the next page as soon as its previous one finishes), after a short warm-up. Reported
per mode and C: pages/s, valid pages/s, p50/p95 end-to-end latency over valid pages, output
tokens/s, prefix-cache hit rate; per C: the median paired per-page speedup (sequential latency /
fork latency over pages valid in both) with P25-P75, and the median forward-step reduction.
This module holds no engine code: it drives a :class:`padoc_ray.host.PageHost`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, replace
from typing import Sequence

from padoc_ray.host import HostPage, PageHost
from padoc_ray.pdf import doc_id_of
from padoc_ray.protocol import Page, page_from_omnidocbench, quantized
from padoc_ray.scheduler import PageRecord


def quantile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (q in [0, 1]); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class BenchPage:
    name: str  #: the page image's file name: its replay truth's key
    page: HostPage
    truth: Page


def load_bench_pages(gt_path: str, images_dir: str, limit: int | None = None) -> list[BenchPage]:
    from PIL import Image

    with open(gt_path, encoding="utf-8") as f:
        objs = json.load(f)
    out = []
    for i, obj in enumerate(objs[:limit] if limit else objs):
        truth = page_from_omnidocbench(obj)
        path = os.path.join(images_dir, os.path.basename(truth.image_path or ""))
        if not os.path.exists(path):
            raise FileNotFoundError(f"page {i}: image {path} not found (is --images right?)")
        with open(path, "rb") as f:
            data = f.read()
        img = Image.open(path).convert("RGB")
        name = os.path.basename(truth.image_path or f"page{i}")
        out.append(BenchPage(name, HostPage(doc_id=doc_id_of(data), page_index=0, image=img, source_name=name), truth))
    return out


def bench_truth(pages: Sequence[BenchPage]) -> dict[tuple[str, int], Page]:
    """The host's replay truth for the bench pages (each image is a one-page document)."""
    return {(p.name, 0): p.truth for p in pages}


async def closed_loop(host: PageHost, pages: list[BenchPage], mode: str, concurrency: int,
                      tag: str) -> tuple[list[PageRecord], float]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, p in enumerate(pages):
        queue.put_nowait((i, p))
    results: list[PageRecord | None] = [None] * len(pages)

    async def worker():
        while True:
            try:
                i, p = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            # the run's tag as tenant, the page's position as salt: no run profits from another run's cache
            results[i] = await host.parse(replace(p.page, mode=mode, tenant=tag, salt=str(i)))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [r for r in results if r is not None], time.perf_counter() - t0


def mode_summary(recs: list[PageRecord], wall: float, cache: dict[str, float]) -> dict:
    valid = [r for r in recs if r.valid]
    lat = [r.e2e_s for r in valid]
    q = cache.get("queries", 0.0)
    return {
        "pages": len(recs), "valid_pages": len(valid), "wall_s": round(wall, 3),
        "pages_per_s": round(len(recs) / wall, 4), "valid_pages_per_s": round(len(valid) / wall, 4),
        "p50_e2e_s": quantile(lat, 0.5), "p95_e2e_s": quantile(lat, 0.95),
        "output_tokens_per_s": round(sum(r.output_tokens for r in recs) / wall, 2),
        "prefix_cache_hit_rate": round(cache.get("hits", 0.0) / q, 4) if q else None,
        "statuses": {s: sum(r.status == s for r in recs) for s in sorted({r.status for r in recs})},
    }


def paired_summary(fork: list[PageRecord], seq: list[PageRecord]) -> dict:
    ratios, reductions = [], []
    for f, s in zip(fork, seq):
        if f.valid and s.valid:
            ratios.append(s.e2e_s / f.e2e_s)
        if f.valid:
            reductions.append(1 - f.f_padoc / f.f_seq if f.f_seq else 0.0)
    return {
        "paired_pages": len(ratios),
        "median_speedup": quantile(ratios, 0.5), "p25_speedup": quantile(ratios, 0.25),
        "p75_speedup": quantile(ratios, 0.75), "median_step_reduction": quantile(reductions, 0.5),
    }


def _cache_delta(engine, before: dict[str, float]) -> dict[str, float]:
    if not hasattr(engine, "prefix_cache_counters"):
        return {}
    now = engine.prefix_cache_counters()
    return {"queries": now.get("prefix_cache_queries", 0) - before.get("prefix_cache_queries", 0),
            "hits": now.get("prefix_cache_hits", 0) - before.get("prefix_cache_hits", 0)}


async def run_bench(host: PageHost, pages: list[BenchPage], concurrencies: Sequence[int], modes: Sequence[str],
                    out_dir: str, warmup: int = 2, log=print) -> dict:
    """``host``: started, with :func:`bench_truth` as its truth and pages_in_flight >= max(concurrencies)."""
    os.makedirs(out_dir, exist_ok=True)
    engine = host.engine
    truths = [quantized(p.truth, host.proto.vocab) for p in pages]
    for mode in modes:  # warm-up: not timed
        await closed_loop(host, pages[:warmup], mode, 1, f"warm-{mode}")
    summary: dict = {"pages": len(pages), "modes": list(modes), "concurrency": {}}
    with open(os.path.join(out_dir, "pages.jsonl"), "w", encoding="utf-8") as pj:
        for c in concurrencies:
            per_mode: dict[str, list[PageRecord]] = {}
            block: dict = {}
            for mode in modes:
                get = getattr(engine, "prefix_cache_counters", dict)
                before = get()
                recs, wall = await closed_loop(host, pages, mode, c, f"c{c}-{mode}")
                per_mode[mode] = recs
                block[mode] = mode_summary(recs, wall, _cache_delta(engine, before))
                for p, r, t in zip(pages, recs, truths):
                    pj.write(json.dumps({
                        "concurrency": c, "mode": mode, "page": p.name, "status": r.status, "valid": r.valid,
                        "e2e_s": round(r.e2e_s, 4), "ttft_s": r.ttft_s, "output_tokens": r.output_tokens,
                        "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                        "n_branches": r.n_branches, "f_seq": r.f_seq, "f_padoc": r.f_padoc,
                        "equals_truth": r.page.regions == t.regions,
                    }) + "\n")
                log(f"C={c:<3} {mode:<10} {block[mode]['pages_per_s']:.3f} pages/s  "
                    f"p50 {block[mode]['p50_e2e_s'] or 0:.2f}s  p95 {block[mode]['p95_e2e_s'] or 0:.2f}s  "
                    f"valid {block[mode]['valid_pages']}/{len(recs)}")
            if "fork" in per_mode and "sequential" in per_mode:
                block["paired"] = paired_summary(per_mode["fork"], per_mode["sequential"])
            summary["concurrency"][str(c)] = block
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def format_table(summary: dict) -> str:
    rows = ["| C | mode | pages/s | valid pages/s | p50 e2e s | p95 e2e s | out tok/s | cache hit | paired speedup "
            "median (P25-P75) | step reduction |", "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, n=3: "-" if x is None else f"{x:.{n}f}"  # noqa: E731
    for c, block in summary["concurrency"].items():
        paired = block.get("paired", {})
        for mode in summary["modes"]:
            m = block[mode]
            sp = ""
            if mode == "fork" and paired:
                sp = (f"{f(paired['median_speedup'], 2)}x ({f(paired['p25_speedup'], 2)}-"
                      f"{f(paired['p75_speedup'], 2)}), n={paired['paired_pages']}")
            red = f(paired.get("median_step_reduction"), 3) if mode == "fork" and paired else ""
            rows.append(f"| {c} | {mode} | {f(m['pages_per_s'])} | {f(m['valid_pages_per_s'])} | {f(m['p50_e2e_s'], 2)} | "
                        f"{f(m['p95_e2e_s'], 2)} | {f(m['output_tokens_per_s'], 0)} | {f(m['prefix_cache_hit_rate'])} | "
                        f"{sp} | {red} |")
    return "\n".join(rows)
