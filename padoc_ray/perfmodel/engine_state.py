"""What the engine model (:mod:`.sim`) keeps: its requests, its pages and the KV cache's block count.

A :class:`SimRequest` is one request of a page's plan (vLLM's ``Request``, as counts: its prompt, the
tokens computed and generated so far, the KV tokens and blocks it holds); a :class:`SimPage` is one page
in flight (its requests, which ones fork from which, its prompt and cache figures for the page record);
:class:`KvBlocks` counts the KV blocks in use (vLLM's ``KVCacheManager``, as counts), with a page's shared
prefix counted once. Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

from .plan import PagePlan


class SimRequest:
    """One request of a page's plan, as the engine model tracks it."""

    __slots__ = ("page", "i", "prompt", "shared", "computed", "generated", "out", "next_at", "kids", "ki",
                 "stop_at", "img_at", "img_end", "done", "need", "kv", "pin", "own", "admitted")

    def __init__(self, page: SimPage, i: int):
        p = page.plan.requests[i]
        self.page, self.i = page, i
        self.prompt, self.shared, self.out = p.prompt_tokens, p.shared_tokens, p.output_tokens
        self.computed = self.generated = self.ki = 0
        #: KV: tokens that must be computed before it decodes (its prompt; after a preemption, prompt + output so
        #: far), tokens in the cache, of them the prefix it found cached (the page's blocks), its own blocks
        self.need, self.kv, self.pin, self.own = self.prompt, 0, 0, 0
        self.admitted = False
        #: (generated-token count, request index) of the requests it forks, in order; the next one is kids[ki]
        self.kids = page.kids[i]
        sp = page.plan.stop_page
        #: the generated-token count at which a status ends its page (None: it ends none)
        self.stop_at = sp[1] if sp is not None and sp[0] == i else None
        #: where its prompt's image starts, until the vision encoder has run on it (None: no image, or encoded)
        self.img_at = page.plan.image_at if p.image else None
        self.img_end = page.plan.image_at + page.plan.image_tokens
        self.done = False
        self.next_at = 0
        self.update_next_at()

    def update_next_at(self) -> None:
        """The next generated-token count at which something happens to this request: it forks a request,
        stops its page, or ends."""
        n = self.out
        if self.ki < len(self.kids):
            n = min(n, self.kids[self.ki][0])
        if self.stop_at is not None:
            n = min(n, self.stop_at)
        self.next_at = n

    def reaches_image(self, n: int) -> bool:
        """Whether a prefill chunk of ``n`` tokens after those computed reaches its not yet encoded image."""
        return self.img_at is not None and self.computed < self.img_end and self.computed + n > self.img_at


class SimPage:
    """One page in flight: its plan, the requests started so far and the figures of its page record."""

    __slots__ = ("plan", "kids", "end_kids", "t_start", "reqs", "live", "prompt", "cached", "stopped", "hold")

    def __init__(self, plan: PagePlan, t_start: float):
        self.plan, self.t_start = plan, t_start
        n = len(plan.requests)
        #: per request: the requests it forks while it decodes ((at token, index), sorted), and when it ends
        self.kids: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.end_kids: list[list[int]] = [[] for _ in range(n)]
        for j, r in enumerate(plan.requests):
            if r.parent is not None:
                (self.kids[r.parent].append((r.at_token, j)) if r.at_token is not None
                 else self.end_kids[r.parent].append(j))
        for k in self.kids:
            k.sort()
        self.reqs: list[SimRequest] = []
        #: requests started and not ended; prompt tokens of its admissions, and of them those found cached
        self.live = self.prompt = self.cached = 0
        self.stopped = False
        #: KV blocks of the page's shared prefix held for requests that found it cached once the request that
        #: computed it no longer holds them (ended or preempted)
        self.hold = 0


class KvBlocks:
    """The KV cache's blocks in use and their peak: each request's own blocks (``SimRequest.own``) and, once
    per page, the blocks of its shared prefix held for the requests that found it cached (``SimPage.hold``).
    ``capacity`` None: the cache never runs out (the engine counts nothing then)."""

    def __init__(self, block_size: int, capacity: int | None):
        self.block_size, self.capacity = block_size, capacity
        self.used = self.peak = 0

    def free(self) -> int:
        """Blocks left (a finite cache only)."""
        return self.capacity - self.used

    def own_blocks(self, r: SimRequest, tokens: int) -> int:
        """Blocks ``r`` needs of its own to hold ``tokens``: all but those of the prefix it found cached."""
        return -(-tokens // self.block_size) - r.pin // self.block_size

    def hold_of(self, page: SimPage, extra_pin: int = 0) -> int:
        """Blocks of the page's shared prefix that its live requests (and one with ``extra_pin`` tokens
        cached, about to be admitted) found cached, beyond what its first request (which computed them)
        still holds itself: counted once for the page."""
        B = self.block_size
        first = page.reqs[0]
        pins = max((q.pin // B for q in page.reqs[1:] if q.admitted and not q.done), default=0)
        pins = max(pins, extra_pin // B)
        return max(0, pins - (first.own if first.admitted and not first.done else 0))

    def sync_hold(self, page: SimPage) -> None:
        """Bring the page's held prefix blocks up to date."""
        h = self.hold_of(page)
        self.used += h - page.hold
        page.hold = h

    def set_own(self, r: SimRequest, blocks: int) -> None:
        """``r`` now holds ``blocks`` of its own (allocated, or 0: freed)."""
        self.used += blocks - r.own
        r.own = blocks
        if r.page.hold or (r.i == 0 and len(r.page.reqs) > 1):
            self.sync_hold(r.page)

    def release(self, page: SimPage) -> None:
        """Free every block of the page (its requests ended or were aborted)."""
        if self.capacity is None:
            return
        for q in page.reqs:
            if q.own:
                self.set_own(q, 0)
        self.sync_hold(page)
