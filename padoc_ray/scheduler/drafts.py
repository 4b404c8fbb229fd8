"""Drafts for content branches: a branch's expected text checked in one prefill, then decoded on.

A *draft* is what a branch is expected to generate, e.g. a region's characters from the PDF's text
layer, tokenized. The engine checks it in one prefill of the branch prompt + the draft
(:meth:`Engine.verify <padoc_ray.engine.interface.DraftCheck>`: the model's greedy token at every draft
position). The branch takes the longest prefix of the draft on which the model's greedy choice agrees,
plus the model's own token at the first disagreement (or after the whole draft), and decodes on from
there as usual. Under greedy decoding the branch's tokens are exactly those it would have decoded
alone; the agreed tokens cost one prefill, not one engine step each. A position the engine could not
check (``None``: its previous position came from the prefix cache) ends the agreement: a draft is
never taken on trust.

Teacher-forced requests (``--replay``) are checked against their trace: the truth is a model that reads
perfectly, so the agreement is what a reading model would accept of this draft. The engine still does
the check's work: the branch goes on with one request whose prompt holds the agreed tokens (their
prefill stands for the check's) and which is forced through the rest of the trace.

:func:`accept` is the decision (pure); :func:`drafted` runs it against an engine and yields the
branch's deltas as :meth:`Engine.generate` would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

from padoc_ray.engine.interface import DraftCheck, GenDelta, GenRequest
from padoc_ray.protocol.page import Page, Region
from padoc_ray.protocol.text_layer import TextLayer, region_text

#: tokens of one draft at most: a hostile text layer (a million characters in one box) costs one bounded
#: prefill, and a region longer than this still gets its first part from the draft
MAX_DRAFT_TOKENS = 512


@dataclass(frozen=True)
class Accepted:
    """What a branch takes from a checked draft."""

    tokens: tuple[int, ...]  #: the tokens taken as generated: the agreed draft prefix, then the model's token
    agreed: int  #: how many draft tokens were accepted (``tokens`` may hold one more: the model's own)
    #: the taken tokens end the branch: the model's token is a stop token, or the token limit is reached
    finish_reason: str | None = None


def accept(draft: Sequence[int], check: DraftCheck, *, stop_ids: Sequence[int] = (), limit: int | None = None
           ) -> Accepted:
    """The longest prefix of ``draft`` on which ``check.greedy`` agrees, then the model's token there
    (its disagreeing token, or ``check.next_token`` after a whole draft); none after a position the
    engine could not check. At most ``limit`` tokens; a stop token ends the branch where it stands."""
    if len(check.greedy) != len(draft):
        raise ValueError(f"the check covers {len(check.greedy)} positions of a {len(draft)}-token draft")
    agreed = 0
    while agreed < len(draft) and check.greedy[agreed] is not None and check.greedy[agreed] == draft[agreed]:
        agreed += 1
    own = check.greedy[agreed] if agreed < len(draft) else check.next_token  # None: not known
    tokens = list(draft[:agreed]) + ([own] if own is not None else [])
    stop = set(stop_ids)
    for i, t in enumerate(tokens):  # a draft holds no stop token, but a check may say the branch ends here
        if t in stop:
            return _limited(tokens[:i + 1], min(agreed, i + 1), "stop", limit)
    return _limited(tokens, agreed, None, limit)


def _limited(tokens: list[int], agreed: int, reason: str | None, limit: int | None) -> Accepted:
    if limit is not None and len(tokens) >= limit:
        return Accepted(tuple(tokens[:limit]), min(agreed, limit), reason if len(tokens) == limit and reason
                        else "length")
    return Accepted(tuple(tokens), agreed, reason)


def draft_ids(vocab, tokenizer, region: Region, layer: TextLayer, limit: int = MAX_DRAFT_TOKENS) -> tuple[int, ...]:
    """The tokens ``region``'s branch would generate if it wrote the text layer's characters in its box
    (:func:`~padoc_ray.protocol.text_layer.region_text`), as the checkpoint's family writes a branch
    (its own serializer, without the branch's start and end tokens); at most ``limit``."""
    text = region_text(layer, region.box, max_chars=8 * limit)
    if not text:
        return ()
    (branch,) = vocab.serialize_fork(tokenizer, Page(1000, 1000, (dataclasses.replace(region, content=text),))).branches
    ids = list(branch)
    if ids and ids[0] == vocab.branch_start:
        ids = ids[1:]
    if ids and ids[-1] == vocab.end_of_stream:
        ids = ids[:-1]
    return tuple(ids[:limit])


def truth_check(trace: Sequence[int], draft: Sequence[int]) -> DraftCheck:
    """The check a perfect reader gives: the teacher-forced ``trace`` at every draft position (None past
    its end: a forced request generates nothing more)."""
    n = len(trace)
    return DraftCheck(greedy=tuple(trace[k] if k < n else None for k in range(len(draft))),
                      next_token=trace[len(draft)] if len(draft) < n else None)


async def drafted(engine, req: GenRequest, draft: Sequence[int],
                  on_accept: Callable[[Accepted], None] | None = None) -> AsyncIterator[GenDelta]:
    """``engine.generate(req)``'s deltas, with ``draft`` checked first: one delta with the accepted tokens
    (the check's prompt and cache counts), then the continuation's deltas (prompt + accepted tokens,
    the rest of the token budget; a forced request the rest of its trace). An empty draft, or an engine
    without ``verify``, decodes as usual. ``on_accept`` hears what was accepted, before the first delta."""
    forced = req.forced_tokens
    if not draft or (forced is None and not hasattr(engine, "verify")):
        async for d in engine.generate(req):
            yield d
        return
    if forced is not None:  # replay: the truth checks; the agreed tokens go to the engine as prompt (a prefill)
        acc = accept(draft, truth_check(forced, draft), stop_ids=req.stop_token_ids, limit=req.generation_limit)
        acc = Accepted(acc.tokens[:acc.agreed], acc.agreed, "length" if acc.agreed >= req.generation_limit else None)
        if on_accept is not None:
            on_accept(acc)
        async for d in _go_on(engine, req, acc):
            yield d
        return
    check = await engine.verify(req, draft)
    if check.greedy[0] is None:
        # the branch prompt ends on a block boundary and came whole from the cache: no logits were computed
        # for the draft's first position. One decode step says the model's token there; the rest of the
        # check was computed after the draft's first token, so it holds if the model agrees with that one
        first = await _one_token(engine, req)
        check = dataclasses.replace(check, greedy=(first, *check.greedy[1:]))
    acc = accept(draft, check, stop_ids=req.stop_token_ids, limit=req.generation_limit)
    if on_accept is not None:
        on_accept(acc)
    yield GenDelta(req.request_id, list(acc.tokens), finished=acc.finish_reason is not None,
                   finish_reason=acc.finish_reason, num_prompt_tokens=check.num_prompt_tokens,
                   num_cached_tokens=check.num_cached_tokens)
    if acc.finish_reason is None:
        async for d in _go_on(engine, req, acc, announced=True):
            yield d


async def _go_on(engine, req: GenRequest, acc: Accepted, announced: bool = False) -> AsyncIterator[GenDelta]:
    """The branch after its accepted tokens: one request of the prompt + them, the rest of the budget
    (a forced request the rest of its trace). Unless ``announced``, the accepted tokens go out first,
    with the request's first delta (and its prompt and cache counts)."""
    n = len(acc.tokens)
    if acc.finish_reason is not None:  # the budget is spent: nothing to ask the engine
        yield GenDelta(req.request_id, list(acc.tokens), finished=True, finish_reason=acc.finish_reason)
        return
    forced = req.forced_tokens
    rest = dataclasses.replace(req, prompt_ids=[*req.prompt_ids, *acc.tokens], max_tokens=req.max_tokens - n,
                               forced_tokens=list(forced[n:]) if forced is not None else None)
    first = not announced
    async for d in engine.generate(rest):
        if first:
            d = dataclasses.replace(d, token_ids=[*acc.tokens, *d.token_ids])
            first = False
        yield d


async def _one_token(engine, req: GenRequest) -> int | None:
    """The model's next token after ``req``'s prompt (one decode step; None if it gave none)."""
    got: list[int] = []
    async for d in engine.generate(dataclasses.replace(req, max_tokens=1)):
        got.extend(d.token_ids)
    return got[0] if got else None
