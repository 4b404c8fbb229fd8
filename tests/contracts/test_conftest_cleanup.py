"""The tests' own clean-up (tests/conftest.py): :func:`stop_session` ends every process a child
started, also those in process groups of their own (as Ray's workers are), orphans, and processes
in another session that carry a cluster's mark; a process group alone (the old teardown) misses
them. Nothing of anyone else is touched."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import CLUSTER_ENV, session_processes, stop_process_group, stop_session

#: a leader that starts (1) a child in a process group of its own, (2) an orphan in its own group
#: (its parent exits), (3) a process in a session of its own carrying the cluster mark; then waits
TREE = r"""
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
subprocess.Popen(sleep, process_group=0)
subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys; "
                  "subprocess.Popen(%r, process_group=0); os._exit(0)" % (sleep,)]).wait()  # the orphan is up
subprocess.Popen(sleep, start_new_session=True, env=dict(os.environ, **{sys.argv[1]: sys.argv[2]}))
print("up", flush=True)
time.sleep(120)
"""


def _tree(tmp_path):
    mark = str(tmp_path / "ray-x")
    leader = subprocess.Popen([sys.executable, "-c", TREE, CLUSTER_ENV, mark], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert leader.stdout.readline().strip() == "up"
    return leader, mark


def test_stop_session_ends_what_a_process_group_misses(tmp_path):
    leader, mark = _tree(tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        procs = session_processes(leader, mark)
        assert len(procs) == 4 and bystander.pid not in {p.pid for p in procs}, procs  # leader + 3
        stop_process_group(leader.pid, grace_s=2)  # what the fixture did before: the leader's group only
        leader.wait(timeout=10)
        left = session_processes(leader, mark)
        assert len(left) == 3, left  # the own-group child, the orphan and the marked one survived it
        stop_session(leader, mark, grace_s=2, check=True)
        assert session_processes(leader, mark) == []
        assert bystander.poll() is None  # someone else's process is untouched
    finally:
        stop_session(leader, mark, grace_s=2)
        bystander.kill()
        bystander.wait(timeout=10)
        leader.stdout.close()


def test_a_reaped_leaders_pid_is_not_taken_for_its_session(tmp_path):
    """Once the leader is reaped and its session empty, a live process with its pid is someone
    else's: stop_session leaves it alone (simulated with a leader object whose pid is alive)."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        class Reaped:  # a leader we reaped, whose pid the kernel has handed to `other`
            pid = other.pid

            @staticmethod
            def poll():
                return 0

            @staticmethod
            def wait(timeout=None):
                return 0

        assert session_processes(Reaped) == []
        stop_session(Reaped, check=True)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)
