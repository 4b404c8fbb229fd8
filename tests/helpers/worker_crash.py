"""What a crashed pytest-xdist worker left running, stopped (a plugin that tests/conftest.py registers).

A worker that dies inside a test (ended by the hang backstop, docs/testing.md#hangs, or by a crash) runs no
teardown: its Ray cluster, S3 server, engines and renderers would go on taking the machine's cores for the
rest of the run. Every process a worker starts inherits the ``PYTEST_XDIST_TESTRUNUID`` and
``PYTEST_XDIST_WORKER`` that pytest-xdist sets in the worker (the tests hand their environment on, Ray
clusters included: tests/conftest.py's ``_env``), so when a worker goes down with an error, the controller
kills every process that carries both, before pytest-xdist starts the worker's replacement under the same name.
"""

from __future__ import annotations

import os

import psutil
import pytest

RUN_VAR, WORKER_VAR = "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER"


def left_by(run: str, worker: str) -> list[psutil.Process]:
    """The live processes whose environment names test run ``run`` and its worker ``worker``."""
    marks = {f"{RUN_VAR}={run}".encode(), f"{WORKER_VAR}={worker}".encode()}
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if marks <= set(f.read().split(b"\0")) and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, called in the controller
def pytest_testnodedown(node, error) -> None:
    if error is None:  # a worker that finished
        return
    worker = node.workerinput["workerid"]
    procs = left_by(node.workerinput["testrunuid"], worker)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    gone, alive = psutil.wait_procs(procs, timeout=10)
    if procs:
        reporter = node.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"stopped {len(gone)} process(es) that crashed worker {worker} left"
                                + (f"; {len(alive)} would not stop: pids {[p.pid for p in alive]}" if alive else ""))
