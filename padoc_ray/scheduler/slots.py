"""Page slots: how many pages an engine host runs at once, handed out lowest priority first
(:class:`PrioritySlots`; :class:`padoc_ray.host.PageHost` holds one of ``HostConfig.pages_in_flight``
slots). Pure asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools


class PrioritySlots:
    """``n`` slots; waiters get them lowest ``priority`` first, then in arrival order. A waiter
    cancelled while it waits leaves the queue; a slot granted to it at that moment is handed on."""

    def __init__(self, n: int):
        self.free = n
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0):
        if self.free > 0 and not self._waiters:
            self.free -= 1
        else:
            fut = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, (priority, next(self._arrivals), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self.free += 1
        while self.free > 0 and self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():  # a cancelled waiter's future is done: skip it
                self.free -= 1
                fut.set_result(None)
