"""The engine behind a narrow interface: ``interface`` (pure types), ``config`` (pure), and the
one vLLM adapter ``vllm_engine`` plus its logits processors, ``forcing`` (teacher forcing) and
``layout_constraint`` (the layout grammar) (all import vLLM lazily from here: importing this
package does not import vLLM)."""

from .config import EngineConfig, cpu_engine_config
from .interface import Engine, EngineDeadError, EngineError, GenDelta, GenRequest

__all__ = ["EngineConfig", "cpu_engine_config", "Engine", "EngineDeadError", "EngineError", "GenDelta", "GenRequest"]
