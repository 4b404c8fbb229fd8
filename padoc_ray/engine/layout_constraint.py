"""The layout grammar as a logits processor of vLLM's V1 model runner (the CPU runner, and the GPU
runner under ``VLLM_USE_V2_MODEL_RUNNER=0``); :mod:`padoc_ray.engine.layout_constraint_v2` is the
same for Model Runner V2.

A request opts in with ``SamplingParams(extra_args={"padoc_constrain_layout": max_regions})``: at
every step every logit but those of the tokens :class:`~padoc_ray.protocol.grammar.LayoutGrammar`
allows next is set to -inf (at most ``max_regions`` regions, and within the request's
``max_tokens``, so the stream always ends with end-of-stream), so the stream parses without an
error by construction. Requests without the key (content branches, sequential streams, other
clients) are untouched. Teacher forcing wins: while a request still has forced tokens
(``padoc_forced_tokens``) this processor only follows them; a forced token outside the grammar
releases the request from the constraint. The grammar rows and the mask are
:mod:`padoc_ray.engine.layout_mask`'s; this adapter only follows vLLM's batch (rows move, requests
come and go through ``BatchUpdate``) and reads each request's live output-token list.
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from .forcing import FORCED_TOKENS_KEY
from .layout_mask import CONSTRAIN_LAYOUT_KEY, GrammarRow, LayoutMask, load_grammar, validate_constraint

__all__ = ["CONSTRAIN_LAYOUT_KEY", "LayoutGrammarProcessor", "load_grammar"]


class _Row:
    """A grammar row plus the request's live output list (vLLM appends to it as tokens come)."""

    __slots__ = ("grammar_row", "out")

    def __init__(self, grammar_row: GrammarRow, out: list[int]):
        self.grammar_row, self.out = grammar_row, out

    def catch_up(self) -> GrammarRow:
        g, out = self.grammar_row, self.out
        new = []
        for t in out[g.fed:]:
            if t < 0:  # async scheduling's placeholder for a token not copied back yet
                break
            new.append(t)
        g.feed(new)
        return g


class LayoutGrammarProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        self.mask = LayoutMask.from_vllm_config(vllm_config)
        self.rows: dict[int, _Row] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        validate_constraint(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    def _new_state(self, params: SamplingParams, _prompt_ids, output_ids: list[int]):
        n_forced = len(((params.extra_args or {}) if params else {}).get(FORCED_TOKENS_KEY) or ())
        row = self.mask.row_for(params, n_forced)
        return None if row is None else _Row(row, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        picked = []
        for row, st in self.rows.items():
            g = st.catch_up()
            if row < logits.shape[0] and (p := g.pick(row)) is not None:
                picked.append(p)
        return self.mask.apply(logits, picked)
