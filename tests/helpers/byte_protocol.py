"""A model protocol for fast tests: the PaDoc protocol on the byte tokenizer (no checkpoint, no
tokenizers package). Prompts are 4 ids, the image placeholder third."""

from __future__ import annotations

from padoc_ray.protocol import ProtocolSpec, Vocab
from padoc_ray.protocol.bytes_tokenizer import ByteTokenizer


class ByteProtocol:
    def __init__(self):
        self.spec = ProtocolSpec()
        self.tokenizer = ByteTokenizer(self.spec, ["<|image_pad|>"])
        self.vocab = Vocab.from_spec(self.spec, self.tokenizer)
        pad = self.tokenizer.token_to_id("<|image_pad|>")
        self._p = {"fork": (1, 2, pad, 3), "sequential": (1, 2, pad, 4)}

    def prompt_ids(self, mode):
        return self._p[mode]


class ByteHpdProtocol:
    """The hpd family (HPD-Parsing's text blocks) on the byte tokenizer: what ModelProtocol gives an
    HPD checkpoint, without one. Prompts are 4 ids, the image placeholder third."""

    family = "hpd"
    modes = ("fork",)

    def __init__(self, **spec):
        from padoc_ray.protocol import HpdSpec, HpdVocab

        self.spec = HpdSpec(**spec)
        self.tokenizer = ByteTokenizer(self.spec)
        self.vocab = HpdVocab.from_spec(self.spec, self.tokenizer)
        self._p = {"fork": (1, 2, self.tokenizer.token_to_id("<image>"), 3)}

    def prompt_ids(self, mode):
        from padoc_ray.protocol.family import check_mode

        check_mode("hpd", mode)
        return self._p[mode]


class ByteDotsProtocol:
    """The dots family (dots.ocr's JSON layout and grounding branches) on the byte tokenizer: what
    ModelProtocol gives a dots checkpoint, without one. Prompts are dots' own, one byte per token."""

    family = "dots"
    modes = ("fork", "sequential")
    branch_shape = "grounding"

    def __init__(self, **spec):
        from padoc_ray.protocol.dots import DotsSpec, DotsVocab, prompt_ids

        self.spec = DotsSpec(**spec)
        self.tokenizer = ByteTokenizer(self.spec)
        self.vocab = DotsVocab.from_spec(self.spec, self.tokenizer)
        self._p = {m: prompt_ids(self.vocab, m) for m in self.modes}

    def prompt_ids(self, mode):
        return self._p[mode]
