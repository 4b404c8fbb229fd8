"""The cyclic garbage collector is held off while an engine host starts (padoc_ray.engine.memory.paused_gc)
and comes back as it was: nested blocks, blocks in two threads, an exception, a collector already off."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading

import pytest

from padoc_ray.engine import memory
from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.host import HostConfig, PageHost

from tests.helpers.spawn_probe import Cycle
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


def test_a_started_host_freezes_what_its_start_left_and_gives_it_back_when_it_shuts_down(monkeypatch):
    """After PageHost.start (its own engine) the objects alive then (here a cycle the start built and kept) are
    out of the collector's view, frozen while the collector is still off, and cyclic garbage from before the start
    is gone (collected first, not frozen); after shutdown nothing is frozen, so the cycles the engine leaves can be
    collected."""
    import weakref

    import padoc_ray.host
    import padoc_ray.tokenizer as tokenizer

    gc.unfreeze()  # what the suite's workers froze (tests/helpers/worker_gc.py)
    kept = []

    def protocol(model_dir):
        kept.append(Cycle())
        return P

    monkeypatch.setattr(tokenizer, "ModelProtocol", protocol)
    garbage = Cycle()
    gone = weakref.ref(garbage)
    del garbage
    collector_on_at_freeze = []

    def freeze():
        collector_on_at_freeze.append(gc.isenabled())
        memory.freeze_startup_heap()

    monkeypatch.setattr(padoc_ray.host, "freeze_startup_heap", freeze)
    host = PageHost("unused", HostConfig(engine="noop"), truth={})
    try:
        asyncio.run(host.start())
        # frozen before the collector is back on: everything the start made is in the youngest generation until a
        # collection, so an automatic one after the pause would walk it all before the freeze's own pass
        assert collector_on_at_freeze == [False] and gc.isenabled()
        assert gone() is None  # collected before the freeze
        assert gc.get_freeze_count() > 0
        assert not any(o is kept[0] for o in gc.get_objects())  # frozen: no generation holds it
    finally:
        host.shutdown()
    assert gc.get_freeze_count() == 0
    assert any(o is kept[0] for o in gc.get_objects())
    # a host handed an engine (tests, benchmarks) leaves the heap to whoever owns the process
    lent = PageHost("unused", HostConfig(), truth={}, engine=ScriptedEngine(lambda req: [0]), model_protocol=P)
    asyncio.run(lent.start())
    assert gc.get_freeze_count() == 0
    lent.shutdown()


# ---- the engine processes vLLM spawns (padoc_ray/engine/spawn_boot) -----------------------------------------------
def _spawned_report(cfg) -> dict:
    """What a process spawned (multiprocessing's spawn, as vLLM starts its engine core) inside ``_spawn_env`` saw."""
    import multiprocessing

    from padoc_ray.engine.vllm_engine import _spawn_env

    from tests.helpers import spawn_probe

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    with _spawn_env(cfg):
        p = ctx.Process(target=spawn_probe.report, args=(q,))
        p.start()
    try:
        return q.get(timeout=120)
    finally:
        p.join(30)


def test_an_engine_process_imports_its_target_with_the_collector_off_and_runs_it_with_it_on(monkeypatch):
    """The spawned process imports its target's module (for the engine core: vLLM) with the collector off and
    runs the target with it on, the preparation's garbage collected and what it left alive frozen; PYTHONPATH,
    sys.path and the environment carry nothing of the start-up folder by then (what it starts in turn is
    unchanged), and this process's environment is as before."""
    from padoc_ray.engine.config import cpu_engine_config
    from padoc_ray.engine.vllm_engine import SPAWN_BOOT_PARENT

    monkeypatch.setenv("PYTHONPATH", "/nonexistent-kept")
    before = dict(os.environ)
    got = _spawned_report(cpu_engine_config("unused"))
    assert got == {"imported_with_gc": False, "gc_at_target": True, "pythonpath": "/nonexistent-kept",
                   "parent_var": None, "boot_on_sys_path": False, "preparation_garbage_collected": True,
                   "kept_frozen": True}
    assert dict(os.environ) == before and SPAWN_BOOT_PARENT not in os.environ


def _python(code: str, env: dict) -> str:
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_only_a_direct_child_of_the_process_that_set_it_up_is_changed_and_the_environments_own_still_runs(tmp_path):
    """A process whose parent is not the one named (a grandchild, say) keeps its collector; one that is, but is no
    multiprocessing child (vLLM's model inspection subprocess), runs with it off until it exits; both drop the
    folder and the variable, and an environment's own ``sitecustomize`` still runs after this one."""
    from padoc_ray.engine.vllm_engine import SPAWN_BOOT, SPAWN_BOOT_PARENT

    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.ENVIRONMENTS_OWN_SITECUSTOMIZE = True\n")
    code = ("import builtins, gc, os, sys; print(gc.isenabled(), os.environ.get('PYTHONPATH'), "
            f"os.environ.get({SPAWN_BOOT_PARENT!r}), {SPAWN_BOOT!r} in sys.path, "
            "getattr(builtins, 'ENVIRONMENTS_OWN_SITECUSTOMIZE', False))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SPAWN_BOOT, str(own)))}
    assert _python(code, {**env, SPAWN_BOOT_PARENT: "1"}) == f"True {own} None False True"
    assert _python(code, {**env, SPAWN_BOOT_PARENT: str(os.getpid())}) == f"False {own} None False True"
