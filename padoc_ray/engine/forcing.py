"""Teacher forcing as a logits processor of vLLM's V1 model runner (the CPU runner, and the GPU
runner under ``VLLM_USE_V2_MODEL_RUNNER=0``). Under Model Runner V2 vLLM forces tokens itself
(trace replay), so this processor is registered on V1 engines only (:mod:`padoc_ray.engine.runners`).

A request opts in with ``SamplingParams(extra_args={"padoc_forced_tokens": [ids...]})``: its n-th
generated token is then :func:`~padoc_ray.engine.interface.forced_token` of those ids (every other
logit is set to -inf), at any temperature, and the adapter ends the request with its trace
(``max_tokens`` = :attr:`~padoc_ray.engine.interface.GenRequest.generation_limit`), as trace replay
does. Requests without the key are untouched. The engine process imports it by its qualified name.
"""

from __future__ import annotations

from typing import Sequence

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from .interface import forced_token

FORCED_TOKENS_KEY = "padoc_forced_tokens"
FORCING_PROCESSOR = "padoc_ray.engine.forcing:ForcedTokensProcessor"


class ForcedTokensProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        # batch row -> (forced ids, reference to the request's live output-token list)
        self.rows: dict[int, tuple[Sequence[int], list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        ids = (sampling_params.extra_args or {}).get(FORCED_TOKENS_KEY)
        if ids is not None and not (isinstance(ids, (list, tuple)) and all(isinstance(i, int) and i >= 0 for i in ids)):
            raise ValueError(f"{FORCED_TOKENS_KEY} must be a list of non-negative token ids")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    @staticmethod
    def _new_state(params: SamplingParams, _prompt_ids, output_ids: list[int]):
        ids = (params.extra_args or {}).get(FORCED_TOKENS_KEY) if params else None
        return (tuple(ids), output_ids) if ids else None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows, cols = [], []
        for row, (ids, out) in self.rows.items():
            tok = forced_token(ids, len(out))
            if tok is not None and row < logits.shape[0]:
                rows.append(row)
                cols.append(tok)
        if rows:
            r = torch.tensor(rows, dtype=torch.long, device=logits.device)
            c = torch.tensor(cols, dtype=torch.long, device=logits.device)
            logits[r] = float("-inf")
            logits[r, c] = 0.0
        return logits
