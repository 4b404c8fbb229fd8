"""`padoc-ray init-model`: a plain Qwen3-VL checkpoint (the tiny base, `build-tiny-model --base`) becomes
a PaDoc checkpoint: exactly the protocol's tokens added, every base row kept bit for bit, new rows the
mean, tied and untied heads; bad bases and outputs refused; the result serves in vLLM (`parse-page`,
teacher-forced, gives the ordinary tiny model's Markdown) and trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _env

EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")
EMB = "model.language_model.embed_tokens.weight"
HEAD = "lm_head.weight"


def _tensors(model_dir: str) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def _bits(t):
    """The raw bits of a float tensor (so equality is bit-for-bit, not numeric)."""
    import torch

    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """The tiny Qwen3-VL without the protocol, untied and tied."""
    from padoc_ray.checkpoint.tiny import TinyModelConfig, build_tiny_model

    root = tmp_path_factory.mktemp("bases")
    return {tied: build_tiny_model(str(root / f"base_tied{int(tied)}"), base=True,
                                   cfg=TinyModelConfig(tie_word_embeddings=tied)) for tied in (False, True)}


@pytest.fixture(scope="module")
def inited(bases, tmp_path_factory):
    from padoc_ray.checkpoint.init import init_model

    root = tmp_path_factory.mktemp("inited")
    return {tied: init_model(b, str(root / f"padoc_tied{int(tied)}"), verify=False)["out"] for tied, b in bases.items()}


def _cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "padoc_ray.cli", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout, cwd=ROOT)


def _main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """``padoc-ray ARGS`` in this process: (exit code, stdout, stderr)."""
    from tests.helpers.cli import run_main

    for k in ("VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL"):  # main() sets these defaults for engine processes
        monkeypatch.setenv(k, os.environ.get(k, "unset-by-test"))
    return run_main(capsys, *args)


# ---- the checkpoint -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_vocabulary_grows_by_exactly_the_protocol_tokens(bases, inited, tiny_model_dir, tied):
    from transformers import AutoTokenizer

    from padoc_ray.protocol import ProtocolSpec

    spec = ProtocolSpec()
    base, out = AutoTokenizer.from_pretrained(bases[tied]), AutoTokenizer.from_pretrained(inited[tied])
    bv, ov = base.get_vocab(), out.get_vocab()
    protocol = spec.all_added_tokens()
    # the base is a plain Qwen3-VL tokenizer: of the protocol it holds only <|im_end|> (end of turn, reused)
    assert [t for t in protocol if t in bv] == ["<|im_end|>"] == [spec.tokens.end_of_stream]
    assert not os.path.exists(os.path.join(bases[tied], "padoc_protocol.json"))
    added = [t for t in protocol if t != "<|im_end|>"]
    assert set(ov) - set(bv) == set(added) and len(ov) == len(bv) + len(added) == len(out)
    assert all(ov[t] == i for t, i in bv.items())  # every base token keeps its id
    assert [ov[t] for t in added] == list(range(len(base), len(base) + len(added)))
    specials = {t.content for t in out.added_tokens_decoder.values() if t.special}
    assert set(added) <= specials
    for t in added[:30] + added[-5:]:
        assert out.encode(t, add_special_tokens=False) == [ov[t]], t
    # the very tokenizer the tiny builder makes (one code path)
    with open(os.path.join(inited[tied], "tokenizer.json"), "rb") as a, \
            open(os.path.join(tiny_model_dir, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read()


@pytest.mark.parametrize("tied", [False, True])
def test_base_rows_are_bit_identical_and_new_rows_the_mean(bases, inited, tied):
    import torch

    from padoc_ray.checkpoint.protocol_files import padded_vocab_size

    b, o = _tensors(bases[tied]), _tensors(inited[tied])
    info = json.load(open(os.path.join(inited[tied], "padoc_init.json")))
    n_base, n_tok = info["base_tokenizer_len"], info["tokenizer_len"]
    old_rows, new_rows = b[EMB].shape[0], o[EMB].shape[0]
    assert (old_rows, new_rows) == (padded_vocab_size(n_base), padded_vocab_size(n_tok)) == tuple(info["vocab_rows"])
    assert new_rows > old_rows and info["tie_word_embeddings"] is tied
    heads = [EMB] if tied else [EMB, HEAD]
    assert (HEAD in b, HEAD in o) == (not tied, not tied)  # a tied checkpoint stores one matrix
    for name in heads:
        assert torch.equal(_bits(o[name][:n_base]), _bits(b[name][:n_base])), name  # every base token row
        mean = b[name][:n_base].mean(dim=0)
        new = o[name][n_base:]
        assert torch.equal(new, mean.expand_as(new)), name  # base padding rows taken by new tokens included
    if not tied:
        assert not torch.allclose(o[EMB][-1], o[HEAD][-1])  # each matrix its own mean
    others = sorted(set(b) - {EMB, HEAD})
    assert others == sorted(set(o) - {EMB, HEAD}) and len(others) > 50
    for name in others:  # nothing else changed, bit for bit
        assert torch.equal(_bits(o[name]), _bits(b[name])), name
    cfg = json.load(open(os.path.join(inited[tied], "config.json")))
    assert cfg["text_config"]["vocab_size"] == new_rows and cfg["tie_word_embeddings"] is tied


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_loads_it_with_the_head_tied_or_not(inited, tied):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from padoc_ray.tokenizer import ModelProtocol

    model = Qwen3VLForConditionalGeneration.from_pretrained(inited[tied], dtype=torch.float32)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert (head.data_ptr() == emb.data_ptr()) is tied
    assert emb.shape[0] == head.shape[0] == model.config.text_config.vocab_size
    v = ModelProtocol(inited[tied]).vocab
    assert max(v.control_ids) < emb.shape[0]


def test_protocol_file_and_chat_template_render_the_prompts(inited, tiny_model_dir):
    from transformers import AutoProcessor, AutoTokenizer

    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.protocol import ProtocolSpec

    out = inited[False]
    spec = ProtocolSpec()
    assert ProtocolSpec.load(out).to_dict() == spec.to_dict() == ProtocolSpec.load(tiny_model_dir).to_dict()
    proc, tok = AutoProcessor.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    for mode in ("fork", "sequential"):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": spec.prompt_text[mode]}]}]
        assert proc.apply_chat_template(msgs, add_generation_prompt=True) == spec.prompt(mode)
        assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == spec.prompt(mode)
        assert ModelProtocol(out).prompt_ids(mode) == ModelProtocol(tiny_model_dir).prompt_ids(mode)
    assert set(os.listdir(tiny_model_dir)) | {"padoc_init.json"} == set(os.listdir(out))
    assert open(os.path.join(out, "chat_template.jinja")).read() == open(
        os.path.join(tiny_model_dir, "chat_template.jinja")).read()


def test_a_spec_file_decides_the_tokens(bases, tmp_path, monkeypatch, capsys):
    """--spec: another coordinate grid and token spelling; exactly that spec's tokens are added."""
    from transformers import AutoTokenizer

    from padoc_ray.protocol import ProtocolSpec
    from padoc_ray.protocol.spec import CoordinateSpec

    spec = ProtocolSpec(coordinates=CoordinateSpec(bins=100, token_format="<|bin{}|>"))
    spec.save(tmp_path)
    out = tmp_path / "padoc100"
    rc, stdout, err = _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", str(out), "--spec",
                            str(tmp_path / "padoc_protocol.json"), "--no-verify")
    assert rc == 0, err
    assert "+123 protocol tokens" in stdout  # 3 control + 20 categories + 100 bins (<|im_end|> is the base's)
    base, new = AutoTokenizer.from_pretrained(bases[False]).get_vocab(), AutoTokenizer.from_pretrained(out).get_vocab()
    assert set(new) - set(base) == set(spec.all_added_tokens()) - {"<|im_end|>"}
    assert "<|bin99|>" in new and "<|coord_0|>" not in new
    assert ProtocolSpec.load(out).to_dict() == spec.to_dict()


def test_a_base_from_s3(bases, s3, tmp_path, monkeypatch, capsys):
    """--base s3://...: copied through the model cache, then the same checkpoint as from the folder."""
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    s3["client"].create_bucket(Bucket="models")
    for name in os.listdir(bases[False]):
        s3["client"].upload_file(os.path.join(bases[False], name), "models", f"qwen3vl-tiny/{name}")
    out = tmp_path / "padoc"
    rc, stdout, stderr = _main(monkeypatch, capsys, "init-model", "--base", "s3://models/qwen3vl-tiny", "--out",
                               str(out), "--no-verify", "--s3-endpoint", s3["endpoint"])
    assert rc == 0, stderr
    assert "+1023 protocol tokens" in stdout and "not verified" in stdout
    assert json.load(open(out / "padoc_init.json"))["base"] == "s3://models/qwen3vl-tiny"
    local = tmp_path / "from_folder"
    assert _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", str(local), "--no-verify")[0] == 0
    a, b = _tensors(str(out)), _tensors(str(local))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


# ---- refusals (exit code 2, nothing written) ----------------------------------------------------------
def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_a_base_that_is_not_qwen3_vl_is_refused(bases, tmp_path, monkeypatch, capsys):
    base = _copy(bases[False], tmp_path / "qwen2vl")
    cfg = json.load(open(os.path.join(base, "config.json")))
    cfg.update(model_type="qwen2_vl", architectures=["Qwen2VLForConditionalGeneration"])
    json.dump(cfg, open(os.path.join(base, "config.json"), "w"))
    out = tmp_path / "out"
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", base, "--out", str(out), "--no-verify")
    assert rc == 2 and "is not a Qwen3-VL checkpoint" in err and "model_type 'qwen2_vl'" in err
    assert not out.exists()
    os.remove(os.path.join(base, "config.json"))
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", base, "--out", str(out), "--no-verify")
    assert rc == 2 and "has no config.json: not a Hugging Face checkpoint" in err
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", str(tmp_path / "nope"), "--out", str(out))
    assert rc == 2 and "model directory not found" in err and not out.exists()


def test_a_base_that_already_is_padoc_is_refused(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", tiny_model_dir, "--out", str(out), "--no-verify")
    assert rc == 2 and "already is a PaDoc checkpoint (it holds padoc_protocol.json)" in err
    # without the spec file the tokenizer still tells
    base = _copy(tiny_model_dir, tmp_path / "nospec")
    os.remove(os.path.join(base, "padoc_protocol.json"))
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", base, "--out", str(out), "--no-verify")
    assert rc == 2 and "already holds the protocol's control tokens" in err and "already is a PaDoc checkpoint" in err
    assert not out.exists()


def test_protocol_tokens_with_another_meaning_are_refused(bases, tmp_path, monkeypatch, capsys):
    """A spec whose region-open token is Qwen's <|box_start|> (a token the base holds, meaning something else)."""
    from padoc_ray.protocol import ProtocolSpec
    from padoc_ray.protocol.spec import ControlTokens

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(ProtocolSpec(tokens=ControlTokens(region_open="<|box_start|>")).to_dict()))
    out = tmp_path / "out"
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", str(out), "--spec",
                       str(spec_file), "--no-verify")
    assert rc == 2 and "already holds tokens the protocol would add, with another meaning: <|box_start|>" in err
    assert not out.exists()


def test_a_non_empty_out_needs_force(bases, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", str(out), "--no-verify")
    assert rc == 2 and "is not empty; pass --force" in err and (out / "keep.txt").read_text() == "precious"
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", str(out), "--force",
                       "--no-verify")
    assert rc == 0, err
    assert not (out / "keep.txt").exists() and (out / "padoc_protocol.json").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temporary folder left
    # the base itself (or a folder inside it) is never an output, --force or not
    rc, _, err = _main(monkeypatch, capsys, "init-model", "--base", bases[False], "--out", bases[False], "--force")
    assert rc == 2 and "overlaps it" in err and os.path.exists(os.path.join(bases[False], "config.json"))


# ---- it serves and trains ----------------------------------------------------------------------------
def _tiny_models_markdown(tiny_model_dir, cpu_engine, loop_thread, pdf: str, longest_side: int) -> str:
    """What the ordinary tiny model gives for ``pdf``, teacher-forced: parse-page's own code path
    (PageHost + parse_local, the same settings) on the session's engine, which hosts that model."""
    from padoc_ray.host import HostConfig, PageHost
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.inputs import load_pages, parse_local
    from padoc_ray.pdf import RenderConfig
    from padoc_ray.protocol import to_markdown
    from padoc_ray.scheduler import SchedulerConfig

    items = load_pages([pdf], render=RenderConfig(longest_side=longest_side))
    cfg = HostConfig(mode="fork", scheduler=SchedulerConfig(max_tokens=8192, max_branches=255), pages_in_flight=1)

    async def go():
        host = await PageHost(tiny_model_dir, cfg, truth=load_truth(GT), engine=cpu_engine).start()
        try:
            return await parse_local(host, items)
        finally:
            host.shutdown()  # not the shared engine: the host does not own it

    recs = loop_thread.run(go(), timeout=300)
    assert [r.status for r in recs] == ["ok"] * len(items)
    return "".join(to_markdown(r.page) for r in recs)


@pytest.mark.engine
def test_cli_verifies_in_vllm_and_parse_page_gives_the_tiny_models_markdown(bases, tiny_model_dir, cpu_engine,
                                                                             loop_thread, tmp_path):
    """The real CPU engine: init-model's check (engine start, free and forced generation) on the tied
    base, then parse-page teacher-forced on memo.pdf gives exactly the ordinary tiny model's Markdown."""
    out = tmp_path / "padoc"
    r = _cli("init-model", "--base", bases[True], "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "verified in vLLM" in r.stdout and "forced protocol region reproduced (8 tokens)" in r.stdout
    memo = os.path.join(EXAMPLES, "memo.pdf")
    mine = _cli("parse-page", memo, "--model", str(out), "--replay", GT, "--longest-side", "400")
    assert mine.returncode == 0, mine.stderr[-3000:]
    assert "status=ok valid=True" in mine.stderr
    ref = _tiny_models_markdown(tiny_model_dir, cpu_engine, loop_thread, memo, 400)
    assert mine.stdout == ref and ref.startswith("# MEMORANDUM") and ref.count("\n") > 5


def test_a_failed_vllm_check_leaves_nothing(bases, tmp_path, monkeypatch):
    """A VerifyError (here: the engine cannot be built) removes the new checkpoint and keeps --out as it was."""
    from padoc_ray.checkpoint import init as im

    def broken(model_dir, **kw):
        assert os.path.exists(os.path.join(model_dir, "padoc_protocol.json"))  # checked before it is published
        raise im.VerifyError("vLLM could not load it")

    monkeypatch.setattr(im, "verify_in_vllm", broken)
    out = tmp_path / "out"
    with pytest.raises(im.VerifyError):
        im.init_model(bases[False], str(out))
    assert not out.exists() and os.listdir(tmp_path) == []


def test_training_steps_run_on_it(inited):
    """A few optimizer steps of the tree-varlen trainer on one packed page: the loss falls, and the new
    protocol rows (layout tokens are targets and inputs) are learned."""
    import torch

    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.trainer.loop import LoopConfig, OptimConfig, load_model, train
    from padoc_ray.trainer.packing import Packer, PackingConfig

    from tests.unit.trainer.test_trainer import PAGE, SMALL_PIXELS, _image

    out = inited[False]
    sample = Packer(out, PackingConfig(max_pixels=SMALL_PIXELS)).pack(PAGE, _image())
    model = load_model(out)
    v = ModelProtocol(out).vocab
    rows = [v.region_open, v.region_close, v.category_ids["title"]]
    before = model.get_input_embeddings().weight[rows].detach().clone()
    hist = train(model, [sample], LoopConfig(steps=4, optim=OptimConfig(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0)))
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and all(torch.isfinite(torch.tensor(h["loss"])) for h in hist)
    assert hist[-1]["loss"] < hist[0]["loss"]
    after = model.get_input_embeddings().weight[rows].detach()
    assert not torch.equal(after, before)
    assert not torch.equal(after[0], after[1])  # identical at init, told apart by training
