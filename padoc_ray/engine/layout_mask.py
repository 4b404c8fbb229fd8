"""What both layout-grammar logits processors share: the request parameter, one grammar cursor per
constrained stream, and the mask over the protocol's columns.

The decision (which tokens may come next after a history) is :mod:`padoc_ray.protocol.grammar`'s
alone; this module turns it into logits for whole batches. The two vLLM adapters around it are thin:
:mod:`padoc_ray.engine.layout_constraint` (vLLM's V1 model runner) and
:mod:`padoc_ray.engine.layout_constraint_v2` (Model Runner V2). They differ only in where a
stream's history comes from (V1: the request's live output list; V2: the runner's token buffers)
and in how rows map to requests. Imports torch, never vLLM.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from padoc_ray.protocol.grammar import Kind, LayoutCursor, LayoutGrammar

logger = logging.getLogger(__name__)

#: ``SamplingParams.extra_args`` key: keep this request in the layout grammar with at most this many regions
CONSTRAIN_LAYOUT_KEY = "padoc_constrain_layout"

#: kinds whose allowed set is a mask (FREE: anything goes)
MASKED_KINDS = (Kind.OPEN_OR_END, Kind.END, Kind.CATEGORY, Kind.COORD, Kind.CLOSE)


def constraint_of(params) -> int | None:
    """The region cap a request asks to be constrained to, or None (unconstrained)."""
    return ((getattr(params, "extra_args", None) or {}) if params is not None else {}).get(CONSTRAIN_LAYOUT_KEY)


def validate_constraint(params) -> None:
    """vLLM calls this at admission: a bad value fails that request, never the engine."""
    n = constraint_of(params)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"{CONSTRAIN_LAYOUT_KEY} must be a non-negative number of regions")


def load_grammar(model_dir: str, tokenizer_dir: str | None = None) -> LayoutGrammar:
    """The layout grammar of a checkpoint: its protocol spec resolved with its tokenizer."""
    from padoc_ray.tokenizer import HFTextTokenizer
    from padoc_ray.protocol import ProtocolSpec, Vocab

    spec = ProtocolSpec.load(model_dir)
    return LayoutGrammar(Vocab.from_spec(spec, HFTextTokenizer.from_pretrained(tokenizer_dir or model_dir)))


class GrammarRow:
    """One constrained stream: its grammar cursor, how many of its output tokens it has seen, and how
    many of those were teacher-forced (forcing decides those tokens; the mask stays off)."""

    __slots__ = ("cursor", "fed", "n_forced")

    def __init__(self, cursor: LayoutCursor, n_forced: int = 0):
        self.cursor, self.fed, self.n_forced = cursor, 0, n_forced

    def feed(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.cursor.advance(int(t))
            self.fed += 1

    @property
    def done(self) -> bool:
        """Nothing left to constrain: the stream ended, or a token outside the grammar set it free."""
        return self.cursor.ended or self.cursor.free

    def pick(self, row: int) -> list[int] | None:
        """``[row, kind, lo, hi]`` for :meth:`LayoutMask.apply`, or None when this row is not masked."""
        if self.fed < self.n_forced:
            return None
        a = self.cursor.allowed()
        return [row, int(a.kind), a.lo, a.hi] if a.kind in MASKED_KINDS else None


class LayoutMask:
    """Masks the logits rows of constrained streams to what their grammar allows next.

    The grammar is loaded from the checkpoint when the first constrained request arrives (in the
    engine process). The mask is built for all constrained rows at once over the protocol's own
    columns (a few hundred to a few thousand ids, whatever the vocabulary): a few tensor operations
    per step, whatever the number of rows; the only full-vocabulary pass sets those rows to -inf.
    """

    def __init__(self, model_dir: str | None, tokenizer_dir: str | None = None):
        self._model, self._tokenizer = model_dir, tokenizer_dir
        self._grammar: LayoutGrammar | None = None
        self._tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "LayoutMask":
        mc = getattr(vllm_config, "model_config", None)
        return cls(getattr(mc, "model", None), getattr(mc, "tokenizer", None))

    @property
    def grammar(self) -> LayoutGrammar:
        if self._grammar is None:
            if not self._model:
                raise RuntimeError("layout constraint: the engine has no model directory to read the protocol from")
            self._grammar = load_grammar(self._model, self._tokenizer)
            logger.info("layout grammar loaded from %s", self._model)
        return self._grammar

    def row_for(self, params, n_forced: int = 0) -> GrammarRow | None:
        """A fresh row for a request entering the batch, or None if it is not constrained."""
        n = constraint_of(params)
        if n is None:
            return None
        return GrammarRow(self.grammar.cursor(max_regions=n, max_tokens=params.max_tokens), n_forced)

    def _tables_for(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The protocol's columns: their ids, which kinds allow each, and each one's bin (-1: not a
        coordinate)."""
        if self._tables is None or self._tables[0].device != device:
            g = self.grammar
            v = g.vocab
            ids = [v.region_open, v.end_of_stream, v.region_close, *v.category_ids.values(), *v.coord_ids]
            col = {t: i for i, t in enumerate(ids)}
            masks = torch.zeros((len(Kind), len(ids)), dtype=torch.bool)
            masks[Kind.OPEN_OR_END, [col[v.region_open], col[v.end_of_stream]]] = True
            masks[Kind.END, col[v.end_of_stream]] = True
            masks[Kind.CATEGORY, [col[t] for t in v.category_ids.values()]] = True
            masks[Kind.CLOSE, col[v.region_close]] = True
            bin_of = torch.full((len(ids),), -1, dtype=torch.int32)
            bin_of[[col[t] for t in v.coord_ids]] = torch.arange(g.bins, dtype=torch.int32)
            self._tables = (torch.tensor(ids, dtype=torch.long).to(device), masks.to(device), bin_of.to(device))
        return self._tables

    def apply(self, logits: torch.Tensor, picked: list[list[int]]) -> torch.Tensor:
        """Mask rows in place: ``picked`` holds ``[row, kind, lo, hi]`` per masked row (:meth:`GrammarRow.pick`)."""
        if not picked:
            return logits
        cols, masks, bin_of = self._tables_for(logits.device)
        p = torch.tensor(picked, dtype=torch.long, device=logits.device)
        rows, lo, hi = p[:, 0], p[:, 2:3].to(torch.int32), p[:, 3:4].to(torch.int32)
        allow = masks[p[:, 1]] | ((bin_of >= lo) & (bin_of <= hi))  # (rows, protocol columns)
        at = (rows[:, None], cols[None, :])
        kept = logits[at].masked_fill(~allow, float("-inf"))
        logits.index_fill_(0, rows, float("-inf"))
        logits[at] = kept
        return logits
