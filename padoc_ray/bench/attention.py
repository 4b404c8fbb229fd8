"""``padoc-ray bench attention``: the three ancestor-attention backends on random packed trees.

For each total length S a random tree is drawn (prefix M of about S/2, N branches forking at points
spread over M, the remaining tokens split among the branches) and each backend runs forward +
backward on random q/k/v with a fixed random output gradient. Reported per backend and length:
median forward+backward seconds (warm-up excluded), the time to build the backend's per-layout
structure (dense mask, flex block mask, varlen plan), peak memory, and the largest absolute
difference of the output and of the q/k/v gradients from the dense reference.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before the run.
On CPU there is no allocator counter, so a thread samples the process RSS (/proc/self/statm) every
~0.5 ms during one extra run, after ``mallopt`` makes glibc return every allocation above 64 KiB to
the OS on free; the figure is peak RSS minus RSS before the run (spikes shorter than the sampling
period can be missed). A run whose estimated memory exceeds ``--memory-budget-gib`` is not
attempted and is recorded as ``{"error": ...}``, as is any run that fails (e.g. flex backward on
CPU, where the forward alone is still timed and checked).

This module imports torch and padoc_ray.trainer only (no ray, no vllm); ``gpu_attention_check.sh``
beside it runs it on a CUDA machine with ray and vllm imports blocked.
"""

from __future__ import annotations

import ctypes
import gc
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

from padoc_ray.trainer.tree import TreeLayout
from padoc_ray.knobs import knob, negate

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class AttentionBenchConfig:
    """Run each ancestor-attention backend forward+backward on a random packed tree per length (prefix about
    S/2, forks spread over it, the rest split among the branches) and report median seconds, peak memory and the
    largest difference from the dense reference. Runs that cannot happen (flex backward on CPU, over the memory
    budget) are recorded as errors."""

    lengths: tuple[int, ...] = (2048, 4096, 8192, 16384)  #: comma list of total packed lengths S
    branches: int = 8  #: content branches per tree
    backends: tuple[str, ...] = ("dense", "flex", "tree_varlen")  #: comma list from dense,flex,tree_varlen
    heads: int = 16  #: query heads
    kv_heads: int = 8  #: key/value heads (GQA)
    head_dim: int = 128  #: head dimension
    repeats: int = 3  #: timed runs; the median is reported
    warmup: int = 1  #: untimed runs first (flex compilation happens here)
    device: str = knob("cpu", choices=("cpu", "cuda"))  #: cpu or cuda
    #: dtype of the inputs and weights (None: float32 on CPU, bfloat16 on CUDA)
    dtype: str | None = knob(None, choices=("float32", "float64", "bfloat16", "float16"), default_text="by device")
    #: skip a run whose estimated memory exceeds this (20 fits a 24 GiB machine)
    memory_budget_gib: float = knob(20.0, metavar="GIB")
    #: compile flex attention (eager flex materializes all scores)
    flex_compile: bool = knob(True, flags=("--no-flex-compile",), dest="no_flex_compile", action="store_true",
                              to_field=negate, from_field=negate,
                              help="run flex attention eagerly (slow; materializes the scores) instead of compiled")
    seed: int = 0  #: seed of the trees and inputs
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")

    def __post_init__(self):
        from padoc_ray.trainer.attention import BACKENDS

        if not self.lengths or any(s < 2 * self.branches + 2 for s in self.lengths):
            raise ValueError(f"every length must be at least 2 * branches + 2 = {2 * self.branches + 2}")
        if self.branches < 0:
            raise ValueError("branches must be >= 0")
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ValueError(f"unknown backend(s) {bad}; choose from {', '.join(BACKENDS)}")
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a positive multiple of kv_heads ({self.kv_heads})")
        if self.head_dim < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError("head_dim and repeats must be >= 1, warmup >= 0")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in (None, "float32", "float64", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, float64, bfloat16 or float16, got {self.dtype!r}")

    @property
    def dtype_name(self) -> str:
        return self.dtype or ("bfloat16" if self.device == "cuda" else "float32")


# ---- the random tree ----------------------------------------------------------------------------
def random_tree(total: int, branches: int, rng: random.Random) -> TreeLayout:
    """Prefix of about total/2 (+-10 %), forks spread over it (one per equal slice of M, at a random
    point of the slice, plus 0 and |M| possible), the rest split randomly among the branches."""
    if branches == 0:
        return TreeLayout(total)
    prefix = max(1, min(total - branches, round(total * rng.uniform(0.45, 0.55))))
    forks = sorted(min(prefix, int(prefix * (i + rng.random()) / branches) + 1) for i in range(branches))
    rest = total - prefix
    cuts = sorted(rng.sample(range(1, rest), branches - 1)) if branches > 1 else []
    lens = [b - a for a, b in zip([0, *cuts], [*cuts, rest])]
    return TreeLayout(prefix, tuple(forks), tuple(lens))


# ---- memory -------------------------------------------------------------------------------------
def _elem(dtype_name: str) -> int:
    return {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[dtype_name]


def estimate_bytes(backend: str, layout: TreeLayout, cfg: AttentionBenchConfig) -> int:
    """A deliberately pessimistic estimate, used only to skip runs that would not fit the budget."""
    s, e = layout.total_len(), _elem(cfg.dtype_name)
    io = 12 * cfg.heads * s * cfg.head_dim * e  # q, k, v, out, their grads, gathered copies
    if backend == "dense":  # the bool mask and a float copy of it (the fused kernels stream the scores)
        return io + s * s * (1 + max(e, 4))
    if backend == "flex":  # the dense mask is evaluated once to build the block mask
        return io + 4 * s * s + (0 if cfg.flex_compile else 3 * cfg.heads * s * s * e)
    # varlen: the additive masks of the non-square segments (CPU path)
    return io + e * sum(n * (f + n) for f, n in zip(layout.forks, layout.branch_lens))


def _limit_glibc_caching() -> None:
    """Make glibc hand freed blocks above 64 KiB back to the OS, so RSS follows live memory."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD (also disables its dynamic growth)
        libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


class _RssPeak:
    """Samples /proc/self/statm in a thread; ``peak - base`` after the block."""

    def __init__(self, period_s: float = 0.0005):
        self.period_s = period_s
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def __enter__(self):
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.period_s)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    @property
    def used(self) -> int:
        return max(0, self.peak - self.base)


# ---- one backend at one length ------------------------------------------------------------------
@dataclass
class _Inputs:
    q: object
    k: object
    v: object
    grad_out: object
    layout: TreeLayout
    ref: tuple | None = None  # dense (out, dq, dk, dv)
    extra: dict = field(default_factory=dict)


def _make_inputs(layout: TreeLayout, cfg: AttentionBenchConfig, seed: int) -> _Inputs:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, cfg.dtype_name)
    s = layout.total_len()

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=cfg.device, dtype=dt)

    # (1, S, H, D) memory seen as (1, H, S, D), as transformers' q/k/v projections hand them over
    q = rnd(1, s, cfg.heads, cfg.head_dim).transpose(1, 2).requires_grad_()
    k = rnd(1, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2).requires_grad_()
    v = rnd(1, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2).requires_grad_()
    return _Inputs(q, k, v, rnd(1, s, cfg.heads, cfg.head_dim), layout)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _step(backend: str, x: _Inputs, cfg: AttentionBenchConfig, backward: bool = True):
    import torch

    from padoc_ray.trainer.attention import tree_attention

    for t in (x.q, x.k, x.v):
        t.grad = None
    if not backward:
        with torch.no_grad():
            return tree_attention(x.q, x.k, x.v, x.layout, backend=backend, flex_compile=cfg.flex_compile), None
    out = tree_attention(x.q, x.k, x.v, x.layout, backend=backend, flex_compile=cfg.flex_compile)
    out.backward(x.grad_out)
    return out.detach(), (x.q.grad, x.k.grad, x.v.grad)


def _timed(fn, device: str) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def _setup_seconds(backend: str, layout: TreeLayout, device: str) -> float:
    """Time to build the per-layout structure from scratch (caches cleared)."""
    from padoc_ray.trainer import attention as A

    if backend == "dense":
        A._dense_mask_cached.cache_clear()
        return _timed(lambda: A.dense_mask(layout, device), device)
    if backend == "flex":
        A._block_mask.cache_clear()
        return _timed(lambda: A._block_mask(layout, str(__import__("torch").device(device)), 128), device)
    A._varlen_plan_cached.cache_clear()
    return _timed(lambda: A.varlen_plan(layout, device), device)


def _peak_bytes(fn, device: str) -> tuple[int, str]:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, "cuda.max_memory_allocated"
    with _RssPeak() as m:
        fn()
    return m.used, "rss_sampled"


def _diffs(res, ref) -> dict:
    out, grads = res
    d = {"max_abs_diff_out": float((out.float() - ref[0].float()).abs().max())}
    if grads is not None:
        d["max_abs_diff_grad"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(grads, ref[1:]))
    return d


def bench_one(backend: str, x: _Inputs, cfg: AttentionBenchConfig) -> dict:
    """Measure one backend on one tree; failures become ``{"error": reason}``."""
    from padoc_ray.trainer.attention import FlexBackwardUnsupported, tree_varlen_kernel

    rec: dict = {}
    if backend == "tree_varlen":
        rec["kernel"] = tree_varlen_kernel(cfg.device, x.q.dtype)
    est = estimate_bytes(backend, x.layout, cfg)
    if est > cfg.memory_budget_gib * GIB:
        return {**rec, "error": f"skipped: estimated {est / GIB:.1f} GiB exceeds the "
                                f"{cfg.memory_budget_gib:g} GiB budget (--memory-budget-gib)"}
    backward = True
    try:
        try:
            out, grads = _step(backend, x, cfg)
            if backend == "dense":  # the reference; dense's own figures then show its run-to-run spread
                x.ref = (out, *(g.clone() for g in grads))
        except FlexBackwardUnsupported as e:  # time and check the forward alone
            rec["error"] = str(e)
            backward = False
        for _ in range(cfg.warmup):
            _step(backend, x, cfg, backward)
        times = [_timed(lambda: _step(backend, x, cfg, backward), cfg.device) for _ in range(cfg.repeats)]
        rec["fwd_bwd_s" if backward else "fwd_s"] = statistics.median(times)
        rec["setup_s"] = _setup_seconds(backend, x.layout, cfg.device)
        holder = {}
        rec["peak_bytes"], rec["peak_method"] = _peak_bytes(lambda: holder.update(r=_step(backend, x, cfg, backward)),
                                                            cfg.device)
        if x.ref is not None and (backend != "dense" or "error" not in rec):
            rec.update(_diffs(holder["r"], x.ref))
        elif backend != "dense":
            rec["diff_note"] = "no dense reference at this length"
    except Exception as e:  # a failed run is a recorded result, never the end of the benchmark
        rec["error"] = f"{type(e).__name__}: {e}".strip()[:500]
    finally:
        _release(cfg.device)
    return rec


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def run_bench(cfg: AttentionBenchConfig, log=print) -> dict:
    """``{backend: {str(length): record}}`` for every backend and length in ``cfg``."""
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device")
    if cfg.device == "cpu":
        _limit_glibc_caching()
    rng = random.Random(cfg.seed)
    results: dict = {b: {} for b in cfg.backends}
    order = sorted(cfg.backends, key=lambda b: b != "dense")  # dense first: it is the reference
    for s in cfg.lengths:
        layout = random_tree(s, cfg.branches, rng)
        x = _make_inputs(layout, cfg, cfg.seed + s)
        log(f"S={s}: prefix {layout.prefix_len}, forks {list(layout.forks)}, branch lengths {list(layout.branch_lens)}")
        for b in order:
            t = time.perf_counter()
            rec = bench_one(b, x, cfg)
            rec.update(prefix_len=layout.prefix_len, attended_pairs=layout.visible_pairs(), dtype=cfg.dtype_name)
            results[b][str(s)] = rec
            log(f"  {b}: {'error: ' + rec['error'] if 'error' in rec else 'ok'} ({time.perf_counter() - t:.1f}s)")
        del x
        _release(cfg.device)
    return results


def format_table(results: dict) -> str:
    """Plain-text table; ``vs dense`` is dense time / backend time (above 1: faster than dense)."""
    hdr = f"{'backend':<12}{'S':>7}{'fwd+bwd s':>11}{'vs dense':>10}{'setup s':>9}{'peak MiB':>10}" \
          f"{'|d out|':>10}{'|d grad|':>10}  note"
    lines = [hdr, "-" * len(hdr)]
    dense = results.get("dense", {})
    for b, per in results.items():
        for s, r in per.items():
            t = r.get("fwd_bwd_s")
            shown = f"{t:.4f}" if t is not None else (f"fwd {r['fwd_s']:.4f}" if "fwd_s" in r else "-")
            dt = dense.get(s, {}).get("fwd_bwd_s")
            ratio = f"{dt / t:.2f}x" if t and dt else "-"

            def num(key, fmt):
                return format(r[key], fmt) if key in r else "-"

            peak = f"{r['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in r else "-"
            lines.append(f"{b:<12}{s:>7}{shown:>11}{ratio:>10}{num('setup_s', '.3f'):>9}{peak:>10}"
                         f"{num('max_abs_diff_out', '.1e'):>10}{num('max_abs_diff_grad', '.1e'):>10}  "
                         f"{r.get('error', r.get('kernel', ''))[:90]}")
    return "\n".join(lines)


def main(cfg: AttentionBenchConfig) -> int:
    """Run each backend forward+backward on a random packed tree per length, print the table, write --json."""
    import sys

    from padoc_ray.bench import UsageError, write_json

    try:
        results = run_bench(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(format_table(results))
    write_json(cfg.json, results)
    return 0
