"""tests/helpers/worker_gc.py: the pytest workers run with the suite's collector thresholds, and what is alive
once a test module is over leaves the collector's view while the cyclic garbage it left is collected."""

from __future__ import annotations

import gc
import subprocess
import sys

from tests.conftest import ROOT
from tests.helpers import worker_gc


def test_this_worker_runs_with_the_suites_thresholds():
    assert gc.get_threshold() == worker_gc.THRESHOLDS != (700, 10, 10)


FIRST = '''
import gc, weakref

import pytest

class Cycle:
    def __init__(self):
        self.me = self

KEPT = Cycle()  # alive as long as the module: frozen after it
GONE = []

@pytest.fixture(scope="module")
def held():
    c = Cycle()  # garbage once the fixture is torn down, at the module's end
    GONE.append(weakref.ref(c))
    yield c

def test_first(held):
    gc.unfreeze()
    c = Cycle()
    GONE.append(weakref.ref(c))
    del c
'''

SECOND = '''
import gc, sys

def test_second():
    first = sys.modules["test_a_first"]
    assert [r() for r in first.GONE] == [None, None]  # collected at the module's end, after its teardown
    assert gc.get_freeze_count() > 0
    assert not any(o is first.KEPT for o in gc.get_objects())  # frozen

def test_third():  # test_second is not the module's last test: nothing but the first module's end froze
    pass
'''


def test_a_module_s_end_collects_and_freezes_what_is_left(tmp_path):
    """Two modules in a pytest run of their own with the plugin and nothing else (no randomized order): the
    second sees the first one's garbage cycles (one its module fixture held) collected and its live objects frozen."""
    (tmp_path / "test_a_first.py").write_text(FIRST)
    (tmp_path / "test_b_second.py").write_text(SECOND)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-p", "tests.helpers.worker_gc", "-c", "/dev/null", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_a_first.py"), str(tmp_path / "test_b_second.py")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


HANGS_AT_COLLECTION = '''
import signal, time

class StuckFinalizer:
    """Cyclic garbage whose finalizer never returns to Python (as a C wait would)."""

    def __init__(self):
        self.me = self

    def __del__(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)

def test_leaves_a_stuck_finalizer():
    StuckFinalizer()
'''


def test_a_module_end_collection_that_hangs_ends_the_worker_with_the_stacks(tmp_path):
    """The collection runs the module's finalizers outside any test's timers: one that never returns is ended by
    faulthandler (``faulthandler_timeout``, 3 s here), with its stack, not left to hang the run."""
    (tmp_path / "test_a_first.py").write_text(HANGS_AT_COLLECTION)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-p", "tests.helpers.worker_gc", "-c", "/dev/null", "--rootdir", str(tmp_path),
                          "-o", "faulthandler_timeout=3", "-o", "faulthandler_exit_on_timeout=true",
                          str(tmp_path / "test_a_first.py")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,  # without the guard: an hour
                         env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "Timeout (0:00:03)!" in out, out[-3000:]
    assert "in __del__" in out and "in freeze_startup_heap" in out, out[-3000:]
