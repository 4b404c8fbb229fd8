"""`padoc-ray bench model`'s runs and report files: the shape of ``bench serve``'s, modeled.

:func:`run_model` plans every page once per mode (:mod:`.plan`), models every (mode, concurrency)
(:mod:`.sim`) and makes one row each with ``bench serve``'s figures (its :func:`mode_row`, from the
modeled page records and token counter) plus the model's own: ``tokens_per_s``, ``steps``,
``mean_batch``, ``engine_utilization`` and its parts, and ``usd_per_million_pages`` when priced
(1e6 / valid pages per second / 3600 x the GPU's hourly price: one engine per GPU). Then
:func:`add_measured` puts a measured ``bench serve`` run beside each row and :func:`add_paper` the
paper's Table 3. :func:`write_report` writes ``report.json``, ``report.md`` and ``bench serve``'s plots.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from padoc_ray.perfmodel.table3 import STEP_FIGURES, add_pairs, fmt, mode_row, plot_report, table3_lines

from .plan import plan_page, with_drafts
from .sim import Envelope, simulate
from .trace import PageTrace

#: the paper's Table 3 (valid pages/s per GPU and P95 end-to-end latency over valid pages), as issue 29 quotes it
PAPER_TABLE3 = {
    "source": "PaDoc paper, Table 3: one A800-80G, vLLM, the 384-page OmniDocBench subset, closed loop "
              "(Appendix E.3 envelope: 384 sequences, 24,576 batched tokens, 32k context, bf16)",
    "concurrency": (16, 32, 64, 128, 256),
    "fork": {"valid_pages_per_s": (1.640, 1.711, 1.722, 1.684, 1.699), "p95_e2e_s": (22.8, 49.1, 70.7, 118.8, 194.0)},
    "sequential": {"valid_pages_per_s": (0.751, 0.814, 0.879, 0.904, 1.015),
                   "p95_e2e_s": (42.6, 83.2, 141.0, 263.2, 319.3)},
}

#: what the model assumes and leaves out (report.json's ``assumptions``, listed in report.md)
ASSUMPTIONS = (
    "one engine, always busy while a page is in flight: no host, Ray or HTTP time between steps "
    "(the engine-bound limit; measured / modeled is the host's and scheduler's efficiency)",
    "vLLM's FCFS scheduler with chunked prefill: running requests first, then waiting ones, within "
    "max_num_seqs and max_num_batched_tokens; no priority scheduling, no preemption",
    "the KV cache (envelope kv_blocks) as vLLM's: a waiting request is admitted only when its new blocks fit, a "
    "running one that cannot grow preempts the last admitted (recomputed on readmission); a page's shared prefix "
    "stays while any of its requests uses it, and a branch finds it cached (full blocks only); no other eviction",
    "the vision encoder runs once per page, in the step whose prefill chunk reaches the image; no encoder budget",
    "no prefix sharing across pages (each page has its own image and cache salt)",
    "teacher-forced streams: every page generates exactly its trace; the scheduler's decisions (forks, "
    "stops, retries) come from the real PageState once per page and mode",
)


@dataclass(frozen=True, kw_only=True)
class ModelBenchConfig:
    """What ``bench model`` models. Envelope fields left None come from the step-time function's
    machine: the ``bench steps`` JSON's engine (else the CPU preset's), or the paper's with a GPU roofline."""

    concurrency: tuple[int, ...] = (16, 32, 64, 128, 256)  #: closed-loop levels (pages in flight)
    mode: tuple[str, ...] = ("fork", "sequential")  #: decode modes to model, comma list
    pages: int | None = None  #: model only the first N pages (none: every page)
    #: the GPU's price per hour: rows get usd_per_million_pages (one engine per GPU)
    gpu_hour_usd: float | None = None
    #: engine max_num_seqs (none: the step-time machine's: the bench steps JSON's engine, else the CPU preset's;
    #: with --gpu the paper's 384)
    max_num_seqs: int | None = None
    #: engine tokens per step, decodes plus prefill chunks (none: the step-time machine's; with --gpu the paper's 24576)
    max_num_batched_tokens: int | None = None
    #: KV block size of the prefix cache (none: the steps JSON's, else the CPU preset's 32; with --gpu vLLM's 16)
    block_size: int | None = None
    #: KV cache size in blocks (none: with --gpu, 90% of the GPU's memory less the weights and 4 GB, as vLLM sizes
    #: it; with --steps unlimited: the CPU preset's 256 MB holds far more than the tiny model's pages need)
    kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be positive integers")
        if not self.mode or not set(self.mode) <= {"fork", "sequential"} or len(set(self.mode)) != len(self.mode):
            raise ValueError(f"--mode takes fork and/or sequential, got {','.join(self.mode) or 'nothing'}")
        if self.pages is not None and self.pages < 1:
            raise ValueError("pages must be >= 1")
        if self.gpu_hour_usd is not None and not self.gpu_hour_usd > 0:
            raise ValueError("gpu_hour_usd must be a positive price")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError("kv_blocks must be >= 1")

    def envelope(self, base: Envelope) -> Envelope:
        """``base`` with the fields set here."""
        kw = {k: getattr(self, k) for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks")
              if getattr(self, k) is not None}
        return Envelope(**{**base.__dict__, **kw})


def run_model(traces: Sequence[PageTrace], vocab, scheduler_cfg, step_time, env: Envelope | Mapping[str, Envelope],
              concurrency: Sequence[int], modes: Sequence[str], *, gpu_hour_usd: float | None = None,
              log: Callable[[str], None] = lambda m: None, accepted_fraction: float = 0.0) -> list[dict]:
    """One row per (mode, concurrency), concurrency-major like ``bench serve``'s; ``env`` is one envelope
    for every mode or one per mode (the paper ran Sequential SFT in vLLM's standard envelope).
    ``accepted_fraction``: text-layer drafts accepted at that share of every fork branch's tokens
    (:func:`~.plan.with_drafts`); 0: none."""
    envs = env if isinstance(env, Mapping) else {m: env for m in modes}
    plans = {m: [with_drafts(plan_page(t, m, vocab, scheduler_cfg), accepted_fraction) for t in traces]
             for m in modes}
    rows: list[dict] = []
    results: dict[tuple[str, int], list[dict]] = {}
    for c in concurrency:
        for m in modes:
            res = simulate(plans[m], c, step_time, envs[m])
            row = mode_row(res.pages, res.wall_s, m, c, samples=res.samples)
            row["token_rate_source"] = "model"
            row.update(tokens_per_s=row["mean_output_tokens_per_s"], steps=res.steps,
                       mean_batch=round(res.mean_batch, 2), mean_scheduled_tokens=round(res.mean_scheduled_tokens, 1),
                       engine_utilization=round(res.engine_utilization, 4), seq_fill=round(res.seq_fill, 4),
                       token_fill=round(res.token_fill, 4), engine_busy_fraction=1.0,
                       engine_seconds_per_page=round(res.wall_s / len(res.pages), 5),
                       prefill_tokens=res.prefill_tokens,
                       # the figures bench serve reads from the engine's own step counters, modeled
                       engine_steps=res.steps,
                       mean_step_ms=round(res.wall_s / res.steps * 1e3, 3) if res.steps else None,
                       mean_running_seqs=round(res.mean_batch, 2), preempted_requests=res.preempted_requests,
                       peak_kv_blocks=res.peak_kv_blocks if envs[m].kv_blocks is not None else None)
            vps = row["valid_pages_per_s"]
            if gpu_hour_usd is not None:
                row["usd_per_million_pages"] = round(1e6 / vps / 3600 * gpu_hour_usd, 2) if vps else None
            results[(m, c)] = res.pages
            rows.append(row)
            log(f"C={c:<3} {m:<10} {vps or 0:.3f} valid pages/s  p95 {row['p95_e2e_s'] or 0:.2f}s  "
                f"{row['tokens_per_s'] or 0:.0f} tok/s  {res.steps} steps  utilization {res.engine_utilization:.2f}")
    add_pairs(rows, results)
    return rows


def _describe(d) -> str:
    """A step-time function's describe() in one line: its scalar entries."""
    if not isinstance(d, dict):
        return str(d)
    return ", ".join(f"{k} {v}" for k, v in d.items() if isinstance(v, (str, int, float))) or "-"


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def add_measured(rows: list[dict], bench_serve_dir: str, steps_probe: dict | None = None) -> dict:
    """Each row gets the measured run's ``valid_pages_per_s`` and ``p95_e2e_s`` at the same (mode,
    concurrency) and ``measured_over_modeled``; a cell the run lacks is null. Returns what was read.

    With ``steps_probe`` (the ``speed_probe`` of the ``bench steps`` JSON the step function was fitted
    on) and a run made with ``bench serve --speed-probe``, each row also gets ``machine_speed_ratio``:
    the probe's step time around that cell over the probe's in the steps run (above 1: the machine was
    slower during the cell), and ``measured_over_modeled_at_cell_speed``: ``measured_over_modeled``
    with every modeled step scaled by that ratio, which takes this machine's drift between the two runs
    out of the comparison and leaves the host's and the scheduler's efficiency."""
    path = os.path.join(bench_serve_dir, "report.json")
    try:
        with open(path, encoding="utf-8") as f:
            measured = json.load(f)
        by = {(r["mode"], int(r["concurrency"])): r for r in measured["rows"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--compare {bench_serve_dir}: not a bench serve output ({path}: {e})") from None
    mcfg = measured.get("config") or {}
    probe_ok = bool(steps_probe and mcfg.get("speed_probe") and steps_probe.get("step_ms")
                    and steps_probe.get("tokens") == mcfg.get("speed_probe_tokens"))
    if probe_ok:
        probe_note = (f"each cell's modeled steps scaled by its speed probe ({mcfg['speed_probe_tokens']} tokens x "
                      f"{steps_probe.get('batch')} requests) over the steps run's ({steps_probe['step_ms']} ms)")
    elif not steps_probe:
        probe_note = "none: the step function's steps JSON has no speed_probe (an older bench steps, or --gpu)"
    elif not mcfg.get("speed_probe"):
        probe_note = "none: the measured run was made without bench serve --speed-probe"
    else:
        probe_note = (f"none: the probes differ (steps run {steps_probe.get('tokens')} tokens, measured run "
                      f"{mcfg.get('speed_probe_tokens')})")
    for row in rows:
        m = by.get((row["mode"], row["concurrency"]), {})
        row["measured_valid_pages_per_s"] = m.get("valid_pages_per_s")
        row["measured_p95_e2e_s"] = m.get("p95_e2e_s")
        row["measured_over_modeled"] = _ratio(row["measured_valid_pages_per_s"], row["valid_pages_per_s"])
        # where a shortfall comes from: more steps than the model's (smaller batches: late forks, waits
        # between steps that leave sequences out) or longer steps (host time, contention, what the fit misses)
        for k in STEP_FIGURES:
            row[f"measured_{k}"] = m.get(k)
        row["measured_steps_over_modeled"] = _ratio(m.get("engine_steps"), row.get("engine_steps"))
        row["measured_step_ms_over_modeled"] = _ratio(m.get("mean_step_ms"), row.get("mean_step_ms"))
        speed = (_ratio(m.get("speed_probe_step_ms"), steps_probe.get("step_ms"))
                 if probe_ok and m.get("speed_probe_step_ms") else None)
        row["machine_speed_ratio"] = speed
        row["measured_over_modeled_at_cell_speed"] = (round(row["measured_over_modeled"] * speed, 4)
                                                      if speed and row["measured_over_modeled"] is not None else None)
    return {"dir": bench_serve_dir, "cells": len(by), "matched": sum(r["measured_valid_pages_per_s"] is not None
                                                                     for r in rows),
            "speed_probe": probe_note}


def add_paper(rows: list[dict], table: dict = PAPER_TABLE3) -> None:
    """Each row gets the paper's cell (null where the paper has no such concurrency), modeled / paper, and
    fork rows the paper's fork / sequential ratio beside the modeled one."""
    cs = list(table["concurrency"])
    for row in rows:
        k = cs.index(row["concurrency"]) if row["concurrency"] in cs else None
        cell = table.get(row["mode"], {})
        row["paper_valid_pages_per_s"] = cell["valid_pages_per_s"][k] if k is not None else None
        row["paper_p95_e2e_s"] = cell["p95_e2e_s"][k] if k is not None else None
        row["modeled_over_paper"] = _ratio(row["valid_pages_per_s"], row["paper_valid_pages_per_s"])
        if row["mode"] == "fork" and k is not None:
            row["paper_fork_over_sequential"] = _ratio(cell["valid_pages_per_s"][k],
                                                       table["sequential"]["valid_pages_per_s"][k])


# ---- report.md --------------------------------------------------------------------------------------------
def format_markdown(report: dict) -> str:
    rows, cfg = report["rows"], report["config"]
    cs = sorted({r["concurrency"] for r in rows})
    modes = [m for m in ("fork", "sequential") if any(r["mode"] == m for r in rows)]
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    env = cfg["envelope"]
    lines = [f"# Engine model ({cfg['target']})", "",
             f"{report['pages']['used']} pages ({report['pages']['source']}); image tokens: "
             f"{report['pages']['image_tokens']}. Envelope: max_num_seqs {env['max_num_seqs']}, max_num_batched_tokens "
             f"{env['max_num_batched_tokens']}, KV block {env['block_size']}"
             + "".join(f"; {m}: max_num_seqs {e['max_num_seqs']}, max_num_batched_tokens {e['max_num_batched_tokens']}"
                       for m, e in (cfg.get("envelope_by_mode") or {}).items() if e != env)
             + f". Step time: {_describe(cfg['step_time'])}.", "",
             "## Table 3 analogue: valid pages/s and P95 end-to-end latency (s) over valid pages", "",
             "Fork cells: change against sequential at the same concurrency. In brackets: measured / paper, "
             "where given.", "",
             *table3_lines(by, cs, modes, extras={
                 "valid_pages_per_s": ("measured_valid_pages_per_s", "paper_valid_pages_per_s"),
                 "p95_e2e_s": ("measured_p95_e2e_s", "paper_p95_e2e_s")})]
    lines += ["", "## Per concurrency and mode", "",
              "| C | mode | valid / pages | valid pages/s | P50 | P95 | tok/s | peak tok/s | steps | mean batch | "
              "utilization (seqs / tokens) | cache hit | $ / M pages | measured / modeled | modeled / paper |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cs:
        for m in modes:
            r = by.get((m, c))
            if r is None:
                continue
            lines.append(
                f"| {c} | {m} | {r['valid_pages']} / {r['pages']} | {fmt(r['valid_pages_per_s'])} | "
                f"{fmt(r['p50_e2e_s'], 2)} | {fmt(r['p95_e2e_s'], 2)} | {fmt(r['tokens_per_s'], 0)} | "
                f"{fmt(r['peak_output_tokens_per_s'], 0)} | {r['steps']} | {fmt(r['mean_batch'], 1)} | "
                f"{fmt(r['engine_utilization'], 2)} ({fmt(r['seq_fill'], 2)} / {fmt(r['token_fill'], 2)}) | "
                f"{fmt(r['prefix_cache_hit_rate'])} | {fmt(r.get('usd_per_million_pages'), 2)} | "
                f"{fmt(r.get('measured_over_modeled'))} | {fmt(r.get('modeled_over_paper'))} |")
    compared = [by[(m, c)] for c in cs for m in modes if by.get((m, c), {}).get("measured_engine_steps")]
    if compared:
        lines += ["", "## Measured against modeled, step by step", "",
                  "measured / modeled pages/s = (modeled steps / measured steps) x (modeled step ms / measured "
                  "step ms): more steps mean smaller batches than the model's (forks that came late, sequences "
                  "left out of steps), longer steps mean time the fitted step function does not have (host work "
                  "between steps, contention for the cores).", "",
                  "| C | mode | measured / modeled | steps: measured (modeled) | mean step ms: measured (modeled) | "
                  "mean running seqs: measured (modeled) | waiting seqs | preempted | prefill tokens: measured "
                  "(modeled) | machine speed: cell / steps run | measured / modeled at the cell's speed |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in compared:
            lines.append(
                f"| {r['concurrency']} | {r['mode']} | {fmt(r['measured_over_modeled'])} | "
                f"{r['measured_engine_steps']} ({r['engine_steps']}) | {fmt(r['measured_mean_step_ms'], 2)} "
                f"({fmt(r['mean_step_ms'], 2)}) | {fmt(r['measured_mean_running_seqs'], 1)} "
                f"({fmt(r['mean_running_seqs'], 1)}) | {fmt(r['measured_mean_waiting_seqs'], 1)} | "
                f"{r['measured_preempted_requests']} | {r['measured_prefill_tokens']} ({r['prefill_tokens']}) | "
                f"{fmt(r.get('machine_speed_ratio'))} | {fmt(r.get('measured_over_modeled_at_cell_speed'))} |")
        probe = (report.get("compare") or {}).get("speed_probe")
        if probe:
            lines += ["", f"Speed probe: {probe}."]
    fork = [by[("fork", c)] for c in cs if ("fork", c) in by and by[("fork", c)].get("paired_pages") is not None]
    if fork:
        lines += ["", "## Fork against sequential", "",
                  "| C | fork / sequential pages/s | paper's | paired median speedup | median F_seq | median F_PaDoc |",
                  "|---|---|---|---|---|---|"]
        for r in fork:
            lines.append(f"| {r['concurrency']} | {fmt(r.get('valid_pages_per_s_vs_sequential'))} | "
                         f"{fmt(r.get('paper_fork_over_sequential'))} | {fmt(r.get('paired_median_speedup'), 2)}x | "
                         f"{fmt(r.get('median_f_seq'), 1)} | {fmt(r.get('median_f_padoc'), 1)} |")
    lines += ["", "engine_utilization: the time-weighted mean over steps of the larger of running sequences / "
                  "max_num_seqs and scheduled tokens / max_num_batched_tokens (how full the binding limit was; "
                  "the engine itself is never idle in the model).", "", "## Assumptions", ""]
    lines += [f"- {a}" for a in report["assumptions"]]
    if report.get("paper"):
        lines += ["", f"Paper figures: {report['paper']['source']}."]
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: str, log: Callable[[str], None] = print) -> dict:
    """``report.json``, ``report.md`` and the plots (``bench serve``'s) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    try:
        report["plots"] = plot_report(report, out_dir)
    except ImportError as e:  # matplotlib is an optional extra
        report["plots"] = []
        log(f"no plots: {e}")
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(format_markdown(report))
    return report
