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

    @property
    def scheduled_tokens(self) -> int:
        """What counts against ``max_num_batched_tokens``: one per decoding sequence plus the prefill."""
        return self.decode_seqs + self.prefill_tokens


class StepTime(Protocol):
    """Seconds one engine step takes. ``describe()`` goes into the report (kind, source, terms)."""

    def seconds(self, load: StepLoad) -> float: ...

    def describe(self) -> dict: ...
