"""The engine replica's health check (padoc_ray/serve/engine.py): Serve replaces a replica whose check
raises, killing its process outright, so a replica whose engine died shuts it down first
(``PageHost.shutdown_dead_engine``, which never raises: tests/unit/host/test_page_host.py). With the real
engine (a SIGKILLed core): tests/engine/host/test_page_host_on_vllm.py. Here, the edges: a live engine is
left alone, a dead one is shut down once and the check fails for its death."""

from __future__ import annotations

import asyncio

import pytest

from padoc_ray.serve.engine import EngineReplica


class _Host:
    def __init__(self, dead: str | None):
        self.dead, self.dead_shutdowns, self.shutdowns = dead, 0, 0

    def shutdown_dead_engine(self) -> None:
        self.dead_shutdowns += 1

    def shutdown(self) -> None:  # the replica's __del__
        self.shutdowns += 1


def _replica(host: _Host) -> EngineReplica:
    replica = EngineReplica.__new__(EngineReplica)  # its __init__ starts a real host
    replica.host = host
    return replica


def test_a_live_engine_passes_and_is_left_running():
    host = _Host(dead=None)
    replica = _replica(host)
    assert asyncio.run(replica.check_health()) is None
    assert host.dead_shutdowns == host.shutdowns == 0
    del replica  # a replica that goes shuts its engine down (EngineReplica.__del__)
    assert host.shutdowns == 1


def test_a_dead_engine_is_shut_down_and_the_check_fails_for_its_death():
    host = _Host(dead="vLLM engine died: core gone")
    replica = _replica(host)
    with pytest.raises(RuntimeError, match="^engine died: vLLM engine died: core gone$"):
        asyncio.run(replica.check_health())
    assert host.dead_shutdowns == 1
