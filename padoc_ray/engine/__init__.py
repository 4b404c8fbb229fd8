"""The engine behind a narrow interface: ``interface`` (pure types), ``config`` (pure), and the
one vLLM adapter ``vllm_engine`` plus its ``forcing`` logits processor (both import vLLM lazily
from here: importing this package does not import vLLM)."""

from .config import EngineConfig, cpu_engine_config
from .interface import Engine, EngineDeadError, EngineError, GenDelta, GenRequest

__all__ = ["EngineConfig", "cpu_engine_config", "Engine", "EngineDeadError", "EngineError", "GenDelta", "GenRequest"]
