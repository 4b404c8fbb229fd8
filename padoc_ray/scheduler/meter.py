"""Engine time per request: the engine's busy time, split among the requests in it.

One :class:`EngineMeter` per engine, shared by every page that runs on it (the page runner tells it
when each request enters the engine and when it leaves). The engine is *busy* while at least one
request is in it. Each request's **share** is, interval by interval, that interval's length divided
by the number of requests in the engine during it: equal per sequence, the way one decode step's
cost is spread over the sequences of its batch. A page's engine time is the sum of its requests'
shares, so the shares of all requests add up to the busy time exactly (up to float rounding),
whatever the overlap, and idle time (no request in the engine) is nobody's.

What "in the engine" means, from the host's side: from the moment the request is submitted to the
moment its final output arrives or it is aborted. That includes a request waiting in the engine's
own queue (past ``max_num_seqs`` or the token budget) and its prefill, weighted like a decoding
sequence: the engine does not say which sequences a step scheduled, nor how many tokens each (a
branch that takes only its final output reports nothing in between), so the split is per live
sequence, not per scheduled token.

Pure: no ray, vllm or torch; the clock is injectable (tests script it).
"""

from __future__ import annotations

import time
from typing import Callable


class EngineMeter:
    """Tracks the requests in one engine and each one's share of the engine's busy time.

    Shares are kept in O(1) per event: ``_per_seq`` is the running integral of ``dt / live``
    (seconds of engine time one sequence present all along would have been charged), and a
    request's share is its value at the request's end minus its value at its start."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._live: dict[str, float] = {}  # request id -> _per_seq when it entered
        self._per_seq = 0.0
        self._busy = 0.0
        self._last = 0.0  # the clock at the last change of the live set

    def _advance(self) -> None:
        now = self.clock()
        if self._live:
            dt = max(0.0, now - self._last)  # a clock that stepped back charges nothing
            self._busy += dt
            self._per_seq += dt / len(self._live)
        self._last = now

    def begin(self, request_id: str) -> None:
        """``request_id`` entered the engine (it is about to be submitted)."""
        if request_id in self._live:
            raise ValueError(f"request {request_id} is already in the engine meter")
        self._advance()
        self._live[request_id] = self._per_seq

    def end(self, request_id: str) -> float:
        """``request_id`` left the engine (finished, failed or aborted); returns its share in seconds."""
        if request_id not in self._live:
            raise ValueError(f"request {request_id} is not in the engine meter")
        self._advance()
        return self._per_seq - self._live.pop(request_id)

    @property
    def live(self) -> int:
        """Requests in the engine now."""
        return len(self._live)

    def busy_s(self) -> float:
        """Seconds the engine has had at least one request in it, up to now."""
        if not self._live:
            return self._busy
        return self._busy + max(0.0, self.clock() - self._last)
