"""A vLLM v1 logits processor that forces a per-request token sequence (teacher-forced replay).

A request opts in with ``SamplingParams(extra_args={"padoc_forced_tokens": [ids...]})``: its
n-th generated token is then ``ids[n]`` (every other logit is set to -inf), at any temperature.
Once the list is used up the request samples freely. Requests without the key are untouched.
Registered on every padoc-ray engine as ``logits_processors=[FORCING_PROCESSOR]``; the engine
process imports it by that qualified name.
"""

from __future__ import annotations

from typing import Sequence

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

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
            n = len(out)
            if n < len(ids) and row < logits.shape[0]:
                rows.append(row)
                cols.append(ids[n])
        if rows:
            r = torch.tensor(rows, dtype=torch.long, device=logits.device)
            c = torch.tensor(cols, dtype=torch.long, device=logits.device)
            logits[r] = float("-inf")
            logits[r, c] = 0.0
        return logits
