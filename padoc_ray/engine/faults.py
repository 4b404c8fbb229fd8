"""Test-only fault injection for the engine adapter: make the engine "die" once, on purpose.

``PADOC_RAY_ENGINE_FAULTS`` holds a JSON object ``{"die_at_request": N, "once": MARKER}``: the N-th
request a :class:`~padoc_ray.engine.vllm_engine.VllmEngine` in this process is asked to generate
fails as if vLLM's engine core had died (vLLM's own ``EngineDeadError``, mapped by the adapter to
:class:`~padoc_ray.engine.interface.EngineDeadError`). ``MARKER`` is a file path, created
atomically when the fault fires; while it exists the fault never fires again, in any process, so
an engine actor restarted by Ray (whose environment is the same) keeps working.

Pure: imports nothing heavy. Unset (the default), nothing is injected and nothing is checked
beyond one dictionary lookup at engine start.
"""

from __future__ import annotations

import json
import os

ENGINE_FAULTS_ENV = "PADOC_RAY_ENGINE_FAULTS"


class EngineFault:
    def __init__(self, die_at_request: int, once: str):
        if die_at_request < 1 or not once:
            raise ValueError(f"{ENGINE_FAULTS_ENV}: die_at_request must be >= 1 and once a file path")
        self.die_at_request, self.once, self.requests = die_at_request, once, 0

    @classmethod
    def from_env(cls) -> EngineFault | None:
        spec = os.environ.get(ENGINE_FAULTS_ENV)
        if not spec:
            return None
        obj = json.loads(spec)
        return cls(int(obj["die_at_request"]), str(obj["once"]))

    def fires(self) -> bool:
        """Count one request; True exactly once over all processes (the marker file decides)."""
        self.requests += 1
        if self.requests < self.die_at_request or os.path.exists(self.once):
            return False
        try:
            os.close(os.open(self.once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return False
        with open(self.once, "w") as f:
            f.write(f"{os.getpid()}\n")  # which process "died"
        return True
