"""``bench ...``: every benchmark command; the measuring code lives in :mod:`padoc_ray.bench`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

from padoc_ray.cli.common import DEFAULT_MODEL, EXAMPLES_DIR, add_command, die, group_help, int_list
from padoc_ray.cli.flags import (
    add_fields,
    add_max_num_seqs,
    add_scheduler_flags,
    engine_overrides,
    from_args,
    scheduler_from_args,
)
from padoc_ray.scheduler.state import DECODE_MODES


def _pdf_paths(spec: str) -> list[str]:
    """PDFs of a folder (searched recursively) or a glob; exits with a clear error when there are none."""
    import glob

    paths = sorted(glob.glob(os.path.join(spec, "**", "*.pdf"), recursive=True)) if os.path.isdir(spec) \
        else sorted(glob.glob(spec))
    if not paths:
        die(f"no PDFs at {spec}")
    return paths


def _add_json(p: argparse.ArgumentParser) -> None:
    """The benchmarks' ``--json`` flag (see :func:`_write_json`)."""
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write the results here as JSON")


def _write_json(path: str | None, obj, *, announce: bool = True) -> None:
    """``--json PATH``: the benchmark's figures as JSON (nothing when the flag is absent)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
    if announce:
        print(f"wrote {path}")


def cmd_bench_raster(args) -> int:
    from padoc_ray.bench.raster import run

    res = run(_pdf_paths(args.input), args.dpi, args.workers, encoding=args.encoding)
    print(json.dumps(res, indent=2))
    _write_json(args.json, res, announce=False)
    return 0



def cmd_bench_pipeline(args) -> int:
    from padoc_ray.bench.pipeline import run

    paths = _pdf_paths(args.input)
    if not os.path.exists(os.path.join(args.model, "padoc_protocol.json")):
        die(f"{args.model} is not a padoc-ray checkpoint (no padoc_protocol.json)")
    res = run([os.path.abspath(p) for p in paths], os.path.abspath(args.model), args.dpi, args.workers,
              pages_in_flight=args.pages_in_flight, cpus_per_actor=args.cpus_per_actor, raster_cpus=args.raster_cpus)
    raw, pipe = res["raw_raster"], res["noop_pipeline"]
    print(f"raw raster stage ({args.workers} processes): {raw['before']['pages_per_s']} / {raw['after']['pages_per_s']} "
          f"pages/s (before / after), mean {raw['mean_pages_per_s']}")
    print(f"no-op pipeline: {pipe['pages']} pages in {pipe['seconds']} s (Ray start {pipe['ray_init_s']} s): "
          f"{pipe['pages_per_s']} pages/s wall; the job alone (cluster up) {pipe['job_seconds']} s, "
          f"{pipe['job_pages_per_s']} pages/s")
    steady = f", {res['ratio_steady']:.0%} (steady: {pipe['steady_pages_per_s']} pages/s)" if res["ratio_steady"] else ""
    print(f"pipeline / raw: {res['ratio_wall']:.0%} (wall), {res['ratio_job']:.0%} (job on a running cluster){steady}")
    _write_json(args.json, res, announce=False)
    return 0


def cmd_bench_driver(args) -> int:
    from padoc_ray.bench.driver import run

    if args.pages < args.pages_per_doc or args.pages_per_doc < 1 or args.rows_per_file < 1:
        die("--pages must be >= --pages-per-doc >= 1 and --rows-per-file >= 1")
    res = run(args.pages, args.pages_per_doc, args.rows_per_file, args.scratch, args.workers)
    b = res["breakdown"]
    print(f"{res['page_rows']} page rows, {res['inputs']} inputs, {res['files']} files: plan {b['plan_s']} s "
          f"+ documents table {b['documents_s']} s = {res['seconds']} s; peak RSS "
          f"{res['peak_rss_bytes'] / 2**30:.2f} GiB; footers read {res['footers_read']}; rows from key indexes {res['rows_from_index']}, page files read {res['files_read']}; load {res['load_avg']}")
    _write_json(args.json, res, announce=False)
    return 0


def cmd_bench_http(args) -> int:
    from padoc_ray.bench.serving.http import format_table, run

    for path, what in ((args.gt, "--gt"), (args.model, "--model")):
        if not os.path.exists(path):
            die(f"{what}: {path} does not exist")
    try:
        report = run(os.path.abspath(args.model), os.path.abspath(args.gt), _pdf_paths(args.input), args.concurrency,
                     requests=args.requests, warmup=args.warmup, out_dir=args.out,
                     constrain_layout=args.constrain_layout)
    except ValueError as e:
        die(str(e))
    print(format_table(report))
    if args.out:
        print(f"wrote {os.path.join(args.out, 'http_bench.json')}")
    return 0



def cmd_bench_pageiou(args) -> int:
    from padoc_ray.bench.pageiou import run
    from padoc_ray.eval.layout import LayoutInputError

    try:
        res = run(pages=args.pages, boxes=args.boxes, seed=args.seed, gt=args.gt, grid=args.grid,
                  raster_pages=args.raster_pages, min_seconds=args.min_seconds)
    except LayoutInputError as e:
        die(str(e))
    print("| set | pages | boxes/page | exact pages/s | raster pages/s | exact/raster | max metric diff "
          "| max area diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['set']} | {r['pages']} | {r['boxes_per_page']} | {r['exact_pages_per_s']:.1f} | "
              f"{r['raster_pages_per_s']:.2f} | {r['speedup']:.0f}x | {r['max_metric_diff']:.2e} "
              f"| {r['max_area_diff']:.2e} |")
    print(f"(raster timed on the first {args.raster_pages} pages of each set, grid {args.grid}; "
          "one process, all four protocols and five classes per page; diffs are the largest per-page differences "
          "between the backends, areas as fractions of the page)")
    _write_json(args.json, res, announce=False)
    return 0




def _attention_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from padoc_ray.bench.attention import AttentionBenchConfig

    add_fields(p, AttentionBenchConfig, [f.name for f in dataclasses.fields(AttentionBenchConfig)])
    _add_json(p)
    p.set_defaults(func=cmd_bench_attention)
    return p


def cmd_bench_attention(args) -> int:
    import sys

    from padoc_ray.bench.attention import AttentionBenchConfig, format_table, run_bench

    try:
        cfg = from_args(AttentionBenchConfig, args)
    except ValueError as e:
        return die(str(e), prog="padoc-ray bench attention", exit=False)
    try:
        results = run_bench(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as e:
        return die(str(e), prog="padoc-ray bench attention", exit=False)
    print(format_table(results))
    _write_json(args.json, results)
    return 0


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m for m in text.split(",") if m)
    if not modes or not set(modes) <= set(DECODE_MODES):
        die(f"--modes takes {' and/or '.join(DECODE_MODES)}")
    return modes


def add_host_args(p: argparse.ArgumentParser) -> None:
    """The engine host's knobs shared by `bench serve` and `bench replay`: every SchedulerConfig field,
    --max-num-seqs and --max-live-branches (defaults: the config dataclasses')."""
    from padoc_ray.host import HostConfig

    add_scheduler_flags(p)
    add_max_num_seqs(p)
    add_fields(p, HostConfig, ("max_live_branches", "inject_loops", "inject_seed"))


def _host_cfg(args, pages_in_flight: int):
    from padoc_ray.host import HostConfig

    try:
        return from_args(HostConfig, args, pages_in_flight=pages_in_flight, scheduler=scheduler_from_args(args),
                         engine_overrides=engine_overrides(args))
    except ValueError as e:
        die(str(e))


def cmd_bench_serve(args) -> int:
    from padoc_ray.bench.serving.run import ModeError, PageSetError, ServeBenchConfig, run

    if len(args.gt) != len(args.images):
        die(f"--gt and --images pair up in order: got {len(args.gt)} --gt and {len(args.images)} --images")
    if not os.path.isdir(args.model):
        die(f"--model: {args.model} is not a folder")
    try:
        cfg = from_args(ServeBenchConfig, args, modes=_modes(args.modes))
    except ValueError as e:
        die(str(e))
    host_cfg = _host_cfg(args, max(cfg.concurrency))
    if cfg.speed_probe and not os.path.isfile(cfg.speed_probe_image):
        die(f"--speed-probe-image: {cfg.speed_probe_image} is not a file")
    log = lambda m: print(m, file=sys.stderr, flush=True)
    try:
        report = run(list(zip(args.gt, args.images)), os.path.abspath(args.model), cfg, host_cfg, args.out, log=log)
    except (PageSetError, ModeError) as e:
        die(str(e))
    with open(os.path.join(args.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"wrote {args.out}/report.json, report.md, pages.jsonl and {', '.join(report['plots']) or 'no plots'}")
    return 0


def _service_bench(args, cls, run) -> dict:
    """A benchmark that starts its own `padoc-ray serve`: its config from the flags, its report to --json."""
    from padoc_ray.cli.common import ROOT

    try:
        report = run(from_args(cls, args), ROOT, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, RuntimeError) as e:
        die(str(e))
    _write_json(args.json, report)
    return report


def cmd_bench_soak(args) -> int:
    from padoc_ray.bench.soak.run import SoakConfig, run

    report = _service_bench(args, SoakConfig, run)
    keys = ("requests", "http_5xx", "http_503_retry_after", "jobs_lost", "job_pages_duplicated")
    print(json.dumps({**{k: report[k] for k in keys}, "rss_slope_mb_per_h": report["rss_slope_mb_per_h"],
                      "rss_floor_slope_mb_per_h": report["rss_floor_slope_mb_per_h"]}, indent=2))
    return 1 if report["http_5xx"] or report["jobs_lost"] or report["job_pages_duplicated"] else 0


def cmd_bench_fairness(args) -> int:
    from padoc_ray.bench.serving.fairness import FairnessConfig, run

    report = _service_bench(args, FairnessConfig, run)
    print(json.dumps({k: report[k] for k in ("idle", "loaded", "p95_loaded_over_idle", "job")}, indent=2))
    return 0


def cmd_bench_replay(args) -> int:
    """`bench replay`: the serving benchmark with its old defaults (C=1,4,16, every page) and its old
    output (summary.json, pages.jsonl, the table on stdout), plus report.json/report.md."""
    import json

    from padoc_ray.bench.serving.run import ModeError, PageSetError, ServeBenchConfig, run
    from padoc_ray.perfmodel.table3 import format_table, legacy_summary

    for path, what in ((args.gt, "--gt"), (args.images, "--images"), (args.model, "--model")):
        if not os.path.exists(path):
            die(f"{what}: {path} does not exist")
    try:
        cfg = ServeBenchConfig(concurrency=tuple(args.concurrency), pages=args.limit, modes=_modes(args.modes),
                               warmup=args.warmup)
    except ValueError as e:
        die(str(e))
    try:
        report = run([(args.gt, args.images)], args.model, cfg, _host_cfg(args, max(cfg.concurrency)), args.out,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    except (PageSetError, ModeError) as e:
        die(str(e))
    summary = legacy_summary(report)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(format_table(summary))
    print(f"wrote {os.path.join(args.out, 'summary.json')} and pages.jsonl (and report.json, report.md)")
    return 0


def cmd_bench_steps(args) -> int:
    from padoc_ray.bench.steps.run import StepsConfig, format_report, run
    from padoc_ray.pdf import PdfError

    if not os.path.isdir(args.model):
        die(f"--model: model directory not found: {args.model} (build one with: padoc-ray build-tiny-model {args.model})")
    if not os.path.exists(os.path.join(args.model, "padoc_protocol.json")):
        die(f"--model: {args.model} is not a padoc-ray checkpoint bench steps can measure (no padoc_protocol.json: "
            f"it fits the padoc family's step costs, which bench model then prices)")
    if not os.path.isfile(args.image):
        die(f"--image: {args.image} is not a file")
    try:
        cfg = from_args(StepsConfig, args)
    except ValueError as e:
        die(f"bench steps: {e}")
    log = lambda m: print(m, file=sys.stderr, flush=True)
    overrides = engine_overrides(args)
    try:
        rep = run(os.path.abspath(args.model), args.image, cfg, engine_overrides=overrides, log=log)
    except PdfError as e:
        die(f"--image: {args.image}: {e}")
    except ValueError as e:
        die(f"bench steps: {e}")
    print(format_report(rep))
    _write_json(args.json, rep)
    return 0


def register(sub) -> None:
    bench = add_command(sub, "bench", help="benchmarks (serve: fork vs sequential serving at C=16..256)",
                           description="Benchmarks whose figures go in reports, never in tests.")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    br = add_command(bsub, "replay", help="fork vs sequential on one engine, teacher-forced with ground truth",
                         description="Replay OmniDocBench-format pages on one engine, fork vs sequential, at each "
                                     "concurrency (closed loop), teacher-forced so a random-weight model does a "
                                     "trained model's work. Writes OUT/summary.json and OUT/pages.jsonl and prints "
                                     "a table.")
    br.add_argument("--gt", required=True, help="OmniDocBench-format ground-truth JSON")
    br.add_argument("--images", required=True, help="folder holding each page's image_path")
    br.add_argument("--model", required=True, help="checkpoint directory")
    br.add_argument("--concurrency", type=int_list, default=[1, 4, 16], help="comma list (default 1,4,16)")
    br.add_argument("--modes", default=",".join(DECODE_MODES), help=f"comma list (default {','.join(DECODE_MODES)})")
    br.add_argument("--out", required=True, help="output folder")
    br.add_argument("--limit", type=int, default=None, help="use only the first N pages")
    br.add_argument("--warmup", type=int, default=2, help="untimed warm-up pages per mode (default 2)")
    add_host_args(br)
    br.set_defaults(func=cmd_bench_replay)
    from padoc_ray.bench.serving.run import ServeBenchConfig

    d = ServeBenchConfig()
    p = add_command(
        bsub, "serve", help="the paper's serving benchmark: fork vs sequential at C=16..256, tables and plots",
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
    add_fields(p, ServeBenchConfig, ("concurrency", "pages", "target"))
    p.add_argument("--modes", default=",".join(d.modes), help="comma list (default fork,sequential)")
    add_fields(p, ServeBenchConfig, ("warmup", "replay", "speed_probe", "speed_probe_image"))
    p.add_argument("--out", required=True, help="output folder")
    add_host_args(p)
    p.set_defaults(func=cmd_bench_serve)
    from padoc_ray.bench.steps.run import StepsConfig

    from padoc_ray.bench import loops

    bl = add_command(bsub, "loops",
                     help="the loop detector on every ground-truth page: false positives, and its cost per step",
                     description="Teacher-force every ground-truth page the project has (the demo pages and the "
                                 "corpus generator over --seeds) through the scheduler's loop detectors, stream by "
                                 "stream, as replay serializes them; print the stops (0 on real pages) and the "
                                 "closest any real stream came to one. --cost also times the detector per engine "
                                 "step at --streams live streams.")
    bl.add_argument("--model", required=True, help="a checkpoint directory (its tokenizer and padoc_protocol.json)")
    add_fields(bl, loops.LoopsConfig, ("seeds", "pages_per_run", "profiles", "gt", "workers", "cost", "streams", "steps",
                                       "json"))
    bl.set_defaults(func=lambda a: loops.run(from_args(loops.LoopsConfig, a, model=a.model)))
    from padoc_ray.bench import viewer as viewer_bench

    bv = add_command(bsub, "viewer", help="the viewer on a large synthetic output: time to first byte and full load",
                     description="Build (once, cached in --scratch) the driver benchmark's synthetic output and its "
                                 "documents table, serve it with padoc-ray view's app on a free local port, and time "
                                 "the documents table, a filter, a search and a page view, cold and warm.")
    add_fields(bv, viewer_bench.ViewerBenchConfig, ("pages", "scratch", "json"))
    bv.set_defaults(func=lambda a: viewer_bench.main(from_args(viewer_bench.ViewerBenchConfig, a)))
    from padoc_ray.cli.bench_model import register_model

    register_model(bsub)
    bst = add_command(bsub, "steps", help="engine decode step time vs batch size: is this machine in fork's regime?",
                      description="On the real engine with the serving settings for this machine: for each batch "
                                  "size n, n requests sharing one page image and prompt (one page's branches) each "
                                  "decode --tokens teacher-forced tokens at once. Prints step time and tokens/s per "
                                  "n, the fit step = fixed + per_seq x n, and for each n (read as C pages decoded one "
                                  "stream each) the batching gain left: how much more token throughput a larger "
                                  "batch gets here. With --series it also measures what the engine model "
                                  "(bench model --steps) fits: prefill tokens, context length over one shared "
                                  "prefix and over prefixes of each sequence's own, bursts of requests admitted "
                                  "together, and the vision encoder per image.")
    bst.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint directory (default {DEFAULT_MODEL})")
    bst.add_argument("--image", default=os.path.join(EXAMPLES_DIR, "paper.pdf"),
                     help="page image, or a PDF whose first page is rendered as the batch job does "
                          "(default examples/paper.pdf)")
    add_fields(bst, StepsConfig, ("batches", "tokens", "repeat", "series", "prefill", "context", "context_batch",
                                  "distinct", "distinct_batch", "admit", "admit_prefix", "image_sides",
                                  "series_repeat"))
    bst.add_argument("--max-num-seqs", type=int, default=None,
                     help="engine max_num_seqs (default: the engine preset's); every batch size must fit")
    _add_json(bst)
    bst.set_defaults(func=cmd_bench_steps)
    bra = add_command(bsub, "raster", help="rasterization pages/s: padoc-ray's raster stage vs pdftoppm",
                          description="Rasterize the same PDFs at the same DPI with pypdfium2 (render only), with "
                                      "the batch job's raster stage (isolated renderer process + page encoding, and the "
                                      "same in process, to show the cost of isolation), render + PNG in process, and "
                                      "pdftoppm (poppler), each with 1 and N processes, and print pages/s.")
    bra.add_argument("--input", required=True, help="folder (searched recursively) or glob of PDFs")
    bra.add_argument("--dpi", type=float, default=144, help="resolution for every tool (default 144)")
    bra.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    bra.add_argument("--encoding", choices=("zstd", "png", "ppm"), default="zstd",
                     help="page encoding of the raster stage variants (default zstd, the batch job's default)")
    _add_json(bra)
    bra.set_defaults(func=cmd_bench_raster)
    p = add_command(bsub, "pageiou", help="PageIoU pages/s: exact (coordinate compression) vs raster backend",
                        description="Time PageIoU's exact backend against the raster cross-check on random "
                                    "layouts and, with --gt, on a jittered copy of a ground-truth file, and report "
                                    "pages/s (all modes and classes of a page per evaluation) and the largest "
                                    "per-page metric difference between the backends.")
    p.add_argument("--pages", type=int, default=200, help="random pages (default 200)")
    p.add_argument("--boxes", type=int, default=30, help="ground-truth boxes per random page (default 30)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--gt", default=None, metavar="GT.json", help="also bench on this OmniDocBench ground truth")
    p.add_argument("--grid", type=int, default=1000, help="raster grid (default 1000)")
    p.add_argument("--raster-pages", type=int, default=10, help="pages per set the raster backend is timed on "
                                                                "(it is slow; default 10)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="time each backend at least this long (default 1)")
    _add_json(p)
    p.set_defaults(func=cmd_bench_pageiou)
    p = add_command(bsub,
        "attention", help="ancestor attention backends (dense, flex, tree_varlen): time, memory, agreement",
        description="Run each ancestor-attention backend forward+backward on a random packed tree per length "
                    "(prefix about S/2, forks spread over it, the rest split among the branches) and report "
                    "median seconds, peak memory and the largest difference from the dense reference. Runs "
                    "that cannot happen (flex backward on CPU, over the memory budget) are recorded as errors.")
    _attention_args(p)
    bpi = add_command(bsub, "pipeline", help="batch-job overhead: no-op engine pipeline vs raw rasterization",
                          description="Run the raster stage's work (render + zstd page encoding) in a plain process pool, then the "
                                      "whole batch job on a local Ray with the no-op engine, then the raw side again; "
                                      "print pages/s of both and the ratio (wall with local Ray start, and the job alone on the "
                                      "running cluster). The no-op actor stands for a GPU engine, so by default it "
                                      "reserves no CPU (--cpus-per-actor 0).")
    bpi.add_argument("--input", required=True, help="folder (searched recursively) or glob of PDFs")
    bpi.add_argument("--model", required=True, help="checkpoint directory (only its protocol and tokenizer are used)")
    bpi.add_argument("--dpi", type=float, default=144, help="resolution (default 144)")
    bpi.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="raw-side processes (default: all cores)")
    bpi.add_argument("--pages-in-flight", type=int, default=64, help="pages in flight in the actor (default 64)")
    bpi.add_argument("--cpus-per-actor", type=float, default=0.0, help="CPUs reserved by the no-op actor (default 0)")
    bpi.add_argument("--raster-cpus", type=float, default=0.25, help="CPUs per raster task (default 0.25, as the batch job)")
    _add_json(bpi)
    bpi.set_defaults(func=cmd_bench_pipeline)
    bd = add_command(bsub, "driver", help="the batch driver's bookkeeping (plan + documents table) over N page rows",
                         description="Build a synthetic batch-job output once (pages/ as many Parquet files in the "
                                     "job's schema and naming, written by two runs, with document errors, retries, "
                                     "incomplete and missing inputs and an unreadable leftover mixed in, plus the "
                                     "runs' commit records), cached in --scratch; then, in a fresh process, time what "
                                     "the driver does around a run: prove the files complete, scan the key columns, "
                                     "plan, list again and add the files written since (none: no pipeline runs), "
                                     "and write documents/documents.parquet. Prints and writes seconds, peak RSS "
                                     "(the fresh process's) and a breakdown. Building 100M rows takes ~15 min on 2 "
                                     "cores and 2.4 GiB of files (~2.9 GiB of disk in 4 KiB blocks).")
    bd.add_argument("--pages", type=int, required=True, help="page rows to synthesize, e.g. 1000000")
    bd.add_argument("--pages-per-doc", type=int, default=10, help="pages per input document (default 10)")
    bd.add_argument("--rows-per-file", type=int, default=1000,
                    help="page rows per Parquet file (default 1000; the job writes at least --rows-per-file 64)")
    bd.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "padoc-bench-driver"),
                    help="where synthetic outputs are built and kept, one folder per size (default: "
                         "$TMPDIR/padoc-bench-driver; 100M rows: 2.4 GiB of files, ~2.9 GiB of disk)")
    bd.add_argument("--workers", type=int, default=2, help="processes building the synthetic output (default 2)")
    _add_json(bd)
    bd.set_defaults(func=cmd_bench_driver)
    from padoc_ray.bench.soak.run import SoakConfig

    bso = add_command(bsub, "soak", help="a long mixed-traffic run of the online endpoint: RSS slopes, 5xx, lost jobs",
                      description="Start `padoc-ray serve` (its own local Ray, a bearer token), run --clients "
                                  "closed-loop clients for --minutes with a mix of sync parses, NDJSON streams, jobs "
                                  "(some cancelled), chat completions, bad inputs (must get 4xx) and client "
                                  "disconnects, drain the jobs, stop the server with SIGTERM, and write the figures: "
                                  "RSS slope (MB/h, after the warm-up) of every Serve process, and the slope of "
                                  "its floor (each 5-minute window's lowest sample: what a leak raises and work in "
                                  "flight does not), 5xx (503 with "
                                  "Retry-After apart), lost jobs, duplicated job pages, latency per kind. Exits 1 "
                                  "when there were 5xx, lost jobs or duplicated pages.")
    add_fields(bso, SoakConfig, ("minutes", "clients", "engine", "model", "replay", "warmup_fraction",
                                 "sample_interval_s", "drain_s", "seed"))
    bso.add_argument("--json", required=True, metavar="OUT.json", help="write the report here")
    bso.set_defaults(func=cmd_bench_soak)
    from padoc_ray.bench.serving.fairness import FairnessConfig

    bf = add_command(bsub, "fairness", help="one tenant's one-page latency while another tenant's long job runs",
                     description="Start `padoc-ray serve --tenant-header`, time tenant B's sequential one-page "
                                 "/v1/parse requests on the idle service, then while tenant A's --job-pages job "
                                 "runs; print P50/P95 of both, the loaded/idle P95 ratio (target: within 2x) and "
                                 "the job's progress during the probes.")
    add_fields(bf, FairnessConfig, ("engine", "model", "job_pages", "probes", "max_job_pages_in_flight",
                                    "max_job_pages_beside_interactive"))
    bf.add_argument("--json", required=True, metavar="OUT.json", help="write the report here")
    bf.set_defaults(func=cmd_bench_fairness)
    bh = add_command(bsub, "http", help="the Serve endpoint's overhead: HTTP clients vs the engine host directly",
                         description="Send the same one-page requests (teacher-forced) to a PageHost directly and to "
                                     "the Serve endpoint (padoc-ray serve's application on a local Ray) over HTTP, in "
                                     "closed loops at each concurrency, one side after the other; print pages/s and "
                                     "P50/P95 latency of both and HTTP pages/s as a fraction of direct.")
    bh.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint directory (default {DEFAULT_MODEL})")
    bh.add_argument("--input", default=EXAMPLES_DIR, help="folder or glob of PDFs (default: the bundled examples)")
    bh.add_argument("--gt", default=os.path.join(EXAMPLES_DIR, "ground_truth.json"),
                    help="ground truth covering every page of --input (default: the examples')")
    bh.add_argument("--concurrency", type=int_list, default=[1, 8, 32], help="clients, e.g. 1,8,32 (default)")
    bh.add_argument("--requests", type=int, default=64, help="one-page requests per concurrency and side (default 64)")
    bh.add_argument("--warmup", type=int, default=4, help="untimed requests per side first (default 4)")
    bh.add_argument("--out", default=None, help="folder for http_bench.json")
    from padoc_ray.scheduler import SchedulerConfig

    add_fields(bh, SchedulerConfig, ("constrain_layout",))
    bh.set_defaults(func=cmd_bench_http)
    group_help(bench)
