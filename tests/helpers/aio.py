"""An asyncio event loop on a daemon thread, for synchronous callers of async code.

Ray Data UDFs, tests and CLI commands are synchronous; the engine and the scheduler are async. A
:class:`LoopThread` owns one loop for the life of its owner, so one engine can serve many calls.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "padoc-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """``coro``'s result; past ``timeout`` s, TimeoutError, and ``coro`` is cancelled (a call that timed
        out must not go on running into the calls after it)."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
