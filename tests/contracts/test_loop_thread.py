"""The tests' event-loop thread (tests/helpers/aio.py): a call that times out is cancelled, so it cannot
go on running into the tests after it (a page left running made two later tests of its module fail on
CI: one saw its requests live in the engine, the other its fault fire on them)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.helpers.aio import LoopThread


def test_a_call_that_times_out_is_cancelled_and_the_loop_serves_the_next():
    lt = LoopThread(name="test-loop")
    cancelled = threading.Event()

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(TimeoutError):
            lt.run(forever(), timeout=0.1)
        assert cancelled.wait(5), "the timed-out call was still running"
        assert lt.run(asyncio.sleep(0, result="next"), timeout=5) == "next"
    finally:
        lt.stop()
