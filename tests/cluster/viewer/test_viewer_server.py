"""The viewer as a server: a real `padoc-ray view` process (uvicorn on 127.0.0.1, a child process)
against slow clients that never finish their request head. The viewer in process:
tests/unit/viewer/test_viewer.py."""

from __future__ import annotations

import pytest

from tests.helpers import viewer_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The viewer's demo output (tests/helpers/viewer_demo.py), as tests/unit/viewer/test_viewer.py builds it."""
    return viewer_demo.build(str(tmp_path_factory.mktemp("demo")), copies=6)


def test_a_client_that_never_finishes_its_request_head_is_cut_off(demo):
    """A real `padoc-ray view` process: a client that sends half a request head and then nothing is cut off
    at --header-timeout-s (uvicorn alone keeps it open while the client lives; the review held 100 such
    connections for 120 s), a half head later in a kept-alive connection too, while whole requests are
    answered as before."""
    import socket
    import subprocess
    import sys
    import time

    from tests.conftest import _env

    proc = subprocess.Popen([sys.executable, "-m", "padoc_ray.cli", "view", demo["out"], "--port", "0",
                             "--header-timeout-s", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        line = proc.stdout.readline()
        assert line.startswith("padoc-ray view: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        port = int(line.rsplit(":", 1)[1].strip().rstrip("/"))

        def half_head(first: bytes = b"") -> tuple[bytes, float]:
            """Send ``first`` (whole requests), then half a head; (all bytes the server sent, seconds to close)."""
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(first + b"GET /api/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            t0, got = time.monotonic(), b""
            while chunk := s.recv(65536):  # b"": the server closed the connection (a timeout raises instead)
                got += chunk
            s.close()
            return got, time.monotonic() - t0

        got, waited = half_head()
        assert got == b"" and waited < 20
        got, waited = half_head(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # one answered, then half
        assert got.startswith(b"HTTP/1.1 ") and got.count(b"HTTP/1.1 ") == 1 and waited < 20
        # a whole request on a fresh connection is answered as before
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := s.recv(65536):
            body += chunk
        assert body.startswith(b"HTTP/1.1 200 ")
    finally:
        proc.kill()
        proc.wait()
    bad = subprocess.run([sys.executable, "-m", "padoc_ray.cli", "view", demo["out"], "--header-timeout-s", "0"],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert bad.returncode != 0 and "header-timeout-s" in bad.stderr and "Traceback" not in bad.stderr
