"""The ``padoc-ray`` command line. Argument parsing lives here only; each command calls library code.

Run ``padoc-ray --help`` for the list of commands and ``padoc-ray COMMAND --help`` for each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEFAULT_MODEL = os.path.join(os.path.dirname(EXAMPLES_DIR), "models", "tiny")


def _die(msg: str, code: int = 2) -> None:
    print(f"padoc-ray: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def parse_page_ranges(text: str | None) -> list[int] | None:
    """'1-3,7' (1-based, inclusive) -> [0, 1, 2, 6]; None -> None (all pages). For argparse."""
    from padoc_ray.pipeline.rows import PageRangeError
    from padoc_ray.pipeline.rows import parse_page_ranges as parse

    try:
        got = parse(text)
    except PageRangeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return None if got is None else list(got)


# ---- build-tiny-model ---------------------------------------------------------------------------
def cmd_build_tiny_model(args) -> int:
    import time

    from padoc_ray.model_kit.tiny import TinyModelConfig, build_tiny_model

    t = time.perf_counter()
    try:
        cfg = TinyModelConfig(seed=args.seed, tie_word_embeddings=args.tie_word_embeddings)
        out = build_tiny_model(args.out, cfg=cfg, force=args.force, base=args.base)
    except FileExistsError as e:
        _die(str(e))
    n = os.path.getsize(os.path.join(out, "model.safetensors"))
    what = "Qwen3-VL base (no protocol tokens)" if args.base else "PaDoc Qwen3-VL checkpoint"
    print(f"built tiny {what} in {out} ({n / 1e6:.1f} MB float32, {time.perf_counter() - t:.1f}s)")
    if args.base:
        print(f"make it a PaDoc checkpoint with: padoc-ray init-model --base {out} --out DIR")
    return 0


# ---- init-model ---------------------------------------------------------------------------------
def cmd_init_model(args) -> int:
    import time

    from padoc_ray.model_kit.init_model import InitModelError, VerifyError, init_model
    from padoc_ray.pipeline.storage import StorageConfig
    from padoc_ray.protocol import ProtocolError, ProtocolSpec

    t = time.perf_counter()
    try:
        spec = ProtocolSpec.load(args.spec) if args.spec else ProtocolSpec()
    except (ProtocolError, OSError) as e:
        _die(f"--spec {args.spec}: {e}")
    try:
        s = init_model(args.base, args.out, spec=spec, force=args.force, verify=args.verify,
                       storage=StorageConfig(endpoint=args.s3_endpoint))
    except (InitModelError, FileNotFoundError) as e:
        _die(str(e))
    except VerifyError as e:
        _die(f"{e}; nothing was written to {args.out}", code=1)
    first, last = s["new_token_ids"] or (None, None)
    print(f"PaDoc checkpoint in {s['out']}: +{s['added_tokens']} protocol tokens (ids {first}..{last}), vocabulary "
          f"{s['base_tokenizer_len']} -> {s['tokenizer_len']} tokens, embedding rows {s['vocab_rows'][0]} -> "
          f"{s['vocab_rows'][1]} ({'tied' if s['tie_word_embeddings'] else 'untied'} LM head, {s['dtype']}); "
          f"new rows = mean of the base token rows")
    if "verify" in s:
        v = s["verify"]
        print(f"verified in vLLM: engine up in {v['engine_start_s']}s, generated {len(v['free_tokens'])} tokens, "
              f"forced protocol region reproduced ({len(v['forced_tokens'])} tokens)")
    else:
        print("not verified in vLLM (--no-verify)")
    print(f"done in {time.perf_counter() - t:.1f}s")
    return 0


# ---- local parsing (demo, parse-page) -----------------------------------------------------------
def _scheduler_cfg(args):
    from padoc_ray.scheduler import SchedulerConfig

    return SchedulerConfig(max_tokens=args.max_tokens, max_branches=args.max_branches, deadline_s=args.deadline,
                           constrain_layout=args.constrain_layout)


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("fork", "sequential"), default="fork",
                   help="fork: layout stream + concurrent content branches (PaDoc); sequential: one "
                        "interleaved stream (the paper's baseline). Default: fork")
    p.add_argument("--max-tokens", type=int, default=8192, help="generated tokens per stream (default 8192)")
    p.add_argument("--max-branches", type=int, default=255, help="content branches per page (default 255)")
    p.add_argument("--deadline", type=float, default=None, help="seconds per page before it is cut (default: none)")
    _add_constrain_layout(p)
    p.add_argument("--longest-side", type=int, default=1600, help="render PDF pages to this many pixels (default 1600)")
    p.add_argument("--dpi", type=float, default=None, help="render PDF pages at this DPI instead of --longest-side")


def _add_constrain_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--constrain-layout", action="store_true", help="keep each layout stream in the checkpoint's layout grammar (a logits mask: category, ordered box coordinates, region close; at most --max-branches regions), so no page ends malformed_layout; teacher-forced tokens still win (default: off)")


def _run_local(model: str, paths: list[str], args, *, pages=None, gt: str | None = None, concurrency: int = 4):
    from padoc_ray.hf_tokenizer import ModelProtocol
    from padoc_ray.host import HostConfig, PageHost
    from padoc_ray.local import load_pages, load_truth, parse_local
    from padoc_ray.pdf import RenderConfig
    from padoc_ray.protocol import ProtocolError

    try:
        proto = ModelProtocol(model)
    except (ProtocolError, OSError) as e:
        _die(f"cannot load model {model}: {e}")
    render = RenderConfig(longest_side=args.longest_side, dpi=args.dpi)
    items = load_pages(paths, render=render, pages=pages)

    if not any(it.page is not None for it in items):
        return items, [None] * len(items)
    cfg = HostConfig(mode=args.mode, scheduler=_scheduler_cfg(args), pages_in_flight=concurrency)

    async def go():
        host = await PageHost(model, cfg, truth=load_truth(gt), proto=proto).start()
        try:
            return await parse_local(host, items)
        finally:
            host.shutdown()

    return items, asyncio.run(go())


def cmd_parse_page(args) -> int:
    from padoc_ray.protocol import to_json, to_markdown

    if not os.path.exists(args.input):
        _die(f"no such file: {args.input}")
    if not os.path.isdir(args.model):
        _die(f"model directory not found: {args.model} (build one with: padoc-ray build-tiny-model {args.model})")
    pages = [args.page - 1] if args.page else None
    items, recs = _run_local(args.model, [args.input], args, pages=pages, gt=args.replay, concurrency=1)
    if not items:
        _die(f"page {args.page} does not exist in {args.input}")
    rc = 0
    for it, rec in zip(items, recs):
        if rec is None:
            print(f"padoc-ray: {it.source}: {it.error.code}: {it.error.message}", file=sys.stderr)
            rc = 1
            continue
        if args.format == "json":
            obj = json.loads(to_json(rec.page))
            obj.update(status=rec.status, valid=rec.valid, message=rec.message, e2e_s=round(rec.e2e_s, 4),
                       n_branches=rec.n_branches, f_seq=rec.f_seq, f_padoc=rec.f_padoc)
            print(json.dumps(obj, ensure_ascii=False, indent=2))
        else:
            print(to_markdown(rec.page), end="")
        print(f"[{it.source} page {it.page_index + 1}: status={rec.status} valid={rec.valid} "
              f"regions={len(rec.page.regions)} branches={rec.n_branches} {rec.e2e_s:.2f}s "
              f"F_seq={rec.f_seq} F_PaDoc={rec.f_padoc}]", file=sys.stderr)
        rc = rc or (0 if rec.status == "ok" else 1)
    return rc


def cmd_demo(args) -> int:
    import glob
    import shutil

    import pyarrow.dataset as pads

    from padoc_ray.host import HostConfig
    from padoc_ray.local import load_truth
    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.pipeline.job import run_batch
    from padoc_ray.protocol import quantized

    paths = sorted(glob.glob(os.path.join(args.examples, "*.pdf")))
    if not paths:
        _die(f"no PDFs in {args.examples} (make them with: python examples/make_examples.py)")
    if not os.path.isdir(args.model):
        _die(f"model directory not found: {args.model} (build it with: padoc-ray build-tiny-model {args.model})")
    gt = os.path.join(args.examples, "ground_truth.json")
    replay = not args.no_replay and os.path.exists(gt)
    print(f"padoc-ray demo: the batch job on {len(paths)} PDFs from {args.examples} on a local Ray cluster, "
          f"model {args.model}, mode {args.mode}")
    if replay:
        print("  the tiny model has random weights: its outputs are teacher-forced from ground_truth.json so the\n"
              "  real engine and scheduler do a trained model's work (use --no-replay to see raw generation)")
    if os.path.exists(args.output):
        if not os.path.isdir(args.output) or (os.listdir(args.output)
                                               and not os.path.exists(os.path.join(args.output, DEMO_MARKER))):
            _die(f"--output {args.output} exists and is not a previous demo output (no {DEMO_MARKER}); the demo "
                 f"replaces its output, so give a new or empty folder, or remove this one yourself")
        shutil.rmtree(args.output)  # the demo always parses afresh (the batch job itself resumes)
    os.makedirs(args.output)
    open(os.path.join(args.output, DEMO_MARKER), "w").close()
    import ray
    import ray.data

    from padoc_ray.utils.raylog import init_ray

    init_ray("local", verbose=args.verbose)
    ray.data.DataContext.get_current().enable_progress_bars = args.verbose
    cfg = BatchConfig(input=os.path.join(args.examples, "*.pdf"), output=args.output, model=args.model,
                      mode=args.mode, replay_gt=gt if replay else None,
                      host=HostConfig(mode=args.mode, scheduler=_scheduler_cfg(args)))
    summary = run_batch(cfg)
    table = pads.dataset(os.path.join(args.output, "pages"), format="parquet").to_table().to_pylist()
    table.sort(key=lambda r: (r["source_uri"], r["page_index"]))
    truth = load_truth(gt if replay else None)
    vocab = _vocab(args.model)
    print(f"\n{'document':<12} {'page':>4} {'status':<16} {'regions':>7} {'branches':>8} {'e2e s':>6} "
          f"{'F_seq':>6} {'F_PaDoc':>7}  matches truth")
    for r in table:
        name = os.path.basename(r["source_uri"])
        t = truth.get((name, r["page_index"]))
        match = "-" if t is None else ("yes" if _row_matches(r, quantized(t, vocab)) else "NO")
        print(f"{name:<12} {r['page_index'] + 1:>4} {r['status']:<16} {len(r['regions']):>7} {r['n_branches'] or 0:>8} "
              f"{r['e2e_s'] or 0:>6.2f} {r['f_seq'] or 0:>6} {r['f_padoc'] or 0:>7}  {match}")
    if table:
        print(f"\n--- Markdown of {os.path.basename(table[0]['source_uri'])} page 1 ---\n{table[0]['markdown']}")
    print(f"summary: {json.dumps({k: summary[k] for k in ('pages_written', 'page_status', 'document_status', 'wall_s', 'pages_per_s', 'all_inputs_accounted')})}")
    print(f"output: {os.path.abspath(args.output)}/pages (Parquet, one row per page), documents/, summary.json")
    ok = summary["all_inputs_accounted"] and (not replay or summary["page_status"] == {"ok": summary["pages_written"]})
    return 0 if ok else 1


#: marks a folder as a demo output, which the next demo may replace (it never deletes anything else)
DEMO_MARKER = ".padoc-demo-output"


def _row_matches(row: dict, truth) -> bool:
    import math

    if len(row["regions"]) != len(truth.regions):
        return False
    for r, t in zip(row["regions"], truth.regions):
        if r["category"] != t.category or r["content"] != t.content:
            return False
        if any(not math.isclose(a, b, abs_tol=1e-6) for a, b in zip(r["bbox"], t.box.as_tuple())):
            return False
    return True


def _vocab(model: str):
    from padoc_ray.hf_tokenizer import load_model_protocol

    return load_model_protocol(model).vocab


# ---- bench ---------------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError("values must be positive integers")
    return vals


def cmd_bench_replay(args) -> int:
    from padoc_ray.bench.replay import bench_truth, format_table, load_bench_pages, run_bench
    from padoc_ray.host import HostConfig, PageHost
    from padoc_ray.scheduler import SchedulerConfig

    for path, what in ((args.gt, "--gt"), (args.images, "--images"), (args.model, "--model")):
        if not os.path.exists(path):
            _die(f"{what}: {path} does not exist")
    try:
        pages = load_bench_pages(args.gt, args.images, args.limit)
    except (FileNotFoundError, ValueError) as e:
        _die(str(e))
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"fork", "sequential"}:
        _die("--modes takes fork and/or sequential")
    overrides = {"scheduling_policy": "priority"} if args.layout_priority else {}
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    cfg = HostConfig(
        engine_overrides=overrides, pages_in_flight=max(args.concurrency), max_live_branches=args.max_live_branches,
        scheduler=SchedulerConfig(max_tokens=args.max_tokens, max_branches=args.max_branches,
                                  layout_priority=args.layout_priority, stream_branches=args.stream_branches,
                                  constrain_layout=args.constrain_layout))

    async def go():
        host = await PageHost(args.model, cfg, truth=bench_truth(pages)).start()
        try:
            return await run_bench(host, pages, args.concurrency, modes, args.out, warmup=args.warmup)
        finally:
            host.shutdown()

    summary = asyncio.run(go())
    print(format_table(summary))
    print(f"wrote {os.path.join(args.out, 'summary.json')} and pages.jsonl")
    return 0


def _pdf_paths(spec: str) -> list[str]:
    """PDFs of a folder (searched recursively) or a glob; exits with a clear error when there are none."""
    import glob

    paths = sorted(glob.glob(os.path.join(spec, "**", "*.pdf"), recursive=True)) if os.path.isdir(spec) \
        else sorted(glob.glob(spec))
    if not paths:
        _die(f"no PDFs at {spec}")
    return paths


def cmd_bench_raster(args) -> int:
    from padoc_ray.bench.raster import run

    res = run(_pdf_paths(args.input), args.dpi, args.workers, encoding=args.encoding)
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def cmd_show(args) -> int:
    from padoc_ray.pipeline.storage import StorageConfig
    from padoc_ray.show import ShowError, show_page

    if args.gt and not os.path.exists(args.gt):
        _die(f"ground truth {args.gt} not found")
    try:
        info = show_page(args.output, args.doc, args.page, args.out, gt=args.gt,
                         storage=StorageConfig(endpoint=args.s3_endpoint))
    except ShowError as e:
        _die(str(e))
    extra = f", ground truth {info['truth']} regions" if info["truth"] is not None else ""
    print(f"{info['out']}: doc {info['doc_id'][:12]} page {info['page_index']} ({info['status']}), "
          f"{info['predicted']} predicted regions{extra}")
    return 0


def cmd_bench_pipeline(args) -> int:
    from padoc_ray.bench.pipeline import run

    paths = _pdf_paths(args.input)
    if not os.path.exists(os.path.join(args.model, "padoc_protocol.json")):
        _die(f"{args.model} is not a padoc-ray checkpoint (no padoc_protocol.json)")
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def cmd_bench_driver(args) -> int:
    from padoc_ray.bench.driver import run

    if args.pages < args.pages_per_doc or args.pages_per_doc < 1 or args.rows_per_file < 1:
        _die("--pages must be >= --pages-per-doc >= 1 and --rows-per-file >= 1")
    res = run(args.pages, args.pages_per_doc, args.rows_per_file, args.scratch, args.workers)
    b = res["breakdown"]
    print(f"{res['page_rows']} page rows, {res['inputs']} inputs, {res['files']} files: plan {b['plan_s']} s "
          f"+ documents table {b['documents_s']} s = {res['seconds']} s; peak RSS "
          f"{res['peak_rss_bytes'] / 2**30:.2f} GiB; footers read {res['footers_read']}; load {res['load_avg']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def cmd_bench_http(args) -> int:
    from padoc_ray.bench.http import format_table, run

    for path, what in ((args.gt, "--gt"), (args.model, "--model")):
        if not os.path.exists(path):
            _die(f"{what}: {path} does not exist")
    try:
        report = run(os.path.abspath(args.model), os.path.abspath(args.gt), _pdf_paths(args.input), args.concurrency,
                     requests=args.requests, warmup=args.warmup, out_dir=args.out,
                     constrain_layout=args.constrain_layout)
    except ValueError as e:
        _die(str(e))
    print(format_table(report))
    if args.out:
        print(f"wrote {os.path.join(args.out, 'http_bench.json')}")
    return 0


# ---- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="padoc-ray",
        description="PaDoc document parsing on Ray and vLLM: a layout stream forks one content branch per "
                    "region, so a page decodes in the depth of its longest layout-content path.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level (default: warnings only)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("build-tiny-model", help="build the tiny random-weight Qwen3-VL checkpoint (offline)",
                       description="Build, offline and deterministically, a tiny random-weight Qwen3-VL PaDoc "
                                   "checkpoint (float32) with tokenizer, processor configs, chat template and "
                                   "padoc_protocol.json. For tests, demos and CPU benchmarks: its outputs are noise "
                                   "unless teacher-forced. With --base: the same tiny Qwen3-VL without the protocol, "
                                   "which `padoc-ray init-model` turns into a PaDoc checkpoint.")
    b.add_argument("out", help="directory to write (must be empty or missing)")
    b.add_argument("--force", action="store_true", help="overwrite a non-empty OUT")
    b.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    b.add_argument("--base", action="store_true",
                   help="build the tiny Qwen3-VL WITHOUT the protocol (no protocol tokens, no padoc_protocol.json): a "
                        "stand-in for a real base such as Qwen3-VL-2B-Instruct, for `padoc-ray init-model`")
    b.add_argument("--tie-word-embeddings", action="store_true",
                   help="one matrix for input embeddings and LM head (as Qwen3-VL-2B has; default: separate)")
    b.set_defaults(func=cmd_build_tiny_model)

    im = sub.add_parser("init-model", help="make a PaDoc checkpoint from a Hugging Face Qwen3-VL checkpoint",
                        description="Turn a Qwen3-VL checkpoint (e.g. Qwen/Qwen3-VL-2B-Instruct) into a PaDoc "
                                    "checkpoint to train: add the protocol's control, category and coordinate tokens "
                                    "to its tokenizer as special tokens, grow the input embeddings and the LM head "
                                    "(tied or not; every base row kept bit for bit, each new row the mean of the base "
                                    "token rows), write padoc_protocol.json and the PaDoc chat template, and check "
                                    "that vLLM loads the result and generates with it. Exit 2 for a refused base or "
                                    "output (not Qwen3-VL, already PaDoc, conflicting tokens, non-empty --out), 1 when "
                                    "the vLLM check fails (nothing is written then).")
    im.add_argument("--base", required=True, help="Qwen3-VL checkpoint: a folder or s3://bucket/prefix")
    im.add_argument("--out", required=True, help="folder to write (must be empty or missing, unless --force)")
    im.add_argument("--spec", default=None, metavar="SPEC.json",
                    help="protocol spec (a padoc_protocol.json or a folder holding one; default: the built-in spec)")
    im.add_argument("--force", action="store_true", help="replace a non-empty --out (only once the new one is built)")
    im.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                    help="start a vLLM engine on the result and generate with it (default: on; the CPU engine "
                         "without a GPU). --no-verify skips it")
    im.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint URL for an s3:// --base")
    im.set_defaults(func=cmd_init_model)

    pp = sub.add_parser("parse-page", help="parse one page of a PDF or one image with a local engine",
                        description="Parse one PDF page (or an image) on a local vLLM engine, no Ray, and print "
                                    "Markdown or JSON on stdout; a status line goes to stderr. Exit 1 if the page "
                                    "did not parse cleanly.")
    pp.add_argument("input", metavar="IMAGE_OR_PDF")
    pp.add_argument("--model", required=True, help="checkpoint directory with padoc_protocol.json")
    pp.add_argument("--page", type=int, default=None, help="1-based page of a PDF (default: every page)")
    pp.add_argument("--format", choices=("markdown", "json"), default="markdown", help="output format (default markdown)")
    pp.add_argument("--replay", metavar="GT.json", default=None,
                    help="teacher-force the model with this OmniDocBench ground truth (matched by file name and page)")
    _add_generation_args(pp)
    pp.set_defaults(func=cmd_parse_page)

    d = sub.add_parser("demo", help="run the batch job on the bundled sample PDFs with the tiny model",
                       description="Run the batch job (Ray Data, local Ray cluster, one engine actor) on "
                                   "examples/*.pdf with the tiny model, write Parquet, and print a summary. "
                                   "The tiny model has random weights, so by default its outputs are teacher-forced "
                                   "from examples/ground_truth.json.")
    d.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint directory (default {DEFAULT_MODEL})")
    d.add_argument("--examples", default=EXAMPLES_DIR, help="folder of PDFs (default: the bundled examples)")
    d.add_argument("--no-replay", action="store_true", help="let the model generate freely (noise for the tiny model)")
    d.add_argument("--output", default=os.path.join(os.path.dirname(EXAMPLES_DIR), "out", "demo"),
                   help="output folder (default out/demo); replaced when it is a previous demo output, refused when it "
                        "is any other non-empty folder")
    _add_generation_args(d)
    d.set_defaults(func=cmd_demo)

    from padoc_ray.pipeline.cli_args import DESCRIPTION, add_batch_args, run_from_args

    bp = sub.add_parser("parse", help="the batch job: PDFs -> Ray Data -> engine actors -> Parquet",
                        description=DESCRIPTION + " Same flags as jobs/batch_parse.py; runs on a local Ray "
                                                  "cluster unless --address or RAY_ADDRESS says otherwise.")
    add_batch_args(bp)
    bp.set_defaults(func=run_from_args)

    from padoc_ray.pipeline.cli_args import REANNOTATE_DESCRIPTION, add_reannotate_args, reannotate_from_args

    ra = sub.add_parser("reannotate", help="offline corpus re-annotation: parse an annotated corpus again, compare, "
                                           "score agreement", description=REANNOTATE_DESCRIPTION)
    add_reannotate_args(ra)
    ra.set_defaults(func=reannotate_from_args)

    from padoc_ray.serve.cli import add_parser as add_serve_parser

    add_serve_parser(sub)

    from padoc_ray.corpus.cli import register as register_corpus

    register_corpus(sub)

    sh = sub.add_parser("show", help="draw a parsed page with its predicted boxes (and the ground truth)",
                        description="Re-render one page of a batch output and draw its predicted regions, coloured by "
                                    "category and numbered in reading order; with --gt, the ground truth beside it.")
    sh.add_argument("output", help="the batch job's --output (local folder or s3://)")
    sh.add_argument("--doc", required=True, help="doc_id, a unique prefix of one, or the source file name")
    sh.add_argument("--page", type=int, required=True, help="0-based page index")
    sh.add_argument("--out", required=True, help="PNG to write")
    sh.add_argument("--gt", default=None, help="OmniDocBench-format ground truth to draw beside the prediction")
    sh.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint URL")
    sh.set_defaults(func=cmd_show)

    from padoc_ray.eval.cli import add_parser as add_eval_parser

    add_eval_parser(sub)
    __import__("padoc_ray.trainer.cli", fromlist=["add_parser"]).add_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks (replay: fork vs sequential serving)",
                           description="Benchmarks whose figures go in reports, never in tests.")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    br = bsub.add_parser("replay", help="fork vs sequential on one engine, teacher-forced with ground truth",
                         description="Replay OmniDocBench-format pages on one engine, fork vs sequential, at each "
                                     "concurrency (closed loop), teacher-forced so a random-weight model does a "
                                     "trained model's work. Writes OUT/summary.json and OUT/pages.jsonl and prints "
                                     "a table.")
    br.add_argument("--gt", required=True, help="OmniDocBench-format ground-truth JSON")
    br.add_argument("--images", required=True, help="folder holding each page's image_path")
    br.add_argument("--model", required=True, help="checkpoint directory")
    br.add_argument("--concurrency", type=_int_list, default=[1, 4, 16], help="comma list (default 1,4,16)")
    br.add_argument("--modes", default="fork,sequential", help="comma list (default fork,sequential)")
    br.add_argument("--out", required=True, help="output folder")
    br.add_argument("--limit", type=int, default=None, help="use only the first N pages")
    br.add_argument("--warmup", type=int, default=2, help="untimed warm-up pages per mode (default 2)")
    br.add_argument("--max-tokens", type=int, default=8192, help="generated tokens per stream (default 8192)")
    br.add_argument("--max-branches", type=int, default=255, help="branches per page (default 255)")
    br.add_argument("--max-num-seqs", type=int, default=None, help="engine max_num_seqs (default: 384)")
    br.add_argument("--layout-priority", action="store_true",
                    help="run layout streams ahead of branches (vLLM priority scheduling)")
    br.add_argument("--max-live-branches", type=int, default=None,
                    help="cap on content branches live in the engine at once, over all pages (default: none)")
    br.add_argument("--stream-branches", action="store_true",
                    help="stream branch tokens (the runaway guard can stop a branch early) instead of taking each "
                         "branch's output once at its end (the default)")
    _add_constrain_layout(br)
    br.set_defaults(func=cmd_bench_replay)
    bra = bsub.add_parser("raster", help="rasterization pages/s: padoc-ray's raster stage vs pdftoppm",
                          description="Rasterize the same PDFs at the same DPI with pypdfium2 (render only), with "
                                      "the batch job's raster stage (isolated renderer process + page encoding, and the "
                                      "same in process, to show the cost of isolation), render + PNG in process, and "
                                      "pdftoppm (poppler), each with 1 and N processes, and print pages/s.")
    bra.add_argument("--input", required=True, help="folder (searched recursively) or glob of PDFs")
    bra.add_argument("--dpi", type=float, default=144, help="resolution for every tool (default 144)")
    bra.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    bra.add_argument("--encoding", choices=("zstd", "png", "ppm"), default="zstd",
                     help="page encoding of the raster stage variants (default zstd, the batch job's default)")
    bra.add_argument("--json", default=None, help="also write the results here")
    bra.set_defaults(func=cmd_bench_raster)
    __import__("padoc_ray.eval.layout_cli", fromlist=["add_bench_parser"]).add_bench_parser(bsub)
    __import__("padoc_ray.trainer.bench_attention", fromlist=["add_bench_parser"]).add_bench_parser(bsub)
    bpi = bsub.add_parser("pipeline", help="batch-job overhead: no-op engine pipeline vs raw rasterization",
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
    bpi.add_argument("--json", default=None, help="also write the results here")
    bpi.set_defaults(func=cmd_bench_pipeline)
    bd = bsub.add_parser("driver", help="the batch driver's bookkeeping (plan + documents table) over N page rows",
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
    bd.add_argument("--json", default=None, help="also write the results here")
    bd.set_defaults(func=cmd_bench_driver)
    bh = bsub.add_parser("http", help="the Serve endpoint's overhead: HTTP clients vs the engine host directly",
                         description="Send the same one-page requests (teacher-forced) to a PageHost directly and to "
                                     "the Serve endpoint (padoc-ray serve's application on a local Ray) over HTTP, in "
                                     "closed loops at each concurrency, one side after the other; print pages/s and "
                                     "P50/P95 latency of both and HTTP pages/s as a fraction of direct.")
    bh.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint directory (default {DEFAULT_MODEL})")
    bh.add_argument("--input", default=EXAMPLES_DIR, help="folder or glob of PDFs (default: the bundled examples)")
    bh.add_argument("--gt", default=os.path.join(EXAMPLES_DIR, "ground_truth.json"),
                    help="ground truth covering every page of --input (default: the examples')")
    bh.add_argument("--concurrency", type=_int_list, default=[1, 8, 32], help="clients, e.g. 1,8,32 (default)")
    bh.add_argument("--requests", type=int, default=64, help="one-page requests per concurrency and side (default 64)")
    bh.add_argument("--warmup", type=int, default=4, help="untimed requests per side first (default 4)")
    bh.add_argument("--out", default=None, help="folder for http_bench.json")
    _add_constrain_layout(bh)
    bh.set_defaults(func=cmd_bench_http)
    bench.set_defaults(func=lambda a: (bench.print_help(), 2)[1])
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # vLLM logs to stdout by default; keep stdout for results (Markdown/JSON), in engine processes too
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
