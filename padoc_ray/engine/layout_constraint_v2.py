"""The layout grammar as a logits processor of vLLM's Model Runner V2 (MRv2: vLLM 0.32's default on
CUDA, ``vllm/v1/worker/gpu/``); :mod:`padoc_ray.engine.layout_constraint` is the same for the V1
runner. Requests opt in the same way (``extra_args={"padoc_constrain_layout": max_regions}``), the
grammar rows and the mask are :mod:`padoc_ray.engine.layout_mask`'s, and both processors allow the
same tokens after the same history (``tests/unit/engine/test_layout_constraint_v2.py``).

What MRv2 changes, and how this adapter follows it (``.../gpu/sample/logits_processor/interface.py``):

* State is per request *slot*, not per batch row: :meth:`add_request` (re)initializes a slot
  whenever a request enters the batch, a recycled slot and a preempted request added again included
  (the latter with its earlier output tokens already in the slot's buffer). Every step's rows are
  mapped to slots by ``LogitsContext.idx_mapping_np``.
* A stream's history is the runner's, not a Python list: ``req_states.all_token_ids[slot]`` up to
  ``total_len[slot]`` on the device (the previous step's ``post_update`` wrote the newest token).
  Reading it on the host needs the device. Under async scheduling the host is a step ahead, so a
  read inside :meth:`apply` would wait for this step's forward pass. Instead
  :meth:`apply_staged_writes`, which the runner calls every step after the previous step's
  ``post_update`` and before this step's forward, starts one small device-to-host copy (committed
  length and the newest :data:`WINDOW` tokens of every constrained slot) and :meth:`apply` waits
  only for that copy. A stream further behind than the window (a request added again after
  preemption) is read directly, once.
* Teacher forcing is vLLM's trace replay: a request with ``trace_decode_token_ids`` has every token
  decided by its trace and ends with it, so this processor declines it.
* Speculative decoding (several logits rows per request) is not supported; the engine adapter
  refuses constrained requests on such an engine.

Import-light as MRv2 asks of custom processors (the frontend loads the class to validate params):
torch and the pure protocol only, no runner modules.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

from .layout_mask import GrammarRow, LayoutMask, validate_constraint

#: newest committed tokens per constrained slot each step's snapshot carries (one is new per step)
WINDOW = 4


class _Slot:
    __slots__ = ("prompt_len", "row")

    def __init__(self, row: GrammarRow, prompt_len: int):
        self.row, self.prompt_len = row, prompt_len


class _Snapshot:
    """Committed lengths and newest tokens of some slots, copied to the host after the previous step's
    tokens landed: ``[total_len, t(total_len - WINDOW) .. t(total_len - 1)]`` per slot."""

    def __init__(self, req_states: LogitsProcRequestState):
        self.req_states = req_states
        self.index: dict[int, int] = {}
        self._slots: tuple[int, ...] = ()
        self._idx: torch.Tensor | None = None
        self._host: torch.Tensor | None = None  # pinned on CUDA: the copy does not block the host
        self._event = None
        self._waited = True

    def take(self, slots: tuple[int, ...]) -> None:
        rs = self.req_states
        total_len, tokens = rs.total_len.gpu, rs.all_token_ids.gpu
        dev = total_len.device
        if slots != self._slots or self._idx is None:
            self._slots, self.index = slots, {s: i for i, s in enumerate(slots)}
            self._idx = torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True)
        total = total_len.index_select(0, self._idx).long()
        cols = (total[:, None] - WINDOW + torch.arange(WINDOW, device=dev)).clamp_(min=0)
        snap = torch.cat([total[:, None], tokens[self._idx[:, None], cols].long()], 1)
        if dev.type == "cuda":
            if self._host is None or self._host.shape[0] < snap.shape[0]:
                self._host = torch.empty((rs.max_num_reqs, WINDOW + 1), dtype=torch.long, pin_memory=True)
            self._host[: snap.shape[0]].copy_(snap, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = snap, None
        self._waited = False

    def get(self, slot: int) -> list[int] | None:
        """``[total_len, *newest tokens]`` of a slot, or None when it is not in this snapshot."""
        i = self.index.get(slot)
        if i is None or self._host is None:
            return None
        if not self._waited:
            if self._event is not None:
                self._event.synchronize()
            self._waited = True
        return self._host[i].tolist()


class LayoutGrammarProcessorV2(LogitsProcessor):
    def __init__(self, vllm_config, req_states: LogitsProcRequestState):
        self.req_states = req_states
        self.mask = LayoutMask.from_vllm_config(vllm_config)
        self.slots: dict[int, _Slot] = {}
        self._snapshot = _Snapshot(req_states)
        self._fresh = False  # a snapshot was taken for this step and not used yet

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        validate_constraint(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        row = None if sampling_params.trace_decode_token_ids else self.mask.row_for(sampling_params)
        if row is None:
            self.slots.pop(req_idx, None)
            return False
        self.slots[req_idx] = _Slot(row, int(self.req_states.prompt_len.np[req_idx]))
        return True

    def apply_staged_writes(self) -> None:
        self._fresh = bool(self.slots)
        if self._fresh:
            self._snapshot.take(tuple(sorted(self.slots)))

    def _catch_up(self, slot: int, st: _Slot) -> None:
        have = st.prompt_len + st.row.fed
        snap = self._snapshot.get(slot) if self._fresh else None
        if snap is not None:
            total, window = snap[0], snap[1:]
        else:  # no snapshot for this step (none taken, or the slot joined after it): read it now
            total = int(self.req_states.total_len.gpu[slot])
            window = []
        new = total - have
        if new <= 0:
            return
        if new <= len(window):
            st.row.feed(window[len(window) - new:])
        else:
            st.row.feed(self.req_states.all_token_ids.gpu[slot, have:total].tolist())

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        if not self.slots:
            return logits
        slots = ctx.idx_mapping_np.tolist()
        batch = [(row, s) for row, s in enumerate(slots) if s in self.slots]
        if not batch:
            return logits
        if logits.shape[0] != len(slots):
            raise RuntimeError("the layout constraint does not support speculative decoding (several logits rows "
                               "per request); the engine adapter refuses constrained requests on such engines")
        picked = []
        for row, s in batch:
            st = self.slots[s]
            self._catch_up(s, st)
            if (p := st.row.pick(row)) is not None:
                picked.append(p)
            elif st.row.done:  # ended or set free: nothing left to constrain in this slot
                del self.slots[s]
        self._fresh = False
        return self.mask.apply(logits, picked)
