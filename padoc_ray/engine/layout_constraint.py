"""A vLLM v1 logits processor that keeps a layout stream inside the layout grammar.

A request opts in with ``SamplingParams(extra_args={"padoc_constrain_layout": max_regions})``: at
every step every logit but those of the tokens :class:`~padoc_ray.protocol.grammar.LayoutGrammar`
allows next is set to -inf (at most ``max_regions`` regions, and within the request's
``max_tokens``, so the stream always ends with end-of-stream), so the stream parses without an
error by construction. Requests without the key (content branches, sequential streams, other
clients) are untouched. Teacher forcing wins: while a request still has forced tokens
(``padoc_forced_tokens``) this processor only follows them; a forced token outside the grammar
releases the request from the constraint.

The grammar's tables come from the checkpoint's ``padoc_protocol.json`` and tokenizer, loaded in
the engine process when the first constrained request arrives. Registered on every padoc-ray
engine next to the forcing processor, as ``logits_processors=[..., LAYOUT_PROCESSOR]``; it costs
nothing while no constrained request runs. The mask is built for all constrained rows at once
over the protocol's own columns (a few tensor operations per step, whatever the number of rows;
the only full-vocabulary pass sets the constrained rows to -inf).
"""

from __future__ import annotations

import logging

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from padoc_ray.protocol.grammar import Kind, LayoutCursor, LayoutGrammar

from .forcing import FORCED_TOKENS_KEY

logger = logging.getLogger(__name__)

CONSTRAIN_LAYOUT_KEY = "padoc_constrain_layout"
LAYOUT_PROCESSOR = "padoc_ray.engine.layout_constraint:LayoutGrammarProcessor"

_MASKED_KINDS = (Kind.OPEN_OR_END, Kind.END, Kind.CATEGORY, Kind.COORD, Kind.CLOSE)


def load_grammar(model_dir: str, tokenizer_dir: str | None = None) -> LayoutGrammar:
    """The layout grammar of a checkpoint: its protocol spec resolved with its tokenizer."""
    from padoc_ray.checkpoint.tokenizer import HFTextTokenizer
    from padoc_ray.protocol import ProtocolSpec, Vocab

    spec = ProtocolSpec.load(model_dir)
    return LayoutGrammar(Vocab.from_spec(spec, HFTextTokenizer.from_pretrained(tokenizer_dir or model_dir)))


class _Row:
    """One constrained request: its grammar cursor, its live output list, how much of it was fed."""

    __slots__ = ("cursor", "fed", "n_forced", "out")

    def __init__(self, cursor: LayoutCursor, out: list[int], n_forced: int):
        self.cursor, self.out, self.fed, self.n_forced = cursor, out, 0, n_forced

    def catch_up(self) -> None:
        out, cur = self.out, self.cursor
        while self.fed < len(out):
            t = out[self.fed]
            if t < 0:  # async scheduling's placeholder for a token not copied back yet
                break
            cur.advance(t)
            self.fed += 1


class LayoutGrammarProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        mc = getattr(vllm_config, "model_config", None)
        self._model = getattr(mc, "model", None)
        self._tokenizer = getattr(mc, "tokenizer", None)
        self.grammar: LayoutGrammar | None = None
        self.rows: dict[int, _Row] = {}
        self._tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # see _tables_for

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        n = (sampling_params.extra_args or {}).get(CONSTRAIN_LAYOUT_KEY)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"{CONSTRAIN_LAYOUT_KEY} must be a non-negative number of regions")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    def _grammar(self) -> LayoutGrammar:
        if self.grammar is None:
            if not self._model:
                raise RuntimeError("layout constraint: the engine has no model directory to read the protocol from")
            self.grammar = load_grammar(self._model, self._tokenizer)
            logger.info("layout grammar loaded from %s", self._model)
        return self.grammar

    def _new_state(self, params: SamplingParams, _prompt_ids, output_ids: list[int]):
        extra = (params.extra_args or {}) if params else {}
        n = extra.get(CONSTRAIN_LAYOUT_KEY)
        if n is None:
            return None
        cursor = self._grammar().cursor(max_regions=n, max_tokens=params.max_tokens)
        return _Row(cursor, output_ids, len(extra.get(FORCED_TOKENS_KEY) or ()))

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_state)

    def _tables_for(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Over the protocol's own columns only (a few hundred to a few thousand ids, whatever the
        vocabulary): their ids, which kinds allow each, and each one's bin (-1: not a coordinate)."""
        if self._tables is None or self._tables[0].device != device:
            g = self._grammar()
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

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        picked: list[list[int]] = []  # [row, kind, lo, hi]
        for row, st in self.rows.items():
            st.catch_up()
            if st.fed < st.n_forced or row >= logits.shape[0]:
                continue  # teacher forcing decides this token
            a = st.cursor.allowed()
            if a.kind in _MASKED_KINDS:
                picked.append([row, int(a.kind), a.lo, a.hi])
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
