"""Fair shares of a fixed capacity: engine slots for pages, run slots for jobs. Pure asyncio.

:class:`FairGate` hands out ``capacity`` slots. Waiters queue by class (a lower class goes first:
interactive pages before job pages) and, within a class, by tenant: a freed slot goes to the next
tenant in round-robin order, so a tenant with 2,000 pages waiting and one with a single page take
turns instead of the single page waiting behind the 2,000. ``per_tenant`` caps the slots one
tenant holds at once (its further waiters are passed over until one of its slots frees), and
``class_caps`` the slots one class holds (job pages never take the whole engine).

``yield_caps`` are lower caps a class keeps while a class before it is *active*: holds or awaits a
slot, or released one less than ``yield_hold_s`` ago. On an engine whose step time grows with its
batch (any CPU; a GPU past its memory-bound range), every job page in the batch slows the
interactive pages beside it; so jobs run at ``class_caps`` while they are alone, and shrink to
``yield_caps`` (as their pages finish: none is stopped) while interactive pages come. The hold
covers the gap between one interactive request and the next, so the cap does not flap.

Cancellation-safe: a waiter that is cancelled (its client left) leaves the queue; a slot granted
to a waiter cancelled at that very moment is handed on, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from typing import AsyncIterator, Callable


class FairGate:
    def __init__(self, capacity: int, *, per_tenant: int | None = None, classes: int = 2,
                 class_caps: dict[int, int] | None = None, yield_caps: dict[int, int] | None = None,
                 yield_hold_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if per_tenant is not None and per_tenant < 1:
            raise ValueError("per_tenant must be >= 1 (or None)")
        if any(c < 1 for c in (class_caps or {}).values()) or any(c < 1 for c in (yield_caps or {}).values()):
            raise ValueError("class caps must be >= 1")
        if any(k == 0 for k in (yield_caps or {})):
            raise ValueError("class 0 goes first: it has no class to yield to")
        if yield_hold_s < 0:
            raise ValueError("yield_hold_s must be >= 0")
        self.capacity, self.per_tenant = capacity, per_tenant
        #: slots one class may hold at once (job pages: so that they never fill the engine's batch)
        self.class_caps = dict(class_caps or {})
        #: slots one class may hold while a class before it is active (see the module's doc)
        self.yield_caps = dict(yield_caps or {})
        self.yield_hold_s, self._clock = yield_hold_s, clock
        self._last_release = [float("-inf")] * classes  #: per class: when it last released a slot
        self._timer: asyncio.TimerHandle | None = None
        self.held = 0
        self._held_by: dict[str, int] = {}
        self._held_class = [0] * classes
        #: per class: tenant -> its waiters in arrival order; the OrderedDict's order is the round-robin
        self._queues: list[OrderedDict[str, deque[asyncio.Future]]] = [OrderedDict() for _ in range(classes)]

    # ---- state ----------------------------------------------------------------------------------------
    def waiting(self, klass: int | None = None) -> int:
        """Waiters of ``klass`` (all classes: None)."""
        qs = self._queues if klass is None else [self._queues[klass]]
        return sum(len(d) for q in qs for d in q.values())

    def held_by(self, tenant: str) -> int:
        return self._held_by.get(tenant, 0)

    def cap(self, klass: int) -> int | None:
        """The slots ``klass`` may hold now (None: no cap of its own)."""
        cap = self.class_caps.get(klass)
        low = self.yield_caps.get(klass)
        if low is not None and self._yielding(klass):
            return low if cap is None else min(cap, low)
        return cap

    def _yielding(self, klass: int) -> bool:
        now = self._clock()
        return any(self._held_class[k] or self.waiting(k) or now - self._last_release[k] < self.yield_hold_s
                   for k in range(klass))

    # ---- slots ----------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, klass: int = 0) -> AsyncIterator[None]:
        """``async with gate.slot(tenant, klass):`` holds one slot for the block."""
        await self.acquire(tenant, klass)
        try:
            yield
        finally:
            self.release(tenant, klass)

    async def acquire(self, tenant: str, klass: int = 0) -> None:
        if not self.waiting() and self._may_take(tenant, klass):
            self._take(tenant, klass)
            return
        fut = asyncio.get_running_loop().create_future()
        self._queues[klass].setdefault(tenant, deque()).append(fut)
        self._grant()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as we were cancelled: hand the slot on
                self.release(tenant, klass)
            else:
                self._drop(klass, tenant, fut)
            raise

    def release(self, tenant: str, klass: int = 0) -> None:
        self.held -= 1
        self._held_class[klass] -= 1
        self._last_release[klass] = self._clock()
        if self.yield_caps and klass < max(self.yield_caps):
            self._regrant_after_hold()
        left = self._held_by.get(tenant, 0) - 1
        if left > 0:
            self._held_by[tenant] = left
        else:
            self._held_by.pop(tenant, None)
        self._grant()

    # ---- inside ---------------------------------------------------------------------------------------
    def _may_take(self, tenant: str, klass: int) -> bool:
        return self.held < self.capacity and self._class_free(klass) and (
            self.per_tenant is None or self.held_by(tenant) < self.per_tenant)

    def _class_free(self, klass: int) -> bool:
        cap = self.cap(klass)
        return cap is None or self._held_class[klass] < cap

    def _regrant_after_hold(self) -> None:
        """When the hold runs out, the yielding classes' caps rise again: grant then (no slot may free
        until then to do it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # released outside a loop (tests, shutdown): the next release grants
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.yield_hold_s + 0.01, self._grant)

    def _take(self, tenant: str, klass: int) -> None:
        self.held += 1
        self._held_class[klass] += 1
        self._held_by[tenant] = self._held_by.get(tenant, 0) + 1

    def _grant(self) -> None:
        """Give free slots to waiters: lowest class first, tenants in turn within a class."""
        while self.held < self.capacity:
            picked = self._next()
            if picked is None:
                return
            q, tenant, klass = picked
            waiters = q.pop(tenant)
            fut = waiters.popleft()
            if waiters:
                q[tenant] = waiters  # to the back of the round-robin
            self._take(tenant, klass)
            fut.set_result(None)

    def _next(self) -> tuple[OrderedDict, str, int] | None:
        for klass, q in enumerate(self._queues):
            if not self._class_free(klass):
                continue
            for tenant, waiters in q.items():
                # a waiter cancelled but not yet dropped is skipped (its own handler drops it)
                while waiters and waiters[0].done():
                    waiters.popleft()
                if waiters and (self.per_tenant is None or self.held_by(tenant) < self.per_tenant):
                    return q, tenant, klass
        return None

    def _drop(self, klass: int, tenant: str, fut: asyncio.Future) -> None:
        waiters = self._queues[klass].get(tenant)
        if waiters is None:
            return
        with contextlib.suppress(ValueError):
            waiters.remove(fut)
        if not waiters:
            del self._queues[klass][tenant]
