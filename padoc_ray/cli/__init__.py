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
import sys
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


class Terminated(SystemExit):
    """What a SIGTERM raises in a command (:func:`sigterm_unwinds`): exit status 128 + the signal."""


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM ends a command the way Ctrl-C does: an exception (:class:`Terminated`, a ``SystemExit(143)``)
    unwinds its stack, so the ``finally`` blocks that shut engines down run. Python's default dies on the
    spot, and vLLM's engine-core process outlives it (a ``bench serve`` stopped with SIGTERM left its engine
    core running, 1.4 GB and polling, 2026-12-03). Only in the main thread, only where no handler is installed
    yet (``serve`` installs its own after Ray's), and the handler before is restored afterwards.

    A signal's handler runs wherever the main thread is: inside a ``__del__`` finalizer or a weakref or gc
    callback, Python prints the exception and drops it ("Exception ignored in ...") and the command would go
    on as if never stopped (a `bench steps` run kept decoding after its SIGTERM, 2026-12-05). Python reports
    such an exception to ``sys.unraisablehook``: for ours, the hook delivers the signal again a moment later,
    once the finalizer is over."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def on_term(signum, _frame):
        raise Terminated(128 + signum)

    hook_before, main_thread = sys.unraisablehook, threading.main_thread().ident

    def redeliver(unraisable):
        if isinstance(unraisable.exc_value, Terminated):
            # to the main thread itself, so that a sleep or a wait it is in returns to run the handler
            threading.Timer(REDELIVER_S, signal.pthread_kill, (main_thread, unraisable.exc_value.code - 128)).start()
        else:
            hook_before(unraisable)

    before = signal.signal(signal.SIGTERM, on_term)
    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        sys.unraisablehook = hook_before


#: how long after a SIGTERM swallowed by a finalizer it is delivered again
REDELIVER_S = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    with sigterm_unwinds():
        return int(args.func(args) or 0)
