"""Command-line flags of the batch job, shared by ``jobs/batch_parse.py`` and ``padoc-ray parse``."""

from __future__ import annotations

import argparse
import logging
import sys

from padoc_ray.pdf import RenderConfig
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.storage import StorageConfig
from padoc_ray.scheduler import SchedulerConfig

DESCRIPTION = """\
Parse PDFs at scale: Ray Data lists the inputs, reads and rasterizes pages (pypdfium2) in CPU
tasks, feeds engine actors that each host a vLLM engine with the layout-fork scheduler, and
writes Parquet: OUTPUT/pages/ (one row per page), OUTPUT/documents/ (one row per input) and
OUTPUT/summary.json. Rerunning with the same --output parses only what is missing. Exit code 0
when every input is accounted for, 1 otherwise, 2 for bad arguments."""


def _range_pair(text: str) -> tuple[int, int]:
    try:
        parts = [int(x) for x in text.split(",")] if "," in text else [int(text)] * 2
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX, got {text!r}") from None
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return parts[0], parts[1]


def add_batch_args(p: argparse.ArgumentParser) -> None:
    from padoc_ray.cli import parse_page_ranges

    io = p.add_argument_group("input and output")
    io.add_argument("--input", required=True,
                    help="local folder or glob (dir/*.pdf), s3://bucket/prefix, or a manifest file (.txt/.manifest) "
                         "with one URI per line")
    io.add_argument("--output", required=True, help="local folder or s3://bucket/prefix for pages/, documents/, "
                                                    "summary.json")
    io.add_argument("--model", required=True, help="checkpoint directory, local or s3:// (holds padoc_protocol.json)")
    io.add_argument("--s3-endpoint", default=None,
                    help="S3-compatible endpoint URL (default: AWS_ENDPOINT_URL(_S3), else AWS); credentials come "
                         "from the standard AWS chain")
    gen = p.add_argument_group("parsing")
    gen.add_argument("--mode", choices=("fork", "sequential"), default="fork",
                     help="fork: PaDoc layout stream + concurrent branches; sequential: the baseline (default fork)")
    gen.add_argument("--pages", type=parse_page_ranges, default=None,
                     help="1-based page ranges to parse in every document, e.g. 1-3,7 (default: all)")
    gen.add_argument("--max-pages-per-doc", type=int, default=None, help="parse at most N pages per document")
    gen.add_argument("--longest-side", type=int, default=1600, help="render pages to this many pixels (default 1600)")
    gen.add_argument("--dpi", type=float, default=None, help="render at this DPI instead of --longest-side")
    gen.add_argument("--max-tokens", type=int, default=8192, help="generated tokens per stream (default 8192)")
    gen.add_argument("--max-branches", type=int, default=255, help="content branches per page (default 255)")
    gen.add_argument("--replay", metavar="GT.json", default=None,
                     help="teacher-force the model with this OmniDocBench ground truth (pages matched by file name "
                          "and page_no; for random-weight demo models and benchmarks)")
    gen.add_argument("--page-deadline", type=float, default=None, help="seconds per page (default: none)")
    act = p.add_argument_group("engine actors")
    act.add_argument("--actors", type=_range_pair, default=(1, 1),
                     help="engine actors: N or MIN,MAX (autoscaled between) (default 1)")
    act.add_argument("--gpus-per-actor", type=float, default=0.0, help="GPUs per engine actor (default 0; 1 on GPU)")
    act.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs per engine actor (default 1)")
    act.add_argument("--pages-in-flight", type=int, default=16, help="pages one actor runs at once (default 16)")
    act.add_argument("--max-live-branches", type=int, default=None,
                     help="per actor: cap on content branches live at once (default: no cap)")
    act.add_argument("--max-num-seqs", type=int, default=None, help="vLLM max_num_seqs (default 384)")
    act.add_argument("--engine", choices=("vllm", "noop"), default="vllm",
                     help="noop: no model, every page an empty layout (measures pipeline overhead)")
    p.add_argument("--raster-cpus", type=float, default=0.5, help="CPUs per rasterization task (default 0.5)")
    p.add_argument("--image-encoding", choices=("png", "ppm"), default="png",
                   help="how rendered pages travel to engine actors: png (lossless, small) or ppm (raw, fast to "
                        "encode; for single-node clusters) (default png)")
    p.add_argument("--rows-per-file", type=int, default=32,
                   help="page rows per Parquet file; progress is saved file by file (default 32)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: RAY_ADDRESS, else a local cluster started for this run)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def config_from_args(args: argparse.Namespace) -> BatchConfig:
    overrides = {"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}
    return BatchConfig(
        input=args.input, output=args.output, model=args.model, mode=args.mode,
        render=RenderConfig(longest_side=args.longest_side, dpi=args.dpi),
        pages=tuple(args.pages) if args.pages is not None else None, max_pages_per_doc=args.max_pages_per_doc,
        scheduler=SchedulerConfig(max_tokens=args.max_tokens, max_branches=args.max_branches,
                                  deadline_s=args.page_deadline),
        storage=StorageConfig(endpoint=args.s3_endpoint), num_actors=args.actors,
        gpus_per_actor=args.gpus_per_actor, cpus_per_actor=args.cpus_per_actor, pages_in_flight=args.pages_in_flight,
        max_live_branches=args.max_live_branches, engine_overrides=overrides, engine=args.engine,
        raster_cpus=args.raster_cpus, replay_gt=args.replay, rows_per_file=args.rows_per_file,
        image_encoding=args.image_encoding,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Validate, start or join Ray, run, and turn the outcome into an exit code."""
    import os

    from padoc_ray.pipeline.job import run_batch
    from padoc_ray.pipeline.storage import InputError

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    import ray

    if not ray.is_initialized():
        address = args.address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=args.verbose,
                 logging_level=logging.INFO if args.verbose else logging.WARNING)
    try:
        summary = run_batch(cfg)
    except InputError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"padoc-ray: error: {e}", file=sys.stderr)
        return 2
    print(f"summary: {os.path.join(cfg.output, 'summary.json')}; pages: {os.path.join(cfg.output, 'pages')}; "
          f"documents: {os.path.join(cfg.output, 'documents')}")
    return 0 if summary["all_inputs_accounted"] else 1
