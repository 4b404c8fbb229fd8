"""The ``padoc-ray`` command line: one package that owns every command.

One module per command group, each with ``register(sub)`` (see :mod:`padoc_ray.cli.common` for the
convention): ``model`` (build-tiny-model, init-model), ``parse`` (parse-page, demo), ``batch``
(parse, reannotate: also behind ``jobs/*.py``), ``serve``, ``show``, ``evaluate`` (eval layout|e2e),
``train``, ``corpus``, ``bench``, ``doctor``. Commands parse arguments, build config dataclasses and call library
code; they hold no parsing, scheduling or metric logic.

Run ``padoc-ray --help`` for the list of commands and ``padoc-ray COMMAND --help`` for each.
"""

from __future__ import annotations

import argparse
import importlib

from padoc_ray.cli.common import add_verbose, setup_logging

#: the command groups, in --help order (imported when the parser is built: importing one group, e.g.
#: ``padoc_ray.cli.evaluate`` alone, loads no other)
GROUPS = ("model", "parse", "batch", "serve", "corpus", "show", "view", "evaluate", "train", "bench", "doctor")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="padoc-ray",
        description="PaDoc document parsing on Ray and vLLM: a layout stream forks one content branch per "
                    "region, so a page decodes in the depth of its longest layout-content path.",
    )
    add_verbose(p, inherit=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for g in GROUPS:
        importlib.import_module(f"padoc_ray.cli.{g}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
