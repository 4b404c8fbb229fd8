"""`padoc_ray.cli.sigterm_unwinds`: a SIGTERM unwinds the command with exit status 143, also when its handler
runs inside a finalizer, where Python drops the handler's exception. Each case runs in a child interpreter
(its main thread, with Python's default SIGTERM handler, as a command has). The command end to end, with
its engine shut down: tests/engine/cli/test_help_and_parse_page.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

CHILD = textwrap.dedent("""
    import signal, sys, time
    from padoc_ray.cli import sigterm_unwinds

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside the finalizer
            sum(range(100_000))

    t0 = time.monotonic()
    try:
        with sigterm_unwinds():
            {body}
            print("went on", flush=True)
    finally:
        print(f"unwound after {{time.monotonic() - t0:.2f}} s", flush=True)
        print("hook restored", sys.unraisablehook is sys.__unraisablehook__, flush=True)
""")


def _child(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD.format(body=body)], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def test_a_sigterm_unwinds_with_exit_status_143():
    r = _child("signal.raise_signal(signal.SIGTERM); time.sleep(30)")
    assert r.returncode == 143, r.stderr[-2000:]
    assert "went on" not in r.stdout and "hook restored True" in r.stdout


def test_a_sigterm_whose_handler_ran_in_a_finalizer_still_unwinds_the_command():
    """Without the redelivery, the exception raised inside ``__del__`` is printed as "Exception ignored"
    and the command sleeps its 30 s and goes on."""
    r = _child("Finalized(); time.sleep(30)")
    assert r.returncode == 143, (r.stdout, r.stderr[-2000:])
    assert "went on" not in r.stdout and "Exception ignored" not in r.stderr
    assert float(r.stdout.split("unwound after ")[1].split()[0]) < 20  # the sleep was cut, not waited out
    assert "hook restored True" in r.stdout


def test_other_unraisable_exceptions_still_reach_the_hook_before():
    r = _child("type('Bad', (), {'__del__': lambda self: 1 / 0})(); print('went on', flush=True)")
    assert r.returncode == 0 and "went on" in r.stdout
    assert "Exception ignored" in r.stderr and "ZeroDivisionError" in r.stderr
