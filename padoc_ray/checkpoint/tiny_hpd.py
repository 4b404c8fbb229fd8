"""Build a tiny random-weight checkpoint in HPD-Parsing's format, offline and deterministically.

HPD-Parsing is an InternVL-format checkpoint: ``config.json`` says ``InternVLChatModel`` /
``internvl_chat`` (remote-code config, here :mod:`.configuration_internvl_chat`, copied beside it), an
InternViT tower (``vision_model.*``), a LayerNorm-Linear-GELU-Linear projector (``mlp1.*``) and a
Qwen3 decoder (``language_model.*``), plus HPD's top-level ``fork_token_id`` / ``child_token_id``.
This builds that format at a tiny size (~2.6 M float32 parameters, 10.6 MB, ~1 s on a CPU after
imports): stock vLLM loads it with ``trust_remote_code=True`` and cuts pages into 448-pixel tiles of
256 ``<IMG_CONTEXT>`` tokens each, as it would the real checkpoint. Tests, demos and CPU benchmarks
of the ``hpd`` family run on it.

What it knows: the format, the image rule (:mod:`padoc_ray.protocol.hpd_image`), the token strings
and the prompt (:mod:`padoc_ray.protocol.hpd`). What it does not: the real weights, the real token
ids (HPD's are 151xxx; here they follow a small BPE: read them from the tokenizer, never hard-code
them), HPD's P-MTP head (no ``language_model.mtp.*``), and any layout knowledge: its outputs are
noise unless teacher-forced. It writes no ``padoc_protocol.json``: the family is recognized from
``config.json``.

The tokenizer is a byte-level BPE trained on :func:`padoc_ray.checkpoint.tiny._training_text`
(English, LaTeX, HTML, digits, every GB2312 hanzi: one token per Chinese character) plus HPD's layout
text (category names, boxes, the system line and the task), wrapped as a Qwen2 tokenizer. The
weights are scaled so float32 greedy decoding has wide top-1 margins (see :func:`_weight_specs`).
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass

from padoc_ray.protocol.hpd import (
    DEFAULT_CATEGORY_MAP, DEFAULT_HPD_NAMES, IMAGE_PLACEHOLDER, SYSTEM_LINE, TASK_TEXT, HpdTokens,
)
from padoc_ray.protocol.hpd_image import MAX_TILES, MIN_TILES, TILE

from .protocol_files import padded_vocab_size, prepare_out
from .tiny_parts import draw_weights, qwen2_bpe_tokenizer, write_json
from .tiny import _training_text

#: InternVL's image tokens (vLLM's InternVL processor's defaults): the placeholder expands to
#: ``<img>`` + 256 ``<IMG_CONTEXT>`` per tile + ``</img>``
IMG_START, IMG_END, IMG_CONTEXT = "<img>", "</img>", "<IMG_CONTEXT>"
PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

_CONFIG_MODULE = "configuration_internvl_chat"


def special_tokens() -> tuple[str, ...]:
    """The checkpoint's special tokens, in id order (each one token)."""
    t = HpdTokens()
    assert t.end_of_stream == IM_END, "HPD's end of stream is the chat model's end of turn"
    return (PAD_TOKEN, IM_START, IM_END, IMG_START, IMG_END, IMG_CONTEXT, IMAGE_PLACEHOLDER, t.block, t.fork,
            t.child)


def chat_template(system: str = SYSTEM_LINE) -> str:
    """InternVL's chat format: a system turn (``system`` unless the messages open with one), an image
    item as ``<image>`` + newline, ``<|im_start|>assistant`` + newline on ``add_generation_prompt``. A
    user turn [image, TASK_TEXT] renders :meth:`HpdSpec.prompt` ("fork"). Every newline is inside a
    Jinja string literal, so whitespace control cannot eat it."""
    if "'" in system or "\\" in system:
        raise ValueError("the system line must not hold quotes or backslashes (it is a Jinja literal)")
    return (
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
        "{%- else -%}{%- set system = '" + system + "' -%}{%- set turns = messages -%}{%- endif -%}"
        "{{ '" + IM_START + "system\\n' + system + '" + IM_END + "\\n' }}"
        "{%- for message in turns -%}"
        "{{ '" + IM_START + "' + message['role'] + '\\n' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for item in message['content'] -%}"
        "{%- if item['type'] in ('image', 'image_url') or 'image' in item -%}{{ '" + IMAGE_PLACEHOLDER + "\\n' }}"
        "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{ '" + IM_END + "\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '" + IM_START + "assistant\\n' }}{%- endif -%}"
    )


@dataclass(frozen=True, kw_only=True)
class TinyHpdConfig:
    """Shape of the tiny HPD-format model (the real one: ViT 1024 x 24, decoder 1024 x 28)."""

    #: decoder (Qwen3 with QK-norm); head_dim 32: vLLM's CPU attention refuses head_dim 16
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    #: vision tower (InternViT); 448-pixel tiles of 14-pixel patches, as the real one
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_layers: int = 2
    vision_heads: int = 2
    image_size: int = TILE
    patch_size: int = 14
    #: BPE cap: the training text saturates near 8.3k tokens, so every GB2312 hanzi is one token
    bpe_vocab_size: int = 12000
    #: RMS of the logits at the LM head (wide top-1 margins: float32 greedy decoding is stable)
    logit_scale: float = 12.0
    seed: int = 0


def _layout_text() -> list[str]:
    """HPD's layout vocabulary: every category name in boxes, the task and the system line."""
    rng = random.Random(20260412)  # fixed: the text (and so the tokenizer) never depends on cfg.seed
    names = sorted(set(DEFAULT_CATEGORY_MAP) | set(DEFAULT_HPD_NAMES.values()))
    lines = [SYSTEM_LINE, TASK_TEXT] * 8
    for _ in range(6):
        for name in names:
            x1, y1 = rng.randrange(0, 900), rng.randrange(0, 900)
            lines.append(f"{name} [{x1},{y1},{rng.randrange(x1, 1001)},{rng.randrange(y1, 1001)}]")
    lines += [" ".join(str(i) for i in range(k, k + 50)) for k in range(0, 1001, 50)]
    lines.append("[12,30,900,1000] [0,0,1000,1000]")
    return lines


def build_tokenizer(cfg: TinyHpdConfig):
    """Train the BPE and wrap it as a Qwen2 tokenizer holding :func:`special_tokens` and the chat template."""
    return qwen2_bpe_tokenizer(_training_text() + _layout_text(), vocab_size=cfg.bpe_vocab_size, pad=PAD_TOKEN,
                               specials=special_tokens(), eos=IM_END, chat_template=chat_template())


def _weight_specs(cfg: TinyHpdConfig, vocab: int) -> list[tuple[str, tuple[int, ...], float | str]]:
    """Every tensor as (name, shape, init): a float is the std of a normal draw, "ones"/"zeros" constants.

    Linear layers draw with std 1/sqrt(fan_in) (activations stay O(1) through the residual stream);
    token embeddings are N(0, 1); the LM head's std is ``logit_scale``/sqrt(hidden), so after the final
    RMSNorm the logits have RMS ~``logit_scale``: over a vocab of ~8k the typical top-1 margin is a few
    units, far above float32 rounding (~1e-6 relative), which keeps greedy decoding the same whether a
    prefix was computed or read from the cache. (HF's default init, std 0.02, gives near-flat logits.)
    """
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    c, ci, p = cfg.vision_hidden_size, cfg.vision_intermediate_size, cfg.patch_size
    n_pos = (cfg.image_size // p) ** 2 + 1
    s = []
    v = "vision_model."
    s += [(v + "embeddings.class_embedding", (1, 1, c), 1.0),
          (v + "embeddings.patch_embedding.weight", (c, 3, p, p), (3 * p * p) ** -0.5),
          (v + "embeddings.patch_embedding.bias", (c,), "zeros"),
          (v + "embeddings.position_embedding", (1, n_pos, c), 1.0)]
    for i in range(cfg.vision_layers):
        e = f"{v}encoder.layers.{i}."
        s += [(e + "attn.qkv.weight", (3 * c, c), c ** -0.5), (e + "attn.qkv.bias", (3 * c,), "zeros"),
              (e + "attn.proj.weight", (c, c), c ** -0.5), (e + "attn.proj.bias", (c,), "zeros"),
              (e + "mlp.fc1.weight", (ci, c), c ** -0.5), (e + "mlp.fc1.bias", (ci,), "zeros"),
              (e + "mlp.fc2.weight", (c, ci), ci ** -0.5), (e + "mlp.fc2.bias", (c,), "zeros"),
              (e + "norm1.weight", (c,), "ones"), (e + "norm1.bias", (c,), "zeros"),
              (e + "norm2.weight", (c,), "ones"), (e + "norm2.bias", (c,), "zeros"),
              (e + "ls1", (c,), "ones"), (e + "ls2", (c,), "ones")]
    s += [("mlp1.0.weight", (4 * c,), "ones"), ("mlp1.0.bias", (4 * c,), "zeros"),  # pixel shuffle: 4c wide
          ("mlp1.1.weight", (d, 4 * c), (4 * c) ** -0.5), ("mlp1.1.bias", (d,), "zeros"),
          ("mlp1.3.weight", (d, d), d ** -0.5), ("mlp1.3.bias", (d,), "zeros")]
    m = "language_model.model."
    s.append((m + "embed_tokens.weight", (vocab, d), 1.0))
    for i in range(cfg.num_hidden_layers):
        e = f"{m}layers.{i}."
        s += [(e + "input_layernorm.weight", (d,), "ones"),
              (e + "self_attn.q_proj.weight", (q, d), d ** -0.5), (e + "self_attn.k_proj.weight", (kv, d), d ** -0.5),
              (e + "self_attn.v_proj.weight", (kv, d), d ** -0.5), (e + "self_attn.o_proj.weight", (d, q), q ** -0.5),
              (e + "self_attn.q_norm.weight", (hd,), "ones"), (e + "self_attn.k_norm.weight", (hd,), "ones"),
              (e + "post_attention_layernorm.weight", (d,), "ones"),
              (e + "mlp.gate_proj.weight", (inter, d), d ** -0.5), (e + "mlp.up_proj.weight", (inter, d), d ** -0.5),
              (e + "mlp.down_proj.weight", (d, inter), inter ** -0.5)]
    s += [(m + "norm.weight", (d,), "ones"), ("language_model.lm_head.weight", (vocab, d), cfg.logit_scale * d ** -0.5)]
    return s


def _weights(cfg: TinyHpdConfig, vocab: int) -> dict:
    return draw_weights(_weight_specs(cfg, vocab), cfg.seed)


def _config(cfg: TinyHpdConfig, vocab: int, ids: dict[str, int]) -> dict:
    t = HpdTokens()
    llm = {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": vocab,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": 1e-6, "rope_theta": cfg.rope_theta,
        "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": ids[PAD_TOKEN],
        "eos_token_id": ids[IM_END], "pad_token_id": ids[PAD_TOKEN], "torch_dtype": "float32",
    }
    vision = {
        "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "num_channels": 3,
        "image_size": cfg.image_size, "patch_size": cfg.patch_size, "hidden_size": cfg.vision_hidden_size,
        "intermediate_size": cfg.vision_intermediate_size, "num_hidden_layers": cfg.vision_layers,
        "num_attention_heads": cfg.vision_heads, "qkv_bias": True, "qk_normalization": False,
        "hidden_act": "gelu", "norm_type": "layer_norm", "layer_norm_eps": 1e-6, "initializer_factor": 1.0,
        "use_flash_attn": False, "torch_dtype": "float32",
    }
    return {
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat",
        "auto_map": {"AutoConfig": f"{_CONFIG_MODULE}.InternVLChatConfig"},
        "vision_config": vision, "llm_config": llm, "select_layer": -1, "downsample_ratio": 0.5,
        "force_image_size": TILE, "ps_version": "v2", "template": "internvl2_5", "dynamic_image_size": True,
        "use_thumbnail": True, "min_dynamic_patch": MIN_TILES, "max_dynamic_patch": MAX_TILES,
        "use_backbone_lora": 0, "use_llm_lora": 0,
        "fork_token_id": ids[t.fork], "child_token_id": ids[t.child], "eos_token_id": ids[IM_END],
        "pad_token_id": ids[PAD_TOKEN], "torch_dtype": "float32",
    }


def build_tiny_hpd_model(out: str, *, cfg: TinyHpdConfig = TinyHpdConfig(), force: bool = False) -> str:
    """Write the checkpoint to ``out`` and return it; refuses a non-empty ``out`` unless ``force``
    (FileExistsError, as :func:`padoc_ray.checkpoint.tiny.build_tiny_model`)."""
    if cfg.head_dim < 32:
        raise ValueError(f"head_dim {cfg.head_dim}: vLLM's CPU attention needs head_dim >= 32")
    prepare_out(out, force)
    from safetensors.torch import save_file
    tok = build_tokenizer(cfg)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special_tokens()}
    vocab = padded_vocab_size(len(tok))
    write_json(os.path.join(out, "config.json"), _config(cfg, vocab, ids))
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), _CONFIG_MODULE + ".py"),
                    os.path.join(out, _CONFIG_MODULE + ".py"))
    write_json(os.path.join(out, "generation_config.json"), {
        "eos_token_id": [ids[IM_END]], "pad_token_id": ids[PAD_TOKEN], "do_sample": False})
    tok.save_pretrained(out)
    save_file(_weights(cfg, vocab), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out
