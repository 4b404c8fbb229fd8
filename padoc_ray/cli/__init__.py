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
import contextlib
import importlib
import signal
import threading

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


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM ends a command the way Ctrl-C does: an exception (``SystemExit(143)``) unwinds its stack,
    so the ``finally`` blocks that shut engines down run. Python's default dies on the spot, and vLLM's
    engine-core process outlives it (a ``bench serve`` stopped with SIGTERM left its engine core running,
    1.4 GB and polling, 2026-12-03). Only in the main thread, only where no handler is installed yet
    (``serve`` installs its own after Ray's), and the handler before is restored afterwards."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    with sigterm_unwinds():
        return int(args.func(args) or 0)
