"""The tables the roofline step time reads: GPUs (vendor datasheets) and model shapes (config.json).

Every number :mod:`.roofline` uses comes from here or from a named default there. A GPU row is what
its vendor's datasheet states: HBM (or GDDR) bandwidth and *dense* bf16 tensor-core peak (the
datasheets also print a 2x "with sparsity" figure; dense is what a transformer's matmuls get).

The built-in model shapes are written by hand (no hub is reachable here; see :data:`SHAPES` for where
each value was checked): ``qwen3-vl-2b`` from the public ``Qwen/Qwen3-VL-2B-Instruct`` ``config.json``,
``hpd-1b`` (HPD-Parsing, an InternVL3.5-1B-based parser) from its ``config.json`` as oar-ocr's
``config.rs`` quotes it, ``dots-ocr`` (rednote-hilab/dots.ocr) from its published ``config.json`` as
two copies quote it and vLLM's ``DotsVisionConfig`` defaults. :func:`model_shape` reads the same fields
from any local checkpoint's ``config.json`` (Qwen-VL style, or dots.ocr's).

A shape also says how the model's branches are prompted (:attr:`ModelShape.branch_shape`, the
families' :data:`~padoc_ray.protocol.family.BRANCH_SHAPES`): ``prefix-fork`` (PaDoc, HPD: the page
prompt and the layout before the region) or ``grounding`` (dots.ocr: the image, a grounding prompt and
the region's box); the engine model's request plans follow it (:mod:`.plan`).

Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from padoc_ray.protocol.dots import is_dots_config
from padoc_ray.protocol.family import BRANCH_SHAPES, GROUNDING, PREFIX_FORK


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float  #: memory bandwidth, bytes/s
    bf16_flops_per_s: float  #: dense bf16 tensor-core peak, FLOP/s
    memory_bytes: float  #: device memory, bytes
    source: str  #: the datasheet the row is read from


_GB, _TB, _TF = 1e9, 1e12, 1e12
GPUS: dict[str, Gpu] = {g.name: g for g in (
    # the paper's GPU (E.3: "a single A800"); the SXM 80GB module, whose figures equal the A100 80GB SXM's
    Gpu("A800-80G", 2039 * _GB, 312 * _TF, 80 * _GB,
        "NVIDIA A800 Tensor Core GPU datasheet (A800 80GB SXM: 2,039 GB/s HBM2e, BF16 312 TFLOPS dense)"),
    Gpu("H100-80G", 3.35 * _TB, 989.5 * _TF, 80 * _GB,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 3.35 TB/s HBM3, BF16 1,979 TFLOPS with sparsity, "
        "989.5 dense)"),
    Gpu("H200", 4.8 * _TB, 989.5 * _TF, 141 * _GB,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141 GB HBM3e at 4.8 TB/s, BF16 1,979 TFLOPS with "
        "sparsity, 989.5 dense)"),
    Gpu("L40S", 864 * _GB, 362.05 * _TF, 48 * _GB,
        "NVIDIA L40S GPU datasheet (48 GB GDDR6 at 864 GB/s, BF16 733 TFLOPS with sparsity, 362.05 dense)"),
)}


@dataclass(frozen=True)
class ModelShape:
    """What a step's bytes and FLOPs depend on: the language model's and the vision encoder's sizes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    vit_depth: int
    vit_hidden: int
    vit_intermediate: int
    patch: int
    merge: int
    vit_out_hidden: int  #: the merger's output width (the language model's hidden size)
    deepstack_mergers: int = 0  #: extra mergers fed from inner ViT layers (Qwen3-VL's DeepStack)
    #: patches one ViT attention sees: 0 = every patch of the image (Qwen-VL); InternViT attends within
    #: a 448-px tile, (448 / 14)^2 = 1024 patches (the thumbnail is one more tile)
    vit_window: int = 0
    #: the merger MLP's inner width: 0 = the merged width ``vit_hidden * merge^2`` (Qwen-VL's merger);
    #: InternVL's mlp1 (LayerNorm, Linear merged -> LM hidden, GELU, Linear) has the LM's hidden size
    merger_hidden: int = 0
    #: whether the LM head is the embedding table (else the table is a second vocab x hidden in memory;
    #: a step reads only the head either way, its lookups are a few rows)
    tied_embeddings: bool = True
    #: whether a ViT layer's MLP is gated (SwiGLU: three matrices, dots_vit's fc1 / fc3 / fc2) rather than
    #: two (Qwen-VL's and InternViT's fc1 / fc2)
    vit_gated_mlp: bool = False
    #: how a branch's prompt is made (:data:`~padoc_ray.protocol.family.BRANCH_SHAPES`' values):
    #: ``prefix-fork`` or ``grounding``
    branch_shape: str = PREFIX_FORK
    source: str = ""

    def __post_init__(self) -> None:
        if self.branch_shape not in set(BRANCH_SHAPES.values()):
            raise ValueError(f"{self.name}: branch_shape must be one of {sorted(set(BRANCH_SHAPES.values()))}, "
                             f"got {self.branch_shape!r}")

    @property
    def layer_params(self) -> int:
        """One decoder layer's matmul weights: q, k, v, o projections and the gated MLP (norms left out)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_values_per_token(self) -> int:
        """K and V values one token keeps per layer, summed over layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    @property
    def vit_layer_params(self) -> int:
        """One ViT layer's matmul weights: q, k, v, o and the MLP (two matrices, three when gated)."""
        return 4 * self.vit_hidden ** 2 + (3 if self.vit_gated_mlp else 2) * self.vit_hidden * self.vit_intermediate

    @property
    def merger_params(self) -> int:
        """One patch merger: merge^2 patches concatenated, an MLP to ``merger_hidden`` (default: the same
        width), then to the LM's width."""
        wide = self.vit_hidden * self.merge ** 2
        mid = self.merger_hidden or wide
        return wide * mid + mid * self.vit_out_hidden

    @property
    def vit_params(self) -> int:
        return self.vit_depth * self.vit_layer_params + (1 + self.deepstack_mergers) * self.merger_params

    @property
    def resident_params(self) -> int:
        """Every weight the engine holds: decoder layers, LM head, the embedding table when it is not the
        head, vision encoder and mergers."""
        embed = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * self.layer_params + self.lm_head_params + embed + self.vit_params


#: sources of the built-in shape (no hub here): layers 28, hidden 2048, 16 heads / 8 KV heads, head_dim 128,
#: vocab 151936, ViT depth 24 x hidden 1024 with 16 heads and patch 16 as printed by a Qwen3-VL-2B loader's
#: model metadata (an InfiniCore Qwen3-VL port, code search); ViT intermediate 4096, out_hidden 2048,
#: merge 2 and DeepStack indexes [5, 11, 17] as sgl-jax's Qwen3VLVisionConfig defaults (code search);
#: intermediate 6144 is the public config's value as recalled (the Qwen3-1.7B text width), not found in
#: the searchable corpus: the one figure here not checked against a second copy.
#:
#: ``hpd-1b`` (PaddlePaddle/HPD-Parsing): the config.json that oar-ocr's HPD-Parsing port
#: (oar-ocr-vl/src/hpd_parsing/config.rs, its ``parses_official_config_shape`` test) parses:
#: vision_config hidden 1024, intermediate 4096, 24 layers, 16 heads, image_size 448, patch 14,
#: downsample_ratio 0.5 (pixel shuffle: 2 x 2 patches a token, so merge 2 and 256 tokens a tile);
#: llm_config (Qwen3: QK-norm, SwiGLU, GQA) 28 layers, hidden 1024, 16 heads / 8 KV heads, head_dim 128,
#: intermediate 3072, vocab 151681 (its last id is <CHILD>, 151680, after InternVL's image tokens), the
#: decoder as InternVL3.5-1B's public config (a Qwen3-0.6B decoder) has it. mlp1 (LayerNorm(4096), Linear 4096 ->
#: 1024, GELU, Linear 1024 -> 1024) as InternVL's projector: merger_hidden = vit_out_hidden = 1024.
#: The LM head is taken as untied (that config, as quoted, sets no tie_word_embeddings, and oar-ocr's
#: decoder loads a separate lm_head unless it is set; not checked against the checkpoint's weights): it
#: changes only the memory (one more 151681 x 1024 table), not a step's reads. Left out: InternViT's CLS
#: token (1025 tokens a tile, not 1024), its qkv bias, and HPD's P-MTP draft head (the model has no
#: speculative decoding)
#:
#: ``dots-ocr`` (rednote-hilab/dots.ocr, ~3B): the published config.json as a dots.ocr port's notes quote it
#: ("Text Decoder Hyperparameters": architectures DotsOCRForCausalLM, hidden_size 1536, intermediate_size
#: 8960, num_hidden_layers 28, num_attention_heads 12, num_key_value_heads 2, vocab_size 151936,
#: tie_word_embeddings false; no head_dim, so 1536 / 12 = 128) and the same values in an MLX port's test
#: fixture (mlx-community/dots.mocr-4bit's config.json); vision_config: embed_dim 1536, hidden_size 1536
#: (the merger's output: the LM's width), intermediate_size 4224, num_hidden_layers 42, 12 heads, patch 14,
#: spatial_merge_size 2, as both copies and vLLM 0.32's DotsVisionConfig defaults
#: (vllm/transformers_utils/configs/dotsocr.py) have them. From vLLM's dots_ocr.py: a ViT layer's MLP is
#: SwiGLU (fc1, fc3, fc2), its attention covers the whole image (cu_seqlens per image, no window), and the
#: merger is LayerNorm, Linear 6144 -> 6144, GELU, Linear 6144 -> 1536 (merger_hidden 0: the merged width).
#: Left out: the q/k/v biases (attention_bias true) and the patch embedding (a 14 x 14 x 3 convolution)
SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("qwen3-vl-2b", layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144,
               vocab=151936, vit_depth=24, vit_hidden=1024, vit_intermediate=4096, patch=16, merge=2,
               vit_out_hidden=2048, deepstack_mergers=3,
               source="Qwen/Qwen3-VL-2B-Instruct config.json (public numbers, written by hand; see gpus.SHAPES)"),
    ModelShape("hpd-1b", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
               vocab=151681, vit_depth=24, vit_hidden=1024, vit_intermediate=4096, patch=14, merge=2,
               vit_out_hidden=1024, vit_window=(448 // 14) ** 2, merger_hidden=1024, tied_embeddings=False,
               source="HPD-Parsing per oar-ocr's config.rs / InternVL3.5-1B public config, written by hand "
                      "(InternViT-300M tiles of 448 px, untied LM head; see gpus.SHAPES)"),
    ModelShape("dots-ocr", layers=28, hidden=1536, heads=12, kv_heads=2, head_dim=128, intermediate=8960,
               vocab=151936, vit_depth=42, vit_hidden=1536, vit_intermediate=4224, patch=14, merge=2,
               vit_out_hidden=1536, tied_embeddings=False, vit_gated_mlp=True, branch_shape=GROUNDING,
               source="rednote-hilab/dots.ocr config.json as quoted by a dots.ocr port's notes and an MLX port's "
                      "fixture, vision defaults as vLLM's DotsVisionConfig, written by hand (Qwen2 decoder, "
                      "dots_vit of 42 SwiGLU layers, untied LM head, grounding branches; see gpus.SHAPES)"),
)}


def gpu(name: str) -> Gpu:
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}: choose one of {', '.join(GPUS)}")
    return GPUS[name]


def model_shape(name_or_dir: str) -> ModelShape:
    """A built-in shape by name, or one read from a checkpoint folder's ``config.json`` (a Qwen-VL style
    config with ``text_config`` and ``vision_config``, or dots.ocr's, flat with a ``vision_config``; a
    text-only config gets no vision encoder)."""
    if name_or_dir in SHAPES:
        return SHAPES[name_or_dir]
    path = os.path.join(name_or_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"model shape {name_or_dir!r}: neither a built-in shape ({', '.join(SHAPES)}) "
                         f"nor a folder with a config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    text, vit = cfg.get("text_config") or cfg, cfg.get("vision_config") or {}
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in text]
    if missing:
        raise ValueError(f"{path}: the text config lacks {', '.join(missing)}")
    heads = text["num_attention_heads"]
    return ModelShape(
        name=os.path.basename(os.path.normpath(name_or_dir)), layers=text["num_hidden_layers"],
        hidden=text["hidden_size"], heads=heads, kv_heads=text.get("num_key_value_heads", heads),
        head_dim=text.get("head_dim") or text["hidden_size"] // heads, intermediate=text["intermediate_size"],
        vocab=text["vocab_size"], vit_intermediate=vit.get("intermediate_size", 0), patch=vit.get("patch_size", 0),
        merge=vit.get("spatial_merge_size", 1), deepstack_mergers=len(vit.get("deepstack_visual_indexes") or ()),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True))), source=path,
        **_vision_names(cfg, vit, text["hidden_size"]))


def _vision_names(cfg: dict, vit: dict, lm_hidden: int) -> dict:
    """The fields whose config.json names differ between Qwen-VL's vision_config (depth, hidden_size,
    out_hidden_size) and dots.ocr's (num_hidden_layers, embed_dim, hidden_size: the merger's output; SwiGLU
    layers; grounding branches)."""
    if is_dots_config(cfg):
        return dict(vit_depth=vit.get("num_hidden_layers", 0), vit_hidden=vit.get("embed_dim", 0),
                    vit_out_hidden=vit.get("hidden_size", lm_hidden), vit_gated_mlp=True, branch_shape=GROUNDING)
    return dict(vit_depth=vit.get("depth", 0), vit_hidden=vit.get("hidden_size", 0),
                vit_out_hidden=vit.get("out_hidden_size", lm_hidden))
