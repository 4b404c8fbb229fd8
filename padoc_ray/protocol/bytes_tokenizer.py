"""A byte-level stand-in tokenizer: content bytes are ids 0-255, protocol tokens follow.

For fast tests and scripted fake engines, where loading a real tokenizer is not wanted. It
satisfies :class:`~padoc_ray.protocol.spec.TextTokenizer`; decode(encode(s)) == s for any str.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .spec import ProtocolSpec


class ByteTokenizer:
    def __init__(self, spec: ProtocolSpec, extra_tokens: Iterable[str] = ()):
        self._added = {t: 256 + i for i, t in enumerate(dict.fromkeys([*spec.all_added_tokens(), *extra_tokens]))}
        self.vocab_size = 256 + len(self._added)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        return self._added.get(token)
