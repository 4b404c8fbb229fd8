"""Command-line flags of the batch job, shared by ``jobs/batch_parse.py`` and ``padoc-ray parse``."""

from __future__ import annotations

import argparse
import sys

from padoc_ray.cli.common import add_command, add_mode, add_render, add_stream_limits
from padoc_ray.host import HostConfig
from padoc_ray.pdf import RenderConfig
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.raster import ENCODINGS, RendererConfig
from padoc_ray.scheduler import SchedulerConfig
from padoc_ray.storage import StorageConfig

DESCRIPTION = """\
Parse PDFs at scale: Ray Data lists the inputs, reads and rasterizes pages (pypdfium2) in CPU
tasks, feeds engine actors that each host a vLLM engine with the layout-fork scheduler, and
writes Parquet: OUTPUT/pages/ (one row per page), OUTPUT/documents/ (one row per input) and
OUTPUT/summary.json. Rerunning with the same --output parses only what is missing (and tries
again inputs that failed to read, were missing, or were refused by a cap that no longer applies).
One run at a time per --output: a second one refuses (exit 2) or waits (--wait-lock). Exit code 0
when every input is accounted for, 1 otherwise, 2 for bad arguments (also: --output inside
--input, or --output in use by another run)."""


def _range_pair(text: str) -> tuple[int, int]:
    try:
        parts = [int(x) for x in text.split(",")] if "," in text else [int(text)] * 2
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX, got {text!r}") from None
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return parts[0], parts[1]


def _resources(text: str) -> dict[str, float]:
    """--engine-resources: a JSON object of custom resource names to amounts."""
    import json

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"padoc_gpu_node\": 1}}', got {text!r} "
                                         f"({e.msg})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of resource names to amounts, got {text!r}")
    return obj


def add_batch_args(p: argparse.ArgumentParser, *, job_io: bool = True) -> None:
    """The batch job's flags; ``job_io=False`` leaves out --input, --output and --mode (for jobs that
    derive them, like re-annotation)."""
    from padoc_ray.cli.common import page_ranges as parse_page_ranges

    io = p.add_argument_group("input and output")
    if job_io:
        io.add_argument("--input", required=True,
                        help="PDFs and page images (PNG, JPEG, TIFF, WebP, BMP, GIF): a local folder or glob "
                             "(dir/*.pdf), s3://bucket/prefix, or a manifest file (.txt/.manifest) with one URI per line")
        io.add_argument("--output", required=True, help="local folder or s3://bucket/prefix for pages/, documents/, "
                                                        "summary.json")
    io.add_argument("--model", required=True, help="checkpoint directory, local or s3:// (holds padoc_protocol.json)")
    io.add_argument("--manifest-allow", action="append", default=[], metavar="PREFIX",
                    help="a folder or s3://bucket/prefix that a manifest --input may name (repeatable; replaces the "
                         "default, the manifest's own folder). Lines outside get a row with status disallowed_uri and are never "
                         "read")
    io.add_argument("--follow-symlinks", action="store_true",
                    help="follow symbolic links in an --input folder whose target is inside it (each folder entered "
                         "once, no file listed twice). Default: links are not followed; each gets a row with status "
                         "symlink, and one pointing outside the folder (symlink_outside_input) is never read")
    io.add_argument("--read-timeout", type=float, default=StorageConfig.read_timeout_s, metavar="SECONDS",
                    help=f"one input file's whole read, local or s3://, must finish within this, else its row says "
                         f"read_failed and a rerun tries again (default {StorageConfig.read_timeout_s:g})")
    io.add_argument("--wait-lock", type=float, default=0.0, metavar="SECONDS",
                    help="when another run holds --output, wait this long for it (default 0: refuse with exit code 2)")
    io.add_argument("--leftover-grace", type=float, default=3600.0, metavar="SECONDS",
                    help="unreadable Parquet files under OUTPUT/pages are skipped; the driver removes those of earlier "
                         "(killed) runs, and files of unknown origin once older than this (default 3600)")
    io.add_argument("--s3-endpoint", default=None,
                    help="S3-compatible endpoint URL (default: AWS_ENDPOINT_URL(_S3), else AWS); credentials come "
                         "from the standard AWS chain")
    gen = p.add_argument_group("parsing")
    if job_io:
        add_mode(gen)
    gen.add_argument("--pages", type=parse_page_ranges, default=None,
                     help="1-based page ranges to parse in every document, e.g. 1-3,7 (default: all)")
    gen.add_argument("--max-pages-per-doc", type=int, default=None, help="parse at most N pages per document")
    gen.add_argument("--doc-page-limit", type=int, default=5000, metavar="N",
                     help="refuse documents with more than N selected pages before any is rendered (status "
                          "too_many_pages; 0: no limit; default 5000)")
    gen.add_argument("--image-frame-limit", type=int, default=1000, metavar="N",
                     help="refuse images with more than N frames (status too_many_frames; default 1000)")
    gen.add_argument("--file-size-limit-mb", type=float, default=512, metavar="MB",
                     help="refuse input files larger than this, from the listing, without reading them, or when "
                          "read if a file grew past it (status file_too_large; 0: no limit; default 512)")
    add_render(gen)
    add_stream_limits(gen)
    gen.add_argument("--replay", metavar="GT.json", default=None,
                     help="teacher-force the model with this OmniDocBench ground truth (pages matched by file name "
                          "and page_no; for random-weight demo models and benchmarks)")
    gen.add_argument("--page-deadline", type=float, default=None, help="seconds per page (default: none)")
    act = p.add_argument_group("engine actors")
    act.add_argument("--actors", type=_range_pair, default=(1, 1),
                     help="engine actors: N or MIN,MAX (autoscaled between) (default 1)")
    act.add_argument("--gpus-per-actor", type=float, default=0.0, help="GPUs per engine actor (default 0; 1 on GPU)")
    act.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs per engine actor (default 1)")
    act.add_argument("--engine-resources", type=_resources, default={}, metavar="JSON",
                     help="custom Ray resources each engine actor asks for, e.g. '{\"padoc_gpu_node\": 1}': engine "
                          "actors then run only on nodes started with that resource (ray start --resources "
                          "'{\"padoc_gpu_node\": 2}' holds two), rasterization and writing anywhere (default: none)")
    act.add_argument("--pages-in-flight", type=int, default=16, help="pages one actor runs at once (default 16)")
    act.add_argument("--max-live-branches", type=int, default=None,
                     help="per actor: cap on content branches live at once (default: no cap)")
    act.add_argument("--max-num-seqs", type=int, default=None, help="vLLM max_num_seqs (default 384)")
    act.add_argument("--engine", choices=("vllm", "noop"), default="vllm",
                     help="noop: no model, every page an empty layout (measures pipeline overhead)")
    p.add_argument("--raster-cpus", type=float, default=BatchConfig.raster_cpus,
                   help="CPUs Ray reserves per rasterization task; a task mostly waits on its renderer process "
                        "(default %(default)g)")
    p.add_argument("--raster-docs-per-task", type=int, default=None,
                   help="input files per rasterization task (default: up to 8, fewer when files are few per CPU)")
    p.add_argument("--raster-pages-per-block", type=int, default=16,
                   help="rendered pages per block leaving the raster stage (default 16)")
    p.add_argument("--engine-batch-pages", type=int, default=16,
                   help="pages per engine-actor call; they run concurrently inside the actor (default 16)")
    rend = p.add_argument_group("rendering")
    rend.add_argument("--render-timeout", type=float, default=RendererConfig.page_timeout_s, metavar="SECONDS",
                      help="opening a document, or rendering one page, may take at most this long; the renderer "
                           "process is then killed and the page gets render_timeout (default %(default)g)")
    rend.add_argument("--doc-timeout", type=float, default=RendererConfig.doc_timeout_s, metavar="SECONDS",
                      help="all pages of one document may take at most this long to render; the pages not "
                           "rendered by then get render_timeout (default %(default)g; 0: no limit)")
    rend.add_argument("--page-render-budget", type=float, default=RendererConfig.page_budget_s, metavar="SECONDS",
                      help="renderer seconds per selected page: a document's time limit is this times its selected "
                           "pages, at least --render-timeout, at most --doc-timeout; only the renderer's own time "
                           "counts, not time spent waiting for the engines (default %(default)g; 0: --doc-timeout "
                           "alone)")
    rend.add_argument("--page-draw-limit", type=int, default=RenderConfig.max_page_draws, metavar="N",
                      help="a page whose content would draw more XObjects than this (nested forms multiply) gets "
                           "page_too_complex without being rendered (default %(default)d; 0: no limit)")
    rend.add_argument("--render-memory-limit-mb", type=int, default=RendererConfig.memory_limit_mb, metavar="MB",
                      help="address-space limit of the renderer process; a page needing more gets "
                           "render_out_of_memory or render_crashed, alone (default %(default)d; 0: none)")
    rend.add_argument("--no-render-isolation", action="store_true",
                      help="render inside the raster task's own process: no crash isolation and no time-outs "
                           "(a renderer crash then fails the whole task); for benchmarks")
    rend.add_argument("--image-encoding", choices=ENCODINGS, default="zstd",
                      help="how rendered pages travel to engine actors, all lossless: zstd (raw pixels, zstd level 1: "
                           "fast, as small as PNG), png, or ppm (uncompressed) (default zstd)")
    p.add_argument("--rows-per-file", type=int, default=64,
                   help="page rows per Parquet file; progress is saved file by file (default 64)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: RAY_ADDRESS, else a local cluster started for this run)")


def config_from_args(args: argparse.Namespace) -> BatchConfig:
    overrides = {"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}
    return BatchConfig(
        input=getattr(args, "input", ""), output=getattr(args, "output", ""), model=args.model,
        mode=getattr(args, "mode", "fork"),
        render=RenderConfig(longest_side=args.longest_side, dpi=args.dpi, max_page_draws=args.page_draw_limit),
        renderer=RendererConfig(isolate=not args.no_render_isolation, page_timeout_s=args.render_timeout,
                                doc_timeout_s=args.doc_timeout or None, page_budget_s=args.page_render_budget or None,
                                memory_limit_mb=args.render_memory_limit_mb),
        pages=tuple(args.pages) if args.pages is not None else None, max_pages_per_doc=args.max_pages_per_doc,
        host=HostConfig(engine=args.engine, engine_overrides=overrides, pages_in_flight=args.pages_in_flight,
                        max_live_branches=args.max_live_branches, mode=getattr(args, "mode", "fork"),
                        scheduler=SchedulerConfig(max_tokens=args.max_tokens, max_branches=args.max_branches,
                                                  deadline_s=args.page_deadline,
                                                  constrain_layout=args.constrain_layout)),
        storage=StorageConfig(endpoint=args.s3_endpoint, read_timeout_s=args.read_timeout), num_actors=args.actors,
        gpus_per_actor=args.gpus_per_actor, cpus_per_actor=args.cpus_per_actor,
        engine_resources=getattr(args, "engine_resources", {}),
        raster_cpus=args.raster_cpus, replay_gt=args.replay, rows_per_file=args.rows_per_file,
        image_encoding=args.image_encoding, raster_pages_per_block=args.raster_pages_per_block,
        engine_batch_pages=args.engine_batch_pages, raster_docs_per_task=args.raster_docs_per_task,
        limits=InputLimits(max_doc_pages=args.doc_page_limit or None, max_image_frames=args.image_frame_limit,
                           max_file_bytes=int(args.file_size_limit_mb * 2**20) or None),
        manifest_allow=tuple(args.manifest_allow), follow_symlinks=args.follow_symlinks, lock_wait_s=args.wait_lock, leftover_grace_s=args.leftover_grace,
    )


def _init_ray(args: argparse.Namespace) -> None:
    """Join the cluster that --address or RAY_ADDRESS names, else start a fresh local one for this
    run (never whatever `ray start` last recorded on the machine). Token authentication stays on."""
    from padoc_ray.ray_init import init_ray

    init_ray(args.address, verbose=getattr(args, "verbose", False))


def run_from_args(args: argparse.Namespace) -> int:
    """Validate, run (starting or joining Ray only when there is work), and turn the outcome into an
    exit code."""
    import os

    from padoc_ray.pipeline.job import run_batch
    from padoc_ray.storage import InputError

    try:
        cfg = config_from_args(args)
    except ValueError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    try:
        summary = run_batch(cfg, start_ray=lambda: _init_ray(args))
    except InputError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    print(f"summary: {os.path.join(cfg.output, 'summary.json')}; pages: {os.path.join(cfg.output, 'pages')}; "
          f"documents: {os.path.join(cfg.output, 'documents')}")
    return 0 if summary["all_inputs_accounted"] else 1


# ---- re-annotation ----------------------------------------------------------------------------------
REANNOTATE_DESCRIPTION = """\
Offline corpus re-annotation: turn several parses of a corpus into agreement figures, a consensus
annotation and a difficulty score per page (the paper's data curation). Prediction sets: padoc-ray's
own parses of --source, one batch run per --modes entry (written to OUTPUT/predictions/<mode>/;
they resume), and other parsers' outputs (--compare NAME=[FORMAT:]PATH: a padoc-ray batch output,
OmniDocBench JSON, MinerU *_content_list.json, dots.ocr layout JSON). Every pair of sets is
compared page by page (PageIoU layout agreement, matched regions, content edit distance); regions
at least --min-agree sets agree on form the consensus. With --gt, the pages are the ground truth's,
and each set and the consensus are also scored against it; without it, every page of every source
file. Writes OUTPUT/consensus/consensus.json (OmniDocBench format, for train --gt and eval),
OUTPUT/agreement/agreement.parquet (one row per page, kind=page, and one per compared pair,
kind=pair) and OUTPUT/reannotate_summary.json. Exit code 0 when every page was compared or has a
recorded reason, 1 when a parsing run left inputs unaccounted for, 2 for bad arguments."""


def _named_set(text: str) -> tuple[str, tuple[str | None, str]]:
    from padoc_ray.eval.importers import parse_compare

    try:
        name, fmt, path = parse_compare(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name, (fmt, path)


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if modes == ("none",):
        return ()
    if "none" in modes:
        raise argparse.ArgumentTypeError("--modes none cannot be combined with other modes")
    return modes


def add_reannotate_args(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("corpus and comparison")
    c.add_argument("--source", required=True,
                   help="folder or s3:// prefix with the PDFs or page images (with --gt: the files its "
                        "page_info.source_pdf / image_path name)")
    c.add_argument("--output", required=True, help="local folder or s3://bucket/prefix for the results")
    c.add_argument("--gt", default=None,
                   help="OmniDocBench-format annotations to score the sets and the consensus against (optional)")
    c.add_argument("--modes", type=_modes, default=("fork",),
                   help="comma list of padoc-ray parses to run: fork, sequential; or none to parse nothing here and "
                        "only compare --compare sets (default fork)")
    c.add_argument("--compare", type=_named_set, action="append", default=[], metavar="NAME=[FORMAT:]PATH",
                   help="another prediction set (repeatable). FORMAT: padoc (a batch output folder), omnidocbench "
                        "(JSON list of pages), mineru (*_content_list.json file or folder), dots (dots.ocr layout JSON "
                        "folder); detected when left out. E.g. mineru=mineru:out/ or other_model=s3://b/out")
    c.add_argument("--min-agree", type=int, default=None, metavar="K",
                   help="prediction sets that must agree on a region for it to enter the consensus (default: a "
                        "strict majority of all sets, e.g. 2 of 3)")
    c.add_argument("--dots-dpi", type=int, default=200,
                   help="the dpi dots.ocr rendered PDF pages at, to read its pixel boxes when its page images are "
                        "not next to the JSON (default 200, dots.ocr's)")
    c.add_argument("--match-iou", type=float, default=0.5,
                   help="box IoU for two regions to pair up and to join a consensus region (default 0.5)")
    c.add_argument("--consensus-iou", type=float, default=0.9,
                   help="a pair agrees with at least this full-page layout IoU (default 0.9)")
    c.add_argument("--consensus-edit", type=float, default=0.1,
                   help="... and at most this mean content edit distance (default 0.1)")
    add_batch_args(p, job_io=False)


def reannotate_from_args(args: argparse.Namespace) -> int:
    from padoc_ray.eval.agreement import AgreementConfig
    from padoc_ray.eval.importers import PredictionSetError
    from padoc_ray.pipeline.reannotate import ReannotateConfig, run_reannotate
    from padoc_ray.storage import InputError

    try:
        cfg = ReannotateConfig(
            gt=args.gt, source=args.source, output=args.output, batch=config_from_args(args),
            modes=args.modes, compare=dict(args.compare), min_agree=args.min_agree, dots_dpi=args.dots_dpi,
            agreement=AgreementConfig(match_iou=args.match_iou, consensus_iou=args.consensus_iou,
                                      consensus_edit=args.consensus_edit))
    except ValueError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    try:
        summary = run_reannotate(cfg, start_ray=lambda: _init_ray(args))
    except (InputError, PredictionSetError, FileNotFoundError, ValueError) as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    import os

    print(f"consensus: {summary['consensus_json']}; agreement: {summary['agreement_parquet']}; "
          f"summary: {os.path.join(cfg.output, 'reannotate_summary.json')}")
    return 0 if all(r["all_inputs_accounted"] for r in summary["runs"].values()) else 1


def register(sub) -> None:
    bp = add_command(sub, "parse", help="the batch job: PDFs -> Ray Data -> engine actors -> Parquet",
                     description=DESCRIPTION + " Same flags as jobs/batch_parse.py; runs on a local Ray "
                                               "cluster unless --address or RAY_ADDRESS says otherwise.")
    add_batch_args(bp)
    bp.set_defaults(func=run_from_args)
    ra = add_command(sub, "reannotate", help="offline corpus re-annotation: parse an annotated corpus again, compare, "
                                            "score agreement", description=REANNOTATE_DESCRIPTION)
    add_reannotate_args(ra)
    ra.set_defaults(func=reannotate_from_args)
