"""Drive one page through an engine: the layout stream, its forked content branches, or one
sequential stream; assemble the result in reading order into a :class:`PageRecord`.

All decisions come from :class:`~padoc_ray.scheduler.state.PageState`; this module only moves
tokens between it and an :class:`~padoc_ray.engine.interface.Engine`, keeps time, enforces the
deadline, and makes sure that a page that ends for any reason (done, limit, deadline, cancel,
error) leaves no request of its own alive in the engine. It knows nothing of vLLM or Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from padoc_ray import status
from padoc_ray.engine.interface import Engine, EngineDeadError, EngineError, GenRequest
from padoc_ray.protocol import DecodeDepth, Page, Region, assemble_page, decode_depth, depth_from_trace, parse_branch
from padoc_ray.protocol.codec import ParsedBranch, RawRegion, assemble_region
from padoc_ray.protocol.render import region_block
from padoc_ray.protocol.text_layer import ABSENT, USED, TextLayer, trust

from .drafts import Accepted, draft_ids, drafted
from .meter import EngineMeter
from .state import DECODE_MODES, ForkAction, MainRetry, PageState, PageStatus, SchedulerConfig, retry_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PageInput:
    page_id: str  #: unique per page (e.g. "<doc_id>:<page_index>"); request ids derive from it
    image: Any  #: the page image (PIL)
    width: int  #: pixel size of the image, for the result's page size
    height: int
    cache_salt: str | None = None  #: one per document: namespaces its prefix cache
    page_no: int = 0
    image_path: str | None = None
    #: teacher-forced replay: the main stream (layout stream or sequential stream) ...
    forced_main: Sequence[int] | None = None
    #: ... and, in fork mode, branch k's generated tokens (content + end-of-stream)
    forced_branches: Sequence[Sequence[int]] | None = None
    #: the page's place in its host's admission order (SchedulerConfig.page_priority: lower runs first)
    seq: int = 0
    #: the page's class (Serve: 0 interactive, 1 job): every request of a lower class runs first under
    #: the priority scheduling policy, whatever the order within a class
    priority: int = 0
    #: loop injection (benchmarks, tests; see replay.inject_loops): branch k's FIRST attempt is forced to
    #: this trace instead (a phrase repeated to the token limit); its later attempts (re-forks) to
    #: ``forced_branches[k]``
    forced_first_attempt: Mapping[int, Sequence[int]] | None = None
    #: the page's text layer (:func:`padoc_ray.pdf.page_text_layer`): in fork mode, a trusted one gives
    #: each text branch's first attempt a draft, checked in one prefill (:mod:`.drafts`); None: no drafts
    text_layer: TextLayer | None = None


@dataclass(frozen=True)
class RegionEvent:
    """A region of a page as it happens: ``region`` when the layout stream closes it (its box and
    category known, no content yet), ``content`` when its branch has finished for good (retries
    done), at once for a region no branch runs for (contentless, over the branch cap), or in
    sequential mode once the next region closes or the stream ends. Each region of the finished
    page gets exactly one of each, its ``region`` first; ``markdown`` is its block in the page's Markdown (None: it has
    none there), so the blocks in reading order, joined like the page's, are the page's Markdown."""

    kind: Literal["region", "content"]
    order: int  #: the region's reading-order position (its ``order`` in the page row)
    region: Region
    markdown: str | None = None


#: receives a page's :class:`RegionEvent` s, on the page's event loop; must not block or raise
EventSink = Callable[[RegionEvent], None]


@dataclass
class PageRecord:
    page_id: str
    mode: str
    status: str
    valid: bool  #: completed normally, structurally valid, no limit reached (paper E.3)
    page: Page
    message: str = ""
    e2e_s: float = 0.0
    ttft_s: float | None = None
    layout_s: float | None = None  #: main stream's wall time
    n_branches: int = 0
    branch_tokens: list[int] = field(default_factory=list)
    branch_prompt_tokens: list[int] = field(default_factory=list)
    branch_cached_tokens: list[int] = field(default_factory=list)
    main_tokens: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0  #: over all requests of the page (expanded, as the engine counts)
    cached_tokens: int = 0  #: of those, served from the prefix cache
    f_seq: int = 0
    f_padoc: int = 0
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    #: per region of ``page`` (reading order): its branch's finish reason ("skipped" for
    #: contentless regions, None where no branch ran or in sequential mode) and generated tokens
    region_finish_reasons: list[str | None] = field(default_factory=list)
    region_tokens: list[int] = field(default_factory=list)  #: every attempt of the region's branch
    #: per region: attempts of its branch (0: none ran), and how the last one ended (stop | loop | length |
    #: skipped | stopped | an engine finish reason; None where no branch ran or in sequential mode)
    region_attempts: list[int] = field(default_factory=list)
    region_finish: list[str | None] = field(default_factory=list)
    retries: int = 0  #: retry attempts started (branch re-forks and layout retries)
    layout_retries: int = 0  #: of those, retries of the layout stream
    #: branches that needed a retry -> how it went: recovered | exhausted | budget (region order)
    retry_outcomes: list[str] = field(default_factory=list)
    #: per branch that produced a token (region order): seconds from its region's close in the layout
    #: stream to its first token (the engine's own first-token time when it reports one)
    fork_latency_s: list[float] = field(default_factory=list)
    #: branches whose first attempt was forced to loop (PageInput.forced_first_attempt; benchmarks)
    injected_loops: int = 0
    #: the checkpoint family that parsed the page, and its region names that family does not map (kept as
    #: they are; metrics count them)
    family: str = "padoc"
    unknown_categories: list[str] = field(default_factory=list)
    #: the engine time the page used: the sum over its requests (retries and discarded attempts too) of each
    #: one's share of the engine's busy time (see :mod:`padoc_ray.scheduler.meter`); None: it never ran
    engine_s: float | None = None
    #: the page's text layer as judged (used | absent | untrusted; absent: none given; None: --text-layer off),
    #: and per region (reading order) the tokens of its branch's draft and how many of them the model accepted
    text_layer: str | None = ABSENT
    region_draft_tokens: list[int] = field(default_factory=list)
    region_accepted_tokens: list[int] = field(default_factory=list)


class _Page:
    """One run of one page; keeps the live request ids so every exit path can abort them."""

    def __init__(self, engine: Engine, model_protocol, inp: PageInput, mode: str, cfg: SchedulerConfig,
                 admission: asyncio.Semaphore | None = None, on_event: EventSink | None = None,
                 meter: EngineMeter | None = None):
        self.engine, self.model_protocol, self.inp, self.mode, self.cfg = engine, model_protocol, inp, mode, cfg
        self.admission = admission
        self.meter = meter if meter is not None else EngineMeter()
        self.engine_s = 0.0  # the shares of the page's requests that have left the engine
        self.on_event = on_event
        self.announced: dict[int, RawRegion] = {}  # region index -> its closed layout, once its event went out
        self.contented: set[int] = set()  # regions whose content event went out
        self.state = PageState(model_protocol.vocab, model_protocol.prompt_ids(mode), cfg, mode)
        #: the image as the checkpoint's family sends it (hpd: resized to its tile grid, with the processor
        #: arguments that keep that grid), and the multimodal uuid that names it as sent
        prepare = getattr(model_protocol, "prepare_image", None)
        if prepare is not None and inp.image is not None:
            self.image, self.mm_kwargs, self.image_uuid = prepare(inp.image, inp.page_id)
        else:
            self.image, self.mm_kwargs, self.image_uuid = inp.image, None, inp.page_id
        self.run_id = f"{inp.page_id}/{uuid.uuid4().hex[:8]}"
        self.live: set[str] = set()
        self.tasks: list[asyncio.Task] = []
        self.stop = asyncio.Event()
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.main_done: float | None = None
        self.closed_at: dict[int, float] = {}  # branch -> when the layout stream closed its region
        self.fork_latency: dict[int, float] = {}  # branch -> region close to first token
        self.closing = False  # the page is ending: no new request may start
        self.text_layer = trust(inp.text_layer) if cfg.text_layer == "speculate" else None
        self.drafts: dict[int, tuple[int, int]] = {}  # branch -> (draft tokens, accepted), once checked

    def _priority(self, branch: bool) -> int:
        """Lower runs first: the page's admission order (page_priority), then its layout stream ahead of
        its branches (layout_priority)."""
        base = 2 * self.inp.seq if self.cfg.page_priority else 0
        return (self.inp.priority << 40) + base + (1 if branch and self.cfg.layout_priority else 0)

    def _request(self, rid: str, prompt: Sequence[int], forced, priority: int, stream: bool = True, *,
                 stream_interval: int | None = None, attempt: int = 0, stream_no: int = -1) -> GenRequest:
        """One request; ``attempt`` > 0 is a retry of stream ``stream_no`` (a region index, -1: the main
        stream): the ladder's temperature and its own seed."""
        seed = retry_seed(self.inp.page_id, stream_no, attempt, self.cfg.retry_seed) if attempt else None
        return GenRequest(
            request_id=rid, prompt_ids=prompt, max_tokens=self.cfg.max_tokens, image=self.image,
            image_uuid=self.image_uuid, cache_salt=self.inp.cache_salt, mm_processor_kwargs=self.mm_kwargs,
            stop_token_ids=(self.model_protocol.vocab.end_of_stream,), forced_tokens=forced,
            temperature=self.cfg.attempt_temperature(attempt), repetition_penalty=self.cfg.repetition_penalty,
            seed=seed, priority=priority, stream=stream,
            stream_interval=stream_interval,
        )

    async def _consume(self, req: GenRequest, branch: int | None, draft: Sequence[int] = ()) -> None:
        st = self.state
        self.live.add(req.request_id)
        finished = False
        first = None
        sent = time.perf_counter()
        self.meter.begin(req.request_id)
        try:
            source = self.engine.generate(req) if not draft else drafted(
                self.engine, req, draft, on_accept=lambda a: self._accepted(branch, len(draft), a))
            async with contextlib.aclosing(source) as gen:
                async for d in gen:
                    first = first or d
                    if branch is None:
                        if self.ttft is None and d.token_ids:
                            self.ttft = time.perf_counter() - self.t0
                        forks, halt = st.on_main_tokens(d.token_ids)
                        if self.on_event is not None:
                            self._announce()
                        for f in forks:
                            self._spawn(f)
                    else:
                        if branch not in self.fork_latency and d.token_ids:
                            self._first_branch_token(branch, sent, d.first_token_s)
                        halt = st.on_branch_tokens(branch, d.token_ids)
                    if d.finished:
                        finished = True
                        self._finished(branch, d.finish_reason, first)
                    if halt or st.stop_all:
                        break
        finally:
            self.engine_s += self.meter.end(req.request_id)  # it left the engine: done, or aborted just below
            self.live.discard(req.request_id)
            if not finished:
                await self.engine.abort([req.request_id])
                self._finished(branch, "stopped", first)
            if branch is None:
                self.main_done = time.perf_counter() - self.t0
            if st.stop_all:
                self.stop.set()

    def _finished(self, branch: int | None, reason: str | None, first) -> None:
        """Tell the state a request ended; start the retry it decides on, if any."""
        args = (reason, getattr(first, "num_prompt_tokens", None), getattr(first, "num_cached_tokens", None))
        if branch is None:
            retry = self.state.on_main_finished(*args)
            if retry is not None:
                self._spawn_main(retry)
        else:
            again = self.state.on_branch_finished(branch, *args)
            if again is not None:
                self._spawn(again)
            elif self.on_event is not None:
                self._content(branch)

    # ---- region events ---------------------------------------------------------------------------
    def _announce(self) -> None:
        """A region event for every region closed since the last call; a content event at once for
        those no branch will run for (fork mode), or for the previous region (sequential mode)."""
        st, mp = self.state, self.model_protocol
        for raw in st.closed[len(self.announced):]:
            if self.mode == "sequential":  # inline content follows its close: the regions before this one are done
                for i in sorted(set(self.announced) - self.contented):
                    self._content(i)
            self.announced[raw.index] = raw
            layout = assemble_region(mp.vocab, mp.tokenizer, raw, None, sequential=True, size=self._size)
            self.on_event(RegionEvent("region", raw.index, dataclasses.replace(layout, content=None)))
            if self.mode == "fork" and raw.index not in st.forks:
                self._content(raw.index)
            elif self.mode == "sequential" and raw.content_text is not None:  # dots: a cell holds its own text
                self._content(raw.index)

    @property
    def _size(self) -> tuple[int, int]:
        return (self.inp.width, self.inp.height)

    def _content(self, index: int) -> None:
        """Region ``index``'s content event, from its kept branch (as :meth:`_record` will read it)."""
        st, vocab = self.state, self.model_protocol.vocab
        raw = self.announced.get(index)
        if raw is None or index in self.contented:
            return
        if self.mode == "sequential":
            branch, seq = None, True
        else:
            seq = False
            branch = (ParsedBranch([], True, []) if index in st.skipped else
                      parse_branch(vocab, st.branches[index].tokens) if index in st.branches else None)
        reg = assemble_region(vocab, self.model_protocol.tokenizer, raw, branch, sequential=seq, size=self._size)
        self.contented.add(index)
        self.on_event(RegionEvent("content", index, reg, region_block(reg, index)))

    def _last_events(self, page: Page) -> None:
        """Events the finished page has that did not go out while it ran (a region only the end of the
        stream closed, content of a branch that never finished), from the page itself."""
        for i, reg in enumerate(page.regions):
            if i not in self.announced:
                self.on_event(RegionEvent("region", i, reg))
            if i not in self.contented:
                self.contented.add(i)
                self.on_event(RegionEvent("content", i, reg, region_block(reg, i)))

    def _first_branch_token(self, branch: int, sent: float, engine_first_s: float | None) -> None:
        now = time.perf_counter()
        # a final-only branch (stream=False) arrives whole: the engine says when its first token was
        first = now if engine_first_s is None else min(now, sent + engine_first_s)
        self.fork_latency[branch] = max(0.0, first - self.closed_at.get(branch, sent))

    def _spawn(self, f: ForkAction) -> None:
        if self.closing:
            return
        if f.attempt == 0:
            self.closed_at[f.index] = time.perf_counter()  # the delta that closed the region just arrived
        forced = None
        first = self.inp.forced_first_attempt
        if f.attempt == 0 and first is not None and f.index in first:
            forced = first[f.index]
        elif self.inp.forced_branches is not None and f.index < len(self.inp.forced_branches):
            forced = self.inp.forced_branches[f.index]
        prio = self._priority(branch=True)
        cfg = self.cfg
        stream = cfg.stream_branches or cfg.branch_stream_interval > 0
        interval = None if cfg.stream_branches or not cfg.branch_stream_interval else cfg.branch_stream_interval
        rid = f"{self.run_id}/b{f.index}" + (f".r{f.attempt}" if f.attempt else "")
        req = self._request(rid, f.prompt_ids, forced, prio, stream, stream_interval=interval, attempt=f.attempt,
                            stream_no=f.index)
        self.tasks.append(asyncio.create_task(self._admitted(req, f.index, self._draft(f))))

    def _draft(self, f: ForkAction) -> tuple[int, ...]:
        """Branch ``f``'s draft from the page's text layer: its first attempt, in fork mode, a trusted layer,
        a region whose content is text (not a table's HTML or a formula's LaTeX, which no text layer writes)."""
        if f.attempt or self.mode != "fork" or self.text_layer != USED or self.cfg.attempt_temperature(0) > 0:
            return ()  # a re-fork, or sampling: a draft is checked against the greedy choice only
        mp = self.model_protocol
        region = assemble_region(mp.vocab, mp.tokenizer, f.region, None, size=self._size)
        if region.content_format != "text":
            return ()
        return draft_ids(mp.vocab, mp.tokenizer, region, self.inp.text_layer)

    def _accepted(self, branch: int, drafted_tokens: int, acc: Accepted) -> None:
        self.drafts[branch] = (drafted_tokens, acc.agreed)

    def _spawn_main(self, retry: MainRetry) -> None:
        """The main stream again, from its last closed region (a forced trace continues from there)."""
        if self.closing:
            return
        forced = self.inp.forced_main
        if forced is not None:
            forced = forced[retry.boundary:]
        main = self._request(f"{self.run_id}/main.r{retry.attempt}", retry.prompt_ids, forced,
                             self._priority(branch=False), attempt=retry.attempt, stream_no=-1)
        if self.cfg.constrain_layout and self.mode == "fork":
            # the grammar counts regions from the request's start: allow what is left
            left = max(0, self.cfg.max_branches - len(self.state.branches) - len(self.state.skipped))
            main = dataclasses.replace(main, constrain_layout_regions=left)
        self.tasks.append(asyncio.create_task(self._consume(main, None)))

    async def _admitted(self, req: GenRequest, branch: int, draft: Sequence[int] = ()) -> None:
        if self.admission is None:
            return await self._consume(req, branch, draft)
        async with self.admission:
            return await self._consume(req, branch, draft)

    async def _wait(self) -> None:
        stopper = asyncio.create_task(self.stop.wait())
        try:
            while not self.stop.is_set():
                pending = [t for t in self.tasks if not t.done()]
                if not pending:
                    break
                await asyncio.wait([*pending, stopper], return_when=asyncio.FIRST_COMPLETED)
                for t in self.tasks:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise t.exception()
        finally:
            stopper.cancel()

    async def _cleanup(self) -> None:
        self.closing = True
        for t in self.tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.live:
            await self.engine.abort(sorted(self.live))
            self.live.clear()

    async def run(self) -> PageRecord:
        st = self.state
        main = self._request(f"{self.run_id}/main", st.prompt_ids, self.inp.forced_main, self._priority(branch=False))
        if self.cfg.constrain_layout and self.mode == "fork":  # the layout grammar (engine.layout_constraint)
            main = dataclasses.replace(main, constrain_layout_regions=self.cfg.max_branches)
        self.tasks.append(asyncio.create_task(self._consume(main, None)))
        try:
            async with asyncio.timeout(self.cfg.deadline_s):
                await self._wait()
        except TimeoutError:
            st.flag(PageStatus.DEADLINE, f"page deadline of {self.cfg.deadline_s}s passed")
        except EngineDeadError:
            await asyncio.shield(self._cleanup())
            raise
        except EngineError as e:
            st.flag(PageStatus.ENGINE_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - any other failure is this page's, not the engine's
            logger.exception("page %s: unexpected error", self.inp.page_id)
            st.flag(PageStatus.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
        except asyncio.CancelledError:
            st.flag(PageStatus.CANCELLED, "page cancelled")
            await asyncio.shield(self._cleanup())
            raise
        await self._cleanup()
        rec = self._record()
        if self.on_event is not None:
            self._last_events(rec.page)
        return rec

    # ---- result ----------------------------------------------------------------------------------
    def _record(self) -> PageRecord:
        st, inp, vocab = self.state, self.inp, self.model_protocol.vocab
        regions = st.finish()
        kw = dict(width=inp.width, height=inp.height, page_no=inp.page_no, image_path=inp.image_path)
        if self.mode == "fork":
            parsed: list[ParsedBranch | None] = []
            for r in regions:
                if r.index in st.skipped:
                    parsed.append(ParsedBranch([], True, []))
                elif r.index in st.branches:
                    parsed.append(parse_branch(vocab, st.branches[r.index].tokens))
                else:
                    parsed.append(None)
            page = assemble_page(vocab, self.model_protocol.tokenizer, regions, st.parser.error_codes, parsed, **kw)
            br = [st.branches[i] for i in sorted(st.branches)]
            depth = depth_from_trace(len(st.main.tokens), [regions[i].fork_point for i in sorted(st.branches)],
                                     [len(b.tokens) for b in br])
        else:
            page = assemble_page(vocab, self.model_protocol.tokenizer, regions, st.parser.error_codes, None, **kw)
            br = []
            d = decode_depth([vocab.layout_tokens(r) for r in regions], [len(r.content_ids) for r in regions])
            # F_seq is what the stream really took; F_PaDoc what the same regions would take forked
            depth = DecodeDepth(f_seq=len(st.main.tokens), f_padoc=min(d.f_padoc, len(st.main.tokens)))
        if self.mode == "fork":
            region_finish = [(status.REGION_SKIPPED if r.index in st.skipped else
                              st.branches[r.index].finish_reason if r.index in st.branches else None) for r in regions]
            region_tokens = [st.region_tokens(r.index) for r in regions]
            region_attempts = [st.attempts.get(r.index, 0) for r in regions]
            region_end = [(status.REGION_SKIPPED if r.index in st.skipped else st.finish_of.get(r.index))
                          for r in regions]
        else:
            region_finish = [None] * len(regions)
            region_tokens = [len(r.content_ids) for r in regions]
            region_attempts = [0] * len(regions)
            region_end = [None] * len(regions)
        reasons = {"main": st.main.finish_reason}
        reasons.update({f"b{i}": st.branches[i].finish_reason for i in sorted(st.branches)})
        valid = (st.status == PageStatus.OK and not page.errors
                 and all(r == "stop" for r in reasons.values()))
        streams = [st.main, *br]
        return PageRecord(
            page_id=inp.page_id, mode=self.mode, status=st.status.label, valid=valid, page=page,
            message="; ".join(st.messages), e2e_s=time.perf_counter() - self.t0, ttft_s=self.ttft,
            layout_s=self.main_done, n_branches=len(br), branch_tokens=[len(b.tokens) for b in br],
            branch_prompt_tokens=[b.prompt_tokens or 0 for b in br],
            branch_cached_tokens=[b.cached_tokens or 0 for b in br],
            main_tokens=len(st.main.tokens),
            output_tokens=sum(len(s.tokens) for s in streams) + st.discarded_tokens,
            prompt_tokens=sum(s.prompt_tokens or 0 for s in streams) + st.discarded_prompt_tokens,
            cached_tokens=sum(s.cached_tokens or 0 for s in streams) + st.discarded_cached_tokens,
            f_seq=depth.f_seq, f_padoc=depth.f_padoc, finish_reasons=reasons,
            region_finish_reasons=region_finish, region_tokens=region_tokens,
            region_attempts=region_attempts, region_finish=region_end, retries=st.retries,
            layout_retries=st.main_attempt, retry_outcomes=[st.outcomes[i] for i in sorted(st.outcomes)],
            fork_latency_s=[self.fork_latency[i] for i in sorted(self.fork_latency)],
            injected_loops=len(inp.forced_first_attempt or ()), engine_s=self.engine_s,
            family=vocab.family,
            unknown_categories=[r.label or r.category for r in regions if not vocab.known_category(r)],
            text_layer=self.text_layer,
            region_draft_tokens=[self.drafts.get(r.index, (0, 0))[0] for r in regions],
            region_accepted_tokens=[self.drafts.get(r.index, (0, 0))[1] for r in regions],
        )


async def run_page(engine: Engine, model_protocol, inp: PageInput, *, mode: str = "fork",
                   cfg: SchedulerConfig | None = None, admission: asyncio.Semaphore | None = None,
                   on_event: EventSink | None = None, meter: EngineMeter | None = None) -> PageRecord:
    """Parse one page. ``model_protocol`` provides ``vocab``, ``tokenizer`` and ``prompt_ids(mode)``
    (e.g. :class:`padoc_ray.tokenizer.ModelProtocol`). ``admission``, shared by every page on
    one engine, caps the branches live in it at once (see :func:`branch_admission`). Page-level
    failures come back as the record's status; only :class:`EngineDeadError` and cancellation
    propagate. ``on_event`` receives the page's :class:`RegionEvent` s as they happen, all of them
    before this returns. ``meter`` splits the engine's busy time among its requests (the record's
    ``engine_s``); every page on one engine must share the engine's one meter, as
    :class:`~padoc_ray.host.PageHost` does (None: a meter of the page's own, right only for a page alone on
    its engine)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
    return await _Page(engine, model_protocol, inp, mode, cfg or SchedulerConfig(), admission, on_event,
                       meter).run()


def branch_admission(max_live_branches: int | None) -> asyncio.Semaphore | None:
    """A cap on content branches live in one engine across all its pages (None: no cap). Under
    load, fewer live branches make each engine step cheaper, so pages with few regions finish
    sooner; branches wait for a slot in fork order."""
    return asyncio.Semaphore(max_live_branches) if max_live_branches else None
