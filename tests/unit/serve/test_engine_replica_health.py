"""The engine replica's health check (padoc_ray/serve/engine.py): Serve replaces a replica whose check
raises, killing its process outright, so a replica whose engine died shuts it down first. With the real
engine (a SIGKILLed core): tests/engine/host/test_page_host_on_vllm.py. Here, the edges: a live engine is
left alone, and a shutdown that fails still fails the check for the engine's death."""

from __future__ import annotations

import asyncio
import logging

import pytest

from padoc_ray.serve.engine import EngineReplica


class _Host:
    def __init__(self, dead: str | None, fails: bool = False):
        self.dead, self.fails, self.shutdowns = dead, fails, 0

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.fails:
            raise OSError("the engine's temp folder could not be removed")


def _replica(host: _Host) -> EngineReplica:
    replica = EngineReplica.__new__(EngineReplica)  # its __init__ starts a real host
    replica.host = host
    return replica


def test_a_live_engine_passes_and_is_left_running():
    host = _Host(dead=None)
    replica = _replica(host)
    assert asyncio.run(replica.check_health()) is None
    assert host.shutdowns == 0
    del replica  # a replica that goes shuts its engine down (EngineReplica.__del__)
    assert host.shutdowns == 1


@pytest.mark.parametrize("fails", [False, True])
def test_a_dead_engine_is_shut_down_and_the_check_fails_for_its_death(fails, caplog):
    host = _Host(dead="vLLM engine died: core gone", fails=fails)
    replica = _replica(host)
    with caplog.at_level(logging.ERROR, logger="padoc_ray.serve.engine"):
        with pytest.raises(RuntimeError, match="^engine died: vLLM engine died: core gone$"):
            asyncio.run(replica.check_health())
    assert host.shutdowns == 1
    assert ("shutting the dead engine down failed" in caplog.text) == fails
    host.fails = False  # the replica's __del__ shuts it down again whenever it is collected: not an error then
