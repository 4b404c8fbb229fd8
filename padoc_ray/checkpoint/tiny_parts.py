"""What the tiny remote-code checkpoints (:mod:`.tiny_hpd`, :mod:`.tiny_dots`) are built from: a byte-level
BPE wrapped as a Qwen2 tokenizer, weights drawn by name, and JSON files. Deterministic: the same inputs
give the same bytes."""

from __future__ import annotations

import json
from typing import Iterable, Sequence

from .protocol_files import add_special_tokens

#: a tensor of a tiny checkpoint: (name, shape, init); init is the std of a normal draw, or "ones" / "zeros"
WeightSpec = tuple[str, tuple[int, ...], "float | str"]


def qwen2_bpe_tokenizer(lines: Sequence[str], *, vocab_size: int, pad: str, specials: Iterable[str], eos: str,
                        chat_template: str):
    """A byte-level BPE trained on ``lines`` (Qwen2's pre-tokenizer, NFC), wrapped as a Qwen2 tokenizer with
    ``pad`` (trained in as the first token), then each of ``specials`` it lacks as one added token in order,
    ``eos`` and ``chat_template``."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[pad])
    tk.train_from_iterator(list(lines), trainer=trainer)
    state = json.loads(tk.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, eos_token=None, pad_token=pad, unk_token=None,
                         errors="replace")
    add_special_tokens(tok, [t for t in specials if t not in tok.get_vocab()])
    tok.eos_token = eos
    tok.chat_template = chat_template
    return tok


def draw_weights(specs: Iterable[WeightSpec], seed: int) -> dict:
    """Float32 tensors by name, drawn in the order of ``specs`` from one generator seeded with ``seed``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, init in specs:
        if init == "ones":
            out[name] = torch.ones(shape, dtype=torch.float32)
        elif init == "zeros":
            out[name] = torch.zeros(shape, dtype=torch.float32)
        else:
            out[name] = torch.randn(shape, generator=g, dtype=torch.float32) * float(init)
    return out


def write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
