"""What one engine step costs: the interface between the engine model and its step-time functions.

The engine model (:mod:`.sim`) describes each step by a :class:`StepLoad`; a :class:`StepTime` turns
it into seconds. Two kinds exist: fitted on this machine from ``padoc-ray bench steps --json``
(:mod:`.fitted`) and a roofline for a named GPU and model shape (:mod:`.roofline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StepLoad:
    """The work of one engine step (one forward pass over the scheduled tokens)."""

    decode_seqs: int  #: sequences that decode one token this step
    prefill_tokens: int  #: prompt tokens computed this step (chunked prefill; cached tokens excluded)
    context_tokens: int  #: tokens attended over, summed over the step's sequences (the KV read)
    images: int = 0  #: images the vision encoder runs on this step
    image_tokens: int = 0  #: those images' tokens after the patch merge (what enters the language model)
    #: query-key pairs of the step's attention: a decoding sequence's context, and for a prefill chunk of n
    #: tokens after ``lo`` computed ones n * lo + n * (n + 1) / 2 (causal within the chunk); None: the step
    #: decodes only, so it is ``context_tokens``
    attention_pairs: int | None = None
    #: distinct KV tokens the step's attention reads: a prefix that several of its sequences share (one
    #: page's prompt and layout, which its branches fork from) counted once; None: nothing is shared, so it
    #: is ``context_tokens``. A CPU reads a shared prefix from its caches after the first sequence, so this,
    #: not ``context_tokens``, is what its memory traffic follows
    kv_tokens: int | None = None
    #: requests the engine admits this step (their first chunk is scheduled): each costs the engine core
    #: work of its own beyond its prefill (its input batch entry, M-RoPE positions, block table, an
    #: attention pass of a new shape); a measured average may be fractional
    new_requests: float = 0

    @property
    def pairs(self) -> int:
        return self.context_tokens if self.attention_pairs is None else self.attention_pairs

    @property
    def distinct_kv_tokens(self) -> int:
        return self.context_tokens if self.kv_tokens is None else self.kv_tokens

    @property
    def scheduled_tokens(self) -> int:
        """What counts against ``max_num_batched_tokens``: one per decoding sequence plus the prefill."""
        return self.decode_seqs + self.prefill_tokens


def prefill_pairs(new: int, cached: int = 0) -> int:
    """Query-key pairs of a prefill of ``new`` tokens after ``cached`` ones (causal within the new ones)."""
    return new * cached + new * (new + 1) // 2


class StepTime(Protocol):
    """Seconds one engine step takes. ``describe()`` goes into the report (kind, source, terms)."""

    def seconds(self, load: StepLoad) -> float: ...

    def describe(self) -> dict: ...
