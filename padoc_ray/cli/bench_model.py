"""``bench model``: what a serving run will do before it starts (:mod:`padoc_ray.perfmodel`)."""

from __future__ import annotations

import json
import os
import sys
import time

from padoc_ray.cli.common import DEFAULT_MODEL, add_command, die
from padoc_ray.cli.flags import add_fields, add_render, add_scheduler_flags, from_args, scheduler_from_args

PROG = "padoc-ray bench model"
WORKLOADS = ("paper384",)


def _fail(msg: str):
    return die(msg, prog=PROG)


def _step_time(args):
    """(step-time function, the envelope of its machine, image processor, what the report calls it)."""
    from padoc_ray.perfmodel.sim import Envelope
    from padoc_ray.perfmodel.trace import TraceError, image_processor

    try:
        if args.steps:
            from padoc_ray.perfmodel.fitted import FittedStepTime
            from padoc_ray.engine.config import cpu_engine_config

            st = FittedStepTime.from_steps_json(args.steps)
            with open(args.steps, encoding="utf-8") as f:
                eng = json.load(f).get("engine") or {}
            cpu = cpu_engine_config(args.model)  # what bench steps runs on a machine without a GPU
            base = Envelope(max_num_seqs=eng.get("max_num_seqs") or cpu.max_num_seqs,
                            max_num_batched_tokens=eng.get("max_num_batched_tokens") or cpu.max_num_batched_tokens,
                            block_size=eng.get("block_size") or cpu.block_size)
            return st, base, image_processor(args.model), f"step time fitted on this machine: {args.steps}"
        from padoc_ray.perfmodel.roofline import RooflineStepTime, kv_cache_blocks, model_shape

        shape = model_shape(args.model_config)
        st = RooflineStepTime(args.gpu, shape)
        block = args.block_size or Envelope().block_size
        base = Envelope(block_size=block, kv_blocks=kv_cache_blocks(args.gpu, shape, block))
        return st, base, image_processor(args.model_config), f"{args.gpu} roofline, {args.model_config}"
    except (OSError, ValueError, KeyError, TraceError) as e:
        _fail(f"{'--steps' if args.steps else '--gpu/--model-config'}: {e}")


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


def _traces(args, mp, proc, cfg, sched):
    """(traces, where the pages came from, where their image tokens came from)."""
    from padoc_ray.perfmodel.trace import TraceError, image_tokens_from_run, traces_from_gt

    try:
        if args.workload == "paper384":
            from padoc_ray.perfmodel.workload import paper384_traces

            sizes = _page_sizes(args.page_sizes) if args.page_sizes else None
            # the modeled model's processor with --gpu/--model-config; with --steps the paper's (Qwen3-VL's)
            modeled = proc if args.gpu else None
            traces, runaway = paper384_traces(mp, pages=cfg.pages, max_tokens=sched.max_tokens, page_sizes=sizes,
                                              proc=modeled)
            who = f"{args.model_config}'s processor ({modeled.source})" if modeled else "Qwen3-VL's processor"
            how = (f"{who} on page sizes drawn from {args.page_sizes}'s page_info" if sizes else
                   f"{who} on A4 / Letter pages at 200 dpi (the workload's PAGE_SIZES)")
            return traces, (f"paper384 synthetic workload ({len(runaway)} pages run to the {sched.max_tokens}-token "
                            f"limit in sequential mode: {', '.join(runaway) or 'none'})"), how
        traces = traces_from_gt(mp, args.gt, proc, images=args.images, limit=cfg.pages,
                                longest_side=args.longest_side)
        run = args.pages_jsonl
        measured = os.path.join(args.compare or "", "pages.jsonl")
        if run is None and args.compare and not args.images and os.path.isfile(measured):
            run = measured
        if run:
            return image_tokens_from_run(traces, run), args.gt, f"as the engine counted them in {run}"
        how = f"page images in {args.images}" if args.images else "page_info sizes"
        return traces, args.gt, f"{proc.source or 'processor'} on the {how} at longest side {args.longest_side}"
    except TraceError as e:
        _fail(str(e))


def _paper_envelopes(cfg, env):
    """paper384's envelope per mode: PaDoc in the one given, Sequential in vLLM's standard one (256
    sequences, 32,768 batched tokens: Appendix E.3), each unless --max-num-seqs / --max-num-batched-tokens
    set it."""
    from dataclasses import replace

    seq = {k: v for k, v in (("max_num_seqs", 256), ("max_num_batched_tokens", 32768)) if getattr(cfg, k) is None}
    return {"fork": env, "sequential": replace(env, **seq)}


def cmd_bench_model(args) -> int:
    from dataclasses import asdict

    from padoc_ray.perfmodel.report import (
        ASSUMPTIONS,
        PAPER_TABLE3,
        ModelBenchConfig,
        add_measured,
        add_paper,
        run_model,
        write_report,
    )
    from padoc_ray.perfmodel.workload import ASSUMPTIONS as WORKLOAD_ASSUMPTIONS
    from padoc_ray.tokenizer import load_model_protocol

    if bool(args.gt) == bool(args.workload):
        _fail("give --gt GT.json or --workload paper384 (one of them)")
    if args.page_sizes and not args.workload:
        _fail("--page-sizes is for --workload paper384 (with --gt the pages carry their own sizes)")
    if args.gpu and not args.model_config:
        _fail("--gpu needs --model-config (a checkpoint directory, qwen3-vl-2b or hpd-1b)")
    for path, what in ((args.gt, "--gt"), (args.images, "--images"), (args.compare, "--compare"),
                       (args.pages_jsonl, "--pages-jsonl"), (args.steps, "--steps"),
                       (args.page_sizes, "--page-sizes")):
        if path and not os.path.exists(path):
            _fail(f"{what} {path}: no such file or folder")
    try:
        cfg = from_args(ModelBenchConfig, args)
        sched = scheduler_from_args(args)
    except ValueError as e:
        return _fail(str(e))
    if sched.layout_priority or sched.page_priority or sched.deadline_s is not None:
        _fail("the model has vLLM's FCFS scheduler only: --layout-priority, --page-priority and --page-deadline "
              "cannot be modeled")
    if not os.path.isfile(os.path.join(args.model, "padoc_protocol.json")):
        _fail(f"--model {args.model} is not a padoc-ray checkpoint (no padoc_protocol.json)")
    st, base, proc, target = _step_time(args)
    env = cfg.envelope(base)
    mp = load_model_protocol(os.path.abspath(args.model))
    traces, source, image_source = _traces(args, mp, proc, cfg, sched)
    envs = _paper_envelopes(cfg, env) if args.workload == "paper384" else {m: env for m in cfg.mode}
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    rows = run_model(traces, mp.vocab, sched, st, envs, cfg.concurrency, cfg.mode, gpu_hour_usd=cfg.gpu_hour_usd,
                     log=log)
    took = time.perf_counter() - t0
    report = {"config": {"target": target, "model": args.model, "step_time": st.describe(), "envelope": asdict(env),
                         "envelope_by_mode": {m: asdict(e) for m, e in envs.items() if m in cfg.mode},
                         "concurrency": list(cfg.concurrency), "modes": list(cfg.mode),
                         "gpu_hour_usd": cfg.gpu_hour_usd, "max_tokens": sched.max_tokens,
                         "max_branches": sched.max_branches, "model_seconds": round(took, 2)},
              "pages": {"used": len(traces), "source": source, "image_tokens": image_source,
                        "names": [t.name for t in traces]},
              "assumptions": list(ASSUMPTIONS) + (list(WORKLOAD_ASSUMPTIONS) if args.workload else []), "rows": rows}
    if args.compare:
        try:
            report["compare"] = add_measured(rows, args.compare, _steps_probe(args.steps))
        except ValueError as e:
            _fail(str(e))
    if args.workload == "paper384":
        add_paper(rows)
        report["paper"] = {"source": PAPER_TABLE3["source"]}
    write_report(report, args.out, log=log)
    with open(os.path.join(args.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"modeled {len(traces)} pages x {len(cfg.mode)} modes x {len(cfg.concurrency)} concurrencies in "
          f"{took:.1f} s; wrote {args.out}/report.json, report.md and {', '.join(report['plots']) or 'no plots'}")
    return 0


def register_model(bsub) -> None:
    """``bench model`` under the ``bench`` group's sub-parsers."""
    from padoc_ray.perfmodel.report import ModelBenchConfig

    p = add_command(
        bsub, "model", help="a discrete-event model of one engine: pages/s, P95, tokens/s and $ per page before a run",
        description="Model one vLLM engine serving pages in a closed loop (C pages in flight), fork and sequential: "
                    "every page's teacher-forced requests, the real scheduler's forks, the engine's envelope "
                    "(max_num_seqs, max_num_batched_tokens with chunked prefill, prefix cache in full KV blocks) and "
                    "a step-time function, fitted on this machine (--steps, from `padoc-ray bench steps --json`) or a "
                    "roofline of a GPU (--gpu, --model-config). The engine-bound limit: no host time. Writes "
                    "OUT/report.json (one row per mode and C), OUT/report.md and bench serve's plots.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--gt", default=None, metavar="GT.json", help="OmniDocBench-format ground truth: the pages")
    src.add_argument("--workload", choices=WORKLOADS, default=None,
                     help="a built-in page set instead of --gt: paper384, synthetic pages matching the paper's "
                          "384-page serving workload (its rows then carry the paper's Table 3)")
    p.add_argument("--page-sizes", default=None, metavar="GT.json",
                   help="with --workload paper384: draw each page's image size from this OmniDocBench-format "
                        "ground truth's page_info (default: A4 and Letter pages at 200 dpi, OmniDocBench's usual "
                        "page images, which the paper's setup serves at their own size)")
    p.add_argument("--images", default=None, metavar="DIR",
                   help="folder of the --gt page images: their sizes give the image tokens (default: page_info sizes)")
    p.add_argument("--pages-jsonl", default=None, metavar="PAGES.jsonl",
                   help="a bench serve run's pages.jsonl: image tokens as its engine counted them (default with "
                        "--compare and no --images: that run's pages.jsonl)")
    add_render(p, names=("longest_side",))
    steps = p.add_mutually_exclusive_group(required=True)
    steps.add_argument("--steps", default=None, metavar="STEPS.json",
                       help="step times fitted on this machine: the JSON `padoc-ray bench steps --json` writes")
    steps.add_argument("--gpu", default=None, metavar="GPU",
                       help="step times from a roofline of this GPU (A800-80G, H100-80G, H200, L40S)")
    p.add_argument("--model-config", default=None, metavar="DIR|NAME",
                   help="with --gpu: the modeled model's shape and image processor, a checkpoint directory or a "
                        "built-in one: qwen3-vl-2b (Qwen3-VL-2B, PaDoc's base) or hpd-1b (HPD-Parsing, "
                        "InternVL3.5-1B-based: 448-px tiles plus a thumbnail, 256 tokens each)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="checkpoint whose token protocol and tokenizer make the traces (and, with --steps, whose "
                        "image processor counts image tokens)")
    add_fields(p, ModelBenchConfig, ("concurrency", "mode", "pages", "gpu_hour_usd", "max_num_seqs",
                                     "max_num_batched_tokens", "block_size", "kv_blocks"))
    p.add_argument("--compare", default=None, metavar="BENCH_SERVE_OUT",
                   help="a bench serve output folder: its measured valid pages/s beside each modeled cell")
    p.add_argument("--out", required=True, help="output folder")
    add_scheduler_flags(p)
    p.set_defaults(func=cmd_bench_model)
