"""``bench ...``: a table over the benchmarks of :mod:`padoc_ray.bench`.

Each benchmark is a config dataclass, whose fields are the command's flags (:mod:`padoc_ray.cli.flags`) and
whose docstring is its description, and an entry ``(config) -> exit code``. This module only names them: a
benchmark that cannot run as asked raises :class:`padoc_ray.bench.UsageError`, which is said here in one line
(exit 2)."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from padoc_ray.cli.common import add_command, die, group_help
from padoc_ray.cli.flags import add_fields, from_args


@dataclass(frozen=True)
class Bench:
    """``padoc-ray bench NAME``: ``ENTRY(CONFIG from the flags)`` of ``padoc_ray.bench.MODULE``."""

    name: str
    module: str
    config: str
    entry: str
    help: str


BENCHES = (
    Bench("replay", "serving.commands", "ReplayCommand", "replay",
          "fork vs sequential on one engine, teacher-forced with ground truth"),
    Bench("serve", "serving.commands", "ServeCommand", "serve",
          "the paper's serving benchmark: fork vs sequential at C=16..256, tables and plots"),
    Bench("loops", "loops", "LoopsConfig", "run",
          "the loop detector on every ground-truth page: false positives, and its cost per step"),
    Bench("viewer", "viewer", "ViewerBenchConfig", "main",
          "the viewer on a large synthetic output: time to first byte and full load"),
    Bench("model", "engine_model", "ModelCommand", "main",
          "a discrete-event model of one engine: pages/s, P95, tokens/s and $ per page before a run"),
    Bench("steps", "steps.run", "StepsCommand", "main",
          "engine decode step time vs batch size: is this machine in fork's regime?"),
    Bench("raster", "raster", "RasterBenchConfig", "main",
          "rasterization pages/s: padoc-ray's raster stage vs pdftoppm"),
    Bench("pageiou", "pageiou", "PageIoUBenchConfig", "main",
          "PageIoU pages/s: exact (coordinate compression) vs raster backend"),
    Bench("attention", "attention", "AttentionBenchConfig", "main",
          "ancestor attention backends (dense, flex, tree_varlen): time, memory, agreement"),
    Bench("pipeline", "pipeline", "PipelineBenchConfig", "main",
          "batch-job overhead: no-op engine pipeline vs raw rasterization"),
    Bench("driver", "driver", "DriverBenchConfig", "main",
          "the batch driver's bookkeeping (plan + documents table) over N page rows"),
    Bench("soak", "soak.run", "SoakConfig", "main",
          "a long mixed-traffic run of the online endpoint: RSS slopes, 5xx, lost jobs"),
    Bench("fairness", "serving.fairness", "FairnessConfig", "main",
          "one tenant's one-page latency while another tenant's long job runs"),
    Bench("http", "serving.http", "HttpBenchConfig", "main",
          "the Serve endpoint's overhead: HTTP clients vs the engine host directly"),
)


def config_from_args(args):
    """The config ``padoc-ray bench NAME ...`` builds from its parsed flags."""
    b = next(b for b in BENCHES if b.name == args.bench_command)
    return from_args(getattr(importlib.import_module(f"padoc_ray.bench.{b.module}"), b.config), args)


def _runner(b: Bench, cls: type, entry):
    prog = f"padoc-ray bench {b.name}"

    def run(args) -> int:
        from padoc_ray.bench import UsageError

        try:
            cfg = from_args(cls, args)
        except ValueError as e:
            return die(str(e), prog=prog)
        try:
            return entry(cfg)
        except UsageError as e:
            return die(str(e), prog=prog)

    return run


def register(sub) -> None:
    bench = add_command(sub, "bench", help="benchmarks (serve: fork vs sequential serving at C=16..256)",
                        description="Benchmarks whose figures go in reports, never in tests.")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    for b in BENCHES:
        mod = importlib.import_module(f"padoc_ray.bench.{b.module}")
        cls = getattr(mod, b.config)
        p = add_command(bsub, b.name, help=b.help, description=" ".join(inspect.getdoc(cls).split()))
        add_fields(p, cls)
        p.set_defaults(func=_runner(b, cls, getattr(mod, b.entry)))
    group_help(bench)
