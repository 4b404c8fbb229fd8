"""``bench model``: what a serving run will do before it starts, modeled by :mod:`padoc_ray.perfmodel`.

:class:`ModelCommand` is the command's config (its fields are its flags); :func:`main` reads the pages and the
step-time function it names, runs the engine model and writes its report."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from padoc_ray.bench import DEFAULT_MODEL, UsageError
from padoc_ray.knobs import knob
from padoc_ray.pdf import RenderConfig
from padoc_ray.perfmodel.report import ModelBenchConfig
from padoc_ray.scheduler.config import SCHEDULER_FLAGS, SchedulerConfig

WORKLOADS = ("paper384",)


@dataclass(frozen=True, kw_only=True)
class ModelCommand:
    """Model one vLLM engine serving pages in a closed loop (C pages in flight), fork and sequential: every
    page's teacher-forced requests, the real scheduler's forks, the engine's envelope (max_num_seqs,
    max_num_batched_tokens with chunked prefill, prefix cache in full KV blocks) and a step-time function, fitted
    on this machine (--steps, from `padoc-ray bench steps --json`) or a roofline of a GPU (--gpu,
    --model-config). The engine-bound limit: no host time. Writes OUT/report.json (one row per mode and C),
    OUT/report.md and bench serve's plots."""

    gt: str | None = knob(None, metavar="GT.json", help="OmniDocBench-format ground truth: the pages (or --workload)")
    workload: str | None = knob(None, choices=WORKLOADS,
                                help="a built-in page set instead of --gt: paper384, synthetic pages matching the "
                                     "paper's 384-page serving workload (its rows then carry the paper's Table 3)")
    page_sizes: str | None = knob(None, metavar="GT.json",
                                  help="with --workload paper384: draw each page's image size from this "
                                       "OmniDocBench-format ground truth's page_info (default: A4 and Letter pages "
                                       "at 200 dpi, OmniDocBench's usual page images, which the paper's setup serves "
                                       "at their own size)")
    images: str | None = knob(None, metavar="DIR", help="folder of the --gt page images: their sizes give the image "
                                                        "tokens (default: page_info sizes)")
    pages_jsonl: str | None = knob(None, metavar="PAGES.jsonl",
                                   help="a bench serve run's pages.jsonl: image tokens as its engine counted them "
                                        "(default with --compare and no --images: that run's pages.jsonl)")
    render: RenderConfig = knob(factory=RenderConfig, nested=("longest_side",))
    steps: str | None = knob(None, metavar="STEPS.json",
                             help="step times fitted on this machine: the JSON `padoc-ray bench steps --json` writes "
                                  "(or --gpu)")
    gpu: str | None = knob(None, metavar="GPU", help="step times from a roofline of this GPU (A800-80G, H100-80G, "
                                                     "H200, L40S)")
    model_config: str | None = knob(None, metavar="DIR|NAME",
                                    help="with --gpu: the modeled model's shape and image processor, a checkpoint "
                                         "directory or a built-in one: qwen3-vl-2b (Qwen3-VL-2B, PaDoc's base), "
                                         "hpd-1b (HPD-Parsing, InternVL3.5-1B-based: 448-px tiles plus a thumbnail, "
                                         "256 tokens each) or dots-ocr (dots.ocr: smart_resize to 28-px squares, "
                                         "grounding branches: image + grounding prompt + box, no layout prefix)")
    model: str = knob(DEFAULT_MODEL, help="checkpoint whose token protocol and tokenizer make the traces (and, with "
                                          "--steps, whose image processor counts image tokens)")
    envelope: ModelBenchConfig = knob(factory=ModelBenchConfig, nested=(
        "concurrency", "mode", "pages", "gpu_hour_usd", "max_num_seqs", "max_num_batched_tokens", "block_size",
        "kv_blocks"))
    compare: str | None = knob(None, metavar="BENCH_SERVE_OUT",
                               help="a bench serve output folder: its measured valid pages/s beside each modeled cell")
    out: str = knob(help="output folder")
    #: model text-layer drafts too (--text-layer speculate): this share of every fork branch's tokens is accepted
    #: from a draft, moving from decode steps into the branch's prefill (a bench serve --pdfs run's
    #: accepted_fraction); the report then gives pages/s and $ per million pages with and without it
    accepted_fraction: float | None = knob(None, metavar="X")
    scheduler: SchedulerConfig = knob(factory=SchedulerConfig, nested=SCHEDULER_FLAGS)


def _step_time(cmd):
    """(step-time function, the envelope of its machine, image processor, what the report calls it)."""
    from padoc_ray.perfmodel.sim import Envelope
    from padoc_ray.perfmodel.trace import TraceError, image_processor

    try:
        if cmd.steps:
            from padoc_ray.perfmodel.fitted import FittedStepTime
            from padoc_ray.engine.config import cpu_engine_config

            st = FittedStepTime.from_steps_json(cmd.steps)
            with open(cmd.steps, encoding="utf-8") as f:
                eng = json.load(f).get("engine") or {}
            cpu = cpu_engine_config(cmd.model)  # what bench steps runs on a machine without a GPU
            base = Envelope(max_num_seqs=eng.get("max_num_seqs") or cpu.max_num_seqs,
                            max_num_batched_tokens=eng.get("max_num_batched_tokens") or cpu.max_num_batched_tokens,
                            block_size=eng.get("block_size") or cpu.block_size)
            return st, base, image_processor(cmd.model), f"step time fitted on this machine: {cmd.steps}"
        from padoc_ray.perfmodel.roofline import RooflineStepTime, kv_cache_blocks, model_shape

        shape = model_shape(cmd.model_config)
        st = RooflineStepTime(cmd.gpu, shape)
        block = cmd.envelope.block_size or Envelope().block_size
        base = Envelope(block_size=block, kv_blocks=kv_cache_blocks(cmd.gpu, shape, block))
        return st, base, image_processor(cmd.model_config), f"{cmd.gpu} roofline, {cmd.model_config}"
    except (OSError, ValueError, KeyError, TraceError) as e:
        raise UsageError(f"{'--steps' if cmd.steps else '--gpu/--model-config'}: {e}")


def _steps_probe(path: str | None) -> dict | None:
    """The ``speed_probe`` of a ``bench steps --json`` file (None without one: --gpu, or an older file)."""
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("speed_probe")


def _page_sizes(path: str) -> list[tuple[int, int]]:
    """(width, height) of every page in an OmniDocBench-format ground truth's page_info."""
    from padoc_ray.perfmodel.trace import TraceError, read_truth

    entries = read_truth(path, "--page-sizes")
    sizes = [(t.page.width, t.page.height) for t in entries if t.page is not None and t.page.width and t.page.height]
    if not sizes:
        raise TraceError(f"--page-sizes {path}: no page with a page_info width and height")
    return sizes


def _traces(cmd, mp, proc, cfg, sched):
    """(traces, where the pages came from, where their image tokens came from)."""
    from padoc_ray.perfmodel.gpus import model_shape
    from padoc_ray.perfmodel.trace import TraceError, image_tokens_from_run, traces_from_gt
    from padoc_ray.protocol.family import PREFIX_FORK

    shape = model_shape(cmd.model_config).branch_shape if cmd.gpu else PREFIX_FORK  # --steps: --model's own
    try:
        if cmd.workload == "paper384":
            from padoc_ray.perfmodel.workload import paper384_traces

            sizes = _page_sizes(cmd.page_sizes) if cmd.page_sizes else None
            # the modeled model's processor with --gpu/--model-config; with --steps the paper's (Qwen3-VL's)
            modeled = proc if cmd.gpu else None
            traces, runaway = paper384_traces(mp, pages=cfg.pages, max_tokens=sched.max_tokens, page_sizes=sizes,
                                              proc=modeled, branch_shape=shape)
            who = f"{cmd.model_config}'s processor ({modeled.source})" if modeled else "Qwen3-VL's processor"
            how = (f"{who} on page sizes drawn from {cmd.page_sizes}'s page_info" if sizes else
                   f"{who} on A4 / Letter pages at 200 dpi (the workload's PAGE_SIZES)")
            return traces, (f"paper384 synthetic workload ({len(runaway)} pages run to the {sched.max_tokens}-token "
                            f"limit in sequential mode: {', '.join(runaway) or 'none'})"), how
        traces = traces_from_gt(mp, cmd.gt, proc, images=cmd.images, limit=cfg.pages,
                                longest_side=cmd.render.longest_side, branch_shape=shape)
        run = cmd.pages_jsonl
        measured = os.path.join(cmd.compare or "", "pages.jsonl")
        if run is None and cmd.compare and not cmd.images and os.path.isfile(measured):
            run = measured
        if run:
            return image_tokens_from_run(traces, run), cmd.gt, f"as the engine counted them in {run}"
        how = f"page images in {cmd.images}" if cmd.images else "page_info sizes"
        return traces, cmd.gt, f"{proc.source or 'processor'} on the {how} at longest side {cmd.render.longest_side}"
    except TraceError as e:
        raise UsageError(str(e))


def _paper_envelopes(cfg, env):
    """paper384's envelope per mode: PaDoc in the one given, Sequential in vLLM's standard one (256
    sequences, 32,768 batched tokens: Appendix E.3), each unless --max-num-seqs / --max-num-batched-tokens
    set it."""
    from dataclasses import replace

    seq = {k: v for k, v in (("max_num_seqs", 256), ("max_num_batched_tokens", 32768)) if getattr(cfg, k) is None}
    return {"fork": env, "sequential": replace(env, **seq)}


def main(cmd: ModelCommand) -> int:
    """Model the run, write OUT/report.json, report.md and plots, print report.md."""
    from dataclasses import asdict

    from padoc_ray.perfmodel.report import (
        ASSUMPTIONS,
        PAPER_TABLE3,
        add_measured,
        add_paper,
        run_model,
        write_report,
    )
    from padoc_ray.perfmodel.workload import ASSUMPTIONS as WORKLOAD_ASSUMPTIONS
    from padoc_ray.tokenizer import load_model_protocol

    if bool(cmd.steps) == bool(cmd.gpu):
        raise UsageError("give --steps STEPS.json or --gpu GPU (one of them)")
    if cmd.accepted_fraction is not None and not 0.0 <= cmd.accepted_fraction <= 1.0:
        raise UsageError(f"--accepted-fraction must be in [0, 1], got {cmd.accepted_fraction}")
    if bool(cmd.gt) == bool(cmd.workload):
        raise UsageError("give --gt GT.json or --workload paper384 (one of them)")
    if cmd.page_sizes and not cmd.workload:
        raise UsageError("--page-sizes is for --workload paper384 (with --gt the pages carry their own sizes)")
    if cmd.gpu and not cmd.model_config:
        raise UsageError("--gpu needs --model-config (a checkpoint directory, qwen3-vl-2b, hpd-1b or dots-ocr)")
    for path, what in ((cmd.gt, "--gt"), (cmd.images, "--images"), (cmd.compare, "--compare"),
                       (cmd.pages_jsonl, "--pages-jsonl"), (cmd.steps, "--steps"),
                       (cmd.page_sizes, "--page-sizes")):
        if path and not os.path.exists(path):
            raise UsageError(f"{what} {path}: no such file or folder")
    cfg, sched = cmd.envelope, cmd.scheduler
    if sched.layout_priority or sched.page_priority or sched.deadline_s is not None:
        raise UsageError("the model has vLLM's FCFS scheduler only: --layout-priority, --page-priority and "
                         "--page-deadline cannot be modeled")
    if not os.path.isfile(os.path.join(cmd.model, "padoc_protocol.json")):
        raise UsageError(f"--model {cmd.model} is not a padoc-ray checkpoint (no padoc_protocol.json)")
    st, base, proc, target = _step_time(cmd)
    env = cfg.envelope(base)
    mp = load_model_protocol(os.path.abspath(cmd.model))
    traces, source, image_source = _traces(cmd, mp, proc, cfg, sched)
    envs = _paper_envelopes(cfg, env) if cmd.workload == "paper384" else {m: env for m in cfg.mode}
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    rows = run_model(traces, mp.vocab, sched, st, envs, cfg.concurrency, cfg.mode, gpu_hour_usd=cfg.gpu_hour_usd,
                     log=log)
    took = time.perf_counter() - t0
    report = {"config": {"target": target, "model": cmd.model, "step_time": st.describe(), "envelope": asdict(env),
                         "envelope_by_mode": {m: asdict(e) for m, e in envs.items() if m in cfg.mode},
                         "concurrency": list(cfg.concurrency), "modes": list(cfg.mode),
                         "gpu_hour_usd": cfg.gpu_hour_usd, "max_tokens": sched.max_tokens,
                         "max_branches": sched.max_branches, "model_seconds": round(took, 2)},
              "pages": {"used": len(traces), "source": source, "image_tokens": image_source,
                        "names": [t.name for t in traces]},
              "assumptions": list(ASSUMPTIONS) + (list(WORKLOAD_ASSUMPTIONS) if cmd.workload else []), "rows": rows}
    if cmd.compare:
        try:
            report["compare"] = add_measured(rows, cmd.compare, _steps_probe(cmd.steps))
        except ValueError as e:
            raise UsageError(str(e))
    if cmd.workload == "paper384":
        add_paper(rows)
        report["paper"] = {"source": PAPER_TABLE3["source"]}
    if cmd.accepted_fraction is not None:
        with_drafts = run_model(traces, mp.vocab, sched, st, envs, cfg.concurrency, cfg.mode,
                                gpu_hour_usd=cfg.gpu_hour_usd, log=log, accepted_fraction=cmd.accepted_fraction)
        report["drafts"] = {"accepted_fraction": cmd.accepted_fraction, "rows": with_drafts}
    write_report(report, cmd.out, log=log)
    if cmd.accepted_fraction is not None:
        with open(os.path.join(cmd.out, "report.md"), "a", encoding="utf-8") as f:
            f.write(_drafts_table(rows, report["drafts"]["rows"], cmd.accepted_fraction))
    with open(os.path.join(cmd.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"modeled {len(traces)} pages x {len(cfg.mode)} modes x {len(cfg.concurrency)} concurrencies in "
          f"{took:.1f} s; wrote {cmd.out}/report.json, report.md and {', '.join(report['plots']) or 'no plots'}")
    return 0


def _drafts_table(rows: list[dict], drafted: list[dict], fraction: float) -> str:
    """report.md's section on text-layer drafts: each (mode, C) without and with them."""
    by = {(r["mode"], r["concurrency"]): r for r in drafted}
    out = [f"\n## Text-layer drafts, {fraction:.0%} of branch tokens accepted\n",
           "| mode | C | valid pages/s | with drafts | steps | with drafts | $ per 1M pages | with drafts |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = by[(r["mode"], r["concurrency"])]
        out.append(f"| {r['mode']} | {r['concurrency']} | {r['valid_pages_per_s']} | {d['valid_pages_per_s']} | "
                   f"{r['engine_steps']} | {d['engine_steps']} | {r.get('usd_per_million_pages')} | "
                   f"{d.get('usd_per_million_pages')} |")
    return "\n".join(out) + "\n"
