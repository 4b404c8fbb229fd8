"""The tiny-model kit: offline, deterministic, loadable by transformers, holding the protocol."""

from __future__ import annotations

import hashlib
import os

import pytest

from padoc_ray.protocol import ProtocolSpec


def _digest(d: str, name: str) -> str:
    with open(os.path.join(d, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_checkpoint_layout_and_determinism(tiny_model_dir, tmp_path):
    from padoc_ray.checkpoint.tiny import build_tiny_model

    files = set(os.listdir(tiny_model_dir))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
            "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
            "chat_template.jinja", "padoc_protocol.json"} <= files
    again = build_tiny_model(str(tmp_path / "again"))
    for name in ("model.safetensors", "tokenizer.json", "config.json", "padoc_protocol.json"):
        assert _digest(again, name) == _digest(tiny_model_dir, name), name


def test_refuses_to_overwrite_without_force(tmp_path):
    from padoc_ray.checkpoint.tiny import build_tiny_model

    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--force"):
        build_tiny_model(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_tokenizer_holds_protocol_and_qwen_tokens(model_protocol):
    tok, v = model_protocol.tokenizer, model_protocol.vocab
    spec = ProtocolSpec.load(model_protocol.model_dir)
    for t in spec.all_added_tokens() + ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>"]:
        ids = tok.encode(t)
        assert len(ids) == 1 and ids[0] == tok.token_to_id(t), t
    assert tok.encode("分析师承诺") == [tok.encode(c)[0] for c in "分析师承诺"]  # one token per hanzi
    text = "Table 1: E = m c^{2} <td>3.5%</td>\n全角，标点。"
    assert tok.decode(tok.encode(text)) == text
    for mode in ("fork", "sequential"):
        ids = model_protocol.prompt_ids(mode)
        assert ids.count(tok.token_to_id("<|image_pad|>")) == 1
    assert model_protocol.prompt_ids("fork") != model_protocol.prompt_ids("sequential")
    assert v.end_of_stream == tok.token_to_id("<|im_end|>")


def test_transformers_loads_and_runs_it(tiny_model_dir):
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, Qwen3VLForConditionalGeneration

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    assert cfg.model_type == "qwen3_vl" and cfg.text_config.vocab_size % 64 == 0
    proc = AutoProcessor.from_pretrained(tiny_model_dir)
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Parse the page."}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True)
    img = Image.new("RGB", (612, 792), "white")
    batch = proc(text=[text], images=[img], return_tensors="pt")
    n_img = int((batch["input_ids"] == cfg.image_token_id).sum())
    assert 100 < n_img < 400  # the pixel budget keeps a page at a few hundred tokens
    with torch.no_grad():
        out = model(**batch)
    assert out.logits.shape[-1] == cfg.text_config.vocab_size
    assert torch.isfinite(out.logits).all()
