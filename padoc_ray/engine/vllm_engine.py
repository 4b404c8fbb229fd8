"""The one module that imports vLLM: an :class:`~padoc_ray.engine.interface.Engine` over ``AsyncLLM``.

It turns :class:`GenRequest` into a token prompt with the page image, its multimodal uuid and the
document's cache salt, streams DELTA outputs as :class:`GenDelta`, and maps vLLM's errors onto the
two tiers (``EngineError`` for one request, ``EngineDeadError`` for the engine). It knows nothing
of layouts, branches or pages.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import AsyncIterator, Sequence

from .config import EngineConfig
from .faults import EngineFault
from .interface import EngineDeadError, EngineError, GenDelta, GenRequest

logger = logging.getLogger(__name__)


def _engine_args(cfg: EngineConfig):
    from vllm.engine.arg_utils import AsyncEngineArgs

    from .forcing import FORCING_PROCESSOR
    from .layout_constraint import LAYOUT_PROCESSOR

    kw = dict(
        model=cfg.model,
        tokenizer=cfg.model,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_prefix_caching=cfg.enable_prefix_caching,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enforce_eager=cfg.enforce_eager,
        seed=cfg.seed,
        scheduling_policy=cfg.scheduling_policy,
        tensor_parallel_size=cfg.tensor_parallel_size,
        limit_mm_per_prompt={"image": 1, "video": 0},
        logits_processors=[FORCING_PROCESSOR, LAYOUT_PROCESSOR],
        disable_log_stats=False,
        skip_tokenizer_init=False,
    )
    if cfg.block_size is not None:
        kw["block_size"] = cfg.block_size
    if cfg.kv_cache_memory_bytes is not None:
        kw["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
    if cfg.attention_backend is not None:
        kw["attention_backend"] = cfg.attention_backend
    if cfg.executor == "uni":
        # named by class path: vLLM's CPU platform turns the name "uni" into "mp" (0.32)
        kw["distributed_executor_backend"] = UNIPROC_EXECUTOR
    elif cfg.executor == "mp":
        kw["distributed_executor_backend"] = "mp"
    kw.update(cfg.extra)
    return AsyncEngineArgs(**kw)


UNIPROC_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"


@contextlib.contextmanager
def _spawn_env(cfg: EngineConfig):
    """OMP_NUM_THREADS for the engine processes spawned inside the block (a spawned process reads it
    when it imports torch); this process's own value is restored afterwards."""
    if cfg.cpu_threads is None:
        yield
        return
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old


def _first_token_s(out) -> float | None:
    """vLLM's own time from the request's arrival to its first token (its stats are on: the engine
    args keep ``disable_log_stats=False``); None before the first token or without stats."""
    s = getattr(getattr(out, "metrics", None), "first_token_latency", None)
    return float(s) if s else None


class VllmEngine:
    """Hosts one ``AsyncLLM`` (its engine core runs in a spawned process: entry scripts need an
    ``if __name__ == "__main__":`` guard). Create it inside the event loop that will drive it."""

    def __init__(self, cfg: EngineConfig):
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ and cfg.kv_cache_memory_bytes is not None:
            # it silently wins over kv_cache_memory_bytes; one budget only
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
        from vllm.v1.engine.async_llm import AsyncLLM

        self.cfg = cfg
        self._fault = EngineFault.from_env()  # test-only (padoc_ray.engine.faults); None normally
        with _spawn_env(cfg):
            self.llm = AsyncLLM.from_engine_args(_engine_args(cfg))
        logger.info("vLLM engine up: model=%s max_num_seqs=%d", cfg.model, cfg.max_num_seqs)

    def _sampling_params(self, req: GenRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from .forcing import FORCED_TOKENS_KEY
        from .layout_constraint import CONSTRAIN_LAYOUT_KEY

        extra = {FORCED_TOKENS_KEY: list(req.forced_tokens)} if req.forced_tokens else {}
        if req.constrain_layout_regions is not None:
            extra[CONSTRAIN_LAYOUT_KEY] = int(req.constrain_layout_regions)
        return SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            seed=req.seed,
            stop_token_ids=list(req.stop_token_ids),
            output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
            detokenize=False,
            skip_special_tokens=False,
            extra_args=extra or None,
        )

    def _prompt(self, req: GenRequest) -> dict:
        p: dict = {"prompt_token_ids": list(req.prompt_ids)}
        if req.image is not None:
            p["multi_modal_data"] = {"image": req.image}
            if req.image_uuid is not None:
                p["multi_modal_uuids"] = {"image": [req.image_uuid]}
        if req.cache_salt is not None:
            p["cache_salt"] = req.cache_salt
        return p

    async def generate(self, req: GenRequest) -> AsyncIterator[GenDelta]:
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDead

        try:
            if self._fault is not None and self._fault.fires():
                raise VllmDead(f"injected by {self._fault.once} (test fault)")
            gen = self.llm.generate(self._prompt(req), self._sampling_params(req), req.request_id,
                                    priority=req.priority)
            async for out in gen:
                c = out.outputs[0] if out.outputs else None
                yield GenDelta(
                    request_id=req.request_id,
                    token_ids=list(c.token_ids) if c is not None else [],
                    finished=out.finished,
                    finish_reason=(c.finish_reason if c is not None else None) if out.finished else None,
                    num_prompt_tokens=len(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
                    num_cached_tokens=out.num_cached_tokens,
                    first_token_s=_first_token_s(out),
                )
        except VllmDead as e:
            raise EngineDeadError(f"vLLM engine died: {e}") from e
        except (ValueError, TypeError) as e:  # validation: too long a prompt, bad params
            raise EngineError(f"request {req.request_id} rejected: {e}") from e
        except Exception as e:
            if self.llm.errored:
                raise EngineDeadError(f"vLLM engine died: {e}") from e
            if type(e).__name__ in ("VLLMValidationError", "VLLMClientError", "GracefulHTTPError"):
                raise EngineError(f"request {req.request_id} rejected: {e}") from e
            raise

    async def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            await self.llm.abort(list(request_ids))

    def num_unfinished_requests(self) -> int:
        return self.llm.get_num_unfinished_requests()

    def prefix_cache_counters(self) -> dict[str, float]:
        """vLLM's prefix-cache query/hit counters (tokens) since start."""
        from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

        out = {}
        for m in get_metrics_snapshot():
            if isinstance(m, Counter) and m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                out[m.name.split(":", 1)[1]] = out.get(m.name, 0) + m.value
        return out

    def generation_tokens(self) -> float:
        """vLLM's generated-token counter since start (monotonic; the serving benchmark samples it)."""
        from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

        return float(sum(m.value for m in get_metrics_snapshot()
                         if isinstance(m, Counter) and m.name == "vllm:generation_tokens"))

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            del llm  # let AsyncLLM.__del__ run now, not at interpreter exit
