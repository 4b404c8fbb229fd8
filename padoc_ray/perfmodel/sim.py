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

:class:`SimEngine` is the engine, laid out like vLLM's: :meth:`~SimEngine.schedule` decides a step and
returns its load, :meth:`~SimEngine.advance` absorbs it; its requests, pages and KV block count live in
:mod:`.engine_state`. :func:`simulate` runs it to the end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from .engine_state import KvBlocks, SimPage, SimRequest
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



def read_kv(kv: dict, r: SimRequest, context: int) -> None:
    """Count what ``r``'s attention over ``context`` tokens reads into ``kv`` (page -> [shared, own]): the
    part of it that is its page's shared prefix (a page's first request's whole context: its branches and
    retries fork from it; a later request's shared prompt tokens) once per page, the rest as its own."""
    shared = context if r.i == 0 else min(r.shared, context)
    acc = kv.setdefault(r.page, [0, 0])
    acc[0] = max(acc[0], shared)
    acc[1] += context - shared


@dataclass
class ScheduledStep:
    """What :meth:`SimEngine.schedule` decided for one step (vLLM's ``SchedulerOutput``, as counts)."""

    budget: int  #: tokens of max_num_batched_tokens left unscheduled
    decodes: list[SimRequest] = field(default_factory=list)  #: requests that decode one token
    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)  #: (request, its prefill tokens)
    admitted: int = 0  #: waiting requests admitted (their first chunk is among ``chunks``)
    preempted: bool = False  #: a running request was preempted for KV blocks: nothing is admitted
    load: StepLoad | None = None  #: the step's work, for the step-time function


class SimEngine:
    """One engine serving page plans under a closed loop: vLLM's V1 scheduler, as counts.

    Each step :meth:`schedule` decides which requests run and what they compute (and allocates their KV
    blocks, preempting and admitting as vLLM does) and returns the step with its :class:`~.step.StepLoad`;
    the caller prices the load in seconds and :meth:`advance` absorbs the step: the clock moves, the
    requests' token counts grow, requests end, fork others, or stop their page, and pages enter and end.
    :meth:`result` is the run's :class:`SimResult` once :attr:`done`."""

    def __init__(self, plans: Sequence[PagePlan], concurrency: int, env: Envelope = Envelope()):
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not plans:
            raise ValueError("no pages to model")
        self.plans, self.env = plans, env
        self.kv_blocks = KvBlocks(env.block_size, env.kv_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  #: in the order they were admitted
        self.records: list[dict] = []  #: page records, in the order the pages ended
        self.next_plan = 0  #: the plan the next page to enter runs
        self.clock = 0.0
        self.preempted = 0
        self.steps = self.generated = self.prefill_tokens = self.seqs_total = self.tokens_total = 0
        #: time-weighted sums of the step's sequence fill, token fill and the larger of the two
        self.u_seq = self.u_tok = self.u_max = 0.0
        self.samples: list[tuple[float, int]] = []
        for _ in range(concurrency):
            self._enter()

    @property
    def done(self) -> bool:
        """Every page has run."""
        return len(self.records) >= len(self.plans)

    # ---- scheduling ---------------------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        """Decide the next step: running requests first, in the order they were admitted, each taking what
        it needs (a decode token, or the next chunk of its prefill) while the token budget lasts; then, unless
        one was preempted, waiting requests in order while the budget lasts and fewer than max_num_seqs run."""
        step = ScheduledStep(budget=self.env.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        if not step.decodes and not step.chunks:
            raise RuntimeError("the engine model scheduled nothing in a step: a request needs more KV blocks than "
                               f"the cache has ({self.env.kv_blocks}), or a bug")
        self.kv_blocks.peak = max(self.kv_blocks.peak, self.kv_blocks.used)
        step.load = self._load(step)
        return step

    def _schedule_running(self, step: ScheduledStep) -> None:
        """The running requests' share of the step; with a finite KV cache, one that cannot grow preempts the
        last admitted (vLLM's FCFS), or itself when it is the last."""
        running, kv = self.running, self.kv_blocks
        i = 0
        while i < len(running) and step.budget > 0:
            r = running[i]
            n = min(r.need - r.computed, step.budget) if r.computed < r.need else 1
            if kv.capacity is not None:
                want = kv.own_blocks(r, r.kv + n)
                while want - r.own > kv.free() and running[-1] is not r:  # preempt from the back (FCFS)
                    self._preempt(running.pop())
                    step.preempted = True
                if want - r.own > kv.free():  # nothing left to preempt but itself
                    self._preempt(running.pop())
                    step.preempted = True
                    break
                kv.set_own(r, want)
            i += 1
            if r.computed < r.need:
                step.chunks.append((r, n))
            else:
                step.decodes.append(r)
            step.budget -= n

    def _schedule_waiting(self, step: ScheduledStep) -> None:
        """Admit waiting requests in order: each finds its page's prefix cached in full blocks (never its whole
        prompt) and prefills a chunk of the rest; with a finite KV cache, one whose blocks do not fit waits."""
        waiting, kv, B = self.waiting, self.kv_blocks, self.env.block_size
        while waiting and step.budget > 0 and len(self.running) < self.env.max_num_seqs:
            r = waiting[0]
            if r.done:  # its page ended while it waited
                waiting.popleft()
                continue
            pin = min(r.shared, r.need - 1) // B * B
            n = min(r.need - pin, step.budget)
            if kv.capacity is not None:
                r.pin = pin
                grow = kv.own_blocks(r, pin + n) + (kv.hold_of(r.page, pin) - r.page.hold if r.i else 0)
                if grow > kv.free():  # vLLM leaves it waiting until blocks free up
                    r.pin = 0
                    break
            waiting.popleft()
            step.admitted += 1
            r.admitted = True
            r.computed = r.kv = pin
            r.page.prompt += r.need
            r.page.cached += r.computed
            if kv.capacity is not None:
                kv.set_own(r, kv.own_blocks(r, pin + n))
                kv.sync_hold(r.page)
            step.chunks.append((r, n))
            step.budget -= n
            self.running.append(r)

    def _load(self, step: ScheduledStep) -> StepLoad:
        """The step's work: its decodes and prefill chunks, their context and attention pairs, the distinct KV
        tokens they read, the images the chunks reach and the requests admitted."""
        kv: dict[SimPage, list[int]] = {}  # page -> [its longest shared prefix read this step, its own tokens read]
        ctx = pairs = 0
        for r in step.decodes:
            c = r.prompt + r.generated
            ctx += c
            pairs += c
            read_kv(kv, r, c)
        pre = imgs = img_tokens = 0
        for r, n in step.chunks:
            hi = r.computed + n
            pre += n
            ctx += hi
            pairs += prefill_pairs(n, r.computed)
            read_kv(kv, r, hi)
            if r.reaches_image(n):
                imgs += 1
                img_tokens += r.page.plan.image_tokens
        return StepLoad(len(step.decodes), pre, ctx, imgs, img_tokens, attention_pairs=pairs,
                        kv_tokens=sum(t + o for t, o in kv.values()), new_requests=step.admitted)

    # ---- absorbing a step ---------------------------------------------------------------------------------
    def advance(self, step: ScheduledStep, seconds: float) -> None:
        """Absorb a scheduled step that took ``seconds``: token counts, the clock and the run's figures, then
        what the new tokens set off (forks, stops, ends; pages ending and entering)."""
        events, completed = self._update_tokens(step)
        self._count(step, seconds, completed)
        finished = False
        for r in events:
            if r.done:  # its page was stopped by an earlier event of this step
                continue
            page, g = r.page, r.generated
            while r.ki < len(r.kids) and r.kids[r.ki][0] <= g:
                self._start(page, r.kids[r.ki][1])
                r.ki += 1
            if r.stop_at is not None and g >= r.stop_at:
                self._stop(page)
                finished = True
            elif g >= r.out:
                self._finish(r)
                finished = True
            else:
                r.update_next_at()
        if finished:
            self.running = [r for r in self.running if not r.done]

    def _update_tokens(self, step: ScheduledStep) -> tuple[list[SimRequest], int]:
        """Decodes generate a token, chunks advance their prefill (a prefill's last chunk samples the first
        token; a chunk that reaches the image encodes it). Returns the requests that reached their next event,
        decodes first, and the number of prefills completed."""
        events: list[SimRequest] = []
        for r in step.decodes:
            r.generated += 1
            r.kv += 1
            if r.generated >= r.next_at:
                events.append(r)
        completed = 0
        for r, n in step.chunks:
            if r.reaches_image(n):
                r.img_at = None
            r.computed += n
            r.kv = r.computed
            if r.computed == r.need:  # the prefill's last chunk samples the next token
                completed += 1
                r.generated += 1
                if r.generated >= r.next_at:
                    events.append(r)
        return events, completed

    def _count(self, step: ScheduledStep, dt: float, completed: int) -> None:
        """Move the clock by the step's ``dt`` seconds and add the step to the run's figures."""
        S, T = self.env.max_num_seqs, self.env.max_num_batched_tokens
        dec, pre = step.load.decode_seqs, step.load.prefill_tokens
        self.clock += dt
        self.steps += 1
        seqs, toks = dec + len(step.chunks), dec + pre
        self.seqs_total += seqs
        self.tokens_total += toks
        self.prefill_tokens += pre
        self.u_seq += dt * seqs / S
        self.u_tok += dt * toks / T
        self.u_max += dt * max(seqs / S, toks / T)
        self.generated += dec + completed
        self.samples.append((self.clock, self.generated))

    # ---- requests and pages -------------------------------------------------------------------------------
    def _start(self, page: SimPage, i: int) -> None:
        """Request ``i`` of the page starts: it joins the waiting queue."""
        r = SimRequest(page, i)
        page.reqs.append(r)
        page.live += 1
        self.waiting.append(r)

    def _enter(self) -> None:
        """The next page enters (if any is left): its first request starts."""
        if self.next_plan < len(self.plans):
            self._start(SimPage(self.plans[self.next_plan], self.clock), 0)
            self.next_plan += 1

    def _end_page(self, page: SimPage) -> None:
        """The page's record; the next page enters in its place."""
        pl, clock = page.plan, self.clock
        self.records.append({
            "page": pl.name, "status": pl.status, "valid": pl.valid, "e2e_s": clock - page.t_start,
            "t_start": page.t_start, "t_end": clock, "output_tokens": sum(r.generated for r in page.reqs),
            "prompt_tokens": page.prompt, "cached_tokens": page.cached, "f_seq": pl.f_seq, "f_padoc": pl.f_padoc,
            "n_branches": pl.n_branches})
        self._enter()

    def _finish(self, r: SimRequest) -> None:
        """``r`` generated its last token: its blocks go back, the requests it starts when it ends start (unless
        its page was stopped), and its page ends with its last request."""
        r.done = True
        page = r.page
        page.live -= 1
        if self.kv_blocks.capacity is not None:
            self.kv_blocks.set_own(r, 0)
            self.kv_blocks.sync_hold(page)
        for j in page.end_kids[r.i]:
            if not page.stopped:
                self._start(page, j)
        if page.live == 0:
            self._end_page(page)

    def _stop(self, page: SimPage) -> None:
        """A status that ends the page: abort its live requests (their tokens so far count)."""
        page.stopped = True
        for q in page.reqs:
            q.done = True
        self.kv_blocks.release(page)
        page.live = 0
        self._end_page(page)

    def _preempt(self, r: SimRequest) -> None:
        """vLLM's recompute preemption: its blocks go back, it waits at the front of the queue, and on
        readmission it prefills its prompt and what it generated so far (less the page prefix it finds
        cached; a page's first request, which has none to find, recomputes it all)."""
        self.preempted += 1
        self.kv_blocks.set_own(r, 0)
        r.admitted = False
        r.computed = r.kv = r.pin = 0
        r.need = r.prompt + r.generated
        self.kv_blocks.sync_hold(r.page)
        self.waiting.appendleft(r)

    def result(self) -> SimResult:
        """The run's figures (once :attr:`done`)."""
        wall, steps = self.clock, self.steps
        return SimResult(self.records, wall, steps, self.u_seq / wall, self.u_tok / wall, self.u_max / wall,
                         self.seqs_total / steps, self.tokens_total / steps, self.prefill_tokens, self.samples,
                         self.preempted, self.kv_blocks.peak)


def simulate(plans: Sequence[PagePlan], concurrency: int, step_time: StepTime, env: Envelope = Envelope()
             ) -> SimResult:
    """Run every plan once through one engine (:class:`SimEngine`) under a closed loop of ``concurrency``
    pages, each step priced by ``step_time``."""
    engine = SimEngine(plans, concurrency, env)
    while not engine.done:
        step = engine.schedule()
        dt = step_time.seconds(step.load)
        if not dt > 0:
            raise ValueError(f"the step time must be positive seconds, got {dt!r} (from {step_time.describe()})")
        engine.advance(step, dt)
    return engine.result()
