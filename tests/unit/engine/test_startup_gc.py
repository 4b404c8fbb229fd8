"""The cyclic garbage collector is held off while an engine host starts (padoc_ray.engine.memory.paused_gc)
and comes back as it was: nested blocks, blocks in two threads, an exception, a collector already off."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from padoc_ray.engine import memory
from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.host import HostConfig, PageHost

from tests.unit.scheduler.test_run_page import P


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_in_the_block_and_back_after_it_even_on_an_error():
    with memory.paused_gc():
        assert not gc.isenabled()
        with memory.paused_gc():  # nested: the inner block's end does not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with memory.paused_gc():
            raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with memory.paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_blocks_in_two_threads_turn_it_on_when_the_last_one_ends():
    entered, release = threading.Event(), threading.Event()
    seen = []

    def other():
        with memory.paused_gc():
            entered.set()
            release.wait(10)
        seen.append(gc.isenabled())

    t = threading.Thread(target=other)
    with memory.paused_gc():
        t.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread's block is still open
    release.set()
    t.join(10)
    assert seen == [True] and gc.isenabled()


def test_a_host_builds_its_protocol_and_engine_with_the_collector_off(monkeypatch):
    """PageHost.start loads the checkpoint's protocol (the tokenizer's imports) and builds its engine (vLLM's
    imports) inside the block; pages run with the collector on."""
    import padoc_ray.engine.fake as fake
    import padoc_ray.tokenizer as tokenizer

    states = {}

    def protocol(model_dir):
        states["protocol"] = gc.isenabled()
        return P

    class Engine(ScriptedEngine):
        def __init__(self, *a, **kw):
            states["engine"] = gc.isenabled()
            super().__init__(*a, **kw)

    monkeypatch.setattr(tokenizer, "ModelProtocol", protocol)
    monkeypatch.setattr(fake, "ScriptedEngine", Engine)
    host = PageHost("unused", HostConfig(engine="noop"), truth={})
    asyncio.run(host.start())
    assert states == {"protocol": False, "engine": False}
    assert host.started and isinstance(host.engine, Engine) and gc.isenabled()
