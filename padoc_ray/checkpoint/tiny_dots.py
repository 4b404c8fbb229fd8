"""Build a tiny random-weight checkpoint in dots.ocr's format, offline and deterministically.

dots.ocr (rednote-hilab) is ``DotsOCRForCausalLM`` / ``dots_ocr``: a remote-code config (here
:mod:`.configuration_dots`, copied beside it) that is a Qwen2 config with a ``vision_config``; the dots
ViT (``vision_tower.*``: 14-pixel patches, RMSNorm blocks with a fused ``qkv``, a SwiGLU MLP
``fc1``/``fc3``/``fc2``, a merger of 2x2 patches) and a Qwen2 decoder (``model.*``, ``lm_head``).
This builds that format at a tiny size (~2.7 M float32 parameters, 10.7 MB, ~3 s on a CPU with
imports): stock vLLM loads it with ``trust_remote_code=True`` and expands ``<|imgpad|>`` into one
token per 28x28 pixels of the resized page, as it would for the real checkpoint. Tests, demos and
CPU benchmarks of the ``dots`` family run on it.

What it knows: the format, the token strings and the prompts (:mod:`padoc_ray.protocol.dots`), and the
image rule (Qwen2-VL's resize with patch 14 and merge 2), with a small pixel budget
(:attr:`TinyDotsConfig.max_pixels`: a letter page is about 300 image tokens, not thousands) that
``preprocessor_config.json`` carries, so :class:`~padoc_ray.protocol.dots.DotsSpec` predicts what vLLM
does. What it does not: the real weights, the real token ids (dots' are 151xxx; here they follow a
small BPE: read them from the tokenizer), and any layout knowledge: its outputs are noise unless
teacher-forced. It writes no ``padoc_protocol.json``: the family is recognized from ``config.json``.

The tokenizer is a byte-level BPE trained on :func:`padoc_ray.checkpoint.tiny._training_text` plus
dots' layout text (JSON cells of every category, the three prompts, boxes), wrapped as a Qwen2
tokenizer; the weights are scaled so float32 greedy decoding has wide top-1 margins (as
:mod:`.tiny_hpd`'s).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass

from padoc_ray.protocol.dots import (
    CATEGORIES, GROUNDING_TEXT, IMAGE_TEXT, LAYOUT_ALL_TEXT, LAYOUT_ONLY_TEXT, MIN_PIXELS, DotsSpec, DotsTokens,
)

from .protocol_files import padded_vocab_size, prepare_out
from .tiny_parts import draw_weights, qwen2_bpe_tokenizer, write_json
from .tiny import _training_text

#: Qwen's pad token, and the video placeholder the Qwen2-VL processor vLLM builds looks for
#: (dots.ocr's ``video_token_id`` is Qwen's ``<|video_pad|>``)
PAD_TOKEN, VIDEO_PAD = "<|endoftext|>", "<|video_pad|>"
#: OpenAI CLIP's normalization, which dots.ocr's image processor uses
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

_CONFIG_MODULE = "configuration_dots"


def special_tokens() -> tuple[str, ...]:
    """The checkpoint's special tokens, in id order (each one token): the pad, dots' chat and image
    tokens (:meth:`DotsSpec.all_added_tokens`) and the video placeholder."""
    return (PAD_TOKEN, *DotsSpec().all_added_tokens(), VIDEO_PAD)


def chat_template(t: DotsTokens = DotsTokens()) -> str:
    """dots.ocr's chat format: a user turn is ``<|user|>`` + its items (an image as
    ``<|img|><|imgpad|><|endofimg|>``, a text as itself) + ``<|endofuser|>``; an assistant turn is
    ``<|assistant|>`` + its text + ``<|endofassistant|>``; ``add_generation_prompt`` appends
    ``<|assistant|>``. A user turn [image, LAYOUT_ONLY_TEXT] renders :meth:`DotsSpec.prompt` ("fork").
    Other roles are refused (the format has no system turn)."""
    image = t.image_start + t.image_pad + t.image_end
    assert image == IMAGE_TEXT, "the template's image item is the spec's image text"
    return (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}{{ '" + t.user + "' }}"
        "{%- elif message['role'] == 'assistant' -%}{{ '" + t.assistant + "' }}"
        "{%- else -%}{{ raise_exception('dots.ocr has no ' + message['role'] + ' turn') }}{%- endif -%}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for item in message['content'] -%}"
        "{%- if item['type'] in ('image', 'image_url') or 'image' in item -%}{{ '" + image + "' }}"
        "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{%- if message['role'] == 'user' -%}{{ '" + t.end_of_user + "' }}"
        "{%- else -%}{{ '" + t.end_of_stream + "' }}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '" + t.assistant + "' }}{%- endif -%}"
    )


@dataclass(frozen=True, kw_only=True)
class TinyDotsConfig:
    """Shape of the tiny dots-format model (the real one: ViT 1536 x 42, decoder 1536 x 28)."""

    #: decoder (Qwen2: biased q/k/v); head_dim 32: vLLM's CPU attention refuses head_dim 16
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 131072
    rope_theta: float = 1_000_000.0
    #: vision tower (dots ViT); head_dim 32 as well
    vision_embed_dim: int = 64
    vision_intermediate_size: int = 128
    vision_layers: int = 2
    vision_heads: int = 2
    patch_size: int = 14
    spatial_merge_size: int = 2
    #: the image processor's pixel budget: dots.ocr's minimum; a maximum of 300 tokens of 28x28 pixels
    #: (the real one: 11,289,600 pixels, 14,400 tokens), so a letter page is ~285 image tokens
    min_pixels: int = MIN_PIXELS
    max_pixels: int = 300 * 28 * 28
    #: BPE cap: the training text saturates well below it
    bpe_vocab_size: int = 12000
    #: RMS of the logits at the LM head (wide top-1 margins: float32 greedy decoding is stable)
    logit_scale: float = 12.0
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _layout_text() -> list[str]:
    """dots' layout vocabulary: JSON cells of every category (with and without text), the three
    prompts, grounding prompts with their boxes, and numbers."""
    rng = random.Random(20260501)  # fixed: the text (and so the tokenizer) never depends on cfg.seed
    lines = [LAYOUT_ONLY_TEXT, LAYOUT_ALL_TEXT, GROUNDING_TEXT] * 8
    for _ in range(6):
        cells = []
        for name in CATEGORIES:
            x1, y1 = rng.randrange(0, 1200), rng.randrange(0, 1600)
            box = [x1, y1, rng.randrange(x1, 1700), rng.randrange(y1, 2200)]
            cells.append({"bbox": box, "category": name})
            lines.append(GROUNDING_TEXT + "[" + ", ".join(map(str, box)) + "]")
        lines.append(json.dumps(cells, ensure_ascii=False))
        lines.append(json.dumps([{**c, "text": "The results of our study."} for c in cells], ensure_ascii=False))
    lines += [", ".join(str(i) for i in range(k, k + 50)) for k in range(0, 2200, 50)]
    lines.append('[{"bbox": [12, 30, 400, 88], "category": "Text"}]')
    return lines


def build_tokenizer(cfg: TinyDotsConfig):
    """Train the BPE and wrap it as a Qwen2 tokenizer holding :func:`special_tokens` (eos
    ``<|endofassistant|>``, pad ``<|endoftext|>``) and the chat template."""
    return qwen2_bpe_tokenizer(_training_text() + _layout_text(), vocab_size=cfg.bpe_vocab_size, pad=PAD_TOKEN,
                               specials=special_tokens(), eos=DotsTokens().end_of_stream, chat_template=chat_template())


def _weight_specs(cfg: TinyDotsConfig, vocab: int) -> list[tuple[str, tuple[int, ...], float | str]]:
    """Every tensor as (name, shape, init), named as dots.ocr's checkpoint names them (what vLLM's
    ``DotsOCRForCausalLM.hf_to_vllm_mapper`` maps): a float is the std of a normal draw, "ones"/"zeros"
    constants. Linear layers draw with std 1/sqrt(fan_in); token embeddings N(0, 1); the LM head's std is
    ``logit_scale``/sqrt(hidden), so the logits' RMS is ~``logit_scale`` (see :mod:`.tiny_hpd`)."""
    d, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    c, ci, p = cfg.vision_embed_dim, cfg.vision_intermediate_size, cfg.patch_size
    m4 = c * cfg.spatial_merge_size ** 2  # the merger's width: 2x2 patches side by side
    v = "vision_tower."
    s: list[tuple[str, tuple[int, ...], float | str]] = [
        (v + "patch_embed.patchifier.proj.weight", (c, 3, p, p), (3 * p * p) ** -0.5),
        (v + "patch_embed.patchifier.proj.bias", (c,), "zeros"),
        (v + "patch_embed.patchifier.norm.weight", (c,), "ones")]
    for i in range(cfg.vision_layers):
        e = f"{v}blocks.{i}."
        s += [(e + "norm1.weight", (c,), "ones"), (e + "attn.qkv.weight", (3 * c, c), c ** -0.5),
              (e + "attn.proj.weight", (c, c), c ** -0.5), (e + "norm2.weight", (c,), "ones"),
              (e + "mlp.fc1.weight", (ci, c), c ** -0.5), (e + "mlp.fc3.weight", (ci, c), c ** -0.5),
              (e + "mlp.fc2.weight", (c, ci), ci ** -0.5)]
    s += [(v + "post_trunk_norm.weight", (c,), "ones"),
          (v + "merger.ln_q.weight", (c,), "ones"), (v + "merger.ln_q.bias", (c,), "zeros"),
          (v + "merger.mlp.0.weight", (m4, m4), m4 ** -0.5), (v + "merger.mlp.0.bias", (m4,), "zeros"),
          (v + "merger.mlp.2.weight", (d, m4), m4 ** -0.5), (v + "merger.mlp.2.bias", (d,), "zeros")]
    s.append(("model.embed_tokens.weight", (vocab, d), 1.0))
    for i in range(cfg.num_hidden_layers):
        e = f"model.layers.{i}."
        s += [(e + "input_layernorm.weight", (d,), "ones"),
              (e + "self_attn.q_proj.weight", (q, d), d ** -0.5), (e + "self_attn.q_proj.bias", (q,), "zeros"),
              (e + "self_attn.k_proj.weight", (kv, d), d ** -0.5), (e + "self_attn.k_proj.bias", (kv,), "zeros"),
              (e + "self_attn.v_proj.weight", (kv, d), d ** -0.5), (e + "self_attn.v_proj.bias", (kv,), "zeros"),
              (e + "self_attn.o_proj.weight", (d, q), q ** -0.5),
              (e + "post_attention_layernorm.weight", (d,), "ones"),
              (e + "mlp.gate_proj.weight", (inter, d), d ** -0.5), (e + "mlp.up_proj.weight", (inter, d), d ** -0.5),
              (e + "mlp.down_proj.weight", (d, inter), inter ** -0.5)]
    s += [("model.norm.weight", (d,), "ones"), ("lm_head.weight", (vocab, d), cfg.logit_scale * d ** -0.5)]
    return s


def _weights(cfg: TinyDotsConfig, vocab: int) -> dict:
    return draw_weights(_weight_specs(cfg, vocab), cfg.seed)


def _config(cfg: TinyDotsConfig, vocab: int, ids: dict[str, int]) -> dict:
    t = DotsTokens()
    vision = {
        "model_type": "dots_vit", "embed_dim": cfg.vision_embed_dim, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.vision_intermediate_size, "num_hidden_layers": cfg.vision_layers,
        "num_attention_heads": cfg.vision_heads, "num_channels": 3, "patch_size": cfg.patch_size,
        "spatial_merge_size": cfg.spatial_merge_size, "temporal_patch_size": 1, "rms_norm_eps": 1e-5,
        "use_bias": False, "post_norm": True, "is_causal": False, "attn_implementation": "sdpa",
    }
    return {
        "architectures": ["DotsOCRForCausalLM"], "model_type": "dots_ocr",
        "auto_map": {"AutoConfig": f"{_CONFIG_MODULE}.DotsOCRConfig"},
        "vocab_size": vocab, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": 1e-6,
        "rope_theta": cfg.rope_theta, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": cfg.num_hidden_layers, "tie_word_embeddings": False, "attention_dropout": 0.0,
        "bos_token_id": ids[PAD_TOKEN], "eos_token_id": ids[t.end_of_stream], "pad_token_id": ids[PAD_TOKEN],
        "image_token_id": ids[t.image_pad], "video_token_id": ids[VIDEO_PAD],
        "vision_config": vision, "torch_dtype": "float32",
    }


def _preprocessor(cfg: TinyDotsConfig) -> dict:
    """Qwen2-VL's image processor as dots.ocr configures it (patch 14, merge 2, one frame, CLIP's
    normalization), with the tiny model's pixel budget."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": cfg.min_pixels, "max_pixels": cfg.max_pixels,
        "patch_size": cfg.patch_size, "temporal_patch_size": 1, "merge_size": cfg.spatial_merge_size,
        "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD, "do_resize": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    }


def build_tiny_dots_model(out: str, *, cfg: TinyDotsConfig = TinyDotsConfig(), force: bool = False) -> str:
    """Write the checkpoint to ``out`` and return it; refuses a non-empty ``out`` unless ``force``
    (FileExistsError, as :func:`padoc_ray.checkpoint.tiny.build_tiny_model`)."""
    if cfg.head_dim < 32 or cfg.vision_embed_dim // cfg.vision_heads < 32:
        raise ValueError(f"head_dim {cfg.head_dim}: vLLM's CPU attention needs head_dim >= 32")
    prepare_out(out, force)
    from safetensors.torch import save_file
    tok = build_tokenizer(cfg)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special_tokens()}
    vocab = padded_vocab_size(len(tok))
    write_json(os.path.join(out, "config.json"), _config(cfg, vocab, ids))
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), _CONFIG_MODULE + ".py"),
                    os.path.join(out, _CONFIG_MODULE + ".py"))
    eos = ids[DotsTokens().end_of_stream]
    write_json(os.path.join(out, "generation_config.json"), {
        "eos_token_id": [eos], "pad_token_id": ids[PAD_TOKEN], "do_sample": False})
    write_json(os.path.join(out, "preprocessor_config.json"), _preprocessor(cfg))
    tok.save_pretrained(out)
    save_file(_weights(cfg, vocab), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out
