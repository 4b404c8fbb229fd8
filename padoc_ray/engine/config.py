"""Engine configuration: one dataclass whose defaults are the paper's serving setup.

Pure: turning it into vLLM arguments happens in :mod:`padoc_ray.engine.vllm_engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: str  #: checkpoint directory (holds padoc_protocol.json)
    enable_prefix_caching: bool = True  #: children reuse the image + layout prefix (the whole point)
    max_num_seqs: int = 384  #: paper E.3: the PaDoc serving envelope
    max_num_batched_tokens: int = 24576  #: paper E.3
    max_model_len: int = 32768  #: paper E.3: 32k context
    gpu_memory_utilization: float = 0.9  #: paper E.3 (on CPU vLLM reads it as a fraction of RAM)
    dtype: str = "auto"  #: pin "float32" on CPU: "auto" ran the float32 tiny model in bf16
    block_size: int | None = None  #: KV block size; None = vLLM's default (CPU needs a multiple of 32)
    kv_cache_memory_bytes: int | None = None  #: fixed KV budget; overrides gpu_memory_utilization
    #: vLLM's cache of processed images, one in the frontend and one in the engine core, each up to
    #: this size (GiB). A page's requests share one image, so it hits only within a page: it needs
    #: to hold the pages in flight, and it fills (it is an LRU, not a leak) up to this size.
    #: None = vLLM's default (4)
    mm_processor_cache_gb: float | None = None
    #: CPU: oneDNN's cache of compiled matmul kernels, one per input shape, in each engine process
    #: (ONEDNN_PRIMITIVE_CACHE_CAPACITY; None = oneDNN's 1024). Serving makes a new shape nearly every step
    #: (the batch's token count), so the cache fills for hours
    onednn_primitive_cache: int | None = None
    #: every this many seconds, return the free heap pages of the engine's processes (this one and
    #: vLLM's worker: the engine core under executor "uni") to the OS with glibc's malloc_trim; glibc
    #: keeps what a process frees, so without it RSS creeps up under serving (see
    #: padoc_ray.engine.memory). None = never
    release_free_heap_s: float | None = 60.0
    #: the allocator preloaded (LD_PRELOAD) into the engine processes vLLM starts: None = the
    #: platform's (glibc's malloc, or the tcmalloc vLLM's own CPU wheels preload), "tcmalloc" = a
    #: tcmalloc found on this machine (vLLM's bundled copy, else the system's libtcmalloc_minimal.so.4;
    #: none found: a warning, and glibc), or the path of an allocator library. A tcmalloc already in
    #: LD_PRELOAD stands
    allocator: str | None = None
    #: let transformers run the checkpoint's own Python (its config class): an HPD-Parsing checkpoint needs it
    #: (InternVL's remote-code config; the host sets it for the hpd family). Only for checkpoints you trust
    trust_remote_code: bool = False
    enforce_eager: bool = False
    #: False: the engine's processes start with TORCH_COMPILE_DISABLE=1, so nothing of vLLM's is compiled,
    #: also what enforce_eager leaves compiled: vLLM 0.32 compiles its logprob rank count
    #: (vllm/v1/sample/ops/logprobs.py) whatever the mode, which on CPU is a dynamo trace and an inductor C++
    #: build (g++) at the first draft check of every engine process. True: vLLM's choice
    torch_compile: bool = True
    attention_backend: str | None = None  #: e.g. "FLASHINFER"; None = vLLM picks (FlashInfer on GPU when present)
    scheduling_policy: str = "fcfs"  #: "priority" lets the layout stream run ahead of branches
    #: where the model runs: None = vLLM's choice (on CPU a separate worker process that the engine
    #: core busy-waits on), "uni" = in the engine core process (no worker process, no busy-wait;
    #: tensor_parallel_size 1 only), "mp" = worker processes
    executor: str | None = None
    #: OpenMP threads of the engine's processes (OMP_NUM_THREADS when they start); None = unchanged
    cpu_threads: int | None = None
    seed: int = 0
    tensor_parallel_size: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  #: any other AsyncEngineArgs field

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be 'fcfs' or 'priority'")
        if self.executor not in (None, "uni", "mp"):
            raise ValueError(f"executor must be None, 'uni' or 'mp', got {self.executor!r}")
        if self.executor == "uni" and self.tensor_parallel_size != 1:
            raise ValueError("executor 'uni' runs one worker: it needs tensor_parallel_size 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError("cpu_threads must be >= 1 (or None)")
        if self.onednn_primitive_cache is not None and self.onednn_primitive_cache < 0:
            raise ValueError("onednn_primitive_cache must be >= 0 (or None)")
        if self.release_free_heap_s is not None and not self.release_free_heap_s > 0:
            raise ValueError("release_free_heap_s must be > 0 seconds (or None: never)")
        if self.allocator not in (None, "tcmalloc") and not self.allocator.startswith("/"):
            raise ValueError(f"allocator must be None, 'tcmalloc' or an absolute library path, got {self.allocator!r}")
        if self.mm_processor_cache_gb is not None and self.mm_processor_cache_gb < 0:
            raise ValueError("mm_processor_cache_gb must be >= 0 (or None)")


def cpu_engine_config(model: str, **overrides: Any) -> EngineConfig:
    """Settings measured to work for the tiny model on a 2-core CPU machine.

    float32 (bf16 outputs were not deterministic under concurrent load), eager mode and nothing
    compiled (``torch_compile=False``: the first draft check of each engine process cost about 5 CPU-s
    and 6 s, a dynamo trace and g++ building inductor's header, for a rank count), 32-token KV
    blocks (CPU KV blocks must be multiples of 32), a 256 MiB KV budget instead of a fraction of
    RAM, 4096 batched tokens (CPU prefill is slow; big chunks stall decode). The model runs in the
    engine core process with one OpenMP thread (``executor="uni"``, ``cpu_threads=1``): vLLM's CPU
    default, a worker process that the engine core waits on by spinning (``sched_yield``), spent
    about half of all CPU samples of a 2-core ``bench replay`` spinning or in the IPC between them.
    A 0.25 GiB processed-image cache instead of vLLM's 4 GiB: it hits only within a page (4.8 s
    against 6.3 s without it for 5 demo pages at 4 in flight); it filled after about 175 pages
    (engine core +325 MB, flat after), while a 4 GiB one grew the engine core by 3.2 GB in a
    30-minute ``bench soak --engine vllm``. oneDNN's kernel cache capped at 8 shapes: with its default
    1024 the engine core kept growing under mixed traffic (replayed, free, cancelled pages, rounds of
    5 pages at 4 in flight: +96 MB from round 100 to 354, still rising), with 8 it was flat from round
    40 (1,566 -> 1,565 MB over 260 rounds) at the same seconds per round. glibc's malloc, not tcmalloc
    (``allocator``; vLLM's own CPU wheels preload the copy they bundle, PyPI's has none): same pages/s,
    but in a 90-minute ``bench soak --engine vllm`` with tcmalloc (and the release every 60 s) the
    engine core swung between 1.51 and 1.92 GB and its slope after the warm-up was 129 MB/h (floor
    42), against 21.6 (floor 9.9) over 2 hours on glibc.
    """
    base = EngineConfig(
        model=model, dtype="float32", enforce_eager=True, torch_compile=False, block_size=32,
        kv_cache_memory_bytes=256 << 20, max_num_batched_tokens=4096, executor="uni", cpu_threads=1,
        mm_processor_cache_gb=0.25, onednn_primitive_cache=8,
    )
    return replace(base, **overrides)


def gpu_engine_config(model: str, **overrides: Any) -> EngineConfig:
    """The paper's serving setup (the defaults), with FlashInfer attention when it is installed."""
    import importlib.util

    if importlib.util.find_spec("flashinfer") is not None:
        overrides.setdefault("attention_backend", "FLASHINFER")
    return EngineConfig(model=model, **overrides)


def engine_preset(model: str, preset: str = "auto", **overrides: Any) -> EngineConfig:
    """The engine settings for this machine: ``gpu`` (the paper's), ``cpu`` (see
    :func:`cpu_engine_config`), or ``auto``: gpu when CUDA is visible, else cpu."""
    if preset == "auto":
        try:
            import torch

            preset = "gpu" if torch.cuda.is_available() else "cpu"
        except Exception:  # noqa: BLE001 - no torch: no CUDA
            preset = "cpu"
    if preset == "gpu":
        return gpu_engine_config(model, **overrides)
    if preset == "cpu":
        return cpu_engine_config(model, **overrides)
    raise ValueError(f"engine preset must be auto, gpu or cpu, got {preset!r}")
