"""``padoc-ray ARGS`` run in the test's own process (:func:`padoc_ray.cli.main`), its output taken from pytest's
``capsys``: for commands whose subject is not a process of their own (those run as processes: ``cli_logged`` in
tests/engine/cli/test_demo_and_bench_commands.py)."""

from __future__ import annotations

import types


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``padoc-ray ARGV``; a command that stops with ``SystemExit`` (``die``: the
    message is on stderr) gives its code. Output written before the call is not part of it."""
    from padoc_ray.cli import main

    capsys.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    got = capsys.readouterr()
    return rc, got.out, got.err


def run_cli(capsys, *argv: str) -> types.SimpleNamespace:
    """:func:`run_main`'s result as a finished process reports it (``returncode``, ``stdout``, ``stderr``)."""
    rc, out, err = run_main(capsys, *argv)
    return types.SimpleNamespace(returncode=rc, stdout=out, stderr=err)
