"""The layout grammar under vLLM's Model Runner V2, on CPU.

MRv2 cannot run here (it needs Triton), so these tests drive its *contracts*: vLLM's own V2 loader
loads what the engine registers, and the V2 processor is driven the way the 0.32 model runner drives
it (``vllm/v1/worker/gpu/model_runner.py``: ``finish_requests`` frees the slots of finished and
preempted requests, ``add_requests`` fills ``RequestState`` and calls ``Sampler.add_request`` then
``apply_staged_writes`` every step, the sampler calls ``apply(logits, LogitsContext)`` with rows
in a new order each step, and ``post_update`` commits the sampled token). The request state is
vLLM's real ``RequestState``; two light stand-ins replace what needs a GPU:

* ``buffer_utils.is_uva_available`` returns False (pinned host memory needs an accelerator), so
  vLLM uses its own device-memory fallback (``NonUvaBuffer``);
* ``StagedWriteTensor.apply_write`` is a pure-torch twin of its Triton kernel, and the harness's
  ``_post_update`` does what ``_post_update_kernel`` does (token at ``total_len``, ``total_len`` + 1).

vLLM's trace replay itself (``vllm/v1/worker/gpu/sample/trace_replay.py``, which overwrites a traced
request's sampled tokens on the GPU) is not executed here: these tests check that the V2 processor
declines a traced request and leaves its rows alone, and the harness writes that request's trace
itself. What the engine hands trace replay is checked against vLLM's own code by
tests/unit/engine/test_runners.py and ``padoc-ray doctor --runner v2``; the replay runs end to end
only on a GPU, in cluster/gpu_check.sh.
"""

from __future__ import annotations

import random
import types

import pytest
import torch

from padoc_ray.engine.layout_mask import CONSTRAIN_LAYOUT_KEY
from padoc_ray.engine.runners import V1_PROCESSORS, V2_PROCESSORS, check_processors, logits_processors
from padoc_ray.protocol import LayoutGrammar


def _apply_write(self) -> None:
    """``StagedWriteTensor.apply_write`` without Triton: the staged (row, start, contents) writes."""
    lo = 0
    for idx, start, hi in zip(self._staged_write_indices, self._staged_write_starts, self._staged_write_cu_lens,
                              strict=True):
        vals = torch.tensor(self._staged_write_contents[lo:hi], dtype=self.gpu.dtype)
        if self.gpu.dim() == 1:
            self.gpu[idx] = vals[0]
        else:
            self.gpu[idx, start:start + len(vals)] = vals
        lo = hi
    self.clear_staged_writes()


@pytest.fixture
def request_state(monkeypatch):
    import vllm.v1.worker.gpu.buffer_utils as bu

    monkeypatch.setattr(bu, "is_uva_available", lambda: False)
    monkeypatch.setattr(bu.StagedWriteTensor, "apply_write", _apply_write)
    from vllm.v1.worker.gpu.states import RequestState

    def make(max_num_reqs: int, vocab: int) -> RequestState:
        return RequestState(max_num_reqs=max_num_reqs, max_model_len=512, max_num_batched_tokens=512,
                            num_speculative_steps=0, vocab_size=vocab, device=torch.device("cpu"))

    return make


def test_vllm_v2_loader_accepts_what_a_v2_engine_registers():
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors_params_validator

    assert logits_processors("v2") == list(V2_PROCESSORS)
    validate = build_custom_logits_processors_params_validator(logits_processors("v2"))  # raised ValueError before
    validate(SamplingParams(extra_args={CONSTRAIN_LAYOUT_KEY: 3}))
    with pytest.raises(VLLMValidationError, match=CONSTRAIN_LAYOUT_KEY):
        validate(SamplingParams(extra_args={CONSTRAIN_LAYOUT_KEY: -1}))
    assert check_processors("v2", logits_processors("v2")) == []
    assert check_processors("v1", logits_processors("v1")) == []
    # each runner refuses the other's processors, naming the class
    assert "ForcedTokensProcessor is not a subclass" in check_processors("v2", V1_PROCESSORS)[0]
    assert "LayoutGrammarProcessorV2" in check_processors("v1", V2_PROCESSORS)[0]


class _Req:
    def __init__(self, rid: str, prompt: list[int], params, trace: list[int] | None = None):
        self.rid, self.prompt, self.params, self.trace = rid, prompt, params, trace
        self.out: list[int] = []  # committed output tokens (V1 reads this very list)
        self.slot: int | None = None  # V2 slot
        self.v1_row: int | None = None
        self.done = False


class _Harness:
    """Both runners' processors over the same requests: V2 through vLLM's RequestState and slot
    machinery, V1 through BatchUpdates over a persistent batch. Each step every running request gets
    one token, chosen from V2's masked logits (or its trace), and both processors must allow exactly
    the tokens the pure grammar allows after that request's history."""

    def __init__(self, request_state, model_dir: str, vocab, width: int, max_num_reqs: int = 6):
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcRequestState

        from padoc_ray.engine.layout_constraint import LayoutGrammarProcessor
        from padoc_ray.engine.layout_constraint_v2 import LayoutGrammarProcessorV2

        cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(model=model_dir, tokenizer=model_dir),
                                    speculative_config=None)
        self.rs = request_state(max_num_reqs, width)
        self.v2 = LayoutGrammarProcessorV2(cfg, LogitsProcRequestState.from_request_state(self.rs))
        self.v1 = LayoutGrammarProcessor(cfg, torch.device("cpu"), False)
        self.vocab, self.width, self.grammar = vocab, width, LayoutGrammar(vocab)
        self.running: list[_Req] = []
        self.v1_rows: list[_Req | None] = []
        self.pending_add: list[_Req] = []
        self.pending_remove: list[_Req] = []
        self.prefilling: set[str] = set()  # first step of these is a partial prefill: no token comes out
        self.rng = random.Random(3)
        self.checked = {"constrained_rows": 0, "untouched_rows": 0}
        self.v2_took: dict[str, list[bool]] = {}  # each request's add_request answers: the V2 processor took it

    # -- the scheduler side ------------------------------------------------------------------------
    def submit(self, req: _Req, *, chunked_prefill: bool = False) -> None:
        self.pending_add.append(req)
        if chunked_prefill:
            self.prefilling.add(req.rid)

    def preempt(self, req: _Req) -> None:
        """The scheduler preempts it; it comes back later as a new request carrying its outputs."""
        self.running.remove(req)
        self.pending_remove.append(req)

    def _v1_update(self, removed: list[int], added: list[_Req]):
        from vllm.v1.sample.logits_processor import BatchUpdate

        rows = []
        for r in added:
            free = [i for i, x in enumerate(self.v1_rows) if x is None]
            r.v1_row = free[0] if free else len(self.v1_rows)
            if r.v1_row == len(self.v1_rows):
                self.v1_rows.append(None)
            self.v1_rows[r.v1_row] = r
            extra = dict(r.params.extra_args or {})
            if r.trace:
                from padoc_ray.engine.forcing import FORCED_TOKENS_KEY

                extra[FORCED_TOKENS_KEY] = r.trace
            rows.append((r.v1_row, type(r.params)(max_tokens=r.params.max_tokens, extra_args=extra), r.prompt, r.out))
        self.v1.update_state(BatchUpdate(batch_size=len(self.v1_rows), removed=removed, moved=[], added=rows)
                             if removed or rows else None)

    # -- one engine step, in the model runner's order --------------------------------------------
    def step(self) -> None:
        finished = [r for r in self.running if r.done]
        removed_v1 = []
        for r in finished + self.pending_remove:  # finish_requests: slots of finished + preempted requests
            self.rs.remove_request(r.rid)
            removed_v1.append(r.v1_row)
            self.v1_rows[r.v1_row] = None
            if r in self.running:
                self.running.remove(r)
        self.pending_remove = []
        added = self.pending_add
        self.pending_add = []
        for r in added:  # add_requests: a resumed request brings its earlier outputs in prefill_token_ids
            self.rs.add_request(r.rid, len(r.prompt), r.prompt + r.out, 0, r.params.max_tokens)
            r.slot = self.rs.req_id_to_index[r.rid]
            self.v2_took.setdefault(r.rid, []).append(self.v2.add_request(r.slot, self._v2_params(r)))
            self.running.append(r)
        if added:
            self.rs.apply_staged_writes()
        self.v2.apply_staged_writes()
        self._v1_update(removed_v1, added)
        if not self.running:
            return
        batch = self.running[:]
        self.rng.shuffle(batch)  # rows come in another order every step
        self._sample(batch)

    def _v2_params(self, r: _Req):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=r.params.max_tokens, extra_args=r.params.extra_args,
                              trace_decode_token_ids=r.trace)

    def _sample(self, batch: list[_Req]) -> None:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

        slots = [r.slot for r in batch]
        idx = torch.tensor(slots, dtype=torch.int32)
        gen = torch.Generator().manual_seed(self.rng.randrange(1 << 30))
        logits = torch.randn(len(batch), self.width, generator=gen)
        ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=idx.numpy(),
                            expanded_local_pos=torch.zeros(len(batch), dtype=torch.int32),
                            input_ids=torch.tensor([(r.prompt + r.out)[-1] for r in batch]),
                            pos=torch.tensor([len(r.prompt) + len(r.out) - 1 for r in batch]),
                            seq_lens_upper_bound_np=torch.tensor([len(r.prompt) + len(r.out) for r in batch]).numpy())
        v2_out = self.v2.apply(logits.clone(), ctx)
        v1_logits = torch.randn(len(self.v1_rows), self.width)
        for r in batch:
            v1_logits[r.v1_row] = logits[batch.index(r)]
        v1_out = self.v1.apply(v1_logits.clone())
        for pos, r in enumerate(batch):
            a, b = v2_out[pos], v1_out[r.v1_row]
            constrained = r.params.extra_args and CONSTRAIN_LAYOUT_KEY in r.params.extra_args and not r.trace
            if constrained:
                allowed = set(torch.isfinite(a).nonzero().flatten().tolist())
                assert allowed == set(torch.isfinite(b).nonzero().flatten().tolist()), (r.rid, r.out)
                cur = self.grammar.cursor(max_regions=r.params.extra_args[CONSTRAIN_LAYOUT_KEY],
                                          max_tokens=r.params.max_tokens)
                for t in r.out:
                    cur.advance(t)
                want = cur.allowed_ids()
                assert allowed == (set(range(self.width)) if want is None else set(want)), (r.rid, r.out)
                self.checked["constrained_rows"] += 1
            else:  # unconstrained, or traced (vLLM's trace replay would decide; V1's grammar leaves it too)
                assert torch.equal(a, logits[pos]) and torch.equal(b, logits[pos]), r.rid
                self.checked["untouched_rows"] += 1
            if r.rid in self.prefilling:  # a partial prefill: the sample is discarded, nothing committed
                self.prefilling.discard(r.rid)
                continue
            if r.trace:  # what trace replay would write (the harness stands in for it)
                tok = r.trace[len(r.out)]
            else:  # the most likely allowed token; a constrained stream writes some regions before it may end
                pick = a.clone()
                eos = self.vocab.end_of_stream
                if constrained and len(r.out) < 25 and torch.isfinite(pick).sum() > 1:
                    pick[eos] = float("-inf")
                tok = int(pick.argmax())
            self._post_update(r, tok)

    def _post_update(self, r: _Req, tok: int) -> None:
        """What ``_post_update_kernel`` does for one request, plus the scheduler's stop check."""
        n = int(self.rs.total_len.gpu[r.slot])
        self.rs.all_token_ids.gpu[r.slot, n] = tok
        self.rs.total_len.gpu[r.slot] = n + 1
        r.out.append(tok)
        limit = min(r.params.max_tokens, len(r.trace)) if r.trace else r.params.max_tokens
        r.done = tok == self.vocab.end_of_stream or len(r.out) >= limit


def test_v2_processor_masks_like_v1_and_leaves_traced_and_free_rows_alone(request_state, tiny_model_dir,
                                                                         model_protocol):
    """Constrained rows: V2 allows exactly what V1 and the pure grammar allow. Unconstrained and traced
    rows: both leave the logits as they are, and the V2 processor takes no slot for them (a traced
    request is trace replay's). Trace replay itself does not run here (the module's docstring)."""
    from vllm import SamplingParams

    mp, v = model_protocol, model_protocol.vocab
    width = 9216 + 64  # wider than the tokenizer, as padded LM heads are
    h = _Harness(request_state, tiny_model_dir, v, width)
    prompt = list(mp.prompt_ids("fork"))

    def constrained(regions, max_tokens):
        return SamplingParams(max_tokens=max_tokens, extra_args={CONSTRAIN_LAYOUT_KEY: regions})

    c = v.coord_ids
    trace = [v.region_open, v.category_ids["title"], c[500], c[20], c[10], c[80], v.region_close, v.end_of_stream]
    a = _Req("a", prompt, constrained(4, 60))
    b = _Req("b", prompt, SamplingParams(max_tokens=9))  # unconstrained; ends early, its slot is recycled
    f = _Req("f", prompt, constrained(255, 40), trace=trace)  # traced: trace replay's, though it asks for the grammar
    d = _Req("d", prompt, constrained(255, 15))  # a token budget that forces an early end
    late = _Req("late", prompt, constrained(2, 40))  # arrives into b's slot, with a chunked prefill
    for r in (a, b, f, d):
        h.submit(r)
    h.step()
    b_slot = b.slot
    for step in range(1, 80):
        if step == 12:
            assert len(a.out) > 4 and not a.done  # more than the snapshot window: the re-add reads directly
            h.preempt(a)
        if step == 15:
            h.submit(a)  # resumed: a new request whose prefill holds its 12 outputs
        if step == 10:
            assert b.done
            h.submit(late, chunked_prefill=True)
        h.step()
        if all(r.done for r in (a, b, f, d, late)):
            break
    assert all(r.done for r in (a, b, f, d, late)), [(r.rid, len(r.out)) for r in (a, b, f, d, late)]
    # the V2 processor took the constrained requests (a twice: resumed), and neither the free one nor the traced one
    assert h.v2_took == {"a": [True, True], "b": [False], "f": [False], "d": [True], "late": [True]}
    assert late.slot == b_slot  # b's slot, recycled
    # every step of every request was checked: one row per committed token, plus late's partial prefill
    assert h.checked == {"constrained_rows": len(a.out) + len(d.out) + len(late.out) + 1,
                         "untouched_rows": len(b.out) + len(f.out)}
    assert len(a.out) > 12 and len(late.out) > 7  # regions were written after the preemption and the prefill
    for r in (a, d, late):  # what came out parses without an error, within its limits
        from padoc_ray.protocol import StreamParser

        p = StreamParser(v)
        p.feed_many(r.out)
        regions = p.finish()
        assert p.error_codes == [] and r.out[-1] == v.end_of_stream, (r.rid, r.out)
        assert len(regions) <= r.params.extra_args[CONSTRAIN_LAYOUT_KEY] and len(r.out) <= r.params.max_tokens


def test_v2_processor_declines_forced_and_unconstrained_requests(request_state, tiny_model_dir):
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcRequestState

    from padoc_ray.engine.layout_constraint_v2 import LayoutGrammarProcessorV2

    rs = request_state(4, 100)
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(model=tiny_model_dir, tokenizer=tiny_model_dir))
    proc = LayoutGrammarProcessorV2(cfg, LogitsProcRequestState.from_request_state(rs))
    rs.add_request("x", 3, [1, 2, 3], 0, 10)
    slot = rs.req_id_to_index["x"]
    assert proc.add_request(slot, SamplingParams(max_tokens=10, extra_args={CONSTRAIN_LAYOUT_KEY: 2}))
    # the same slot recycled for requests the processor leaves alone: its old state must go
    assert not proc.add_request(slot, SamplingParams(max_tokens=10))
    assert not proc.add_request(slot, SamplingParams(max_tokens=10, extra_args={CONSTRAIN_LAYOUT_KEY: 2},
                                                     trace_decode_token_ids=[5, 6]))
    assert proc.slots == {}
