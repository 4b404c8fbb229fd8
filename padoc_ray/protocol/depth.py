"""Decode-depth accounting (paper eqs. 13-14 and Appendix D.2, eqs. 34-35).

Lengths are counted in decode steps, i.e. generated tokens, end-of-stream tokens included:

* ``F_seq``   = l(B_1:N) + sum_k l(Y_k): the length of the sequential stream (region tokens,
  inline contents, one final end-of-stream).
* ``F_PaDoc`` = max(l(B_1:N), max_k [l(B<=k) + l'(Y_k)]): the layout stream runs alone
  (its own end-of-stream included); branch k becomes schedulable in the step after the one that
  produced region k's close token, i.e. after l(B<=k) layout steps, and then takes
  l'(Y_k) = content tokens + its own end-of-stream.

So ``F_PaDoc <= F_seq`` always, and ``1 - F_PaDoc / F_seq`` is the per-page step reduction. Works
on ground truth (serialized pages) or on the traces a run actually generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class DecodeDepth:
    f_seq: int
    f_padoc: int

    @property
    def step_reduction(self) -> float:
        return 1.0 - self.f_padoc / self.f_seq if self.f_seq else 0.0


def decode_depth(region_layout_lens: Sequence[int], content_lens: Sequence[int]) -> DecodeDepth:
    """From per-region layout token counts (R_OPEN..R_CLOSE) and per-region content token counts."""
    if len(region_layout_lens) != len(content_lens):
        raise ValueError("one content length per region is needed")
    layout_total = sum(region_layout_lens) + 1  # + end-of-stream
    f_seq = layout_total + sum(content_lens)
    f_padoc, prefix = layout_total, 0
    for lb, ly in zip(region_layout_lens, content_lens):
        prefix += lb
        f_padoc = max(f_padoc, prefix + ly + 1)  # + the branch's end-of-stream
    return DecodeDepth(f_seq=f_seq, f_padoc=f_padoc)


def depth_from_trace(layout_len: int, fork_points: Sequence[int], branch_lens: Sequence[int], seq_len: int | None = None) -> DecodeDepth:
    """From a generated fork-mode trace: layout stream length, each branch's fork point (tokens
    before its region close) and generated length (end-of-stream included). ``seq_len`` is the
    sequential length if known; otherwise it is reconstructed as layout + sum of contents."""
    f_padoc = layout_len
    for f, n in zip(fork_points, branch_lens):
        f_padoc = max(f_padoc, f + 1 + n)
    f_seq = seq_len if seq_len is not None else layout_len + sum(max(0, n - 1) for n in branch_lens)
    return DecodeDepth(f_seq=f_seq, f_padoc=f_padoc)
