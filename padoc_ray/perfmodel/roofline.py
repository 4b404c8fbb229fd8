"""A roofline step time for a named GPU and model shape (the tables in :mod:`.gpus`).

One engine step of the language model reads every weight once and each scheduled sequence's KV
cache, and does the matmuls of every scheduled token plus their attention; it takes the longer of
its memory time and its compute time (a roofline), plus a fixed per-step overhead. A step that
encodes images also runs the vision encoder on them first (its own roofline: its weights read once,
its FLOPs over the images' patches). Five terms, each with one efficiency factor (the fraction of the
datasheet peak it gets), so the step is::

    overhead + max(weights_bytes / (bw * e_weights) + kv_bytes / (bw * e_kv),
                   matmul_flops / (peak * e_matmul) + attention_flops / (peak * e_attention))
             + vision encoder: max(vit_weight_bytes / (bw * e_weights), vit_flops / (peak * e_vit))

What the terms count (``StepLoad`` fields in brackets):

* weights: the decoder layers' projections and MLP plus the LM head, at ``dtype_bytes`` a value
  (norms and the embedding lookup are a few rows, left out);
* KV: K and V of every layer and KV head over [``context_tokens``];
* matmul: 2 FLOPs per weight per scheduled token [``decode_seqs + prefill_tokens``] through the decoder
  layers, and through the LM head for the decoding sequences only (a prefill chunk's one logits row
  is left out);
* attention: 4 FLOPs (QK and PV) per layer, query head and head_dim for every query over the keys it
  sees. ``StepLoad`` does not say whose context is whose, so each sequence is taken at the step's mean
  context: a decoding token sees all of it, a prefill token (the chunk taken as one sequence's) sees it
  less half the chunk (causal). Exact for a decode-only step and for a lone prefill;
* vision: ``merge^2`` patches per image token [``image_tokens``] through the ViT layers (2 FLOPs a
  weight), full attention over each attention window's patches (the shape's ``vit_window``: a whole
  image [``image_tokens / images``] for Qwen-VL, a 448-px tile of 1,024 patches for InternViT, the
  thumbnail being one more tile), and the patch mergers.

Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .gpus import Gpu, ModelShape, gpu, model_shape
from .step import StepLoad


@dataclass(frozen=True)
class Efficiency:
    """The fraction of datasheet peak each term gets; the defaults and why.

    * ``weights`` 0.7: streaming weights is a large sequential read; the memory-bandwidth utilization
      (MBU) that published LLM-serving measurements report for batch decode on A100/H100 is about
      0.6-0.8 (Databricks' "LLM Inference Performance Engineering: Best Practices", 2023, and vLLM /
      TensorRT-LLM decode benchmarks).
    * ``kv`` 0.5: paged KV blocks are smaller, scattered reads; paged-attention kernels reach about half
      of peak bandwidth on long contexts (the vLLM/FlashInfer paged-decode kernel figures).
    * ``matmul`` 0.6: the model-FLOPs utilization (MFU) of large prefill GEMMs in bf16 on A100/H100
      is commonly 0.5-0.7; a 2B model's narrower GEMMs sit at the low end.
    * ``attention`` 0.4: FlashAttention-2 reports 50-73% of A100 peak forward at long sequences, less
      for the short, ragged batches of serving.
    * ``vit`` 0.4: the vision encoder's GEMMs are narrow (hidden 1024) and run on one image at a time.
    * ``step_overhead_s`` 0.002: per-step host work (scheduling, input preparation, sampling, output
      processing) that vLLM does between GPU passes; vLLM V1 was built to cut it to a few ms per step.
    """

    weights: float = 0.7  #: fraction of peak bandwidth when reading the weights
    kv: float = 0.5  #: fraction of peak bandwidth when reading the KV cache
    matmul: float = 0.6  #: fraction of dense bf16 peak for the decoder's matmuls
    attention: float = 0.4  #: fraction of dense bf16 peak for attention
    vit: float = 0.4  #: fraction of dense bf16 peak for the vision encoder
    step_overhead_s: float = 0.002  #: fixed seconds per step (host work between GPU passes)

    def __post_init__(self) -> None:
        for name in ("weights", "kv", "matmul", "attention", "vit"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {v}")
        if self.step_overhead_s < 0:
            raise ValueError("step_overhead_s must be >= 0")


#: bf16: bytes per weight and per KV value
DTYPE_BYTES = 2
#: the share of device memory vLLM takes (its default gpu_memory_utilization; the paper's Appendix E.3: 90%)
GPU_MEMORY_UTILIZATION = 0.9
#: what vLLM keeps of that besides the weights and the KV cache: the profiled activation peak (a 2B model's
#: MLP over 24,576 batched tokens is ~0.6 GB, the sampler's float32 logits for 384 sequences ~0.2 GB and its
#: sorting copies more), CUDA graph pools and the CUDA context's allocations: a few GB for a 2B model
NON_KV_BYTES = 4e9


def kv_cache_blocks(gpu_: Gpu | str, shape: ModelShape | str, block_size: int, *,
                    utilization: float = GPU_MEMORY_UTILIZATION, reserve_bytes: float = NON_KV_BYTES,
                    dtype_bytes: int = DTYPE_BYTES) -> int:
    """KV blocks one engine gets on ``gpu_``: its memory x ``utilization``, less the weights (decoder, LM head,
    the embedding table when the head is not tied to it, vision encoder) and ``reserve_bytes``, in blocks of
    ``block_size`` tokens."""
    g = gpu(gpu_) if isinstance(gpu_, str) else gpu_
    s = model_shape(shape) if isinstance(shape, str) else shape
    weights = s.resident_params * dtype_bytes
    free = g.memory_bytes * utilization - weights - reserve_bytes
    per_block = block_size * s.kv_values_per_token * dtype_bytes
    if free < per_block:
        raise ValueError(f"{s.name} does not fit on {g.name}: {weights / 1e9:.1f} GB of weights and "
                         f"{reserve_bytes / 1e9:.1f} GB reserved leave no KV cache")
    return int(free // per_block)


class RooflineStepTime:
    """:class:`~.step.StepTime` of one GPU (a :class:`~.gpus.Gpu` or its table name) serving one model
    shape (a :class:`~.gpus.ModelShape`, a built-in name or a checkpoint folder)."""

    def __init__(self, gpu_: Gpu | str, shape: ModelShape | str, efficiency: Efficiency | None = None,
                 dtype_bytes: int = DTYPE_BYTES):
        self.gpu = gpu(gpu_) if isinstance(gpu_, str) else gpu_
        self.shape = model_shape(shape) if isinstance(shape, str) else shape
        self.eff = efficiency or Efficiency()
        if dtype_bytes < 1:
            raise ValueError("dtype_bytes must be >= 1")
        self.dtype_bytes = dtype_bytes

    def terms(self, load: StepLoad) -> dict[str, float]:
        """Seconds of each term for ``load`` (before the roofline combines them)."""
        s, g, e, b = self.shape, self.gpu, self.eff, self.dtype_bytes
        bw, peak = g.hbm_bytes_per_s, g.bf16_flops_per_s
        tokens = load.scheduled_tokens
        seqs = load.decode_seqs + (1 if load.prefill_tokens else 0)
        out = {"weights": 0.0, "kv": 0.0, "matmul": 0.0, "attention": 0.0, "vit": 0.0}
        if tokens:
            out["weights"] = (s.layers * s.layer_params + s.lm_head_params) * b / (bw * e.weights)
            out["kv"] = load.context_tokens * s.kv_values_per_token * b / (bw * e.kv)
            mm = 2 * (s.layers * s.layer_params * tokens + s.lm_head_params * load.decode_seqs)
            out["matmul"] = mm / (peak * e.matmul)
            mean_ctx = load.context_tokens / seqs
            seen = load.decode_seqs * mean_ctx + load.prefill_tokens * max(mean_ctx - load.prefill_tokens / 2,
                                                                          load.prefill_tokens / 2)
            att = 4 * s.layers * s.heads * s.head_dim * seen
            out["attention"] = att / (peak * e.attention)
        if load.images and load.image_tokens:
            out["vit"] = self._vit_seconds(load.images, load.image_tokens)
        return out

    def _vit_seconds(self, images: int, image_tokens: int) -> float:
        s, g, e = self.shape, self.gpu, self.eff
        patches = image_tokens * s.merge ** 2
        window = s.vit_window or patches / images  # the patches each one attends to: its tile's, or its image's
        flops = (2 * s.vit_depth * s.vit_layer_params * patches
                 + 4 * s.vit_depth * s.vit_hidden * window * patches  # full attention within each window
                 + 2 * (1 + s.deepstack_mergers) * s.merger_params * image_tokens)
        read = s.vit_params * self.dtype_bytes / (g.hbm_bytes_per_s * e.weights)
        return max(read, flops / (g.bf16_flops_per_s * e.vit))

    def bound(self, load: StepLoad) -> str:
        """``memory`` or ``compute``: which side of the roofline the language-model pass is on."""
        t = self.terms(load)
        return "memory" if t["weights"] + t["kv"] >= t["matmul"] + t["attention"] else "compute"

    def seconds(self, load: StepLoad) -> float:
        t = self.terms(load)
        return self.eff.step_overhead_s + max(t["weights"] + t["kv"], t["matmul"] + t["attention"]) + t["vit"]

    def describe(self) -> dict:
        s = self.shape
        return {"kind": "roofline", "gpu": self.gpu.name, "gpu_source": self.gpu.source,
                "hbm_gb_per_s": self.gpu.hbm_bytes_per_s / 1e9, "bf16_tflops": self.gpu.bf16_flops_per_s / 1e12,
                "model": s.name, "model_source": s.source, "dtype_bytes": self.dtype_bytes,
                "lm_params": s.layers * s.layer_params + s.lm_head_params, "vit_params": s.vit_params,
                "efficiency": asdict(self.eff)}
