"""The serving report: the figures and files of the paper's Table 3, from per-page results (pure aggregation).

Shared by what is measured (``bench serve``, ``bench http``, the soak) and what is modeled (``bench model``,
:mod:`padoc_ray.perfmodel.report`), so both write the same rows and can be laid side by side.

Input: one dict per timed page (see :func:`padoc_ray.bench.serving.run.page_result`) with at least
``page``, ``status``, ``valid``, ``e2e_s``, ``t_start``/``t_end`` (seconds from the run's start),
``output_tokens``, ``prompt_tokens``, ``cached_tokens``, ``f_seq``, ``f_padoc``; and optionally
generation-token counter samples ``[(t, tokens)]``. Output: the rows of ``report.json``, the
Markdown tables of ``report.md`` (laid out like the paper's Tables 3 and 11) and the PNG plots
(Figure 2). Definitions follow the paper's Appendix E.3: valid pages/s counts valid pages over the
wall time of the whole run (work on invalid pages included); latency percentiles are over valid
pages; output tokens/s counts every generated token; the peak rate is the largest generated-token
increase over any fixed window (10 s) of counter samples; the paired speedup is, per page valid in
both modes, sequential latency / fork latency.

Knows nothing of engines, hosts or HTTP; imports matplotlib only to draw.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

MODES_ORDER = ("fork", "sequential")


def quantile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (q in [0, 1]); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(x, n)


def peak_rate(samples: Sequence[tuple[float, float]], window_s: float = 10.0) -> tuple[float | None, float | None]:
    """(largest counter increase per second over any window of ``window_s``, the window used).

    ``samples``: (time, monotonic counter) in time order. Each window starts at a sample and ends
    at the last sample at most ``window_s`` later; its rate is the increase divided by
    ``window_s`` (a fixed window, as the paper's). A run shorter than the window has one window:
    the whole run, divided by its own length. (None, None) with fewer than two samples."""
    if len(samples) < 2:
        return None, None
    span = samples[-1][0] - samples[0][0]
    if span <= 0:
        return None, None
    if span < window_s:
        return (samples[-1][1] - samples[0][1]) / span, span
    best, j = 0.0, 0
    for i, (t0, c0) in enumerate(samples):
        j = max(j, i)
        while j + 1 < len(samples) and samples[j + 1][0] <= t0 + window_s:
            j += 1
        if samples[j][0] - t0 < window_s * 0.999 and j == len(samples) - 1:
            break  # windows running past the end are not full windows
        best = max(best, samples[j][1] - c0)
    return best / window_s, window_s


def spread_samples(recs: Iterable[dict], step_s: float = 0.2) -> list[tuple[float, float]]:
    """Counter samples rebuilt from page results when the engine's counter cannot be read (over
    HTTP): each page's output tokens spread evenly over its [t_start, t_end]."""
    recs = [r for r in recs if r.get("t_end") is not None]
    if not recs:
        return []
    end = max(r["t_end"] for r in recs)
    out, t = [], 0.0
    while True:
        total = 0.0
        for r in recs:
            a, b, n = r["t_start"], r["t_end"], r.get("output_tokens") or 0
            if t >= b:
                total += n
            elif t > a:
                total += n * (t - a) / (b - a)
        out.append((t, total))
        if t >= end:
            return out
        t = min(end, t + step_s)


#: the engine's step counters over a run (``VllmEngine.step_counters``), as deltas
STEP_COUNTERS = ("engine_steps", "running_seq_steps", "waiting_seq_steps", "preempted_requests", "prefill_tokens")
#: the row keys :func:`step_row` makes of them (``bench model`` rows carry the same, modeled)
STEP_FIGURES = ("engine_steps", "mean_step_ms", "mean_running_seqs", "mean_waiting_seqs", "preempted_requests",
                "prefill_tokens")


def step_row(steps: dict | None, wall: float) -> dict:
    """What the engine's own step counters say of a run: its steps, the mean step time (wall / steps:
    the engine steps back to back while pages are in flight), the mean running and waiting sequences
    per step, preemptions, prompt tokens computed. Null without counters (the HTTP target)."""
    n = (steps or {}).get("engine_steps") or 0
    if not n:
        return dict.fromkeys(STEP_FIGURES)
    return {"engine_steps": int(n), "mean_step_ms": round(wall / n * 1e3, 3),
            "mean_running_seqs": round(steps["running_seq_steps"] / n, 2),
            "mean_waiting_seqs": round(steps["waiting_seq_steps"] / n, 2),
            "preempted_requests": int(steps["preempted_requests"]), "prefill_tokens": int(steps["prefill_tokens"])}


def mode_row(recs: list[dict], wall: float, mode: str, concurrency: int, *, samples=None,
             cache: dict | None = None, window_s: float = 10.0, steps: dict | None = None) -> dict:
    """One report row: the figures of one mode at one concurrency. ``cache``: the engine's
    prefix-cache counter deltas ({"queries", "hits"}); without it the pages' own token counts.
    ``steps``: the engine's step counter deltas (:data:`STEP_COUNTERS`, see :func:`step_row`)."""
    valid = [r for r in recs if r["valid"]]
    lat = [r["e2e_s"] for r in valid]
    out_tokens = sum(r.get("output_tokens") or 0 for r in recs)
    if cache and cache.get("queries"):
        hit, hit_src = cache["hits"] / cache["queries"], "engine_counter"
    else:
        prompt = sum(r.get("prompt_tokens") or 0 for r in recs)
        hit, hit_src = (sum(r.get("cached_tokens") or 0 for r in recs) / prompt if prompt else None), "page_records"
    if samples and samples[-1][1] > samples[0][1]:  # a counter that never moved in the run says nothing
        src = "engine_counter"
    else:
        samples, src = spread_samples(recs), "page_records"
    peak, win = peak_rate(samples, window_s)
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    accepted = sum(r.get("accepted_tokens") or 0 for r in recs)
    return {
        "mode": mode, "concurrency": concurrency, "pages": len(recs), "valid_pages": len(valid),
        "invalid_pages": len(recs) - len(valid), "statuses": dict(sorted(statuses.items())),
        "wall_s": round(wall, 3), "pages_per_s": round(len(recs) / wall, 4) if wall > 0 else None,
        "valid_pages_per_s": round(len(valid) / wall, 4) if wall > 0 else None,
        "mean_e2e_s": _r(sum(lat) / len(lat)) if lat else None,
        **{f"p{int(q * 100)}_e2e_s": _r(quantile(lat, q)) for q in (0.5, 0.9, 0.95, 0.99)},
        "output_tokens": out_tokens,
        "mean_output_tokens_per_s": round(out_tokens / wall, 2) if wall > 0 else None,
        "peak_output_tokens_per_s": _r(peak, 2), "peak_window_s": _r(win, 3), "token_rate_source": src,
        "prefix_cache_hit_rate": _r(hit), "prefix_cache_source": hit_src,
        # text-layer drafts (--text-layer speculate, pages with their PDFs' text layers: bench --pdfs)
        "draft_tokens": sum(r.get("draft_tokens") or 0 for r in recs), "accepted_tokens": accepted,
        "accepted_fraction": _r(accepted / out_tokens) if out_tokens else None,
        **step_row(steps, wall),
    }


def paired_speedup(fork: Sequence[dict], seq: Sequence[dict]) -> dict:
    """Per page valid in both runs (matched by ``page``): sequential latency / fork latency."""
    s_by = {r["page"]: r for r in seq}
    ratios = [s_by[f["page"]]["e2e_s"] / f["e2e_s"] for f in fork
              if f["valid"] and f["page"] in s_by and s_by[f["page"]]["valid"] and f["e2e_s"] > 0]
    return {"paired_pages": len(ratios), "paired_median_speedup": _r(quantile(ratios, 0.5)),
            "paired_p25_speedup": _r(quantile(ratios, 0.25)), "paired_p75_speedup": _r(quantile(ratios, 0.75))}


def step_figures(fork: Sequence[dict], seq: Sequence[dict] = ()) -> dict:
    """Table 11(a) analogue over the fork run's valid pages: forward steps of the sequentialized
    response (F_seq) and along the fork critical path (F_PaDoc), and the per-page reduction
    1 - F_PaDoc / F_seq; plus the steps the sequential run really took (its valid pages)."""
    ok = [r for r in fork if r["valid"] and r.get("f_seq")]
    red = [1 - r["f_padoc"] / r["f_seq"] for r in ok]
    seq_steps = [r["f_seq"] for r in seq if r["valid"] and r.get("f_seq")]
    return {"step_pages": len(ok), "median_f_seq": quantile([r["f_seq"] for r in ok], 0.5),
            "median_f_padoc": quantile([r["f_padoc"] for r in ok], 0.5),
            "median_step_reduction": _r(quantile(red, 0.5)), "p25_step_reduction": _r(quantile(red, 0.25)),
            "p75_step_reduction": _r(quantile(red, 0.75)),
            "median_sequential_run_steps": quantile(seq_steps, 0.5)}


def add_pairs(rows: list[dict], results: dict[tuple[str, int], list[dict]]) -> None:
    """Fork rows get the paired speedup, step figures and changes against sequential at the same C."""
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    for row in rows:
        c = row["concurrency"]
        if row["mode"] != "fork":
            continue
        row.update(step_figures(results[("fork", c)], results.get(("sequential", c), [])))
        seq = by.get(("sequential", c))
        if seq is None:
            continue
        row.update(paired_speedup(results[("fork", c)], results[("sequential", c)]))
        sv, fv = seq["valid_pages_per_s"], row["valid_pages_per_s"]
        row["valid_pages_per_s_vs_sequential"] = _r(fv / sv) if sv else None
        sp, fp = seq["p95_e2e_s"], row["p95_e2e_s"]
        row["p95_change_vs_sequential"] = _r(fp / sp - 1) if sp and fp is not None else None


# ---- report.md ------------------------------------------------------------------------------------------
def fmt(x, n: int = 3) -> str:
    """A table cell: ``x`` rounded to ``n`` places, "-" for None (what every report table here writes)."""
    return "-" if x is None else f"{x:.{n}f}"


def _pct(x) -> str:
    return "" if x is None else f" ({x * 100:+.1f}%)"


def _share(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


#: Table 3's two metrics: (row key, label, decimals)
TABLE3_METRICS = (("valid_pages_per_s", "valid pages/s", 3), ("p95_e2e_s", "P95 e2e s", 2))


def table3_lines(by: dict, cs: Sequence[int], modes: Sequence[str], extras: dict | None = None) -> list[str]:
    """The Table 3 analogue: one line per metric and mode, one cell per concurrency (rows ``by`` (mode, C));
    fork cells carry their change against sequential at the same C. ``extras``: per metric key, row keys
    whose values (where a row has them) follow the cell in brackets."""
    lines = ["| metric | mode | " + " | ".join(f"C{c}" for c in cs) + " |", "|---|---|" + "---|" * len(cs)]
    for key, label, n in TABLE3_METRICS:
        for m in modes:
            cells = []
            for c in cs:
                r = by.get((m, c))
                if r is None:
                    cells.append("-")
                    continue
                s = by.get(("sequential", c))
                ch = None
                if m == "fork" and s and s.get(key) and r.get(key) is not None:
                    ch = r[key] / s[key] - 1
                extra = [fmt(r.get(k), n) for k in (extras or {}).get(key, ()) if k in r]
                cells.append(fmt(r.get(key), n) + _pct(ch) + (f" [{' / '.join(extra)}]" if extra else ""))
            lines.append(f"| {label} | {m} | " + " | ".join(cells) + " |")
    return lines


def format_markdown(report: dict) -> str:
    rows = report["rows"]
    cs = sorted({r["concurrency"] for r in rows})
    modes = [m for m in MODES_ORDER if any(r["mode"] == m for r in rows)]
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    cfg = report["config"]
    pg = report["pages"]
    sets = ", ".join(f"{s['count']} from {s['gt']}" for s in pg["sets"])
    lines = [f"# Serving benchmark ({cfg['target']}, {cfg['model']})", "",
             f"{pg['used']} pages ({sets}); "
             f"{pg['requested']} requested{'' if pg['used'] >= pg['requested'] else ' (fewer exist: all were used)'}. "
             f"Closed loop, {cfg['warmup']} warm-up pages per mode; "
             f"{'teacher-forced with the ground truth' if cfg.get('replay', True) else 'free generation (no forcing)'}. "
             f"Engine: {report.get('engine', '-')}.", "",
             *[f"Mode {m} not run: {why}." for m, why in cfg.get("modes_skipped", {}).items()],
             *([""] if cfg.get("modes_skipped") else []),
             "## Table 3 analogue: valid pages/s and P95 end-to-end latency (s) over valid pages", "",
             "Fork cells: change against sequential at the same concurrency.", "",
             *table3_lines(by, cs, modes)]
    lines += ["", "## Per concurrency and mode", "",
              "| C | mode | valid / pages | valid pages/s | P50 | P90 | P95 | P99 | mean tok/s | peak tok/s "
              "(window s) | cache hit | paired speedup median (P25-P75), n | statuses |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cs:
        for m in modes:
            r = by.get((m, c))
            if r is None:
                continue
            sp = ""
            if r.get("paired_median_speedup") is not None:
                sp = (f"{fmt(r['paired_median_speedup'], 2)}x ({fmt(r['paired_p25_speedup'], 2)}-"
                      f"{fmt(r['paired_p75_speedup'], 2)}), n={r['paired_pages']}")
            st = ", ".join(f"{k} {v}" for k, v in r["statuses"].items())
            lines.append(f"| {c} | {m} | {r['valid_pages']} / {r['pages']} | {fmt(r['valid_pages_per_s'])} | "
                         f"{fmt(r['p50_e2e_s'], 2)} | {fmt(r['p90_e2e_s'], 2)} | {fmt(r['p95_e2e_s'], 2)} | "
                         f"{fmt(r['p99_e2e_s'], 2)} | {fmt(r['mean_output_tokens_per_s'], 0)} | "
                         f"{fmt(r['peak_output_tokens_per_s'], 0)} ({fmt(r['peak_window_s'], 1)}) | "
                         f"{fmt(r['prefix_cache_hit_rate'])} | {sp} | {st} |")
    stepped = [by[(m, c)] for c in cs for m in modes if (m, c) in by and by[(m, c)].get("engine_steps")]
    if stepped:
        lines += ["", "## The engine's steps (its scheduler's own counters)", "",
                  "| C | mode | steps | mean step ms | mean running seqs | mean waiting seqs | preempted | "
                  "prefill tokens |", "|---|---|---|---|---|---|---|---|"]
        for r in stepped:
            lines.append(f"| {r['concurrency']} | {r['mode']} | {r['engine_steps']} | {fmt(r['mean_step_ms'], 2)} | "
                         f"{fmt(r['mean_running_seqs'], 1)} | {fmt(r['mean_waiting_seqs'], 1)} | "
                         f"{r['preempted_requests']} | {r['prefill_tokens']} |")
    fork = [by[("fork", c)] for c in cs if ("fork", c) in by]
    if fork:
        lines += ["", "## Table 11 analogue: (a) forward steps (fork run's valid pages), (b) paired speedup", "",
                  "| C | pages | median F_seq | median F_PaDoc | median reduction (P25-P75) | sequential run's "
                  "median steps | paired median speedup (P25-P75) | median latency reduction |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in fork:
            med = r.get("paired_median_speedup")
            lines.append(
                f"| {r['concurrency']} | {r['step_pages']} | {fmt(r['median_f_seq'], 1)} | {fmt(r['median_f_padoc'], 1)} | "
                f"{_share(r['median_step_reduction'])} ({_share(r['p25_step_reduction'])}-"
                f"{_share(r['p75_step_reduction'])}) | {fmt(r['median_sequential_run_steps'], 1)} | "
                f"{fmt(med, 2)}x ({fmt(r.get('paired_p25_speedup'), 2)}-{fmt(r.get('paired_p75_speedup'), 2)}) | "
                f"{_share(1 - 1 / med if med else None)} |")
    if report.get("plots"):
        lines += ["", "## Figure 2 analogue", ""] + [f"![{p}]({p})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


# ---- plots ------------------------------------------------------------------------------------------------
PLOTS = (("valid_pages_per_s", "valid pages/s", "valid_pages_per_s.png"),
         ("p95_e2e_s", "P95 end-to-end latency (s)", "p95_e2e_s.png"))


def plot_report(report: dict, out_dir: str) -> list[str]:
    """One PNG per figure (valid pages/s vs C, P95 vs C), one line per mode; file names returned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = []
    for key, label, name in PLOTS:
        fig, ax = plt.subplots(figsize=(5, 3.6), dpi=110)
        for m in [m for m in MODES_ORDER if any(r["mode"] == m for r in rows)]:
            pts = sorted((r["concurrency"], r[key]) for r in rows if r["mode"] == m and r[key] is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_xscale("log", base=2)
        cs = sorted({r["concurrency"] for r in rows})
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent pages (C)")
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs concurrency ({report['config']['target']})", fontsize=9)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend()
        else:  # e.g. P95 latency of valid pages where no page was valid: say so, not an empty legend
            ax.text(0.5, 0.5, f"no {label} in this run", transform=ax.transAxes, ha="center", va="center")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name))
        plt.close(fig)
        names.append(name)
    return names


# ---- bench replay's summary (its old output) ---------------------------------------------------------------
def legacy_summary(report: dict) -> dict:
    """``bench replay``'s summary.json shape: {pages, modes, concurrency: {C: {mode: ..., paired}}}."""
    out: dict = {"pages": report["pages"]["used"], "modes": report["config"]["modes"], "concurrency": {}}
    for r in report["rows"]:
        block = out["concurrency"].setdefault(str(r["concurrency"]), {})
        block[r["mode"]] = {k: r[k] for k in (
            "pages", "valid_pages", "wall_s", "pages_per_s", "valid_pages_per_s", "p50_e2e_s", "p95_e2e_s",
            "prefix_cache_hit_rate", "statuses", "draft_tokens", "accepted_tokens", "accepted_fraction")}
        block[r["mode"]]["output_tokens_per_s"] = r["mean_output_tokens_per_s"]
        block[r["mode"]]["engine_steps"] = r.get("engine_steps")
        if r.get("paired_median_speedup") is not None or r.get("paired_pages") is not None:
            block["paired"] = {"paired_pages": r["paired_pages"], "median_speedup": r["paired_median_speedup"],
                               "p25_speedup": r["paired_p25_speedup"], "p75_speedup": r["paired_p75_speedup"],
                               "median_step_reduction": r["median_step_reduction"]}
    return out


def format_table(summary: dict) -> str:
    """``bench replay``'s printed table, from :func:`legacy_summary`."""
    rows = ["| C | mode | pages/s | valid pages/s | p50 e2e s | p95 e2e s | out tok/s | cache hit | paired speedup "
            "median (P25-P75) | step reduction |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c, block in summary["concurrency"].items():
        paired = block.get("paired", {})
        for mode in summary["modes"]:
            m = block[mode]
            sp = red = ""
            if mode == "fork" and paired:
                sp = (f"{fmt(paired['median_speedup'], 2)}x ({fmt(paired['p25_speedup'], 2)}-"
                      f"{fmt(paired['p75_speedup'], 2)}), n={paired['paired_pages']}")
                red = fmt(paired.get("median_step_reduction"), 3)
            rows.append(f"| {c} | {mode} | {fmt(m['pages_per_s'])} | {fmt(m['valid_pages_per_s'])} | "
                        f"{fmt(m['p50_e2e_s'], 2)} | {fmt(m['p95_e2e_s'], 2)} | {fmt(m['output_tokens_per_s'], 0)} | "
                        f"{fmt(m['prefix_cache_hit_rate'])} | {sp} | {red} |")
    return "\n".join(rows)
