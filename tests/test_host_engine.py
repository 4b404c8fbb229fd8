"""The engine host on the real CPU vLLM engine (tiny model, teacher-forced)."""

from __future__ import annotations

import asyncio
import glob
import os

import pytest

from padoc_ray.host import HostConfig, HostPage, PageHost
from padoc_ray.groundtruth import load_truth
from padoc_ray.inputs import load_pages

from .conftest import ROOT

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
            tasks = [asyncio.create_task(host.parse(HostPage(**{**p.__dict__, "salt": f"a{delay}-{i}"})))
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
            again = await asyncio.gather(*(host.parse(HostPage(**{**p.__dict__, "salt": f"b{delay}-{i}"}))
                                           for i, p in enumerate(pages)))
            assert [r.status for r in again] == ["ok"] * len(pages), [(r.page_id, r.status, r.message) for r in again]

    loop_thread.run(go(), timeout=600)
