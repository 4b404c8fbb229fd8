"""Test-only fault injection for the engine adapter: make the engine die once, on purpose.

``PADOC_RAY_ENGINE_FAULTS`` holds a JSON object ``{"die_at_request": N, "once": MARKER, "how": HOW}``:
the N-th request a :class:`~padoc_ray.engine.vllm_engine.VllmEngine` in this process is asked to
generate kills the engine, in one of two ways (``HOW``):

* ``"raise"`` (the default): the request fails as if vLLM's engine core had died (vLLM's own
  ``EngineDeadError`` raised inside the adapter, mapped to
  :class:`~padoc_ray.engine.interface.EngineDeadError`). Nothing really dies.
* ``"kill_engine_core"``: a real crash. The request goes to vLLM, and when its first output arrives
  (mid-page) the adapter SIGKILLs this process's vLLM engine core process (its child process named
  ``VLLM::EngineCore``, :func:`kill_engine_core`). From there on it is vLLM's own doing: its
  engine-core monitor sees the process die and fails every request in flight, and every later one,
  with its ``EngineDeadError`` (measured on the CPU engine: about 0.1 s). It needs vLLM's
  multiprocessing engine core (the default; not ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

``MARKER`` is a file path, created atomically when the fault fires (it holds the pid of the process
whose engine died); while it exists the fault never fires again, in any process, so an engine actor
restarted by Ray (whose environment is the same) keeps working.

Pure: imports nothing heavy (psutil only when an engine core is killed). Unset (the default),
nothing is injected and nothing is checked beyond one dictionary lookup at engine start.
"""

from __future__ import annotations

import json
import logging
import os
import signal

ENGINE_FAULTS_ENV = "PADOC_RAY_ENGINE_FAULTS"
FAULT_KINDS = ("raise", "kill_engine_core")
ENGINE_CORE_NAME = "EngineCore"  #: vLLM's engine core process names itself VLLM::EngineCore (0.32)

logger = logging.getLogger(__name__)


class EngineFault:
    def __init__(self, die_at_request: int, once: str, how: str = "raise"):
        if die_at_request < 1 or not once:
            raise ValueError(f"{ENGINE_FAULTS_ENV}: die_at_request must be >= 1 and once a file path")
        if how not in FAULT_KINDS:
            raise ValueError(f"{ENGINE_FAULTS_ENV}: how must be one of {', '.join(FAULT_KINDS)}, got {how!r}")
        self.die_at_request, self.once, self.how, self.requests = die_at_request, once, how, 0

    @classmethod
    def from_env(cls) -> EngineFault | None:
        spec = os.environ.get(ENGINE_FAULTS_ENV)
        if not spec:
            return None
        obj = json.loads(spec)
        return cls(int(obj["die_at_request"]), str(obj["once"]), str(obj.get("how", "raise")))

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
            f.write(f"{os.getpid()}\n")  # which process's engine died
        return True


def engine_core_pids(parent: int | None = None) -> list[int]:
    """Process ids of vLLM engine core processes among the children of ``parent`` (default: this
    process): the processes whose name or command line names ``EngineCore``."""
    import psutil

    out = []
    for child in psutil.Process(parent or os.getpid()).children(recursive=True):
        try:
            if ENGINE_CORE_NAME in child.name() or any(ENGINE_CORE_NAME in a for a in child.cmdline()):
                out.append(child.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return out


def kill_engine_core(parent: int | None = None) -> list[int]:
    """SIGKILL every vLLM engine core process below ``parent`` (default: this process); returns their
    pids. Raises RuntimeError when there is none (an in-process engine core has no process to kill)."""
    pids = engine_core_pids(parent)
    if not pids:
        raise RuntimeError(f"{ENGINE_FAULTS_ENV}: no vLLM engine core process below pid {parent or os.getpid()} "
                           f"(VLLM_ENABLE_V1_MULTIPROCESSING=0 runs it in-process)")
    for pid in pids:
        logger.warning("test fault: SIGKILL of vLLM engine core process %d", pid)
        os.kill(pid, signal.SIGKILL)
    return pids
