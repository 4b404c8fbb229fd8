"""The soak benchmark's processes: ``padoc-ray serve`` as a subprocess, and the RSS of the Serve
application's processes, sampled in a thread.

Which processes: ``padoc-ray serve`` starts its own local Ray, so the Ray session's processes are
its descendants (it starts the GCS and the raylet; the raylet starts the workers). Among them, the
Serve application is the workers whose process title (Ray's ``setproctitle``, psutil's
``cmdline()[0]``) is ``ray::ServeController...``, ``ray::ProxyActor...`` or
``ray::ServeReplica:<app>:<deployment>...``, plus the processes those start (the ingress replica's
renderer processes). Ray's own daemons (GCS, raylet, dashboard agents, log monitor) and idle
workers (``ray::IDLE``) are not the application and are left out. A replica's children are one
series, the sum of their RSS (``<replica>/children <replica pid>``): renderers are replaced (after
a crash, a cancelled document, ``recycle_after_pages``), so one renderer's own series is too short
to have a slope, while their sum is what a leak there would grow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence

from padoc_ray.bench.serving.http import _free_port
from padoc_ray.bench.soak.report import RssSeries

#: the Ray worker titles that belong to the Serve application
APP_TITLES = ("ServeController", "ProxyActor", "ServeReplica")


def process_label(cmdline: Sequence[str], parent_label: str | None = None) -> str | None:
    """The label a process is reported under, from its command line (its process title for a Ray
    worker) and its parent's label; None: not part of the Serve application."""
    title = cmdline[0] if cmdline else ""
    if title.startswith("ray::"):
        name = title[5:].split(" ")[0].split(".")[0]  # ray::ServeController.listen_for_change -> ServeController
        return name if name.startswith(APP_TITLES) else None
    if parent_label and parent_label.startswith("ServeReplica"):
        return f"{parent_label}/children"
    return None


def app_processes(root_pid: int) -> dict[str, list]:
    """``{"<label> <pid>": [psutil.Process, ...]}``: the serve process (``serve``), each Serve
    application process among its descendants, and each replica's children under one key with the
    replica's pid (see the module docstring)."""
    import psutil

    root = psutil.Process(root_pid)
    out: dict[str, list] = {f"serve {root_pid}": [root]}
    labels: dict[int, str | None] = {root_pid: None}
    try:
        procs = root.children(recursive=True)  # parents come before their children
    except psutil.Error:
        return out
    for p in procs:
        try:
            ppid = p.ppid()
            label = process_label(p.cmdline(), labels.get(ppid))
        except psutil.Error:
            continue
        labels[p.pid] = label
        if not label:
            continue
        key = f"{label} {ppid}" if label.endswith("/children") else f"{label} {p.pid}"
        out.setdefault(key, []).append(p)
    return out


class RssSampler:
    """Every ``interval_s``, the RSS of every :func:`app_processes` process (processes that appear
    later get their own series from then on); ``t`` is seconds since :meth:`start`."""

    def __init__(self, root_pid: int, interval_s: float = 10.0):
        self.root_pid, self.interval_s = root_pid, interval_s
        self.series: dict[str, RssSeries] = {}
        self.seen: dict[int, object] = {}  # every process ever sampled, to check none is left behind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-rss", daemon=True)

    def start(self) -> "RssSampler":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def sample(self) -> None:
        import psutil

        t = time.monotonic() - self.t0
        for name, procs in app_processes(self.root_pid).items():
            rss = n = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    continue
                n += 1
                self.seen[p.pid] = p
            if n:
                s = self.series.setdefault(name, RssSeries(name))
                s.samples.append((round(t, 2), float(rss)))
                s.max_processes = max(s.max_processes, n)

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> list[RssSeries]:
        self._stop.set()
        self._thread.join()
        self.sample()  # the last point: the end of the traffic
        return list(self.series.values())


class ServeProcess:
    """``padoc-ray serve`` in a session of its own on a free 127.0.0.1 port with a fresh bearer
    token (PADOC_RAY_API_TOKEN); its output goes to files in a temporary folder (with its job store).
    ``flags``: the serve flags after ``--model``/``--port``/``--job-store``."""

    def __init__(self, model: str, flags: Sequence[str], ready_timeout_s: float = 900.0):
        self.token = uuid.uuid4().hex
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = ["--model", model, *flags]
        self.ready_timeout_s = ready_timeout_s
        self.tmp = tempfile.TemporaryDirectory(prefix="padoc-soak-")
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    def start(self) -> "ServeProcess":
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ, PADOC_RAY_API_TOKEN=self.token, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.pop("RAY_ADDRESS", None)  # its own local Ray, never one someone else started
        cmd = [sys.executable, "-m", "padoc_ray.cli", "serve", *self.flags, "--port", str(self.port),
               "--job-store", os.path.join(self.tmp.name, "jobs")]
        self._out = open(os.path.join(self.tmp.name, "serve.out"), "w")
        self._err = open(os.path.join(self.tmp.name, "serve.err"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL)
        end = time.monotonic() + self.ready_timeout_s
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"padoc-ray serve exited with {self.proc.returncode} before /readyz answered: "
                                   f"{self.log_tail()}")
            if time.monotonic() > end:
                raise RuntimeError(f"{self.url}/readyz did not answer 200 within {self.ready_timeout_s:g} s: "
                                   f"{self.log_tail()}")
            time.sleep(1.0)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, n: int = 3000) -> str:
        with open(os.path.join(self.tmp.name, "serve.err"), errors="replace") as f:
            return f.read()[-n:]

    def stop(self, seen: Sequence[object] = (), timeout_s: float = 120.0) -> dict:
        """SIGTERM, then (past ``timeout_s``) SIGKILL to its session. Returns its exit code, whether
        it stopped on SIGTERM, and the ``seen`` processes (psutil) still alive after it (then killed)."""
        import psutil

        clean = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                clean = False
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.returncode = self.proc.returncode if self.proc is not None else None
        left = []
        for p in seen:
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.cmdline()[:1]} {p.pid}")
                    p.kill()
        return {"exit_code": self.returncode, "stopped_on_sigterm": clean, "processes_left": left}

    def close(self) -> None:
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None:
                f.close()
        self.tmp.cleanup()
