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
from .step import StepLoad, StepTime


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """One engine's limits. Defaults: the paper's serving envelope (Appendix E.3) on vLLM's GPU block size."""

    max_num_seqs: int = 384  #: sequences one step may run (vLLM max_num_seqs)
    max_num_batched_tokens: int = 24576  #: tokens one step may schedule: decodes plus prefill chunks
    block_size: int = 16  #: KV block size; the prefix cache serves full blocks only

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be >= 1")


class _Req:
    __slots__ = ("page", "i", "prompt", "shared", "computed", "generated", "out", "next_at", "kids", "ki",
                 "stop_at", "img_at", "img_end", "done")

    def __init__(self, page: "_Page", i: int):
        p = page.plan.requests[i]
        self.page, self.i = page, i
        self.prompt, self.shared, self.out = p.prompt_tokens, p.shared_tokens, p.output_tokens
        self.computed = self.generated = self.ki = 0
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
    __slots__ = ("plan", "kids", "end_kids", "t_start", "reqs", "live", "prompt", "cached", "stopped")

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


def simulate(plans: Sequence[PagePlan], concurrency: int, step_time: StepTime, env: Envelope = Envelope()
             ) -> SimResult:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not plans:
        raise ValueError("no pages to model")
    S, T, B = env.max_num_seqs, env.max_num_batched_tokens, env.block_size
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    records: list[dict] = []
    nxt = 0
    clock = 0.0

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
        page.live = 0
        end_page(page)

    for _ in range(concurrency):
        enter()
    steps = gen = prefill_total = seqs_total = tokens_total = 0
    u_seq = u_tok = u_max = 0.0
    samples: list[tuple[float, int]] = []
    while len(records) < len(plans):
        budget, dec, ctx = T, 0, 0
        events: list[_Req] = []
        chunks: list[tuple[_Req, int]] = []  # (request, prefill tokens this step)
        for r in running:  # admission order: decodes, and prefills a previous step left unfinished
            if budget <= 0:
                break
            if r.computed < r.prompt:
                n = min(r.prompt - r.computed, budget)
                chunks.append((r, n))
                budget -= n
                continue
            dec += 1
            ctx += r.prompt + r.generated
            r.generated += 1
            budget -= 1
            if r.generated >= r.next_at:
                events.append(r)
        while waiting and budget > 0 and len(running) < S:
            r = waiting.popleft()
            if r.done:  # its page ended while it waited
                continue
            r.computed = min(r.shared, r.prompt - 1) // B * B
            r.page.prompt += r.prompt
            r.page.cached += r.computed
            n = min(r.prompt - r.computed, budget)
            chunks.append((r, n))
            budget -= n
            running.append(r)
        pre = imgs = img_tokens = 0
        for r, n in chunks:
            lo, r.computed = r.computed, r.computed + n
            pre += n
            ctx += r.computed
            if r.img_at is not None and lo < r.img_end and r.computed > r.img_at:
                imgs += 1
                img_tokens += r.page.plan.image_tokens
                r.img_at = None
            if r.computed == r.prompt:  # the prefill's last chunk samples the first token
                r.generated = 1
                if r.next_at <= 1:
                    events.append(r)
        completed = sum(1 for r, _ in chunks if r.computed == r.prompt)
        if not dec and not chunks:
            raise RuntimeError("the engine model scheduled nothing in a step (a bug)")
        dt = step_time.seconds(StepLoad(dec, pre, ctx, imgs, img_tokens))
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
                     tokens_total / steps, prefill_total, samples)
