"""`padoc-ray bench serve` and `bench replay`: argument parsing and the thin commands over
:mod:`padoc_ray.bench.serve`."""

from __future__ import annotations

import argparse
import os
import sys


def _die(msg: str) -> None:
    print(f"padoc-ray: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def int_list(text: str) -> list[int]:
    """'16,32,64' -> [16, 32, 64]; positive integers only (an argparse type)."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"values must be positive integers, got {text!r}")
    return vals


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m for m in text.split(",") if m)
    if not modes or not set(modes) <= {"fork", "sequential"}:
        _die("--modes takes fork and/or sequential")
    return modes


def add_host_args(p: argparse.ArgumentParser) -> None:
    """The engine host's knobs shared by `bench serve` and `bench replay` (defaults: the config dataclasses')."""
    from padoc_ray.engine.config import EngineConfig
    from padoc_ray.scheduler import SchedulerConfig

    p.add_argument("--max-tokens", type=int, default=SchedulerConfig.max_tokens,
                   help=f"generated tokens per stream (default {SchedulerConfig.max_tokens})")
    p.add_argument("--max-branches", type=int, default=SchedulerConfig.max_branches,
                   help=f"branches per page (default {SchedulerConfig.max_branches})")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"engine max_num_seqs (default: the engine preset's, {EngineConfig.max_num_seqs})")
    p.add_argument("--layout-priority", action="store_true",
                   help="run layout streams ahead of branches (vLLM priority scheduling)")
    p.add_argument("--max-live-branches", type=int, default=None,
                   help="cap on content branches live in the engine at once, over all pages (default: none)")
    p.add_argument("--stream-branches", action="store_true",
                   help="stream branch tokens (the runaway guard can stop a branch early) instead of taking each "
                        "branch's output once at its end (the default)")


def _host_cfg(args, pages_in_flight: int):
    from padoc_ray.bench.serve import host_config

    try:
        return host_config(pages_in_flight=pages_in_flight, max_tokens=args.max_tokens, max_branches=args.max_branches,
                           max_num_seqs=args.max_num_seqs, layout_priority=args.layout_priority,
                           max_live_branches=args.max_live_branches, stream_branches=args.stream_branches)
    except ValueError as e:
        _die(str(e))


def cmd_bench_serve(args) -> int:
    from padoc_ray.bench.serve import PageSetError, ServeBenchConfig, run

    if len(args.gt) != len(args.images):
        _die(f"--gt and --images pair up in order: got {len(args.gt)} --gt and {len(args.images)} --images")
    if not os.path.isdir(args.model):
        _die(f"--model: {args.model} is not a folder")
    try:
        cfg = ServeBenchConfig(concurrency=tuple(args.concurrency), pages=args.pages, modes=_modes(args.modes),
                               warmup=args.warmup, target=args.target)
    except ValueError as e:
        _die(str(e))
    host_cfg = _host_cfg(args, max(cfg.concurrency))
    log = lambda m: print(m, file=sys.stderr, flush=True)
    try:
        report = run(list(zip(args.gt, args.images)), os.path.abspath(args.model), cfg, host_cfg, args.out, log=log)
    except PageSetError as e:
        _die(str(e))
    with open(os.path.join(args.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"wrote {args.out}/report.json, report.md, pages.jsonl and {', '.join(report['plots']) or 'no plots'}")
    return 0


def cmd_bench_replay(args) -> int:
    """`bench replay`: the serving benchmark with its old defaults (C=1,4,16, every page) and its old
    output (summary.json, pages.jsonl, the table on stdout), plus report.json/report.md."""
    import json

    from padoc_ray.bench.serve import PageSetError, ServeBenchConfig, run
    from padoc_ray.bench.serve_report import format_table, legacy_summary

    for path, what in ((args.gt, "--gt"), (args.images, "--images"), (args.model, "--model")):
        if not os.path.exists(path):
            _die(f"{what}: {path} does not exist")
    try:
        cfg = ServeBenchConfig(concurrency=tuple(args.concurrency), pages=args.limit, modes=_modes(args.modes),
                               warmup=args.warmup)
    except ValueError as e:
        _die(str(e))
    try:
        report = run([(args.gt, args.images)], args.model, cfg, _host_cfg(args, max(cfg.concurrency)), args.out)
    except PageSetError as e:
        _die(str(e))
    summary = legacy_summary(report)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(format_table(summary))
    print(f"wrote {os.path.join(args.out, 'summary.json')} and pages.jsonl (and report.json, report.md)")
    return 0


def add_bench_parser(bsub) -> None:
    from padoc_ray.bench.serve import ServeBenchConfig

    d = ServeBenchConfig()
    p = bsub.add_parser(
        "serve", help="the paper's serving benchmark: fork vs sequential at C=16..256, tables and plots",
        description="Closed loops keeping C pages in flight, fork and sequential on one engine and one page set "
                    "(OmniDocBench-format ground truth + page images, teacher-forced), warm-up first; on a PageHost "
                    "here (--target direct) or the Serve endpoint on a local Ray over HTTP (--target http). "
                    "Writes OUT/report.json (one row per mode and C), OUT/report.md (tables like the paper's "
                    "Tables 3 and 11), OUT/pages.jsonl and PNG plots (valid pages/s and P95 vs C).")
    p.add_argument("--gt", action="append", required=True, metavar="GT.json",
                   help="OmniDocBench-format ground truth; repeat it (with --images) to add page sets, in order")
    p.add_argument("--images", action="append", required=True, metavar="DIR",
                   help="folder holding each page's image_path; one per --gt, in the same order")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--concurrency", type=int_list, default=list(d.concurrency),
                   help=f"comma list of pages in flight (default {','.join(map(str, d.concurrency))})")
    p.add_argument("--pages", type=int, default=d.pages,
                   help=f"use the first N pages of the set, all when fewer exist (default {d.pages}, the paper's)")
    p.add_argument("--target", choices=("direct", "http"), default=d.target,
                   help="direct: a PageHost in this process; http: the Serve endpoint (default direct)")
    p.add_argument("--modes", default=",".join(d.modes), help="comma list (default fork,sequential)")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"untimed warm-up pages per mode (default {d.warmup})")
    p.add_argument("--out", required=True, help="output folder")
    add_host_args(p)
    p.set_defaults(func=cmd_bench_serve)
