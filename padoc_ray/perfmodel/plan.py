"""What the real scheduler asks of the engine for one page: its requests and what starts each one.

:func:`plan_page` feeds a page's forced streams (:class:`~.trace.ModeTrace`) to the real
:class:`~padoc_ray.scheduler.state.PageState` the way the runner does (the main stream one token per
engine step; a branch in chunks of ``branch_stream_interval`` tokens, one token with
``stream_branches``, whole when 0) and records the requests its decisions make: the main stream, one
branch per :class:`ForkAction` (its prompt: the action's own), re-forks and layout retries, where a
stream is stopped, and a status that ends the whole page. Teacher-forced streams are fixed, so these
decisions do not depend on timing: the plan is made once per page and mode and replayed by the engine
model (:mod:`.sim`) at every concurrency.

A branch's prompt and the part of it the prefix cache can serve follow the trace's branch shape
(:attr:`~.trace.PageTrace.branch_shape`, the modeled model's :attr:`~.gpus.ModelShape.branch_shape`):

* ``prefix-fork`` (PaDoc, HPD): the fork action's own prompt, the page prompt + the layout before the
  region's close + the branch start; all but its last token were computed by the layout stream;
* ``grounding`` (dots.ocr): the region's grounding prompt (:class:`~.trace.GroundingPrompts`), the
  image + the grounding text + its box, no layout tokens. The page's first grounding branch shares the
  chat's start and the image with the page prompt; a later one also the grounding text, which the first
  computed (the engine model serves it in full blocks, as for any shared prefix). Taken as computed
  even when the two are admitted in one step, and the grounding text's KV read is counted as the page
  prompt's (:func:`~.sim.read_kv` takes a page's shared prefix as one): a few tokens a page.

A re-fork shares its whole prompt with the attempt before it, in either shape.

A trace whose fork points differ from what PageState forks raises :class:`ForkMismatch`. Where the
runner's order of events could matter (the shared retry token budget), branches are fed in fork
order after the layout stream. Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from padoc_ray.protocol.codec import INVALID_BOX, MISSING_BRANCH, parse_branch
from padoc_ray.protocol.depth import decode_depth, depth_from_trace
from padoc_ray.scheduler.state import PageState, PageStatus, SchedulerConfig

from .trace import ModeTrace, PageTrace, TraceError


class ForkMismatch(TraceError):
    """The trace's fork points are not where the scheduler forks."""


@dataclass(frozen=True)
class RequestPlan:
    """One engine request of a page."""

    key: str  #: "main", "b3" (branch of region 3), "b3.r1" (its first re-fork), "main.r1"
    prompt_tokens: int  #: as the engine counts them (the image placeholder expanded)
    #: prompt tokens an earlier request of the page computed before this one starts (what the prefix cache can serve)
    shared_tokens: int
    output_tokens: int  #: tokens generated before it ends
    finish_reason: str  #: stop (end-of-stream), length (max_tokens) or stopped (by the scheduler)
    parent: int | None = None  #: the request whose progress starts this one (None: the page's start)
    #: ... once the parent generated this many tokens (None: when the parent ends)
    at_token: int | None = None
    image: bool = False  #: the vision encoder runs in this request's prefill


@dataclass(frozen=True)
class PagePlan:
    name: str
    mode: str
    requests: tuple[RequestPlan, ...]
    image_tokens: int
    image_at: int  #: the image's first position in the page prompt
    #: (request, generated tokens) where a status ending the whole page comes (its live requests are aborted)
    stop_page: tuple[int, int] | None
    status: str
    valid: bool
    f_seq: int
    f_padoc: int
    n_branches: int


def _chunks(n: int, cfg: SchedulerConfig) -> int:
    """How many branch tokens the runner hands PageState at once."""
    if cfg.stream_branches:
        return 1
    return cfg.branch_stream_interval or n or 1


def plan_page(trace: PageTrace, mode: str, vocab, cfg: SchedulerConfig) -> PagePlan:
    mt: ModeTrace = trace.mode(mode)
    image = trace.image_tokens
    st = PageState(vocab, mt.prompt_ids, cfg, mode)
    reqs: list[RequestPlan] = []
    stop_page: tuple[int, int] | None = None
    pending: list[tuple[object, int, int | None]] = []  # (ForkAction, parent request, at token)

    def expanded(prompt_ids) -> int:
        return len(prompt_ids) - 1 + image

    def branch_prompt(f, grounded: bool) -> tuple[int, int]:
        """(prompt tokens, of them shared with an earlier request of the page) of fork action ``f``."""
        if mt.grounding is None:  # prefix-fork: all but the branch start computed by the step that made the close
            p = expanded(f.prompt_ids)
            return p, p - 1 if f.attempt == 0 else p
        g = mt.grounding
        p = g.lengths[f.index] - 1 + image
        if f.attempt:
            return p, p
        return p, (g.text_end if grounded else g.image_end) - 1 + image

    def run_main(prompt_ids, forced, parent: int | None, key: str) -> None:
        nonlocal stop_page
        me = len(reqs)
        limit = min(len(forced), cfg.max_tokens)
        n, halted = 0, False
        for n, t in enumerate(forced[:limit], start=1):
            forks, halted = st.on_main_tokens((t,))
            for f in forks:
                if f.index >= len(mt.fork_points) or f.region.fork_point != mt.fork_points[f.index]:
                    want = mt.fork_points[f.index] if f.index < len(mt.fork_points) else "none"
                    raise ForkMismatch(f"page {trace.name}: the scheduler forks region {f.index} after "
                                       f"{f.region.fork_point} layout tokens, the trace says {want}")
                pending.append((f, me, n))
            if st.stop_all and stop_page is None:
                stop_page = (me, n)
            if halted or st.stop_all:
                break
        reason = "stopped" if halted else ("stop" if n == len(forced) else "length")
        p = expanded(prompt_ids)
        reqs.append(RequestPlan(key, p, p if parent is not None else 0, n, reason, parent, None, parent is None))
        retry = st.on_main_finished(reason, p, None)
        if retry is not None and stop_page is None:
            run_main(retry.prompt_ids, mt.main[retry.boundary:], me, f"main.r{retry.attempt}")

    run_main(mt.prompt_ids, mt.main, None, "main")
    if mode == "fork" and st.main.finish_reason == "stop":  # the layout stream ran to its end
        closed = [r.fork_point for r in st.closed]
        if closed != list(mt.fork_points):
            raise ForkMismatch(f"page {trace.name}: the layout stream closes regions after {closed} tokens, the "
                               f"trace's fork points are {list(mt.fork_points)}")
    grounded = False  # a grounding branch of the page has computed the grounding text
    while pending:
        f, parent, at = pending.pop(0)
        forced = mt.branches[f.index]
        limit = min(len(forced), cfg.max_tokens)
        step = _chunks(limit, cfg)
        n, halted = 0, False
        while n < limit and not halted:
            chunk = forced[n:n + step]
            n += len(chunk)
            halted = st.on_branch_tokens(f.index, chunk)
        reason = "stopped" if halted else ("stop" if n == len(forced) else "length")
        p, shared = branch_prompt(f, grounded)
        grounded = True
        me = len(reqs)
        key = f"b{f.index}" + (f".r{f.attempt}" if f.attempt else "")
        reqs.append(RequestPlan(key, p, shared, n, reason, parent, at))
        again = st.on_branch_finished(f.index, reason, p, None)
        if st.stop_all and stop_page is None:
            stop_page = (me, n)
        if again is not None:
            pending.append((again, me, None))
    return _finish(trace, mode, mt, st, vocab, tuple(reqs), stop_page)


def _finish(trace: PageTrace, mode: str, mt: ModeTrace, st: PageState, vocab, reqs, stop_page) -> PagePlan:
    """Status, validity and decode depths as the runner's page record has them."""
    regions = st.finish()
    errors = list(st.parser.error_codes) + [e for r in regions for e in r.errors if e != INVALID_BOX]
    reasons = [st.main.finish_reason]
    if mode == "fork":
        for r in regions:
            if r.index in st.skipped:
                continue
            if r.index not in st.branches:
                errors.append(MISSING_BRANCH)
                continue
            br = st.branches[r.index]
            errors += parse_branch(vocab, br.tokens).errors
            reasons.append(br.finish_reason)
        forked = sorted(st.branches)
        depth = depth_from_trace(len(st.main.tokens), [regions[i].fork_point for i in forked],
                                 [len(st.branches[i].tokens) for i in forked])
        f_seq, f_padoc = depth.f_seq, depth.f_padoc
    else:
        n_fields = len(vocab.spec.coordinates.region_fields) + 2
        d = decode_depth([n_fields] * len(regions), [len(r.content_ids) for r in regions])
        f_seq, f_padoc = len(st.main.tokens), min(d.f_padoc, len(st.main.tokens))
    valid = st.status == PageStatus.OK and not errors and all(r == "stop" for r in reasons) and stop_page is None
    return PagePlan(trace.name, mode, reqs, trace.image_tokens, mt.image_at, stop_page, st.status.label, valid,
                    f_seq, f_padoc, len(st.branches))


def with_drafts(plan: PagePlan, accepted_fraction: float) -> PagePlan:
    """``plan`` with text-layer drafts (:mod:`padoc_ray.scheduler.drafts`) accepted at ``accepted_fraction``
    of every branch's first attempt: that share of its tokens moves from decoding (a step each) into its
    prefill (the check's one prefill of prompt + draft), uncached; the branch still decodes at least its
    last token. Sequential plans and re-forks are unchanged (no drafts there)."""
    if not 0.0 <= accepted_fraction <= 1.0:
        raise ValueError("accepted_fraction must be in [0, 1]")
    if plan.mode != "fork" or accepted_fraction == 0:
        return plan
    reqs = []
    for r in plan.requests:
        first_attempt = r.key.startswith("b") and "." not in r.key
        moved = min(r.output_tokens - 1, round(accepted_fraction * r.output_tokens)) if first_attempt else 0
        reqs.append(replace(r, prompt_tokens=r.prompt_tokens + moved, output_tokens=r.output_tokens - moved)
                    if moved > 0 else r)
    return replace(plan, requests=tuple(reqs))
