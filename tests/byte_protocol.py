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
