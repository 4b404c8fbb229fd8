"""Python's cyclic garbage collector in the pytest workers (a plugin that tests/conftest.py registers).

A worker accumulates a large heap that lives as long as it does: the modules it imported (torch,
transformers, vLLM, Ray, pyarrow) and the session's fixtures. With the collector's defaults, every
full collection walked all of it again: in the unit tier alone the two workers spent 21 of their 108
CPU-s collecting (44 and 28 full collections of 0.17-0.31 CPU-s each). Here:

* once a test module is over (its module fixtures torn down), one collection, and the survivors leave
  the collector's view (``gc.freeze``), as an engine host does after its start
  (:func:`padoc_ray.engine.memory.freeze_startup_heap`), and for the same reason;
* the first generation is collected every 10,000 net allocations, not 700 (the older ones every 20
  collections of the one below), so a test that builds large object graphs is not interrupted as
  often. Nothing in the suite depends on when the collector runs; reference counting frees most
  objects whatever the thresholds.

The collection at a module's end runs after the test's own protocol, where neither pytest-timeout's nor
faulthandler's timer is set, and it runs the finalizers of what the module left (a zmq context's
``destroy``, a thread's ``join``): it is watched as a test is (docs/testing.md#hangs), by faulthandler with
the suite's ``faulthandler_timeout``, which writes every thread's stack and ends the worker if it hangs.

The processes the tests start (commands, Ray workers, engines) keep Python's defaults: this is the
test harness's own process, not the product's.
"""

from __future__ import annotations

import faulthandler
import gc
import sys

import pytest

from padoc_ray.engine.memory import freeze_startup_heap

#: the workers' collector thresholds (Python's defaults: 700, 10, 10)
THRESHOLDS = (10_000, 20, 20)


def pytest_configure(config) -> None:
    gc.set_threshold(*THRESHOLDS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield  # the whole test: its teardown (the module's fixtures are finalized when the next test is elsewhere),
    # and then pytest letting go of the fixture values the test was given
    if nextitem is None or nextitem.module is not item.module:
        limit = float(item.config.getini("faulthandler_timeout") or 0)
        if limit > 0:  # between tests the capture is off: stderr is the run's
            faulthandler.dump_traceback_later(limit, exit=item.config.getini("faulthandler_exit_on_timeout"),
                                              file=sys.__stderr__)
        try:
            freeze_startup_heap()  # one collection, then the survivors frozen
        finally:
            if limit > 0:
                faulthandler.cancel_dump_traceback_later()
