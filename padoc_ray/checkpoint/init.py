"""``padoc-ray init-model``: a Hugging Face Qwen3-VL checkpoint -> a PaDoc checkpoint to train.

What the paper did first (Sec. 5, training recipe): start from Qwen3-VL-2B, extend its vocabulary
with the protocol's tokens, and grow the input embeddings and the LM head to match. Here:

* the tokenizer gains the spec's control, category and coordinate tokens as special tokens
  (:func:`.protocol_files.add_protocol_tokens`, the tiny builder's code path); the end-of-stream
  token is the base's ``<|im_end|>``, reused;
* the embedding matrix (and the LM head, tied or not) grows to the new tokenizer length rounded
  up to a multiple of 64 (never shrinks);
* **row initialization**: every row of a new token, embedding and LM head separately (one matrix
  when tied), is the mean of the base's rows of its real tokens (ids below the base tokenizer's
  length; padding rows excluded), computed in float32 and cast to the checkpoint's dtype. A new
  token's logit then starts at the average logit over the old vocabulary, so adding the tokens
  barely changes the base's next-token distribution (Hewitt, "Initializing new word embeddings
  for pretrained language models", 2021), and as an input it is an "average token". It is exact
  and deterministic (transformers' own ``mean_resizing`` adds random noise); the tokens differ as
  soon as training sees them in different positions. Padding rows past the new tokens get the
  same value. Rows of every base token are copied bit for bit; base padding rows not taken by a
  new token are kept too;
* the output holds the base's other files (processor configs, license, ...), the weights in the
  base's dtype, ``padoc_protocol.json``, the PaDoc chat template (as the tiny model's) and
  ``padoc_init.json`` (what was done);
* it is built in a temporary folder beside ``--out`` and moved into place once checked (and, with
  ``verify``, once vLLM has loaded it and generated with it): a failed run leaves no checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass

from padoc_ray.protocol.spec import SPEC_FILENAME, ProtocolSpec

from .protocol_files import (
    REQUIRED_BASE_TOKENS, ProtocolTokenConflict, add_protocol_tokens, padded_vocab_size, protocol_tokens_to_add,
    save_tokenizer_files,
)

logger = logging.getLogger(__name__)

INIT_FILENAME = "padoc_init.json"
QWEN3_VL_MODEL_TYPE = "qwen3_vl"
QWEN3_VL_ARCHITECTURE = "Qwen3VLForConditionalGeneration"

#: base files never copied: weights (re-saved), tokenizer and chat template files (rewritten), PaDoc files
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
_SKIP_FILES = {
    "config.json", "generation_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.json", "chat_template.jinja", SPEC_FILENAME, INIT_FILENAME,
    "padoc_training.json",
}


class InitModelError(ValueError):
    """A base checkpoint or an output folder init-model refuses (a usage error: exit code 2)."""


class VerifyError(RuntimeError):
    """The new checkpoint did not load or generate in vLLM."""


@dataclass(frozen=True)
class BaseInfo:
    model_dir: str
    config: dict
    tokens_to_add: list[str]


def _same_or_nested(a: str, b: str) -> bool:
    a, b = os.path.realpath(a), os.path.realpath(b)
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)


def check_out(out: str, base_dir: str | None, force: bool) -> None:
    if base_dir is not None and _same_or_nested(out, base_dir):
        raise InitModelError(f"--out {out} is the base checkpoint {base_dir} or overlaps it; write to another folder")
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise InitModelError(f"--out {out} exists and is not a directory")
        if os.listdir(out) and not force:
            raise InitModelError(f"--out {out} is not empty; pass --force to replace it")


def check_base(model_dir: str, spec: ProtocolSpec) -> BaseInfo:
    """Refuse what is not a plain Qwen3-VL checkpoint this spec can extend; returns the tokens to add."""
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise InitModelError(f"base {model_dir} has no config.json: not a Hugging Face checkpoint")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InitModelError(f"base {model_dir}: config.json is unreadable ({e})") from None
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    if model_type != QWEN3_VL_MODEL_TYPE or (archs and QWEN3_VL_ARCHITECTURE not in archs):
        raise InitModelError(
            f"base {model_dir} is not a Qwen3-VL checkpoint (config.json: model_type {model_type!r}, architectures "
            f"{archs}); init-model takes a Qwen3-VL one (model_type {QWEN3_VL_MODEL_TYPE!r}, {QWEN3_VL_ARCHITECTURE}), "
            f"e.g. Qwen/Qwen3-VL-2B-Instruct")
    if os.path.exists(os.path.join(model_dir, SPEC_FILENAME)):
        raise InitModelError(f"base {model_dir} already is a PaDoc checkpoint (it holds {SPEC_FILENAME}); "
                             f"init-model takes the plain Qwen3-VL base")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # any loader failure is a bad base
        raise InitModelError(f"base {model_dir}: its tokenizer does not load ({type(e).__name__}: {e})") from None
    vocab = tok.get_vocab()
    needed = list(REQUIRED_BASE_TOKENS) + re.findall(r"<\|[^|<>]+\|>", spec.image_placeholder)
    missing = [t for t in dict.fromkeys(needed) if t not in vocab]
    if missing:
        raise InitModelError(f"base {model_dir}: its tokenizer lacks {', '.join(missing)}, which the chat template and "
                             f"the page prompt use; not a Qwen3-VL tokenizer")
    try:
        to_add = protocol_tokens_to_add(vocab, spec)
    except ProtocolTokenConflict as e:
        raise InitModelError(f"base {model_dir}: {e}") from None
    return BaseInfo(model_dir=model_dir, config=config, tokens_to_add=to_add)


def _copy_base_files(base: str, out: str) -> list[str]:
    copied = []
    for name in sorted(os.listdir(base)):
        src = os.path.join(base, name)
        if name.startswith(".") or not os.path.isfile(src) or name in _SKIP_FILES or name.endswith(_WEIGHT_SUFFIXES):
            continue
        shutil.copyfile(src, os.path.join(out, name))
        copied.append(name)
    return copied


def _grow_embeddings(model, n_base_tokens: int, new_ids: list[int], new_rows: int) -> dict:
    """Resize input embeddings and LM head to ``new_rows`` and set new tokens' rows to the mean of
    the base tokens' rows (see the module docstring); every base row is kept bit for bit."""
    import torch

    emb_old = model.get_input_embeddings().weight.detach().clone()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    head_old = None if (head is None or tied) else head.weight.detach().clone()
    old_rows = emb_old.shape[0]
    model.resize_token_embeddings(new_rows, mean_resizing=False)
    # after the resize: rows past the base matrix, and rows of new tokens that take base padding rows
    fresh = sorted(set(range(old_rows, new_rows)) | set(new_ids))
    idx = torch.tensor(fresh, dtype=torch.long)

    def fill(weight, old):
        mean = old[:n_base_tokens].to(torch.float32).mean(dim=0).to(old.dtype)
        with torch.no_grad():
            weight[:old_rows].copy_(old)  # resize copied them already; make "bit for bit" not depend on it
            if len(fresh):
                weight[idx] = mean
        return mean

    emb = model.get_input_embeddings().weight
    fill(emb, emb_old)
    head = model.get_output_embeddings()
    tied_after = head is not None and head.weight is emb
    if tied != tied_after:
        raise RuntimeError("resizing changed whether the LM head is tied to the input embeddings")
    if head is not None and not tied_after:
        fill(head.weight, head_old)
    return {"tied": tied, "old_rows": old_rows, "new_rows": new_rows, "initialized_rows": len(fresh)}


def build(base_dir: str, out_dir: str, spec: ProtocolSpec, info: BaseInfo, *, base_uri: str | None = None) -> dict:
    """Write the PaDoc checkpoint of ``base_dir`` into the (empty) ``out_dir``; returns a summary."""
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(base_dir)
    n_base = len(tok)
    added = add_protocol_tokens(tok, spec)
    if added != info.tokens_to_add:
        raise RuntimeError("the tokenizer added other tokens than planned")
    new_ids = [tok.convert_tokens_to_ids(t) for t in added]
    if new_ids != list(range(n_base, n_base + len(added))):
        raise RuntimeError(f"new token ids are not {n_base}..{n_base + len(added) - 1}")

    model = Qwen3VLForConditionalGeneration.from_pretrained(base_dir, dtype="auto").eval()
    dtype = next(model.parameters()).dtype
    old_rows = model.get_input_embeddings().weight.shape[0]
    if old_rows < n_base:
        raise InitModelError(f"base {base_dir}: its embedding has {old_rows} rows for {n_base} tokens")
    new_rows = max(old_rows, padded_vocab_size(len(tok)))
    grown = _grow_embeddings(model, n_base, new_ids, new_rows)
    if model.config.get_text_config().vocab_size != new_rows:
        raise RuntimeError("config vocab_size was not updated by the resize")

    copied = _copy_base_files(base_dir, out_dir)
    with torch.no_grad():
        model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer_files(out_dir, tok, spec)
    summary = {
        "base": base_uri or base_dir,
        "spec_tokens": len(spec.all_added_tokens()),
        "added_tokens": len(added),
        "new_token_ids": [new_ids[0], new_ids[-1]] if new_ids else [],
        "base_tokenizer_len": n_base,
        "tokenizer_len": len(tok),
        "vocab_rows": [grown["old_rows"], grown["new_rows"]],
        "tie_word_embeddings": grown["tied"],
        "dtype": str(dtype).removeprefix("torch."),
        "row_init": "mean of the base's token rows (ids < base_tokenizer_len), float32, cast to dtype; "
                    "embedding and LM head each their own mean",
        "copied_from_base": copied,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(os.path.join(out_dir, INIT_FILENAME), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    check_checkpoint(out_dir, spec, n_base + len(added), new_rows)
    return summary


def check_checkpoint(out_dir: str, spec: ProtocolSpec, n_tokens: int, rows: int) -> None:
    """Cheap structural checks of a written checkpoint (no engine): the protocol resolves, prompts
    hold one image placeholder, every token id has an embedding row."""
    from padoc_ray.tokenizer import ModelProtocol

    model_protocol = ModelProtocol(out_dir)  # every protocol token one id, distinct; one image pad per prompt
    if len(model_protocol.tokenizer.hf) != n_tokens:
        raise RuntimeError(f"the saved tokenizer has {len(model_protocol.tokenizer.hf)} tokens, expected {n_tokens}")
    if max(model_protocol.vocab.control_ids) >= rows:
        raise RuntimeError("a protocol token id has no embedding row")
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg["text_config"]["vocab_size"] != rows:
        raise RuntimeError("config.json's text_config.vocab_size does not match the embedding")
    if model_protocol.spec.to_dict() != spec.to_dict():
        raise RuntimeError("padoc_protocol.json does not round-trip")


def verify_in_vllm(model_dir: str, *, preset: str = "auto", timeout_s: float = 600.0) -> dict:
    """Start a vLLM engine on ``model_dir`` and generate twice with a small page image: freely (a few
    tokens, greedy) and teacher-forced through one protocol region (region open, a category, four
    coordinates, region close, end of stream), which must come back exactly. Raises VerifyError."""
    import asyncio

    from PIL import Image

    from padoc_ray.engine.config import engine_preset
    from padoc_ray.engine.interface import GenRequest
    from padoc_ray.tokenizer import ModelProtocol

    model_protocol = ModelProtocol(model_dir)
    v = model_protocol.vocab
    forced = [v.region_open, next(iter(v.category_ids.values())), v.coord_ids[0], v.coord_ids[1],
              v.coord_ids[-1], v.coord_ids[-2], v.region_close, v.end_of_stream]
    image = Image.new("RGB", (128, 128), "white")
    with open(os.path.join(model_dir, "config.json")) as f:
        rows = json.load(f)["text_config"]["vocab_size"]
    cfg = engine_preset(model_dir, preset, max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=2048)

    async def run(engine, rid: str, max_tokens: int, forced_tokens=None) -> list[int]:
        req = GenRequest(request_id=rid, prompt_ids=list(model_protocol.prompt_ids("fork")), max_tokens=max_tokens,
                         image=image, image_uuid=f"verify-{rid}", forced_tokens=forced_tokens, stream=False)
        ids: list[int] = []
        async for d in engine.generate(req):
            ids += d.token_ids
        return ids

    async def go():
        from padoc_ray.engine.vllm_engine import VllmEngine

        t0 = time.perf_counter()
        engine = VllmEngine(cfg)
        try:
            start_s = time.perf_counter() - t0
            free = await asyncio.wait_for(run(engine, "free", 4), timeout_s)
            got = await asyncio.wait_for(run(engine, "forced", len(forced), forced), timeout_s)
        finally:
            engine.shutdown()
        return start_s, free, got

    try:
        start_s, free, got = asyncio.run(go())
    except Exception as e:  # any engine failure means the checkpoint does not serve
        raise VerifyError(f"vLLM could not load or run {model_dir}: {type(e).__name__}: {e}") from e
    if not free or any(not 0 <= i < rows for i in free):
        raise VerifyError(f"vLLM's free generation gave {free!r}")
    if got != forced:
        raise VerifyError(f"vLLM's forced generation gave {got!r}, expected the protocol tokens {forced!r}")
    return {"engine_start_s": round(start_s, 1), "free_tokens": free, "forced_tokens": got}


def init_model(base: str, out: str, *, spec: ProtocolSpec | None = None, force: bool = False, verify: bool = True,
               storage=None, preset: str = "auto") -> dict:
    """Turn the Qwen3-VL checkpoint ``base`` (a folder or ``s3://``) into a PaDoc checkpoint at ``out``.

    Raises :class:`InitModelError` for a refused base or output, :class:`VerifyError` when vLLM
    cannot run the result (nothing is left at ``out`` then)."""
    from padoc_ray.storage import is_s3, StorageConfig
    from padoc_ray.modelstore import local_model_dir

    spec = spec or ProtocolSpec()
    out = os.path.abspath(out)
    check_out(out, None if is_s3(base) else base, force)
    try:
        base_dir = local_model_dir(base, storage or StorageConfig())
    except FileNotFoundError as e:
        raise InitModelError(str(e)) from None
    check_out(out, base_dir, force)
    info = check_base(base_dir, spec)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.init-{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        summary = build(base_dir, tmp, spec, info, base_uri=base)
        if verify:
            summary["verify"] = verify_in_vllm(tmp, preset=preset)
        old = None
        if os.path.exists(out):  # --force (checked above): swap, then drop the old folder
            old = os.path.join(parent, f".{os.path.basename(out)}.old-{os.getpid()}")
            os.rename(out, old)
        os.rename(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary["out"] = out
    return summary
