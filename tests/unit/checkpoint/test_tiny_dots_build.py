"""The tiny dots.ocr-format checkpoint as files (``padoc_ray.checkpoint.tiny_dots``): built offline and
deterministically, in dots.ocr's config format, with dots' tokens, chat template and a Qwen2-VL image
processor whose pixel budget the ``dots`` family reads. No engine here (tests/engine/checkpoint/
test_tiny_dots.py runs it in stock vLLM); the tokenizer is read with its class, so no remote code runs
in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from padoc_ray.protocol.dots import (
    CATEGORIES, GROUNDING_TEXT, LAYOUT_ALL_TEXT, LAYOUT_ONLY_TEXT, DotsSpec, DotsTokens, pixels_from_preprocessor,
)

FILES = ["chat_template.jinja", "config.json", "configuration_dots.py", "generation_config.json", "model.safetensors",
         "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"]


def _digest(d: str, name: str) -> str:
    with open(os.path.join(d, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _json(d: str, name: str) -> dict:
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tok(tiny_dots_dir):
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(tiny_dots_dir)  # the class itself: no remote code in this process


def test_build_is_deterministic(tiny_dots_dir, tmp_path, record_property):
    """The same files from the same seed; another seed moves the weights only. How long a build takes is
    a figure (``build_s`` in the test report), never asserted."""
    from padoc_ray.checkpoint.tiny_dots import TinyDotsConfig, build_tiny_dots_model

    t = time.perf_counter()
    again = build_tiny_dots_model(str(tmp_path / "again"))
    record_property("build_s", round(time.perf_counter() - t, 1))
    assert sorted(os.listdir(again)) == FILES  # no padoc_protocol.json: config.json says dots
    for name in FILES:
        assert _digest(again, name) == _digest(tiny_dots_dir, name), name
    other = build_tiny_dots_model(str(tmp_path / "seed1"), cfg=TinyDotsConfig(seed=1))
    assert _digest(other, "model.safetensors") != _digest(tiny_dots_dir, "model.safetensors")
    for name in set(FILES) - {"model.safetensors"}:
        assert _digest(other, name) == _digest(tiny_dots_dir, name), name


def test_refuses_a_non_empty_out_without_force(tmp_path):
    from padoc_ray.checkpoint.tiny_dots import build_tiny_dots_model

    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--force"):
        build_tiny_dots_model(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert build_tiny_dots_model(str(tmp_path), force=True) == str(tmp_path)
    assert not (tmp_path / "keep.txt").exists()


def test_refuses_a_head_dim_vllm_cpu_cannot_run(tmp_path):
    from padoc_ray.checkpoint.tiny_dots import TinyDotsConfig, build_tiny_dots_model

    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_dots_model(str(tmp_path / "m"), cfg=TinyDotsConfig(num_attention_heads=8))
    assert not (tmp_path / "m").exists()


def test_config_is_dots_format_with_the_tokenizers_ids(tiny_dots_dir, tok):
    from padoc_ray.protocol.family import recognize

    cfg = _json(tiny_dots_dir, "config.json")
    t = DotsTokens()
    assert cfg["architectures"] == ["DotsOCRForCausalLM"] and cfg["model_type"] == "dots_ocr"
    assert cfg["auto_map"] == {"AutoConfig": "configuration_dots.DotsOCRConfig"}
    assert cfg["image_token_id"] == tok.convert_tokens_to_ids(t.image_pad)
    assert cfg["video_token_id"] == tok.convert_tokens_to_ids("<|video_pad|>") != cfg["image_token_id"]
    assert cfg["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids(t.end_of_stream)
    assert cfg["pad_token_id"] == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"]) == (128, 2, 4, 2, 32)
    assert cfg["vocab_size"] % 64 == 0 and len(tok) <= cfg["vocab_size"] < len(tok) + 64
    assert cfg["torch_dtype"] == "float32" and cfg["tie_word_embeddings"] is False
    vit = cfg["vision_config"]
    assert (vit["patch_size"], vit["spatial_merge_size"], vit["temporal_patch_size"], vit["num_hidden_layers"]) == \
        (14, 2, 1, 2)
    assert vit["hidden_size"] == cfg["hidden_size"]  # the merger writes decoder-width tokens
    assert vit["embed_dim"] // vit["num_attention_heads"] >= 32
    assert _json(tiny_dots_dir, "generation_config.json")["eos_token_id"] == [tok.eos_token_id]
    assert recognize(tiny_dots_dir).family == "dots"


def test_weights_carry_dots_names_in_float32(tiny_dots_dir):
    from safetensors import safe_open

    cfg = _json(tiny_dots_dir, "config.json")
    with safe_open(os.path.join(tiny_dots_dir, "model.safetensors"), "pt") as f:
        shapes = {n: f.get_slice(n).get_shape() for n in f.keys()}
        dtypes = {str(f.get_slice(n).get_dtype()) for n in shapes}
    assert dtypes == {"F32"}
    tops = {".".join(n.split(".")[:2]) for n in shapes}
    assert tops == {"vision_tower.patch_embed", "vision_tower.blocks", "vision_tower.post_trunk_norm",
                    "vision_tower.merger", "model.embed_tokens", "model.layers", "model.norm", "lm_head.weight"}
    block = {n.split(".", 3)[3] for n in shapes if n.startswith("vision_tower.blocks.0.")}
    assert block == {"norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight",
                     "mlp.fc2.weight", "mlp.fc3.weight"}  # dots' ViT: no biases (use_bias false)
    for p in ("q", "k", "v"):  # Qwen2: biased q/k/v, unbiased o
        assert f"model.layers.1.self_attn.{p}_proj.bias" in shapes
    assert "model.layers.1.self_attn.o_proj.bias" not in shapes
    assert shapes["lm_head.weight"] == [cfg["vocab_size"], cfg["hidden_size"]]
    assert shapes["vision_tower.merger.mlp.2.weight"] == [cfg["hidden_size"], 4 * cfg["vision_config"]["embed_dim"]]


def test_tokenizer_holds_dots_tokens_and_renders_dots_prompts(tok):
    from padoc_ray.checkpoint.tiny_dots import special_tokens

    spec = DotsSpec()
    assert set(special_tokens()) == {*spec.all_added_tokens(), "<|endoftext|>", "<|video_pad|>"}
    ids = [tok.convert_tokens_to_ids(s) for s in special_tokens()]
    assert len(set(ids)) == len(ids) == 9
    for s, i in zip(special_tokens(), ids):
        assert tok.encode(s, add_special_tokens=False) == [i], s  # one token each, in any context
        assert tok.added_tokens_decoder[i].special, s
    for mode, text in (("fork", LAYOUT_ONLY_TEXT), ("sequential", LAYOUT_ALL_TEXT)):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == spec.prompt(mode)
    before, after = spec.grounding_parts()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": GROUNDING_TEXT + "[1, 2, 3, 4]"}]}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == before + "[1, 2, 3, 4]" + after
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "[]"}]
    assert tok.apply_chat_template(turns, tokenize=False) == "<|user|>hi<|endofuser|><|assistant|>[]<|endofassistant|>"
    with pytest.raises(Exception, match="no system turn"):
        tok.apply_chat_template([{"role": "system", "content": "x"}] + turns, tokenize=False)


def test_tokenizer_is_trained_on_dots_layout_text(tok):
    cells = [{"bbox": [12, 30, 400, 88], "category": name} for name in CATEGORIES]
    layout = json.dumps(cells) + "<|endofassistant|>"
    assert tok.decode(tok.encode(layout, add_special_tokens=False)) == layout
    key = tok.encode(' "category": "', add_special_tokens=False)
    for name in CATEGORIES:  # every category name is one token, or two around its hyphen
        ids = tok.encode(f' "category": "{name}"}}', add_special_tokens=False)
        assert ids[:len(key)] == key and len(ids) - len(key) - 1 <= 1 + name.count("-"), name
    for text in (LAYOUT_ONLY_TEXT, LAYOUT_ALL_TEXT):  # the prompts are merged words, not bytes
        assert len(tok.encode(text, add_special_tokens=False)) < len(text) / 3
    assert tok.encode("分析师承诺", add_special_tokens=False) == [tok.encode(c)[0] for c in "分析师承诺"]  # 1 per hanzi


def test_preprocessor_sets_the_pixel_budget_the_family_reads(tiny_dots_dir):
    from padoc_ray.checkpoint.tiny_dots import TinyDotsConfig
    from padoc_ray.protocol.family import recognize

    pre = _json(tiny_dots_dir, "preprocessor_config.json")
    cfg = TinyDotsConfig()
    assert pre["image_processor_type"] == "Qwen2VLImageProcessor"
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (14, 2, 1)
    assert pixels_from_preprocessor(pre) == {"min_pixels": 3136, "max_pixels": cfg.max_pixels, "factor": 28}
    spec = recognize(tiny_dots_dir).spec
    assert (spec.factor, spec.min_pixels, spec.max_pixels) == (28, 3136, cfg.max_pixels)
    for page in ((1275, 1650), (1700, 2200), (827, 1169)):  # letter at 150 and 200 dpi, A4 at 100 dpi
        w, h = spec.input_size(*page)
        assert w % 28 == 0 and h % 28 == 0 and w * h <= cfg.max_pixels
        assert 250 <= (w // 28) * (h // 28) <= 400, page  # a page is a few hundred image tokens
