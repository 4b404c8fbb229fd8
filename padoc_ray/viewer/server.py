"""Run the viewer: uvicorn in the foreground, its URL printed once it answers, a clean stop on SIGINT/SIGTERM,
and a deadline for each request head (:func:`with_header_deadline`)."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request


def with_header_deadline(base: type, seconds: float) -> type:
    """``base`` (a uvicorn HTTP protocol class) with a deadline on request heads: a connection that has not
    sent a whole request head ``seconds`` after it opened, or after its last response, is closed.

    uvicorn arms no timer before a request's head is complete (its keep-alive timer starts after a
    response and stops at the first byte of the next request), so a client that sends half a head and
    then nothing holds its connection, and a descriptor, until it goes away."""

    class HeaderDeadline(base):
        _head_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_late, self.cycle)

        def _head_late(self, armed) -> None:
            # no request began since the timer was armed, and none is being answered: cut the connection off
            if self.cycle is armed and (armed is None or armed.response_complete) and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def run(app, host: str, port: int, *, announce=print, header_timeout_s: float = 10.0) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (uvicorn's handlers: requests in flight finish; then it
    returns). Once ``GET /`` answers, ``announce`` gets the URL (with the real port when ``port`` is 0).
    A connection gets ``header_timeout_s`` to send each request head (:func:`with_header_deadline`)."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if header_timeout_s <= 0:
        raise ValueError(f"--header-timeout-s must be positive, got {header_timeout_s}")
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                            http=with_header_deadline(H11Protocol, header_timeout_s))
    server = uvicorn.Server(config)

    def watch():
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.05)
        real = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://{host if ':' not in host else f'[{host}]'}:{real}/"
        for _ in range(200):
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        announce(url)
                        return
            except OSError:
                time.sleep(0.05)

    threading.Thread(target=watch, name="viewer-announce", daemon=True).start()
    # uvicorn handles SIGINT/SIGTERM while it runs, then raises the signal again to the handler it found:
    # let that one be a no-op, so a stop we were asked for ends the command normally (exit 0)
    before = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for s, h in before.items():
            signal.signal(s, h)
