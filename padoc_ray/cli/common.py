"""What every command shares: the registration convention, argument types, the error report and
logging (Ray is started by :func:`padoc_ray.ray_init.init_ray`).

Every module of :mod:`padoc_ray.cli` exposes ``register(sub)``, which adds its commands with
:func:`add_command` (so each takes ``-v/--verbose`` the same way, before or after the command
name) and sets ``func`` to a function of the parsed arguments that returns the exit code: 0 done,
1 the work ran and something failed, 2 a usage error (:func:`die`, the one error report). The
flags of config fields (``SchedulerConfig``, ``HostConfig``, ``RenderConfig``, ``BatchConfig`` ...)
are made by :mod:`padoc_ray.cli.flags` from the dataclasses themselves: their defaults and help come
from the fields, never restated by hand (``tests/contracts/test_flags.py`` checks every flag's default).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
DEFAULT_MODEL = os.path.join(ROOT, "models", "tiny")


def die(msg: str, code: int = 2, *, prog: str = "padoc-ray", exit: bool = True) -> int:
    """The one error report of every command: ``PROG: error: MSG`` on stderr, one line, no traceback;
    then ``SystemExit(code)`` (2: a usage error), or, with ``exit=False``, ``code`` returned."""
    print(f"{prog}: error: {msg}", file=sys.stderr)
    if exit:
        raise SystemExit(code)
    return code


def add_verbose(p: argparse.ArgumentParser, *, inherit: bool = True) -> None:
    """``-v/--verbose``. ``inherit``: a sub-command's flag does not reset the top-level one."""
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS if inherit else False,
                   help="log at INFO level (default: warnings only)")


def add_command(sub, name: str, *, verbose: bool = True, **kwargs) -> argparse.ArgumentParser:
    """A command (or a sub-command of a group) with the shared flags."""
    p = sub.add_parser(name, **kwargs)
    if verbose:
        add_verbose(p)
    return p


def group_help(p: argparse.ArgumentParser) -> None:
    """A command group called without its sub-command prints its help and exits 2."""
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def setup_logging(verbose: bool) -> None:
    """One logging set-up for every command (stdout stays for results, in engine processes too)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# ---- argument types -----------------------------------------------------------------------------------
def positive(kind):
    """``type=positive(int)`` / ``positive(float)``: a number > 0, or a usage error that says so."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return v

    return parse


def int_list(text: str) -> list[int]:
    """``1,4,16`` -> [1, 4, 16] (positive integers)."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError("values must be positive integers")
    return vals


def str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def page_ranges(text: str | None) -> list[int] | None:
    """'1-3,7' (1-based, inclusive) -> [0, 1, 2, 6]; None -> None (all pages)."""
    from padoc_ray.output.rows import PageRangeError
    from padoc_ray.output.rows import parse_page_ranges as parse

    try:
        got = parse(text)
    except PageRangeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return None if got is None else list(got)


def job_parser(prog: str, description: str, add_args) -> argparse.ArgumentParser:
    """The parser of a ``jobs/*.py`` Ray job script: the same flags as its ``padoc-ray`` command."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_args(p)
    add_verbose(p, inherit=False)
    return p


def job_main(prog: str, description: str, add_args, run, argv=None) -> int:
    """The entry point of a ``jobs/*.py`` Ray job script."""
    args = job_parser(prog, description, add_args).parse_args(argv)
    setup_logging(args.verbose)
    return run(args)
