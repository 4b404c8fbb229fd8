"""What every command shares: the registration convention, argument types, errors and logging (Ray is
started by :func:`padoc_ray.ray_init.init_ray`).

Every module of :mod:`padoc_ray.cli` exposes ``register(sub)``, which adds its commands with
:func:`add_command` (so each takes ``-v/--verbose`` the same way, before or after the command
name) and sets ``func`` to a function of the parsed arguments that returns the exit code: 0 done,
1 the work ran and something failed, 2 a usage error (:func:`die`). Defaults come from the config
dataclasses (``HostConfig``, ``SchedulerConfig``, ``BatchConfig`` ...), never restated here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
DEFAULT_MODEL = os.path.join(ROOT, "models", "tiny")


def die(msg: str, code: int = 2):
    """A usage error (or ``code``): one line on stderr, no traceback."""
    print(f"padoc-ray: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


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


# ---- the generation flags every parsing surface shares (defaults: SchedulerConfig's, RenderConfig's) ------
def add_mode(p, *, help_suffix: str = "") -> None:
    from padoc_ray.scheduler.state import DECODE_MODES

    p.add_argument("--mode", choices=DECODE_MODES, default=DECODE_MODES[0],
                   help="fork: the PaDoc layout stream + concurrent content branches; sequential: one interleaved "
                        f"stream (the paper's baseline). Default {DECODE_MODES[0]}{help_suffix}")


def add_stream_limits(p, *, number=int) -> None:
    """--max-tokens, --max-branches, --constrain-layout (``number``: the argparse type of the limits)."""
    from padoc_ray.scheduler import SchedulerConfig

    d = SchedulerConfig()
    p.add_argument("--max-tokens", type=number, default=d.max_tokens,
                   help=f"generated tokens per stream (default {d.max_tokens})")
    p.add_argument("--max-branches", type=number, default=d.max_branches,
                   help=f"content branches per page (default {d.max_branches})")
    add_constrain_layout(p)


def add_constrain_layout(p) -> None:
    p.add_argument("--constrain-layout", action="store_true",
                   help="keep each layout stream in the checkpoint's layout grammar (a logits mask: category, ordered "
                        "box coordinates, region close; at most --max-branches regions), so no page ends "
                        "malformed_layout; teacher-forced tokens still win (default: off)")


def add_render(p) -> None:
    from padoc_ray.pdf import RenderConfig

    d = RenderConfig()
    p.add_argument("--longest-side", type=int, default=d.longest_side,
                   help=f"render PDF pages to this many pixels (default {d.longest_side})")
    p.add_argument("--dpi", type=float, default=None, help="render PDF pages at this DPI instead of --longest-side")
