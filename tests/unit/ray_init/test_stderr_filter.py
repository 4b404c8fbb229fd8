"""The driver's stderr filter: drops exactly the known-noise lines, forwards the rest, never blocks."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, re, sys
sys.path.insert(0, {root!r})
from padoc_ray.ray_init import KNOWN_NOISE, filter_stderr
filter_stderr(KNOWN_NOISE)
noise = (b"[2026-11-30 13:30:38,464 E 4837 4837] core_worker.cc:2465: Actor with class name: "
         b"'MapWorker(MapBatches(EngineStage))' and ID: '05526d12666b1398123af84801000000' has constructor "
         b"arguments in the object store and max_restarts > 0. If the arguments go out of scope...\n")
os.write(2, b"before\n" + noise + b"after\n")
print("from python", file=sys.stderr)
for i in range({n}):
    os.write(2, b"x" * 1000 + b"\n")
print("done", flush=True)
"""


def _run(n: int, **kw):
    import os

    from tests.conftest import ROOT as root
    return subprocess.run([sys.executable, "-c", SCRIPT.format(root=root, n=n)], timeout=60, **kw)


def test_known_noise_is_dropped_and_everything_else_forwarded():
    out = _run(0, capture_output=True)
    assert out.returncode == 0
    assert out.stderr == b"before\nafter\nfrom python\n" and out.stdout == b"done\n"


def test_a_closed_stderr_never_blocks_the_process():
    """With the reader of stderr gone, writing far more than a pipe holds must still finish."""
    import os

    r, w = os.pipe()
    os.close(r)  # nobody will ever read the real stderr
    out = _run(500, stdout=subprocess.PIPE, stderr=w)
    os.close(w)
    assert out.returncode == 0 and out.stdout == b"done\n"
