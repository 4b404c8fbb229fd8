"""A loopback HTTP proxy in front of an S3 server (moto) that behaves like a throttling store.

Test support, not part of the package. Every request is read whole, then either forwarded to the
server (the server's answer goes back as is) or, for a share of requests, refused the way S3
refuses when it throttles: ``503 SlowDown`` with S3's XML error body, or the connection is closed
without an answer (a dropped connection). Faults hit reads and writes alike and come before the
request reaches the server, so a refused write has no effect there; only ``lose_conditional``
loses the answers of conditional writes that were applied (a lock's create or heartbeat). One request key
(method, path and query) is refused at most ``max_streak`` times in a row, so a client that retries
with the AWS standard strategy always gets through.

Everything is counted: requests by method, faults by kind, how many faulted requests came back
(retried by the client), and every forwarded request's (method, path, status), so a test can
count, e.g., how often a model file was downloaded.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b'<Message>Please reduce your request rate.</Message><RequestId>padoc-proxy</RequestId></Error>')
HOP_BY_HOP = {"connection", "expect", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class S3Proxy:
    """``with S3Proxy(upstream) as p: ... p.endpoint ...``. ``slow_down``: share of requests answered
    503 SlowDown; ``drop``: share whose connection is closed unanswered; ``seed``: the faults'
    random sequence."""

    def __init__(self, upstream: str, *, slow_down: float = 0.0, drop: float = 0.0, max_streak: int = 2,
                 seed: int = 0, delay_s: float = 0.0, delay_prefix: str = "/", lose_conditional: int = 0):
        if not (0 <= slow_down and 0 <= drop and slow_down + drop < 1):
            raise ValueError("slow_down and drop are shares of requests: >= 0, together < 1")
        u = urlparse(upstream)
        self.upstream = (u.hostname, u.port or 80)
        self.slow_down, self.drop, self.max_streak = slow_down, drop, max_streak
        #: GETs of paths under ``delay_prefix`` are answered ``delay_s`` late (a slow store)
        self.delay_s, self.delay_prefix = delay_s, delay_prefix
        #: the first ``lose_conditional`` conditional writes (If-Match / If-None-Match: a lock) are applied
        #: by the server, then their answer is lost (the connection closed): the client's retry finds
        #: its own write and fails the condition
        self.lose_conditional = lose_conditional
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  #: every request received, by method
        self.faults: Counter = Counter()  #: injected faults, by kind (slow_down, drop) and method
        self.retried = 0  #: requests that arrived again after a fault (the client retried them)
        self.forwarded: list[tuple[str, str, int, int]] = []  #: (method, path, server status, body bytes)
        self._streak: dict[str, int] = {}  # request key -> faults in a row
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----
    def start(self) -> "S3Proxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "S3Proxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stats(self) -> dict:
        with self._lock:
            return {"requests": sum(self.requests.values()), "by_method": dict(self.requests),
                    "faults": dict(self.faults), "faulted": sum(v for k, v in self.faults.items() if ":" not in k),
                    "retried": self.retried}

    def unanswered(self) -> list[str]:
        """Requests whose last try was refused and that never came back: the client gave up on them."""
        with self._lock:
            return sorted(self._streak)

    # ---- one request ----
    def _decide(self, key: str, method: str) -> str | None:
        with self._lock:
            self.requests[method] += 1
            streak = self._streak.get(key, 0)
            if streak:
                self.retried += 1
            x = self._rng.random()
            fault = None
            if streak < self.max_streak:
                if x < self.slow_down:
                    fault = "slow_down"
                elif x < self.slow_down + self.drop:
                    fault = "drop"
            if fault is None:
                self._streak.pop(key, None)
            else:
                self._streak[key] = streak + 1
                self.faults[fault] += 1
                self.faults[f"{fault}:{method}"] += 1
            return fault

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        body = _read_body(h)
        fault = self._decide(f"{h.command} {h.path}", h.command)
        if fault == "drop":
            h.close_connection = True
            try:
                h.connection.shutdown(2)  # no answer at all: the client sees a dropped connection
            except OSError:
                pass
            return
        if fault == "slow_down":
            h.send_response(503, "Slow Down")
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(SLOW_DOWN_BODY)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(SLOW_DOWN_BODY)
            return
        if self.delay_s and h.command == "GET" and h.path.startswith(self.delay_prefix):
            time.sleep(self.delay_s)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        with self._lock:
            self.forwarded.append((h.command, urlparse(h.path).path, resp.status, len(data)))
            lose = (h.command == "PUT" and self.lose_conditional > 0
                    and ("If-Match" in h.headers or "If-None-Match" in h.headers))
            if lose:
                self.lose_conditional -= 1
                self.faults["lost_answer"] += 1
                self.faults["lost_answer:PUT"] += 1
                self._streak[f"{h.command} {h.path}"] = 1
        if lose:  # applied by the server; the client never hears of it
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.send_response_only(resp.status, resp.reason)  # the server's own Date and Server headers follow
        head = h.command == "HEAD"  # its Content-Length is the object's size: passed on as is
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP and (head or k.lower() != "content-length"):
                h.send_header(k, v)
        if not head:
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # a client that hung up: nothing to report
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _read_body(h: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body (Content-Length or chunked), or None when it has none."""
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline().strip():  # trailers, then the blank line
                    pass
                return b"".join(parts)
            parts.append(h.rfile.read(size))
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else (b"" if h.command in ("PUT", "POST") else None)
