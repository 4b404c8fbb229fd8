"""The vLLM adapter: an :class:`~padoc_ray.engine.interface.Engine` over ``AsyncLLM``.

It turns :class:`GenRequest` into a token prompt with the page image, its multimodal uuid and the
document's cache salt, streams DELTA outputs as :class:`GenDelta`, and maps vLLM's errors onto the
two tiers (``EngineError`` for one request, ``EngineDeadError`` for the engine). An engine core
process that dies (even by SIGKILL) is vLLM's to notice, and it does (its engine-core monitor waits
on the process's sentinel; the output socket's task fails too): the client is marked dead
(``llm.errored``) and every request in flight, and every later one, fails with vLLM's
``EngineDeadError``, which we map. Measured on the CPU engine: a SIGKILL mid-page ended every page
in 0.1-0.2 s (tests/engine/host/test_page_host_on_vllm.py); killed while idle, ``errored`` was set
within 0.3 s. It asks vLLM which model runner it will use (:mod:`padoc_ray.engine.runners`) and
registers that runner's logits processors: on V1 :mod:`~padoc_ray.engine.forcing` and
:mod:`~padoc_ray.engine.layout_constraint`, on Model Runner V2 :mod:`~padoc_ray.engine.layout_constraint_v2`
with vLLM's trace replay doing the teacher forcing. It knows nothing of layouts, branches or pages.
vLLM is imported here, in :mod:`~padoc_ray.engine.runners` and in those processor modules, nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import logging.handlers
import os
import shutil
import tempfile
import weakref
from typing import AsyncIterator, Sequence

from . import memory
from .config import EngineConfig
from .faults import EngineFault
from .interface import DraftCheck, EngineDeadError, EngineError, GenDelta, GenRequest
from .memory import EXTENSION, RPC_METHOD, release_free_heap

logger = logging.getLogger(__name__)


def engine_kwargs(cfg: EngineConfig) -> dict:
    """``AsyncEngineArgs`` fields for ``cfg``, before the runner's processors are added."""
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
        trust_remote_code=cfg.trust_remote_code,
        seed=cfg.seed,
        scheduling_policy=cfg.scheduling_policy,
        tensor_parallel_size=cfg.tensor_parallel_size,
        limit_mm_per_prompt={"image": 1, "video": 0},
        disable_log_stats=False,
        skip_tokenizer_init=False,
    )
    if cfg.block_size is not None:
        kw["block_size"] = cfg.block_size
    if cfg.kv_cache_memory_bytes is not None:
        kw["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
    if cfg.mm_processor_cache_gb is not None:
        kw["mm_processor_cache_gb"] = cfg.mm_processor_cache_gb
    if cfg.attention_backend is not None:
        kw["attention_backend"] = cfg.attention_backend
    if cfg.executor == "uni":
        # named by class path: vLLM's CPU platform turns the name "uni" into "mp" (0.32)
        kw["distributed_executor_backend"] = UNIPROC_EXECUTOR
    elif cfg.executor == "mp":
        kw["distributed_executor_backend"] = "mp"
    if cfg.release_free_heap_s is not None:
        kw["worker_extension_cls"] = EXTENSION  # a user's own, in cfg.extra, wins (then only this process is trimmed)
    kw.update({k: v for k, v in cfg.extra.items() if k != "logits_processors"})
    return kw


def engine_args(cfg: EngineConfig, runner: str):
    """The ``AsyncEngineArgs`` of an engine on ``runner`` ("v1" | "v2"): ``cfg``'s fields plus that
    runner's logits processors (a user's own, ``cfg.extra["logits_processors"]``, after ours) and,
    on MRv2, vLLM's trace replay for teacher forcing."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from .runners import logits_processors, uses_trace_replay

    kw = engine_kwargs(cfg)
    kw["logits_processors"] = logits_processors(runner, cfg.extra.get("logits_processors") or ())
    if uses_trace_replay(runner):
        kw["enable_trace_replay"] = True
    return AsyncEngineArgs(**kw)


def engine_runner(cfg: EngineConfig) -> str:
    """The model runner vLLM will give an engine with ``cfg`` (it builds its config; we read it)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from .runners import resolve_runner

    return resolve_runner(AsyncEngineArgs(**engine_kwargs(cfg)))


def sampling_params(req: GenRequest, runner: str):
    """vLLM's ``SamplingParams`` for one request on ``runner``. A forced request ends with its trace
    (``max_tokens`` = :attr:`GenRequest.generation_limit`) on both runners; its tokens travel as
    ``trace_decode_token_ids`` on MRv2 (vLLM's trace replay) and as our forcing processor's
    ``extra_args`` key on V1."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from .layout_mask import CONSTRAIN_LAYOUT_KEY
    from .runners import uses_trace_replay

    replay = uses_trace_replay(runner)
    extra: dict = {}
    trace = list(req.forced_tokens) if req.forced_tokens else None
    if trace and not replay:
        from .forcing import FORCED_TOKENS_KEY

        extra[FORCED_TOKENS_KEY] = trace
    if req.constrain_layout_regions is not None:
        extra[CONSTRAIN_LAYOUT_KEY] = int(req.constrain_layout_regions)
    return SamplingParams(
        max_tokens=req.generation_limit,
        temperature=req.temperature,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        stop_token_ids=list(req.stop_token_ids),
        output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
        stream_interval=req.stream_interval if req.stream and req.stream_interval else None,
        detokenize=False,
        skip_special_tokens=False,
        extra_args=extra or None,
        trace_decode_token_ids=trace if replay else None,
    )


def _top1(entry) -> int | None:
    """The rank-1 token of one position's prompt logprobs (vLLM adds the prompt's own token beside it)."""
    if not entry:
        return None
    ranked = [t for t, lp in entry.items() if getattr(lp, "rank", None) == 1]
    return ranked[0] if ranked else max(entry.items(), key=lambda kv: kv[1].logprob)[0]


UNIPROC_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"


@contextlib.contextmanager
def scoped_env(name: str, value: str | None):
    """``os.environ[name] = value`` inside the block (None: unchanged), restored afterwards; what a
    process spawned inside the block sees."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


#: a folder whose ``sitecustomize`` the engine processes that vLLM spawns run first (see its docstring)
SPAWN_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawn_boot")
#: the variable that names the process whose spawned children it applies to (its value in spawn_boot)
SPAWN_BOOT_PARENT = "PADOC_RAY_SPAWN_BOOT_PARENT"


@contextlib.contextmanager
def _spawn_env(cfg: EngineConfig, temp_dir: str | None = None):
    """OMP_NUM_THREADS, ONEDNN_PRIMITIVE_CACHE_CAPACITY, TORCH_COMPILE_DISABLE (``cfg.torch_compile``)
    and LD_PRELOAD (``cfg.allocator``) for the engine processes spawned inside the block (a spawned
    process reads them when it starts), the start-up folder (:data:`SPAWN_BOOT`: the collector paused
    while they import vLLM), and TMPDIR ``temp_dir`` when given (the engine's own temp folder, see
    :class:`VllmEngine`; torch.compile's cache stays where it was, and so do inductor's C++ headers, see
    :func:`_link_inductor_home`; vLLM's ZeroMQ sockets there too, see :func:`_rpc_base_path`). Yields the
    LD_PRELOAD they get (None: this process's, unchanged)."""
    cache = None if cfg.onednn_primitive_cache is None else str(cfg.onednn_primitive_cache)
    preload = _preload(cfg.allocator)
    path = os.pathsep.join(p for p in (SPAWN_BOOT, os.environ.get("PYTHONPATH")) if p)
    tempfile.gettempdir()  # this process's own temp folder, chosen (and kept: Python caches it) before TMPDIR moves
    if temp_dir is not None and cfg.torch_compile:
        _link_inductor_home(temp_dir)
    with scoped_env("OMP_NUM_THREADS", None if cfg.cpu_threads is None else str(cfg.cpu_threads)), \
            scoped_env("ONEDNN_PRIMITIVE_CACHE_CAPACITY", cache), \
            scoped_env("TORCH_COMPILE_DISABLE", None if cfg.torch_compile else "1"), \
            scoped_env("LD_PRELOAD", preload), scoped_env("TMPDIR", temp_dir), \
            scoped_env("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_dir() if temp_dir else None), \
            scoped_env("VLLM_RPC_BASE_PATH", _rpc_base_path(temp_dir)), \
            scoped_env("PYTHONPATH", path), scoped_env(SPAWN_BOOT_PARENT, str(os.getpid())):
        yield preload


#: the longest path of a Unix socket (``sun_path`` holds 108 bytes with its terminating zero)
UNIX_SOCKET_PATH_MAX = 107
#: what vLLM appends to its socket folder: ``/<uuid4>``
_RPC_NAME_LEN = 37


def _rpc_base_path(temp_dir: str | None) -> str | None:
    """Where vLLM binds the ZeroMQ sockets between the engine's processes (``VLLM_RPC_BASE_PATH``): the
    engine's own temp folder, removed with it. By default vLLM binds three in the temp folder and leaves
    their files behind even after a clean shutdown (one engine start, three files in /tmp). None (vLLM's
    own choice): no ``temp_dir``, the user set the variable, or a socket there would pass the length that
    Unix sockets allow."""
    if temp_dir is None or os.environ.get("VLLM_RPC_BASE_PATH"):
        return None
    if len(os.fsencode(temp_dir)) + _RPC_NAME_LEN > UNIX_SOCKET_PATH_MAX:
        return None
    return temp_dir


def _link_inductor_home(temp_dir: str) -> None:
    """torch keeps inductor's precompiled C++ headers in its folder in the temp folder whatever
    TORCHINDUCTOR_CACHE_DIR says (``_HEADER_DIR`` in torch/_inductor/codecache.py): in the engine's own
    temp folder they would be removed with it, and each engine start that compiles for the CPU would
    build them again (g++, seconds). A link there to this process's folder of the same name keeps them."""
    home = _torch_inductor_home()  # in this process's temp folder (tempfile cached it before TMPDIR moved)
    if home is None:
        return
    link = os.path.join(temp_dir, os.path.basename(home))
    os.makedirs(home, exist_ok=True)
    if not os.path.lexists(link):
        os.symlink(home, link)  # removing the engine's folder removes the link, not what it points to


def _inductor_cache_dir() -> str | None:
    """Where torch.compile's kernels are cached for this process (TORCHINDUCTOR_CACHE_DIR, else torch's
    default, a folder in the temp folder): the engine processes keep it, not their own temp folder's,
    so what one engine compiled (on a GPU) is still there for the next one. None: torch decides."""
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or _torch_inductor_home()


def _torch_inductor_home() -> str | None:
    """torch's own inductor folder for this process, in its temp folder; None: another torch, whose layout
    is its own (its default is then in the engine's temp folder)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return default_cache_dir()


def _preload(allocator: str | None) -> str | None:
    """The LD_PRELOAD that gives the engine processes ``allocator``; None: leave it as it is."""
    if allocator is None:
        return None
    if allocator == "tcmalloc":
        library = memory.find_tcmalloc()
        if library is None:
            logger.warning("allocator 'tcmalloc': no %s on this machine (Debian/Ubuntu: apt install "
                           "libtcmalloc-minimal4); the engine runs on glibc's malloc", memory.TCMALLOC_SONAME)
            return None
    else:
        library = allocator
        if not os.path.isfile(library):
            raise EngineError(f"allocator {library!r}: no such library file")
    return memory.preload_value(library, os.environ.get("LD_PRELOAD"))


def _memory_handlers() -> list[logging.handlers.MemoryHandler]:
    """Every buffering handler with a target on the root logger or a named one, in this process."""
    named = list(logging.Logger.manager.loggerDict.values())  # a copy: other threads add loggers
    loggers = [logging.getLogger(), *(lg for lg in named if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.handlers.MemoryHandler) and h.target is not None]


@contextlib.contextmanager
def _kept_memory_handlers():
    """Give back their targets to the process's memory handlers that vLLM's logging set-up closes.

    vLLM applies its logging configuration with ``logging.config.dictConfig`` when it builds an
    engine's config (once per process), and ``dictConfig`` first closes every handler of the
    process. A closed ``MemoryHandler`` loses its target and from then on keeps every record it is
    given, since flushing to no target clears nothing. Ray Serve logs a replica through one (its
    access log, the replica's prints and its own messages, into ``logs/serve/replica_*.log``): in
    the Engine replica that file stopped at the engine's start and the records piled up in memory
    (6,085 after 33 minutes of ``bench soak --engine vllm``). Files that were targets reopen on
    their next record (``FileHandler`` does that itself)."""
    kept = {h: h.target for h in _memory_handlers()}
    try:
        yield
    finally:
        for h, target in kept.items():
            if h.target is None:
                h.setTarget(target)


#: seconds vLLM gives its engine core process to exit after SIGTERM before it kills it, on CPU. The
#: core leaves its loop at once and then sits in teardown until vLLM's default 5 s grace runs out
#: (vLLM 0.32, tiny model: every shutdown took 5.0 s, then "force killing remaining process"); with a
#: 1 s grace it still was killed every time, after a second of CPU in its collector; with 0.25 s, 0.35
#: CPU-s. On CPU nothing outlives the process (what the core leaves in its temp folder goes with the
#: folder: :class:`VllmEngine`); on a GPU vLLM's default stands (device memory must be released).
CPU_SHUTDOWN_GRACE_S = 0.25


def _first_token_s(out) -> float | None:
    """vLLM's own time from the request's arrival to its first token (its stats are on: the engine
    args keep ``disable_log_stats=False``); None before the first token or without stats."""
    s = getattr(getattr(out, "metrics", None), "first_token_latency", None)
    return float(s) if s else None


def _counting_logger(sink: dict):
    """A vLLM stat logger (per engine) that adds the figures the benchmarks read into ``sink``: the
    same increments vLLM's Prometheus logger makes, kept on this engine instead of the registry."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class EngineCounters(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:  # one per engine step that sent outputs
                sink["queries"] += scheduler_stats.prefix_cache_stats.queries
                sink["hits"] += scheduler_stats.prefix_cache_stats.hits
                sink["steps"] += 1
                sink["running_seqs"] += scheduler_stats.num_running_reqs
                sink["waiting_seqs"] += scheduler_stats.num_waiting_reqs
            if iteration_stats is not None:
                sink["generation_tokens"] += iteration_stats.num_generation_tokens
                sink["preempted"] += iteration_stats.num_preempted_reqs
                sink["prefill_tokens"] += iteration_stats.prompt_token_stats.computed

        def log_engine_initialized(self):
            pass

    return EngineCounters


class VllmEngine:
    """Hosts one ``AsyncLLM`` (its engine core runs in a spawned process: entry scripts need an
    ``if __name__ == "__main__":`` guard). Create it inside the event loop that will drive it.

    The engine's processes get a temp folder of their own (TMPDIR: :attr:`temp_dir`), removed at
    :meth:`shutdown` (or when the engine is collected, or at exit): the engine core puts its
    ``torch.distributed`` file store there (``vllm_dist_<uuid>``), which it never removes itself when
    vLLM kills it at shutdown or it dies, and vLLM binds the sockets between the processes there, whose
    files it leaves even after a clean shutdown: each engine start left four files in /tmp."""

    def __init__(self, cfg: EngineConfig):
        self.temp_dir = tempfile.mkdtemp(prefix="padoc-engine-")
        self._remove_temp_dir = weakref.finalize(self, shutil.rmtree, self.temp_dir, True)
        try:
            with memory.paused_gc():  # vLLM's import and the engine's start: 1.7-2 CPU-s less (see memory)
                self._start(cfg)
        except BaseException:
            self._remove_temp_dir()
            raise

    def _start(self, cfg: EngineConfig) -> None:
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ and cfg.kv_cache_memory_bytes is not None:
            # it silently wins over kv_cache_memory_bytes; one budget only
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
        from vllm.v1.engine.async_llm import AsyncLLM

        from .runners import runner_of

        self.cfg = cfg
        #: the periodic heap release (cfg.release_free_heap_s): started by the first request, in its loop
        self._releaser: asyncio.Task | None = None
        #: what it did: releases, and RSS bytes returned here (frontend) and in vLLM's workers (engine)
        self.heap_releases = {"releases": 0, "frontend_bytes": 0, "engine_bytes": 0}
        self._fault = EngineFault.from_env()  # test-only (padoc_ray.engine.faults); None normally
        with _spawn_env(cfg, self.temp_dir) as preload, _kept_memory_handlers():
            #: "v1" | "v2": vLLM's choice for this configuration, read from its own config
            self.runner = engine_runner(cfg)
            #: this engine's own counters (Prometheus's registry is process-wide: a second engine in
            #: the process unregisters the first one's series, so reading it would read the wrong engine)
            self._counters = dict.fromkeys(("generation_tokens", "queries", "hits", "steps", "running_seqs",
                                            "waiting_seqs", "preempted", "prefill_tokens"), 0.0)
            self.llm = AsyncLLM.from_engine_args(engine_args(cfg, self.runner),
                                                 stat_loggers=[_counting_logger(self._counters)])
        if runner_of(self.llm.vllm_config) != self.runner:  # the same arguments gave another answer
            got = runner_of(self.llm.vllm_config)
            self.shutdown()
            raise RuntimeError(f"vLLM chose model runner {got} after reporting {self.runner}")
        #: the library this engine preloaded into vLLM's engine processes (cfg.allocator); None: none
        #: added (glibc's malloc, or what LD_PRELOAD already held)
        self.allocator_library = preload.split(":")[0] if preload else None
        #: speculative decoding: several logits rows per request, which the layout grammar cannot mask
        self._speculative = self.llm.vllm_config.speculative_config is not None
        logger.info("vLLM engine up: model=%s runner=%s max_num_seqs=%d allocator=%s", cfg.model, self.runner,
                    cfg.max_num_seqs, self.allocator_library or "unchanged")

    def _sampling_params(self, req: GenRequest):
        if req.constrain_layout_regions is not None and self._speculative:
            raise EngineError(f"request {req.request_id} rejected: the layout constraint (--constrain-layout) "
                              f"does not work with speculative decoding")
        return sampling_params(req, self.runner)

    def _prompt(self, req: GenRequest) -> dict:
        p: dict = {"prompt_token_ids": list(req.prompt_ids)}
        if req.image is not None:
            p["multi_modal_data"] = {"image": req.image}
            if req.image_uuid is not None:
                p["multi_modal_uuids"] = {"image": [req.image_uuid]}
            if req.mm_processor_kwargs:
                p["mm_processor_kwargs"] = dict(req.mm_processor_kwargs)
        if req.cache_salt is not None:
            p["cache_salt"] = req.cache_salt
        return p

    def _start_releaser(self) -> None:
        if self._releaser is None and self.cfg.release_free_heap_s is not None:
            self._releaser = asyncio.get_running_loop().create_task(self._release_loop(self.cfg.release_free_heap_s))

    async def _release_loop(self, every_s: float) -> None:
        """Every ``every_s``: :meth:`release_free_heap`, until shutdown; a failed release is logged and
        the loop goes on (a user's own ``worker_extension_cls`` lacks our method: then only this
        process is trimmed)."""
        engine_rpc = True
        while self.llm is not None:
            await asyncio.sleep(every_s)
            if self.llm is None or self.llm.errored:
                return
            try:
                engine_rpc = await self.release_free_heap(engine=engine_rpc)
            except Exception as e:  # noqa: BLE001 - memory hygiene must never fail serving
                logger.warning("releasing free heap memory failed: %s", e)

    async def release_free_heap(self, engine: bool = True) -> bool:
        """Return the free heap pages of this process and (``engine``) of vLLM's workers to the OS
        (:mod:`padoc_ray.engine.memory`); adds to :attr:`heap_releases`. Returns whether the workers
        could be reached (False: their worker class lacks the extension)."""
        here = await asyncio.to_thread(release_free_heap)
        c = self.heap_releases
        c["releases"] += 1
        if here:
            c["frontend_bytes"] += max(0, here["rss_before"] - here["rss_after"])
        if not engine or self.llm is None:
            return engine
        try:
            outs = await self.llm.collective_rpc(RPC_METHOD, timeout=30)
        except Exception as e:  # vLLM hands a worker's error back as a plain Exception with its message
            if "not implemented" not in str(e):
                raise
            logger.warning("vLLM's worker class lacks %s (another worker_extension_cls is set): only the "
                           "frontend process releases free heap memory", RPC_METHOD)
            return False
        for out in outs or ():
            if out:
                c["engine_bytes"] += max(0, out["rss_before"] - out["rss_after"])
        return True

    async def generate(self, req: GenRequest) -> AsyncIterator[GenDelta]:
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDead

        self._start_releaser()

        kill_core = False  # test fault "kill_engine_core": SIGKILL the engine core at this request's first output
        try:
            if self._fault is not None and self._fault.fires():
                if self._fault.how == "raise":
                    raise VllmDead(f"injected by {self._fault.once} (test fault)")
                kill_core = True
            gen = self.llm.generate(self._prompt(req), self._sampling_params(req), req.request_id,
                                    priority=req.priority)
            async for out in gen:
                if kill_core:  # a real crash, mid-page: vLLM's own engine-core monitor must notice it
                    from .faults import kill_engine_core

                    kill_core = False
                    kill_engine_core()
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
        except Exception as e:
            err = self._our_error(req, e)
            if err is e:
                raise
            raise err from e

    def _our_error(self, req: GenRequest, e: Exception) -> Exception:
        """The engine interface's error for vLLM's ``e`` (EngineDeadError, EngineError), or ``e`` itself."""
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDead

        if isinstance(e, VllmDead) or (self.llm is not None and self.llm.errored):
            return EngineDeadError(f"vLLM engine died: {e}")
        if isinstance(e, (ValueError, TypeError)) or type(e).__name__ in (
                "VLLMValidationError", "VLLMClientError", "GracefulHTTPError"):  # validation: too long, bad params
            return EngineError(f"request {req.request_id} rejected: {e}")
        return e

    async def verify(self, req: GenRequest, draft: Sequence[int]) -> DraftCheck:
        """One prefill of ``req``'s prompt + ``draft`` that reads the prefix cache, with the top-1 prompt
        logprob of every draft position and one greedy token after it (vLLM switches cache reads off for
        prompt-logprob requests unless told otherwise: the image and the prompt would be computed again).
        A position's logprob needs the logits of the position before it: where that one came from the
        cache there are none (V1 returns uninitialised entries there, Model Runner V2 leaves them out), so
        such positions are None (``DraftCheck.greedy``), decided by ``num_cached_tokens``, never by the
        entries' values. The cache can reach into a draft whose tokens some earlier request computed."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, skip_reading_prefix_cache=False,
                            output_kind=RequestOutputKind.FINAL_ONLY, detokenize=False, skip_special_tokens=False,
                            stop_token_ids=list(req.stop_token_ids))
        prompt = self._prompt(dataclasses.replace(req, prompt_ids=[*req.prompt_ids, *draft]))
        out = None
        try:
            async for out in self.llm.generate(prompt, sp, req.request_id, priority=req.priority):
                pass
        except Exception as e:
            err = self._our_error(req, e)
            if err is e:
                raise
            raise err from e
        if out is None or out.prompt_logprobs is None:
            raise EngineError(f"request {req.request_id}: vLLM returned no prompt logprobs")
        logprobs, cached = out.prompt_logprobs, out.num_cached_tokens or 0
        # the draft ends the expanded prompt (P positions). V1 returns P entries (junk where the position
        # before came from the cache), Model Runner V2 only the computed ones: align both at the end
        n_prompt = len(out.prompt_token_ids) if out.prompt_token_ids is not None else len(logprobs)
        first = n_prompt - len(draft)  # the draft's first position in the expanded prompt
        at = len(logprobs) - len(draft)
        greedy = tuple(_top1(logprobs[at + k]) if first + k - 1 >= cached and at + k >= 0 else None
                       for k in range(len(draft)))
        c = out.outputs[0] if out.outputs else None
        return DraftCheck(greedy=greedy, next_token=c.token_ids[0] if c is not None and c.token_ids else None,
                          num_prompt_tokens=n_prompt, num_cached_tokens=cached)

    async def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            await self.llm.abort(list(request_ids))

    def num_unfinished_requests(self) -> int:
        return self.llm.get_num_unfinished_requests()

    def prefix_cache_counters(self) -> dict[str, float]:
        """vLLM's prefix-cache query/hit counts (tokens) of this engine since start."""
        return {"prefix_cache_queries": self._counters["queries"], "prefix_cache_hits": self._counters["hits"]}

    def step_counters(self) -> dict[str, float]:
        """This engine's steps since start, as its scheduler reported them: ``engine_steps`` (steps that
        sent outputs), ``running_seq_steps`` / ``waiting_seq_steps`` (the sums over steps of the
        sequences running and waiting after each step, so a request that finished in a step is not
        counted in it: divided by the steps, the mean batch and queue),
        ``preempted_requests`` and ``prefill_tokens`` (prompt tokens computed, cache hits left out)."""
        c = self._counters
        return {"engine_steps": c["steps"], "running_seq_steps": c["running_seqs"],
                "waiting_seq_steps": c["waiting_seqs"], "preempted_requests": c["preempted"],
                "prefill_tokens": c["prefill_tokens"]}

    def generation_tokens(self) -> float:
        """Tokens this engine generated since start (monotonic; the serving benchmark samples it)."""
        return self._counters["generation_tokens"]

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if self._releaser is not None:
            self._releaser.cancel()
        if llm is not None:
            from vllm.platforms import current_platform

            llm.shutdown(timeout=CPU_SHUTDOWN_GRACE_S if current_platform.is_cpu() else None)
            del llm  # let AsyncLLM.__del__ run now, not at interpreter exit
        self._remove_temp_dir()  # the engine core is gone (vLLM waited for it or killed it)
