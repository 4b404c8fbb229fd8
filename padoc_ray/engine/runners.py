"""Which of vLLM's two model runners an engine gets, and what padoc-ray registers on each.

vLLM 0.32 has two model runners, with two logits-processor interfaces:

* **V1** (``vllm/v1/worker/gpu_model_runner.py``; on CPU the only one, Triton having no CPU
  backend): processors subclass ``vllm.v1.sample.logits_processor.LogitsProcessor``. Teacher forcing
  is padoc-ray's :mod:`~padoc_ray.engine.forcing` processor.
* **Model Runner V2** (MRv2, ``vllm/v1/worker/gpu/``): vLLM's default on CUDA whenever Triton works
  (``VllmConfig.use_v2_model_runner``, ``vllm/config/vllm.py``). Processors subclass
  ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``; its loader refuses V1-interface
  classes when the engine starts. Teacher forcing is vLLM's own trace replay (engine argument
  ``enable_trace_replay``, ``SamplingParams.trace_decode_token_ids``,
  ``vllm/v1/worker/gpu/sample/trace_replay.py``), which overwrites each sampled token from GPU
  state (safe under async scheduling) and ends the request with its trace.

The runner is vLLM's decision, never a copy of its rule: :func:`resolve_runner` builds vLLM's config
from the engine arguments and reads it (``VLLM_USE_V2_MODEL_RUNNER=0|1`` is vLLM's own switch).
:func:`check_processors` runs vLLM's own loader for a runner, which needs no GPU.
"""

from __future__ import annotations

from typing import Sequence

RUNNERS = ("v1", "v2")

#: what a V1 engine registers: teacher forcing, then the layout grammar
V1_PROCESSORS = ("padoc_ray.engine.forcing:ForcedTokensProcessor",
                 "padoc_ray.engine.layout_constraint:LayoutGrammarProcessor")
#: what an MRv2 engine registers: the layout grammar (teacher forcing is vLLM's trace replay)
V2_PROCESSORS = ("padoc_ray.engine.layout_constraint_v2:LayoutGrammarProcessorV2",)


def _check(runner: str) -> str:
    if runner not in RUNNERS:
        raise ValueError(f"model runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    return runner


def logits_processors(runner: str, extra: Sequence[str] = ()) -> list[str]:
    """The processors an engine on ``runner`` registers: padoc-ray's, then ``extra`` (a user's own,
    ``EngineConfig.extra["logits_processors"]``)."""
    return [*(V2_PROCESSORS if _check(runner) == "v2" else V1_PROCESSORS), *extra]


def uses_trace_replay(runner: str) -> bool:
    """Whether teacher forcing on ``runner`` is vLLM's trace replay (MRv2) rather than our processor."""
    return _check(runner) == "v2"


def runner_of(vllm_config) -> str:
    return "v2" if vllm_config.use_v2_model_runner else "v1"


def resolve_runner(engine_args) -> str:
    """The runner vLLM will use for these ``AsyncEngineArgs``: it builds its config and we read it.
    Building the config a second time (``AsyncLLM.from_engine_args``) costs milliseconds."""
    from vllm.usage.usage_lib import UsageContext

    return runner_of(engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT))


def check_processors(runner: str, processors: Sequence[str]) -> list[str]:
    """Load ``processors`` with vLLM's own loader for ``runner`` (the one its engine runs at start) and
    validate default sampling parameters with them; returns the problems (empty: they load)."""
    from vllm import SamplingParams

    try:
        if _check(runner) == "v2":
            from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors_params_validator

            build_custom_logits_processors_params_validator(list(processors))(SamplingParams())
        else:
            from vllm.v1.sample.logits_processor import validate_logits_processors_parameters

            validate_logits_processors_parameters(list(processors), SamplingParams())
    except Exception as e:  # noqa: BLE001 - the loader's own words are the report
        cause = f" ({e.__cause__})" if e.__cause__ is not None else ""
        return [f"vLLM's {runner} loader refuses the logits processors: {type(e).__name__}: {e}{cause}"]
    return []
