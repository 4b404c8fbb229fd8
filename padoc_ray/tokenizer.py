"""A checkpoint's token protocol: its spec bound to its Hugging Face tokenizer (:class:`ModelProtocol`).

Binds a Hugging Face tokenizer to the protocol's :class:`~padoc_ray.protocol.spec.TextTokenizer`.

Loads the tokenizer of a checkpoint directory and exposes what the codec and the scheduler need:
content text <-> ids (no special tokens added), protocol-token lookup, and the page prompt ids.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from padoc_ray.protocol import ProtocolError, ProtocolSpec, Vocab


class HFTextTokenizer:
    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        self._vocab = hf_tokenizer.get_vocab()

    @classmethod
    def from_pretrained(cls, model_dir: str) -> "HFTextTokenizer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)


class ModelProtocol:
    """Everything protocol-related a checkpoint directory defines: spec, tokenizer, resolved vocab."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.spec = ProtocolSpec.load(model_dir)
        self.tokenizer = HFTextTokenizer.from_pretrained(model_dir)
        self.vocab = Vocab.from_spec(self.spec, self.tokenizer)
        self._prompts = {m: self._prompt_ids(m) for m in self.spec.prompt_text}

    def _prompt_ids(self, mode: str) -> tuple[int, ...]:
        ids = self.tokenizer.encode(self.spec.prompt(mode))
        pad = self.tokenizer.token_to_id("<|image_pad|>")
        if pad is not None and ids.count(pad) != 1:
            raise ProtocolError(f"the {mode} prompt must hold exactly one unexpanded image placeholder, got {ids.count(pad)}")
        return tuple(ids)

    def prompt_ids(self, mode: str) -> tuple[int, ...]:
        """Unexpanded page-prompt ids (one image placeholder) for ``fork`` or ``sequential``."""
        try:
            return self._prompts[mode]
        except KeyError:
            raise ProtocolError(f"unknown mode {mode!r}; expected one of {sorted(self._prompts)}") from None


@lru_cache(maxsize=4)
def load_model_protocol(model_dir: str) -> ModelProtocol:
    return ModelProtocol(model_dir)
