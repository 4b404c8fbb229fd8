"""Build a tiny random-weight Qwen3-VL PaDoc checkpoint, offline and deterministically.

The checkpoint is what tests, the demo and CPU benchmarks run on: a real Qwen3-VL architecture
(vision tower, deepstack, M-RoPE) with ~6 M float32 parameters, a byte-level BPE tokenizer that
holds the Qwen special tokens and every protocol token as single tokens, Qwen3-VL processor
configs, a chat template and the protocol spec. transformers and vLLM load it like any Qwen3-VL
checkpoint. It knows nothing of engines or scheduling; its outputs are noise unless forced.

The tokenizer is trained on a built-in text seed (English prose, LaTeX and HTML fragments, digits)
plus every GB2312 hanzi and CJK punctuation mark, so each Chinese character is one token, as it is
for real Qwen tokenizers (a tokenizer trained on English alone makes ~3 tokens per character).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from padoc_ray.protocol.spec import ProtocolSpec

from .protocol_files import (  # CHAT_TEMPLATE and QWEN_SPECIAL_TOKENS: re-exported for older imports
    CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, add_protocol_tokens, add_special_tokens, padded_vocab_size, prepare_out,
    save_tokenizer_files,
)

_SEED_TEXT = """\
The quarterly report describes revenue, operating costs and the outlook for the next year.
In this section we present the method, the experimental setup and the results of our study.
Table 1 shows the accuracy of each model on the test set; the best value is in bold.
Figure 2 plots the loss against the number of training steps for three learning rates.
We thank the reviewers for their comments. All errors are our own. See the appendix for proofs.
Abstract Introduction Related Work Method Experiments Conclusion References Acknowledgements
The document parser reads the page image, predicts the layout of every region, and then
recognizes the text, formulas and tables inside each region in reading order.
Page 1 of 12. Chapter 3. Section 4.2. Equation (7). Theorem 1. Lemma 2. Proof. Definition 5.
January February March April May June July August September October November December
a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z
0 1 2 3 4 5 6 7 8 9 10 12 15 20 25 50 100 2024 2025 2026 3.14 0.5 1e-3 95% $12.50 +/- -
<table><tr><td>Name</td><td>Value</td></tr><tr><td colspan="2">Total</td><td rowspan="2">x</td></tr></table>
<thead><tbody><th>Model</th><th>Score</th></tbody></thead>
\\frac{a}{b} + \\sqrt{x^{2} + y^{2}} = \\sum_{i=1}^{n} \\alpha_{i} \\beta^{i} \\int_{0}^{\\infty} e^{-t} dt
\\mathbf{x} \\mathrm{d} \\left( \\right) \\cdot \\times \\leq \\geq \\neq \\approx \\in \\partial \\nabla
\\begin{array}{cc} \\end{array} \\begin{aligned} \\end{aligned} \\quad \\qquad \\text{if} \\hat{y}
E = m c^{2} a^{2} + b^{2} = c^{2} f(x) = \\lim_{h \\to 0} \\frac{f(x+h) - f(x)}{h} \\theta \\lambda \\sigma
def main(): return 0  # code, for, while, import, class, self, print, None, True, False
"""


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """Shape of the tiny model (the measured recipe: ~4 s to build, RSS ~2.3 GB in vLLM)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 65536
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_heads: int = 2
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    #: image pixel budget: a letter page becomes ~250 image tokens
    max_pixels: int = 256 * 32 * 32
    min_pixels: int = 4 * 32 * 32
    bpe_vocab_size: int = 24000
    #: one matrix for input embeddings and LM head (Qwen3-VL-2B ties them; the tiny default does not)
    tie_word_embeddings: bool = False
    seed: int = 0


def _training_text() -> list[str]:
    lines = _SEED_TEXT.splitlines() * 4
    hanzi = []
    for hi in range(0xA1, 0xF8):  # GB2312 rows: punctuation/full-width (A1-A3) and hanzi (B0-F7)
        if 0xA4 <= hi <= 0xAF:
            continue
        for lo in range(0xA1, 0xFF):
            try:
                hanzi.append(bytes([hi, lo]).decode("gb2312"))
            except UnicodeDecodeError:
                pass
    # one character per line: the Qwen pre-tokenizer then sees each as its own word
    lines += [c for c in hanzi for _ in range(2)]
    return lines


def build_tokenizer(spec: ProtocolSpec | None, cfg: TinyModelConfig):
    """Train the BPE and wrap it as a Qwen2 tokenizer with the Qwen specials and, given a spec, the
    protocol tokens (``spec=None``: a plain Qwen3-VL tokenizer, the stand-in for a real base)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.bpe_vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"],
    )
    tk.train_from_iterator(_training_text(), trainer=trainer)
    state = json.loads(tk.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Qwen2Tokenizer(
        vocab=state["vocab"], merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, errors="replace",
    )
    add_special_tokens(tok, [t for t in QWEN_SPECIAL_TOKENS if t != "<|endoftext|>"])
    if spec is not None:
        add_protocol_tokens(tok, spec)  # the same code path as init-model
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _write_processor_configs(out: str, cfg: TinyModelConfig) -> None:
    common = {
        "patch_size": cfg.patch_size, "temporal_patch_size": cfg.temporal_patch_size,
        "merge_size": cfg.spatial_merge_size, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_resize": True,
        "do_convert_rgb": True,
        "size": {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
    }
    files = {
        "preprocessor_config.json": {**common, "image_processor_type": "Qwen2VLImageProcessor", "resample": 3},
        "video_preprocessor_config.json": {
            **common, "video_processor_type": "Qwen3VLVideoProcessor", "fps": 2, "min_frames": 4,
            "max_frames": 8, "do_sample_frames": True,
        },
        "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
    }
    for name, obj in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2)


def build_tiny_model(out: str, *, spec: ProtocolSpec | None = None, cfg: TinyModelConfig | None = None,
                     force: bool = False, base: bool = False) -> str:
    """Write the checkpoint to ``out``; refuses a non-empty directory unless ``force``.

    ``base=True`` builds the same tiny Qwen3-VL *without* the protocol: no protocol tokens, no
    ``padoc_protocol.json`` (a stand-in for a real base such as Qwen3-VL-2B-Instruct, which
    ``padoc-ray init-model`` turns into a PaDoc checkpoint).
    """
    import torch
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    if base and spec is not None:
        raise ValueError("a base checkpoint has no protocol spec")
    spec = None if base else (spec or ProtocolSpec())
    cfg = cfg or TinyModelConfig()
    prepare_out(out, force)

    tok = build_tokenizer(spec, cfg)
    vocab_size = padded_vocab_size(len(tok))
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text = dict(
        vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                         "mrope_interleaved": True},
        pad_token_id=ids["<|endoftext|>"], dtype="float32",
    )
    if cfg.tie_word_embeddings:
        text["tie_word_embeddings"] = True  # what vLLM's language model reads
    vision = dict(
        depth=cfg.vision_depth, hidden_size=cfg.vision_hidden_size, intermediate_size=cfg.vision_intermediate_size,
        num_heads=cfg.vision_heads, patch_size=cfg.patch_size, spatial_merge_size=cfg.spatial_merge_size,
        temporal_patch_size=cfg.temporal_patch_size, out_hidden_size=cfg.hidden_size,
        num_position_embeddings=576, deepstack_visual_indexes=[0, 1],
    )
    config = Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=cfg.tie_word_embeddings,
    )
    config.dtype = "float32"
    torch.manual_seed(cfg.seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    GenerationConfig(eos_token_id=[eos], pad_token_id=ids["<|endoftext|>"], do_sample=False).save_pretrained(out)
    save_tokenizer_files(out, tok, spec)
    _write_processor_configs(out, cfg)
    return out
