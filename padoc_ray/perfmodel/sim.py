"""The discrete-event core: one engine serving page plans (:mod:`.plan`) under a closed loop.

Each step schedules like vLLM's default (FCFS) scheduler with chunked prefill: first the running
requests in the order they were admitted, each taking what it needs (one token to decode, or the rest
of its prompt) while the step's ``max_num_batched_tokens`` last, then waiting requests in arrival order
while the budget lasts and fewer than ``max_num_seqs`` run. A request admitted to the engine is served
from the prefix cache for the longest prefix an earlier request of its page computed, rounded down to
full KV blocks (and never the whole prompt: the last prompt token is always computed). The vision
encoder runs once per page, in the step whose prefill chunk of the page's first request reaches the
image. A request's first token comes on the step its prefill completes, then one token per step. The
step's :class:`~.step.StepLoad` goes to the :class:`~.step.StepTime`, whose seconds advance the clock.
Besides its sequences and tokens, a load counts its attention's query-key pairs (causal within a
prefill chunk), the distinct KV tokens it reads (a page's shared prefix, its first request's context
which its branches and retries fork from, once, whatever number of its requests read it) and the
requests it admits.

Closed loop: ``concurrency`` pages enter at the start; when a page ends (all its requests ended, or a
status that ends the page aborted them) the next one enters; every page runs once. A request a page's
progress starts (a fork, a re-fork, a layout retry) enters the waiting queue at the end of the step
that started it. Nothing else costs time: no host, no Ray hop, no idle engine, no KV cache eviction;
so the result is the engine-bound limit. Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from .plan import PagePlan
from .step import StepLoad, StepTime, prefill_pairs


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """One engine's limits. Defaults: the paper's serving envelope (Appendix E.3) on vLLM's GPU block size."""

    max_num_seqs: int = 384  #: sequences one step may run (vLLM max_num_seqs)
    max_num_batched_tokens: int = 24576  #: tokens one step may schedule: decodes plus prefill chunks
    block_size: int = 16  #: KV block size; the prefix cache serves full blocks only
    #: KV blocks the cache holds (vLLM's num_gpu_blocks); None: it never runs out
    kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be >= 1")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError("kv_blocks must be >= 1 (or None: the KV cache never runs out)")


class _Req:
    __slots__ = ("page", "i", "prompt", "shared", "computed", "generated", "out", "next_at", "kids", "ki",
                 "stop_at", "img_at", "img_end", "done", "need", "kv", "pin", "own", "admitted")

    def __init__(self, page: "_Page", i: int):
        p = page.plan.requests[i]
        self.page, self.i = page, i
        self.prompt, self.shared, self.out = p.prompt_tokens, p.shared_tokens, p.output_tokens
        self.computed = self.generated = self.ki = 0
        #: KV: tokens that must be computed before it decodes (its prompt; after a preemption, prompt + output so
        #: far), tokens in the cache, of them the prefix it found cached (the page's blocks), its own blocks
        self.need, self.kv, self.pin, self.own = self.prompt, 0, 0, 0
        self.admitted = False
        self.kids = page.kids[i]
        sp = page.plan.stop_page
        self.stop_at = sp[1] if sp is not None and sp[0] == i else None
        self.img_at = page.plan.image_at if p.image else None
        self.img_end = page.plan.image_at + page.plan.image_tokens
        self.done = False
        self.next_at = 0
        self.advance()

    def advance(self) -> None:
        """The next generated-token count at which something happens to this request."""
        n = self.out
        if self.ki < len(self.kids):
            n = min(n, self.kids[self.ki][0])
        if self.stop_at is not None:
            n = min(n, self.stop_at)
        self.next_at = n


class _Page:
    __slots__ = ("plan", "kids", "end_kids", "t_start", "reqs", "live", "prompt", "cached", "stopped", "hold")

    def __init__(self, plan: PagePlan, t_start: float):
        self.plan, self.t_start = plan, t_start
        n = len(plan.requests)
        self.kids: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.end_kids: list[list[int]] = [[] for _ in range(n)]
        for j, r in enumerate(plan.requests):
            if r.parent is not None:
                (self.kids[r.parent].append((r.at_token, j)) if r.at_token is not None
                 else self.end_kids[r.parent].append(j))
        for k in self.kids:
            k.sort()
        self.reqs: list[_Req] = []
        self.live = self.prompt = self.cached = 0
        self.stopped = False
        #: KV blocks of the page's shared prefix held for requests that found it cached once the request that
        #: computed it no longer holds them (ended or preempted)
        self.hold = 0


def read_kv(kv: dict, r: "_Req", context: int) -> None:
    """Count what ``r``'s attention over ``context`` tokens reads into ``kv`` (page -> [shared, own]): the
    part of it that is its page's shared prefix (a page's first request's whole context: its branches and
    retries fork from it; a later request's shared prompt tokens) once per page, the rest as its own."""
    shared = context if r.i == 0 else min(r.shared, context)
    acc = kv.setdefault(r.page, [0, 0])
    acc[0] = max(acc[0], shared)
    acc[1] += context - shared


@dataclass
class SimResult:
    """One closed-loop run: per-page records (``bench serve``'s page-result keys) and engine figures."""

    pages: list[dict]
    wall_s: float
    steps: int
    #: time-weighted means over steps: running sequences / max_num_seqs, scheduled tokens /
    #: max_num_batched_tokens, and the larger of the two (the binding limit's fill: engine_utilization)
    seq_fill: float
    token_fill: float
    engine_utilization: float
    mean_batch: float  #: sequences per step (step-weighted)
    mean_scheduled_tokens: float
    prefill_tokens: int
    samples: list[tuple[float, int]] = field(default_factory=list)  #: (clock, tokens generated so far) per step
    preempted_requests: int = 0  #: requests preempted for KV blocks (recomputed when readmitted)
    peak_kv_blocks: int = 0  #: the most KV blocks in use at once


def simulate(plans: Sequence[PagePlan], concurrency: int, step_time: StepTime, env: Envelope = Envelope()
             ) -> SimResult:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not plans:
        raise ValueError("no pages to model")
    S, T, B, K = env.max_num_seqs, env.max_num_batched_tokens, env.block_size, env.kv_blocks
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    records: list[dict] = []
    nxt = 0
    clock = 0.0
    used = peak = preempted = 0  # KV blocks in use (counted only with a finite cache)

    def own_blocks(r: _Req, tokens: int) -> int:
        return -(-tokens // B) - r.pin // B

    def hold_of(page: _Page, extra_pin: int = 0) -> int:
        """Blocks of the page's shared prefix that its live requests (and one with ``extra_pin`` tokens
        cached, about to be admitted) found cached, beyond what its first request (which computed them)
        still holds itself: counted once for the page."""
        first = page.reqs[0]
        pins = max((q.pin // B for q in page.reqs[1:] if q.admitted and not q.done), default=0)
        pins = max(pins, extra_pin // B)
        return max(0, pins - (first.own if first.admitted and not first.done else 0))

    def sync_hold(page: _Page) -> None:
        nonlocal used
        h = hold_of(page)
        used += h - page.hold
        page.hold = h

    def set_own(r: _Req, blocks: int) -> None:
        nonlocal used
        used += blocks - r.own
        r.own = blocks
        if r.page.hold or (r.i == 0 and len(r.page.reqs) > 1):
            sync_hold(r.page)

    def release(page: _Page) -> None:
        if K is None:
            return
        for q in page.reqs:
            if q.own:
                set_own(q, 0)
        sync_hold(page)

    def start(page: _Page, i: int) -> None:
        r = _Req(page, i)
        page.reqs.append(r)
        page.live += 1
        waiting.append(r)

    def enter() -> None:
        nonlocal nxt
        if nxt < len(plans):
            start(_Page(plans[nxt], clock), 0)
            nxt += 1

    def end_page(page: _Page) -> None:
        pl = page.plan
        records.append({"page": pl.name, "status": pl.status, "valid": pl.valid, "e2e_s": clock - page.t_start,
                        "t_start": page.t_start, "t_end": clock, "output_tokens": sum(r.generated for r in page.reqs),
                        "prompt_tokens": page.prompt, "cached_tokens": page.cached, "f_seq": pl.f_seq,
                        "f_padoc": pl.f_padoc, "n_branches": pl.n_branches})
        enter()

    def finish(r: _Req) -> None:
        r.done = True
        page = r.page
        page.live -= 1
        if K is not None:
            set_own(r, 0)
            sync_hold(page)
        for j in page.end_kids[r.i]:
            if not page.stopped:
                start(page, j)
        if page.live == 0:
            end_page(page)

    def stop(page: _Page) -> None:
        """A status that ends the page: abort its live requests (their tokens so far count)."""
        page.stopped = True
        for q in page.reqs:
            q.done = True
        release(page)
        page.live = 0
        end_page(page)

    def preempt(r: _Req) -> None:
        """vLLM's recompute preemption: its blocks go back, it waits at the front of the queue, and on
        readmission it prefills its prompt and what it generated so far (less the page prefix it finds
        cached; a page's first request, which has none to find, recomputes it all)."""
        nonlocal preempted
        preempted += 1
        set_own(r, 0)
        r.admitted = False
        r.computed = r.kv = r.pin = 0
        r.need = r.prompt + r.generated
        sync_hold(r.page)
        waiting.appendleft(r)

    for _ in range(concurrency):
        enter()
    steps = gen = prefill_total = seqs_total = tokens_total = 0
    u_seq = u_tok = u_max = 0.0
    samples: list[tuple[float, int]] = []
    while len(records) < len(plans):
        budget, dec, ctx, pairs, admitted = T, 0, 0, 0, 0
        kv: dict[_Page, list[int]] = {}  # page -> [its longest shared prefix read this step, its own tokens read]
        events: list[_Req] = []
        chunks: list[tuple[_Req, int]] = []  # (request, prefill tokens this step)
        was_preempted = False
        i = 0
        while i < len(running):  # admission order: decodes, and prefills a previous step left unfinished
            if budget <= 0:
                break
            r = running[i]
            n = min(r.need - r.computed, budget) if r.computed < r.need else 1
            if K is not None:
                want = own_blocks(r, r.kv + n)
                while want - r.own > K - used and running[-1] is not r:  # preempt from the back (FCFS)
                    preempt(running.pop())
                    was_preempted = True
                if want - r.own > K - used:  # nothing left to preempt but itself
                    preempt(running.pop())
                    was_preempted = True
                    break
                set_own(r, want)
            i += 1
            if r.computed < r.need:
                chunks.append((r, n))
                budget -= n
                continue
            dec += 1
            c = r.prompt + r.generated
            ctx += c
            pairs += c
            read_kv(kv, r, c)
            r.generated += 1
            r.kv += 1
            budget -= 1
            if r.generated >= r.next_at:
                events.append(r)
        while waiting and budget > 0 and len(running) < S and not was_preempted:
            r = waiting[0]
            if r.done:  # its page ended while it waited
                waiting.popleft()
                continue
            pin = min(r.shared, r.need - 1) // B * B
            n = min(r.need - pin, budget)
            if K is not None:
                r.pin = pin
                grow = own_blocks(r, pin + n) + (hold_of(r.page, pin) - r.page.hold if r.i else 0)
                if grow > K - used:  # vLLM leaves it waiting until blocks free up
                    r.pin = 0
                    break
            waiting.popleft()
            admitted += 1
            r.admitted = True
            r.computed = r.kv = pin
            r.page.prompt += r.need
            r.page.cached += r.computed
            if K is not None:
                set_own(r, own_blocks(r, pin + n))
                sync_hold(r.page)
            chunks.append((r, n))
            budget -= n
            running.append(r)
        pre = imgs = img_tokens = completed = 0
        for r, n in chunks:
            lo, r.computed = r.computed, r.computed + n
            r.kv = r.computed
            pre += n
            ctx += r.computed
            pairs += prefill_pairs(n, lo)
            read_kv(kv, r, r.computed)
            if r.img_at is not None and lo < r.img_end and r.computed > r.img_at:
                imgs += 1
                img_tokens += r.page.plan.image_tokens
                r.img_at = None
            if r.computed == r.need:  # the prefill's last chunk samples the next token
                completed += 1
                r.generated += 1
                if r.generated >= r.next_at:
                    events.append(r)
        if not dec and not chunks:
            raise RuntimeError("the engine model scheduled nothing in a step: a request needs more KV blocks than "
                               f"the cache has ({K}), or a bug")
        peak = max(peak, used)
        dt = step_time.seconds(StepLoad(dec, pre, ctx, imgs, img_tokens, attention_pairs=pairs,
                                        kv_tokens=sum(t + o for t, o in kv.values()), new_requests=admitted))
        if not dt > 0:
            raise ValueError(f"the step time must be positive seconds, got {dt!r} (from {step_time.describe()})")
        clock += dt
        steps += 1
        seqs, toks = dec + len(chunks), dec + pre
        seqs_total += seqs
        tokens_total += toks
        prefill_total += pre
        u_seq += dt * seqs / S
        u_tok += dt * toks / T
        u_max += dt * max(seqs / S, toks / T)
        gen += dec + completed
        samples.append((clock, gen))
        finished = False
        for r in events:
            if r.done:  # its page was stopped by an earlier event of this step
                continue
            page, g = r.page, r.generated
            while r.ki < len(r.kids) and r.kids[r.ki][0] <= g:
                start(page, r.kids[r.ki][1])
                r.ki += 1
            if r.stop_at is not None and g >= r.stop_at:
                stop(page)
                finished = True
            elif g >= r.out:
                finish(r)
                finished = True
            else:
                r.advance()
        if finished:
            running = [r for r in running if not r.done]
    wall = clock
    return SimResult(records, wall, steps, u_seq / wall, u_tok / wall, u_max / wall, seqs_total / steps,
                     tokens_total / steps, prefill_total, samples, preempted, peak)
