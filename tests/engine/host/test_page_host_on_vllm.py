"""The engine host on the real CPU vLLM engine (tiny model, teacher-forced)."""

from __future__ import annotations

import asyncio
import glob
import os

import pytest

from padoc_ray.groundtruth import load_truth
from padoc_ray.host import HostConfig, PageHost, PageRequest
from padoc_ray.inputs import load_pages

from tests.conftest import ROOT

pytestmark = pytest.mark.engine


def test_pages_cancelled_early_do_not_break_the_next_request_for_them(cpu_engine, model_protocol, loop_thread,
                                                                      tiny_model_dir):
    """A request cancelled before vLLM had its image (a client that left) must not poison the
    next request for the same pages: online, every request has its own salt, hence its own image
    uuid (vLLM 0.32 failed the next request of a reused uuid with finish reason "error")."""
    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    pages = [it.page for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf"))))] * 4
    host = PageHost(tiny_model_dir, HostConfig(pages_in_flight=32), truth=truth, engine=cpu_engine,
                    model_protocol=model_protocol)

    async def go():
        await host.start()
        for delay in (0.02, 0.05, 0.1):
            tasks = [asyncio.create_task(host.parse(PageRequest(**{**p.__dict__, "salt": f"a{delay}-{i}"})))
                     for i, p in enumerate(pages)]
            await asyncio.sleep(delay)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for _ in range(100):  # cancelled pages leave nothing in the engine (aborts land within moments)
                if host.unfinished_requests() == 0:
                    break
                await asyncio.sleep(0.05)
            assert host.unfinished_requests() == 0
            again = await asyncio.gather(*(host.parse(PageRequest(**{**p.__dict__, "salt": f"b{delay}-{i}"}))
                                           for i, p in enumerate(pages)))
            assert [r.status for r in again] == ["ok"] * len(pages), [(r.page_id, r.status, r.message) for r in again]

    loop_thread.run(go(), timeout=600)


def test_a_sigkilled_engine_core_is_an_engine_death_within_seconds(tiny_model_dir, record_property):
    """A real engine crash: vLLM's engine core process (the child of the process hosting the
    AsyncLLM) is SIGKILLed while pages run on an engine of this test's own. Every page then ends
    with EngineDeadError, none hangs, within a bound (vLLM's own engine-core monitor notices: about
    0.1 s measured here; the bound is 60 s), and the host refuses every later page at once: before it
    is admitted, so nothing of it reaches the engine. The engine core kept its files in the engine's own
    temp folder, which is gone once the host shut down (the killed core could not remove its file store),
    and so are the sockets between its processes, bound there. Serve's health check of the host fails and
    shuts the dead engine down itself."""
    import signal
    import stat
    import time

    import psutil

    from padoc_ray.engine.faults import engine_core_pids
    from padoc_ray.engine.interface import EngineDeadError
    from padoc_ray.serve.engine import EngineReplica

    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    pages = [it.page for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf"))))]
    host = PageHost(tiny_model_dir, HostConfig(pages_in_flight=4), truth=truth)
    temp_dir = None

    async def go():
        before = set(engine_core_pids())  # the session's shared engine, if a test started it
        await host.start()
        try:
            nonlocal temp_dir
            temp_dir = host.engine.temp_dir
            cores = sorted(set(engine_core_pids()) - before)
            assert len(cores) == 1, cores  # this engine's core: one process, a child of this one
            # the core's torch.distributed file store: in the engine's temp folder (its TMPDIR), not /tmp
            assert glob.glob(os.path.join(temp_dir, "vllm_dist_*")), os.listdir(temp_dir)
            # and the sockets between the engine's processes (vLLM leaves their files even after a clean shutdown)
            kept = [p for p in glob.glob(os.path.join(temp_dir, "*")) if stat.S_ISSOCK(os.lstat(p).st_mode)]
            assert len(kept) >= 2, os.listdir(temp_dir)
            first = await host.parse(pages[0])  # the engine works before the crash
            assert first.status == "ok", first.message
            tasks = [asyncio.create_task(host.parse(p)) for p in pages * 3]
            while host.unfinished_requests() == 0:  # mid-page: requests of running pages are in the engine
                await asyncio.sleep(0.01)
            killed_at = time.monotonic()
            os.kill(cores[0], signal.SIGKILL)
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            detect_s = time.monotonic() - killed_at
            record_property("engine_death_detected_s", round(detect_s, 3))
            print(f"engine core SIGKILL -> every page ended in {detect_s:.3f} s")
            errors = [r for r in done if isinstance(r, BaseException)]
            assert errors and all(isinstance(e, EngineDeadError) for e in errors), [repr(e) for e in errors]
            assert all(r.status == "ok" for r in done if not isinstance(r, BaseException))  # done before the kill
            assert host.dead is not None and host.engine.llm.errored
            admitted = host.pages_admitted
            with pytest.raises(EngineDeadError, match="died earlier"):
                await host.parse(pages[0])
            assert host.pages_admitted == admitted  # refused before it was admitted: no request of it was made
            assert not psutil.pid_exists(cores[0]) or psutil.Process(cores[0]).status() == psutil.STATUS_ZOMBIE
            # Serve's health check on this host (an engine replica's): it fails, and shuts the dead engine down
            # first (Serve then kills the replica's process outright, which would leave the folder behind)
            replica = EngineReplica.__new__(EngineReplica)  # its __init__ starts a host of its own
            replica.host = host
            with pytest.raises(RuntimeError, match="engine died"):
                await replica.check_health()
            assert host.engine is None and not os.path.exists(temp_dir)
            with pytest.raises(EngineDeadError, match="died earlier"):  # still dead, not "not started"
                await host.parse(pages[0])
        finally:
            host.shutdown()
            await asyncio.sleep(0.1)

    asyncio.run(go())
    assert not os.path.exists(temp_dir)


def test_engine_fault_spec(monkeypatch, tmp_path):
    """PADOC_RAY_ENGINE_FAULTS: "how" defaults to "raise", "kill_engine_core" is the real crash,
    anything else is refused; the fault fires once over all processes (its marker file)."""
    import json

    from padoc_ray.engine.faults import ENGINE_FAULTS_ENV, EngineFault, engine_core_pids

    marker = tmp_path / "died"
    monkeypatch.setenv(ENGINE_FAULTS_ENV, json.dumps({"die_at_request": 2, "once": str(marker)}))
    f = EngineFault.from_env()
    assert f.how == "raise" and [f.fires(), f.fires(), f.fires()] == [False, True, False]
    assert int(marker.read_text()) == os.getpid()
    g = EngineFault(1, str(marker), "kill_engine_core")
    assert g.how == "kill_engine_core" and not g.fires()  # the marker exists: never again
    with pytest.raises(ValueError, match="how must be one of"):
        EngineFault(1, str(marker), "segfault")
    import subprocess
    import sys

    from padoc_ray.engine.faults import kill_engine_core

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a process without an engine core: nothing to kill is an error, never a silent no-op
        assert engine_core_pids(sleeper.pid) == []
        with pytest.raises(RuntimeError, match="no vLLM engine core process"):
            kill_engine_core(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_a_salt_is_a_cache_namespace(cpu_engine, model_protocol, loop_thread, tiny_model_dir):
    """What makes Serve's per-request salt mean anything: the same page parsed twice reuses its
    image and prompt prefix when both requests carry one salt, and reuses nothing when they carry
    two (the second then counts exactly the cached tokens of the first, which are the page's own
    branch-over-layout reuse)."""
    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    (page,) = [it.page for it in load_pages([os.path.join(ROOT, "examples", "memo.pdf")])]
    host = PageHost(tiny_model_dir, HostConfig(), truth=truth, engine=cpu_engine, model_protocol=model_protocol)

    async def go():
        await host.start()
        out = {}
        for salts in (("one", "one"), ("first", "second")):
            recs = [await host.parse(PageRequest(**{**page.__dict__, "salt": f"cache-test-{s}", "tenant": "t"}))
                    for s in salts]
            assert [r.status for r in recs] == ["ok", "ok"]
            out[salts] = [r.cached_tokens for r in recs]
        return out

    got = loop_thread.run(go(), timeout=600)
    shared, apart = got[("one", "one")], got[("first", "second")]
    assert shared[1] > shared[0], got  # one salt: the second request hit the first one's blocks
    assert apart[1] == apart[0] == shared[0], got  # two salts: nothing shared


def test_pages_engine_time_sums_to_the_engine_s_busy_time(cpu_engine, model_protocol, loop_thread, tiny_model_dir):
    """Issue 29 on the real engine: pages in both modes, run together on one host, use engine time
    (engine_s) that adds up to the time the engine had a page's request in it, within 1%, wave by
    wave (the pause between two waves is in neither); no page is charged more than its wall time."""
    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    pages = [it.page for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf"))))]
    host = PageHost(tiny_model_dir, HostConfig(pages_in_flight=8), truth=truth, engine=cpu_engine,
                    model_protocol=model_protocol)

    async def wave(tag):
        return await asyncio.gather(*(host.parse(PageRequest(**{**p.__dict__, "salt": f"engine-s-{tag}-{i}",
                                                                "mode": ("fork", "sequential")[i % 2]}))
                                      for i, p in enumerate(pages * 2)))

    async def go():
        await host.start()
        first = await wave("a")
        busy_first = host.meter.busy_s()
        await asyncio.sleep(0.2)
        return first, busy_first, await wave("b"), host.meter.busy_s(), host.meter.live

    first, busy_first, second, busy, live = loop_thread.run(go(), timeout=600)
    recs = first + second
    assert [r.status for r in recs] == ["ok"] * len(recs), [(r.page_id, r.status, r.message) for r in recs]
    assert live == 0 and all(0 < r.engine_s <= r.e2e_s for r in recs), [(r.engine_s, r.e2e_s) for r in recs]
    assert sum(r.engine_s for r in first) == pytest.approx(busy_first, rel=0.01)
    assert sum(r.engine_s for r in second) == pytest.approx(busy - busy_first, rel=0.01)
