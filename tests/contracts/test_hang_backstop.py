"""A test stuck where pytest-timeout cannot reach it ends its worker, with every thread's stack written out,
and the run goes on (pyproject.toml's faulthandler settings; docs/testing.md#hangs).

pytest-timeout raises in the test's main thread from a SIGALRM handler, which Python runs only when that
thread next executes bytecode: a test inside a C call that never returns hangs its worker, and the run with
it, until CI's limit. Here a pytest run with the repository's configuration (its pyproject.toml, the two
timeouts scaled down on the command line) runs a test that blocks SIGALRM before it sleeps: as stuck as a
C call for pytest-timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tomllib

import psutil

from tests.conftest import ROOT

HANGING = '''
import os
import signal
import subprocess
import sys
import time


def test_before():
    pass


def test_stuck_in_c():
    # a process of the test's own, in a session of its own (as a `ray start` cluster): no teardown stops it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    with open(os.environ["CHILD_PID_FILE"], "w") as f:
        f.write(str(child.pid))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # pytest-timeout's signal never gets through
    time.sleep(3600)


def test_after():
    pass
'''


def _settings() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["pytest"]["ini_options"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_backstop_comes_after_pytest_timeout_and_ends_the_process():
    ini = _settings()
    # pytest-timeout's failure (the test's own traceback, the run's process kept) comes first wherever it can
    assert float(ini["faulthandler_timeout"]) > float(ini["timeout"])
    assert ini["faulthandler_exit_on_timeout"] is True


def test_a_test_stuck_in_c_ends_its_worker_with_the_stacks_and_the_run_goes_on(tmp_path):
    """...and what the worker started is stopped (tests/helpers/worker_crash.py, given with ``-p`` here: this
    run does not load the suite's conftest)."""
    (tmp_path / "test_hanging.py").write_text(HANGING)
    pid_file = tmp_path / "child.pid"
    env = dict(os.environ, CHILD_PID_FILE=str(pid_file), PYTHONPATH=ROOT)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", os.path.join(ROOT, "pyproject.toml"), "--rootdir", str(tmp_path),
             "-p", "no:cacheprovider", "-p", "tests.helpers.worker_crash", "-n", "1", "-o", "timeout=1",
             "-o", "faulthandler_timeout=3", str(tmp_path / "test_hanging.py")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # without the backstop: an hour
        out = run.stdout + run.stderr
        assert run.returncode == 1, out[-3000:]
        assert "worker 'gw0' crashed while running 'test_hanging.py::test_stuck_in_c'" in out, out[-3000:]
        assert "Timeout (0:00:03)!" in out and "in test_stuck_in_c" in out, out[-3000:]  # faulthandler's dump
        assert "1 failed, 2 passed" in out, out[-3000:]  # the test after it ran, in a fresh worker
        assert "stopped 1 process(es) that crashed worker gw0 left" in out, out[-3000:]
        assert _gone(int(pid_file.read_text()))
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
