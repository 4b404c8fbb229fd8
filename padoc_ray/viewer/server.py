"""Run the viewer: uvicorn in the foreground, its URL printed once it answers, a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request


def run(app, host: str, port: int, *, announce=print) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (uvicorn's handlers: requests in flight finish; then it
    returns). Once
    ``GET /`` answers, ``announce`` gets the URL (with the real port when ``port`` is 0)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))

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
