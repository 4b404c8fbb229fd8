"""``bench serve`` and ``bench replay``: the serving benchmark (:mod:`padoc_ray.bench.serving.run`) as two
commands, each a config whose fields are its flags and an entry that runs it."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass

from padoc_ray.bench import UsageError, require_path
from padoc_ray.bench.serving.run import ModeError, PageSetError, ServeBenchConfig, run
from padoc_ray.host import HostConfig
from padoc_ray.knobs import comma_items, comma_text, knob

#: the engine host's knobs both commands take: every SchedulerConfig field, --max-num-seqs, the branch cap
#: and the injected loops (pages in flight: the largest concurrency)
HOST_FLAGS = ("scheduler", "engine_overrides", "max_live_branches", "inject_loops", "inject_seed")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, kw_only=True)
class ServeCommand:
    """Closed loops keeping C pages in flight, fork and sequential on one engine and one page set
    (OmniDocBench-format ground truth + page images, teacher-forced), warm-up first; on a PageHost here
    (--target direct) or the Serve endpoint on a local Ray over HTTP (--target http). Writes OUT/report.json
    (one row per mode and C), OUT/report.md (tables like the paper's Tables 3 and 11), OUT/pages.jsonl and PNG
    plots (valid pages/s and P95 vs C)."""

    gt: tuple[str, ...] = knob(action="append", metavar="GT.json", to_field=tuple,
                               help="OmniDocBench-format ground truth; repeat it (with --images) to add page sets, "
                                    "in order")
    images: tuple[str, ...] = knob(action="append", metavar="DIR", to_field=tuple,
                                   help="folder holding each page's image_path; one per --gt, in the same order")
    model: str = knob(help="checkpoint directory")
    bench: ServeBenchConfig = knob(factory=ServeBenchConfig, nested=(
        "concurrency", "pages", "target", "modes", "warmup", "replay", "speed_probe", "speed_probe_image", "pdfs"))
    out: str = knob(help="output folder")
    host: HostConfig = knob(factory=HostConfig, nested=HOST_FLAGS)


def serve(cmd: ServeCommand) -> int:
    """Run the benchmark, print report.md."""
    if len(cmd.gt) != len(cmd.images):
        raise UsageError(f"--gt and --images pair up in order: got {len(cmd.gt)} --gt and {len(cmd.images)} "
                         f"--images")
    require_path(cmd.model, "--model", kind="dir")
    cfg = cmd.bench
    if cfg.speed_probe and not os.path.isfile(cfg.speed_probe_image):
        raise UsageError(f"--speed-probe-image: {cfg.speed_probe_image} is not a file")
    host = dataclasses.replace(cmd.host, pages_in_flight=max(cfg.concurrency))
    try:
        report = run(list(zip(cmd.gt, cmd.images)), os.path.abspath(cmd.model), cfg, host, cmd.out, log=_log)
    except (PageSetError, ModeError) as e:
        raise UsageError(str(e)) from None
    with open(os.path.join(cmd.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"wrote {cmd.out}/report.json, report.md, pages.jsonl and {', '.join(report['plots']) or 'no plots'}")
    return 0


@dataclass(frozen=True, kw_only=True)
class ReplayCommand:
    """Replay OmniDocBench-format pages on one engine, fork vs sequential, at each concurrency (closed loop),
    teacher-forced so a random-weight model does a trained model's work. Writes OUT/summary.json and
    OUT/pages.jsonl and prints a table."""

    gt: str = knob(help="OmniDocBench-format ground-truth JSON")
    images: str = knob(help="folder holding each page's image_path")
    model: str = knob(help="checkpoint directory")
    concurrency: tuple[int, ...] = knob((1, 4, 16), parse="ints", note="comma list")
    modes: tuple[str, ...] = knob(("fork", "sequential"), from_field=comma_text, to_field=comma_items,
                                  note="comma list")
    out: str = knob(help="output folder")
    limit: int | None = knob(None, help="use only the first N pages", default_text="all")
    warmup: int = 2  #: untimed warm-up pages per mode
    #: the folder of the pages' source PDFs (each truth's page_info.source_pdf): every page carries its text
    #: layer, so --text-layer speculate drafts from it; none: image pages, no drafts
    pdfs: str | None = knob(None, metavar="DIR")
    host: HostConfig = knob(factory=HostConfig, nested=HOST_FLAGS)


def replay(cmd: ReplayCommand) -> int:
    """The serving benchmark with its old defaults (C=1,4,16, every page) and its old output (summary.json,
    pages.jsonl, the table on stdout), plus report.json/report.md."""
    from padoc_ray.perfmodel.table3 import format_table, legacy_summary

    for path, what in ((cmd.gt, "--gt"), (cmd.images, "--images"), (cmd.model, "--model")):
        require_path(path, what)
    cfg = ServeBenchConfig(concurrency=cmd.concurrency, pages=cmd.limit, modes=cmd.modes, warmup=cmd.warmup,
                           pdfs=cmd.pdfs)
    host = dataclasses.replace(cmd.host, pages_in_flight=max(cfg.concurrency))
    try:
        report = run([(cmd.gt, cmd.images)], cmd.model, cfg, host, cmd.out, log=_log)
    except (PageSetError, ModeError) as e:
        raise UsageError(str(e)) from None
    summary = legacy_summary(report)
    with open(os.path.join(cmd.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(format_table(summary))
    print(f"wrote {os.path.join(cmd.out, 'summary.json')} and pages.jsonl (and report.json, report.md)")
    return 0
