"""Command-line flags of the batch job, shared by ``jobs/batch_parse.py`` and ``padoc-ray parse``."""

from __future__ import annotations

import argparse

from padoc_ray.cli.common import add_command, die
from padoc_ray.cli.flags import (
    add_fields,
    add_mode,
    add_render,
    add_scheduler_flags,
    from_args,
    scheduler_from_args,
)
from padoc_ray.host import HostConfig
from padoc_ray.pdf import RenderConfig
from padoc_ray.pipeline.config import BatchConfig, EnginesConfig, InputsConfig, OutputsConfig, RasterConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.raster import RendererConfig
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


def add_batch_args(p: argparse.ArgumentParser, *, job_io: bool = True) -> None:
    """The batch job's flags; ``job_io=False`` leaves out --input, --output and --mode (for jobs that
    derive them, like re-annotation)."""
    io = p.add_argument_group("input and output")
    if job_io:
        io.add_argument("--input", required=True,
                        help="PDFs and page images (PNG, JPEG, TIFF, WebP, BMP, GIF): a local folder or glob "
                             "(dir/*.pdf), s3://bucket/prefix, or a manifest file (.txt/.manifest) with one URI per line")
        io.add_argument("--output", required=True, help="local folder or s3://bucket/prefix for pages/, documents/, "
                                                        "summary.json")
    io.add_argument("--model", required=True, help="checkpoint directory, local or s3:// (holds padoc_protocol.json)")
    add_fields(io, InputsConfig, ("manifest_allow", "follow_symlinks"))
    add_fields(io, StorageConfig, ("read_timeout_s", "endpoint"))
    add_fields(io, OutputsConfig, ("lock_wait_s", "leftover_grace_s", "lock_stale_s"))
    gen = p.add_argument_group("parsing")
    if job_io:
        add_mode(gen)
    add_fields(gen, InputsConfig, ("pages", "max_pages_per_doc"))
    add_fields(gen, InputLimits, ("max_doc_pages", "max_image_frames", "max_file_bytes"))
    add_render(gen)
    add_scheduler_flags(gen)
    add_fields(gen, BatchConfig, ("replay_gt",))
    act = p.add_argument_group("engine actors")
    add_fields(act, EnginesConfig, ("num_actors", "gpus_per_actor", "cpus_per_actor", "engine_resources",
                                    "batch_pages"))
    add_fields(act, HostConfig, ("pages_in_flight", "max_live_branches", "engine", "engine_overrides"))
    rend = p.add_argument_group("rendering")
    add_fields(rend, RasterConfig, ("cpus", "docs_per_task", "pages_per_block", "block_mb", "encoding"))
    add_fields(rend, RendererConfig, ("page_timeout_s", "doc_timeout_s", "page_budget_s", "memory_limit_mb",
                                      "isolate"))
    add_render(rend, names=("max_page_draws",))
    out = p.add_argument_group("writing")
    add_fields(out, OutputsConfig, ("rows_per_file", "writer_cpus", "gpu_hour_usd"))
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: RAY_ADDRESS, else a local cluster started for this run)")


def config_from_args(args: argparse.Namespace) -> BatchConfig:
    host = from_args(HostConfig, args, scheduler=scheduler_from_args(args))
    return from_args(
        BatchConfig, args, input=getattr(args, "input", ""), output=getattr(args, "output", ""), model=args.model,
        storage=from_args(StorageConfig, args),
        inputs=from_args(InputsConfig, args, limits=from_args(InputLimits, args)),
        raster=from_args(RasterConfig, args, render=from_args(RenderConfig, args),
                         renderer=from_args(RendererConfig, args)),
        engines=from_args(EnginesConfig, args, host=host), outputs=from_args(OutputsConfig, args))


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

    from padoc_ray.host import model_problem

    try:
        cfg = config_from_args(args)
    except ValueError as e:
        return die(str(e), exit=False)
    problem = model_problem(cfg.model, cfg.engines.host)
    if problem:
        return die(problem, exit=False)
    try:
        summary = run_batch(cfg, start_ray=lambda: _init_ray(args))
    except (InputError, FileNotFoundError) as e:
        return die(str(e), exit=False)
    print(f"summary: {os.path.join(cfg.output, 'summary.json')}; pages: {os.path.join(cfg.output, 'pages')}; "
          f"documents: {os.path.join(cfg.output, 'documents')}")
    return 0 if summary["all_inputs_accounted"] else 1


# ---- re-annotation ----------------------------------------------------------------------------------
REANNOTATE_DESCRIPTION = """\
Offline corpus re-annotation: turn several parses of a corpus into agreement figures, a consensus
annotation and a difficulty score per page (the paper's data curation). Prediction sets: padoc-ray's
own parses of --source, one batch run per --modes entry (written to OUTPUT/predictions/<mode>/;
they resume), and other parsers' outputs (--compare NAME=[FORMAT:]PATH: a padoc-ray batch output,
OmniDocBench JSON, MinerU *_content_list.json, dots.ocr layout JSON, or a checkpoint folder (or
model:PATH: padoc, hpd or dots family), which is run here as another parser in fork mode, e.g.
hpd=models/hpd). Every pair of sets is
compared page by page (PageIoU layout agreement, matched regions, content edit distance); regions
at least --min-agree sets agree on form the consensus. With --gt, the pages are the ground truth's,
and each set and the consensus are also scored against it; without it, every page of every source
file. Writes OUTPUT/consensus/consensus.json (OmniDocBench format, for train --gt and eval),
OUTPUT/agreement/agreement.parquet (one row per page, kind=page, and one per compared pair,
kind=pair) and OUTPUT/reannotate_summary.json. Exit code 0 when every page was compared or has a
recorded reason, 1 when a parsing run left inputs unaccounted for, 2 for bad arguments."""


def _named_set(text: str) -> tuple[str, tuple[str | None, str]]:
    from padoc_ray.curation.importers import parse_compare

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
                        "folder), model (a checkpoint, padoc, hpd or dots family, parsed here in fork mode into "
                        "OUTPUT/predictions/NAME/); detected when left out. E.g. mineru=mineru:out/, "
                        "other_model=s3://b/out or hpd=models/hpd")
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
    from padoc_ray.curation.agreement import AgreementConfig
    from padoc_ray.curation.importers import PredictionSetError
    from padoc_ray.curation.reannotate import ReannotateConfig, run_reannotate
    from padoc_ray.storage import InputError

    try:
        cfg = ReannotateConfig(
            gt=args.gt, source=args.source, output=args.output, batch=config_from_args(args),
            modes=args.modes, compare=dict(args.compare), min_agree=args.min_agree, dots_dpi=args.dots_dpi,
            agreement=AgreementConfig(match_iou=args.match_iou, consensus_iou=args.consensus_iou,
                                      consensus_edit=args.consensus_edit))
    except ValueError as e:
        return die(str(e), exit=False)
    try:
        summary = run_reannotate(cfg, start_ray=lambda: _init_ray(args))
    except (InputError, PredictionSetError, FileNotFoundError, ValueError) as e:
        return die(str(e), exit=False)
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
