"""Render documents with deadlines and crash isolation: a poison file costs its own rows, nothing more.

:class:`IsolatedRenderer` keeps one renderer process (:mod:`padoc_ray.raster.worker`) per caller
process and streams a document's pages out of it. A renderer that crashes (pdfium can segfault)
or outlives a deadline is killed and replaced; only the document being rendered is affected:

* time is the renderer's own: the CPU time its process uses, not the wall clock, so a renderer
  that a loaded machine gives a small share of a CPU is not cut for it, and while the caller holds
  a yielded event (a consumer under backpressure) nothing is charged. A renderer that neither runs
  nor waits for a CPU for as long as its page may take is stuck, and that time counts in full;
* starting a renderer process (Python and pdfium loading) is no document's time: a process that
  is not ready within ``start_timeout_s`` (wall clock) counts as a crash;
* opening (or repairing) a document, and each page, may take ``page_timeout_s``; the page that
  overruns gets ``render_timeout`` and rendering goes on with the next page in a fresh process;
* the whole document may take its time limit: ``page_budget_s`` times its selected pages (at
  least ``page_timeout_s``), capped by ``doc_timeout_s``; pages not rendered by then get
  ``render_timeout``;
* a page whose renderer crashed is tried ``crash_tries`` times in all, then gets
  ``render_crashed``; after ``max_crashes_per_doc`` crashes the rest of the document gets
  ``render_crashed`` too; a document that cannot even be opened gets one document-level row
  with the code;
* the renderer process is replaced after ``recycle_after_pages`` pages, between documents or in
  the middle of one (the document is reopened in the fresh process and goes on where it was);
* a document whose ``cancel`` event is set (its consumer left) ends at once, mid-page too: another
  thread sets the event and calls :meth:`IsolatedRenderer.interrupt`, the renderer process is
  killed (its CPU freed now, not after the page) and the document yields nothing more; the next
  document starts a fresh process.

A page whose content would draw too many XObjects is refused before pdfium loads it
(``page_too_complex``, :class:`padoc_ray.pdf.DrawCounter`, ``RenderConfig.max_page_draws``).

:class:`~padoc_ray.raster.inprocess.InProcessRenderer` renders in the caller's process with the
same interface and no protection. What a renderer yields is :mod:`padoc_ray.raster.events`'s.
Knows nothing of Ray.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_ready
from typing import TYPE_CHECKING, Iterator

import psutil

from padoc_ray.knobs import knob, negate, none_is_zero, zero_is_none
from padoc_ray.pdf import PdfError, RenderConfig
from padoc_ray.raster.events import DocFailed, Event, Opened, PageFailed, PageRendered, Selector
from padoc_ray.status import RENDER_CRASHED, RENDER_TIMEOUT

if TYPE_CHECKING:
    from padoc_ray.raster.inprocess import InProcessRenderer

logger = logging.getLogger(__name__)

_CPU_TICK_S = 0.01  # the kernel counts CPU time in ticks: less than one tick of running or waiting to run is none
_MIN_WAIT_S = 0.01


@dataclass(frozen=True, kw_only=True)
class RendererConfig:
    """How documents are rendered. Defaults suit crawled PDFs at 1-2k pixels per page."""

    #: render in a separate process (crash and hang protection)
    isolate: bool = knob(True, flags=("--no-render-isolation",), dest="no_render_isolation", action="store_true",
                         to_field=negate, from_field=negate,
                         help="render inside the raster task's own process: no crash isolation and no time-outs (a "
                              "renderer crash then fails the whole task); for benchmarks")
    #: opening a document, or rendering one page, takes at most this (renderer CPU time; a renderer
    #: that neither runs nor waits for a CPU for this long is stuck)
    page_timeout_s: float = knob(120.0, flags=("--render-timeout",), metavar="SECONDS")
    #: all of a document's pages take at most this (None: no limit)
    doc_timeout_s: float | None = knob(600.0, flags=("--doc-timeout",), metavar="SECONDS", to_field=zero_is_none,
                                       from_field=none_is_zero, note="0: no limit")
    #: renderer seconds per selected page: a document's limit is this times its selected pages, at
    #: least page_timeout_s, at most doc_timeout_s (None: doc_timeout_s alone). A legitimate page
    #: renders in well under a second (the slowest measured: docs/batch.md, issue 27), so a 3-page document
    #: holds a raster slot for at most 120 s, not 600 s; 60 pages or more get the whole doc_timeout_s
    page_budget_s: float | None = knob(10.0, flags=("--page-render-budget",), metavar="SECONDS", to_field=zero_is_none,
                                       from_field=none_is_zero, note="0: --doc-timeout alone")
    crash_tries: int = 2  #: tries of a page whose renderer crashed, before it gets render_crashed
    max_crashes_per_doc: int = 3  #: crashes after which the rest of a document gets render_crashed
    recycle_after_pages: int = 5000  #: a fresh renderer process after this many pages (bounds leaks)
    #: address-space limit of the renderer process (0: none)
    memory_limit_mb: int = knob(8192, flags=("--render-memory-limit-mb",), metavar="MB")
    #: a fresh renderer process must say it is ready (Python started, pdfium loaded) within this; the
    #: start never counts against a document's limits. One that is not ready counts as a crash
    start_timeout_s: float = 60.0
    #: added to the renderer process's niceness (0: its parent's). The online service renders job
    #: documents at 10, so that on a busy machine the interactive requests' renderers get the CPU first
    nice: int = 0

    def __post_init__(self) -> None:
        limits = (self.page_timeout_s, self.start_timeout_s, self.doc_timeout_s, self.page_budget_s)
        if any(x is not None and x <= 0 for x in limits):
            raise ValueError("render time-outs must be > 0")
        if self.crash_tries < 1 or self.max_crashes_per_doc < 1 or self.recycle_after_pages < 1:
            raise ValueError("crash_tries, max_crashes_per_doc and recycle_after_pages must be >= 1")
        if self.memory_limit_mb < 0:
            raise ValueError("memory_limit_mb cannot be negative")
        if not 0 <= self.nice <= 19:
            raise ValueError("nice is 0..19 (a renderer never runs ahead of its parent)")

    def doc_limit_s(self, pages: int | None) -> float:
        """The renderer time a document of ``pages`` selected pages may take (None: not yet known)."""
        limit = self.doc_timeout_s if self.doc_timeout_s else float("inf")
        if pages is not None and self.page_budget_s is not None:
            limit = min(limit, max(self.page_timeout_s, self.page_budget_s * pages))
        return limit


class _Died(Exception):
    """The renderer process ended (crash, kill)."""


class _TimedOut(Exception):
    """The renderer did not answer in time (the argument says how: CPU time, or stuck)."""


class _Cancelled(Exception):
    """The document's consumer left (its ``cancel`` event is set)."""


class IsolatedRenderer:
    """Renders in a child process with deadlines; see the module doc. Not thread-safe: one per
    thread, and a long-lived thread: the child dies with the thread that started it (its
    PR_SET_PDEATHSIG follows the parent *thread*), so a short-lived thread costs a new process.
    A document's time is its renderer's CPU time (psutil reads it while an answer is waited for)."""

    def __init__(self, cfg: RendererConfig = RendererConfig()):
        self.cfg = cfg
        self._proc: subprocess.Popen | None = None
        self._ps: psutil.Process | None = None  # the same process, for its CPU time
        self._cpu_seen = 0.0  # its CPU seconds when last read
        self._cpu_charged = 0.0  # its CPU seconds charged to documents so far
        self._conn = None
        self._pages = 0  # pages rendered by the current process
        self._owner = os.getpid()  # a forked copy of this object must never talk to our renderer
        self.restarts = 0  # processes started after a crash or a time-out (for tests and logs)
        self.recycles = 0  # processes replaced after recycle_after_pages pages
        self.cancels = 0  # documents ended mid-render, their process killed, because the consumer left
        # a byte here wakes the thread waiting for the renderer (interrupt()); kept for the object's life
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        atexit.register(self.close)

    @property
    def pid(self) -> int | None:
        """The renderer process's id; None while none is running (it starts with the next document)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def interrupt(self) -> None:
        """Wake the thread rendering a document whose ``cancel`` event was set, to kill its renderer
        at once instead of after the page. Thread-safe; a wake-up when no document is cancelled is
        ignored (stale wake-ups are drained)."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # BlockingIOError: the pipe is full, so a wake-up is pending anyway
            pass

    # ---- the child process ----
    def _start(self, cancel: threading.Event | None) -> None:
        """Start a renderer process and wait until it is ready (raises _Died when it is not within
        ``start_timeout_s``, or ends first; _Cancelled when ``cancel`` is set meanwhile)."""
        from multiprocessing import Pipe

        import padoc_ray

        ours, theirs = Pipe(duplex=True)
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(padoc_ray.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "padoc_ray.raster.worker", str(theirs.fileno()), str(os.getpid()),
               str(self.cfg.memory_limit_mb), str(self.cfg.nice)]
        self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                      stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None, env=env)
        theirs.close()
        self._conn, self._pages = ours, 0
        timeout = self.cfg.start_timeout_s
        try:
            reply = self._answer(time.monotonic() + timeout, cancel)
        except _TimedOut:
            self._kill()
            raise _Died(f"the renderer process was not ready within {timeout:g} s") from None
        except _Died as e:
            raise _Died(f"the renderer process {e} before it was ready") from None
        except _Cancelled:
            self._kill()
            raise
        if reply[0] != "ready":  # the protocol is strictly ordered; anything else is a bug
            self._kill()
            raise RuntimeError(f"the renderer process said {reply[0]!r} before it was ready")
        try:
            self._ps = psutil.Process(self._proc.pid)
        except psutil.Error:
            self._ps = None  # it is gone: the next request finds out
        self._cpu_seen = 0.0
        self._cpu_charged = self._cpu()  # its start is not a document's time

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                self._proc.kill()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._ps = None, None, None

    def close(self) -> None:
        """End the renderer process (also at interpreter exit)."""
        if os.getpid() != self._owner:  # inherited through fork: the renderer is the parent's
            return
        if self._proc is not None and self._proc.poll() is None and self._conn is not None:
            try:
                self._conn.send(("exit",))
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def _send(self, msg) -> None:
        if self._proc is None:
            raise RuntimeError("no renderer process (it is started when a document is opened)")
        try:
            self._conn.send(msg)
        except OSError as e:  # BrokenPipeError: it died between two documents
            raise _Died(self._death()) from e

    def _cpu(self) -> float:
        """The renderer process's CPU seconds (user + system), as last seen when it cannot be read."""
        if self._ps is not None:
            try:
                t = self._ps.cpu_times()
                self._cpu_seen = max(self._cpu_seen, t.user + t.system)
            except psutil.Error:
                pass
        return self._cpu_seen

    def _busy(self) -> float:
        """The renderer's CPU seconds plus the seconds it spent runnable, waiting for a CPU (Linux's
        /proc/PID/schedstat): a renderer that a loaded machine starves is not stuck, one that grows
        neither is. Where the wait cannot be read, CPU seconds alone."""
        busy = self._cpu()
        if self._proc is not None:
            try:
                with open(f"/proc/{self._proc.pid}/schedstat") as f:
                    busy += int(f.read().split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                pass
        return busy

    def _runnable(self) -> bool:
        """Whether the renderer is running or queued for a CPU right now (state R in /proc/PID/stat). The
        kernel adds a queued task's wait to its schedstat only when the task gets a CPU, so a renderer that a
        loaded machine starves for longer than a check's interval shows no wait yet: its state says it."""
        if self._proc is None:
            return False
        try:
            with open(f"/proc/{self._proc.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            return False

    def _recv(self, doc: _DocState, cancel: threading.Event | None):
        """The renderer's next answer about ``doc``. Its time is the renderer's CPU time since the last
        answer, charged to the document: the wait ends with _TimedOut once that passes what the page
        (or what is left of the document) may take, or once the renderer has neither run nor waited for a
        CPU for that long (stuck: the whole budget is charged). Raises _Died or _Cancelled too."""
        budget = doc.budget()
        still_at, still = time.monotonic(), self._busy()  # when the renderer last ran or waited to run
        while True:
            used = self._cpu_seen - self._cpu_charged
            stuck_in = still_at + budget - time.monotonic()
            if used >= budget or stuck_in <= 0:
                doc.spent += budget
                self._cpu_charged = self._cpu_seen
                raise _TimedOut("of renderer CPU time" if used >= budget
                                else "stuck: neither running nor waiting for a CPU")
            # one renderer thread cannot use CPU time faster than the wall clock runs
            wait = max(min(budget - used, stuck_in), _MIN_WAIT_S)
            try:
                reply = self._answer(time.monotonic() + wait, cancel)
            except _TimedOut:
                busy = self._busy()
                if busy - still >= _CPU_TICK_S or self._runnable():
                    still_at, still = time.monotonic(), busy
                continue
            except _Died:
                doc.spent += self._cpu_seen - self._cpu_charged
                raise
            cpu = self._cpu()
            doc.spent += cpu - self._cpu_charged
            self._cpu_charged = cpu
            return reply

    def _answer(self, deadline: float, cancel: threading.Event | None):
        """The process's next message, due by ``deadline`` (monotonic clock; raises _TimedOut, _Died
        or _Cancelled)."""
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise _TimedOut()
            ready = wait_ready([self._conn, self._wake_r], wait)
            if self._wake_r in ready:
                _drain(self._wake_r)
            if cancel is not None and cancel.is_set():
                raise _Cancelled()
            if self._conn in ready:
                try:
                    return self._conn.recv()
                except (EOFError, OSError) as e:
                    raise _Died(self._death()) from e
            if not ready:
                raise _TimedOut()

    def _death(self) -> str:
        """How the child ended, in words (it is reaped and forgotten)."""
        rc = None
        if self._proc is not None:
            try:
                rc = self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        if rc is not None and rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exited with code {rc}"

    # ---- one document ----
    def render_document(self, data: bytes, name: str, select: Selector, render: RenderConfig, encoding: str, *,
                        max_frames: int | None = None, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Open ``data`` and render the pages ``select(page_count)`` names, yielding :class:`Opened`
        then one event per page (in order), or a single :class:`DocFailed` (after :class:`Opened`
        when ``select`` refused the document). ``max_frames`` caps the frames of a page image.
        The document's time limit counts its renderer's CPU time, not the time the caller holds an
        event before asking for the next. A crash, a page's time-out or a recycle ends a pass in one
        renderer process, and the next pass reopens the document in a fresh one. Once ``cancel`` is
        set (and :meth:`interrupt` called, when this thread is waiting for the renderer), the renderer
        process is killed and the document ends, yielding nothing more."""
        if cancel is not None and cancel.is_set():
            return
        doc = _DocState(self.cfg)
        clean = False
        try:
            while True:
                if self._proc is not None and self._pages >= self.cfg.recycle_after_pages:
                    self.close()
                    self.recycles += 1
                opened = yield from self._open(doc, data, name, select, max_frames, cancel)
                if opened is None:  # the renderer crashed opening it: again, in a fresh process
                    continue
                if opened and not (yield from self._stream(doc, name, render, encoding, cancel)):
                    continue  # this pass ended early: the next one reopens the document
                clean = True  # the document has ended: its events said how
                return
        except _Cancelled:  # the consumer left mid-page: the renderer is killed below, nothing more is said
            self.cancels += 1
            logger.info("rendering %s cancelled: its renderer process is killed", name)
            return
        finally:
            if not clean:  # the consumer stopped early, or an error: the child's state is unknown
                self._kill()

    def _open(self, doc: _DocState, data: bytes, name: str, select: Selector, max_frames: int | None,
              cancel: threading.Event | None) -> Iterator[Event]:
        """(Re)open the document in a live renderer (the first time: yield :class:`Opened` and select
        its pages). Returns True to stream its pages, False when the document has ended (the events
        say why), None to try again (the renderer crashed, and the document may be tried again)."""
        cfg = self.cfg
        try:
            if self._proc is None:  # a fresh process (its start is no document's time)
                self._start(cancel)
            self._send(("open", data, name, max_frames))
            reply = self._recv(doc, cancel)
        except (_Died, _TimedOut) as e:
            self._kill()
            self.restarts += 1
            if isinstance(e, _TimedOut):
                code = RENDER_TIMEOUT
                msg = doc.late() if doc.doc_bound else (
                    f"opening the document took longer than {cfg.page_timeout_s:g} s ({e}; renderer killed)")
            else:
                doc.crashes += 1
                if doc.crashes < (cfg.crash_tries if doc.todo is None else cfg.max_crashes_per_doc):
                    return None
                code = RENDER_CRASHED
                msg = f"the renderer process crashed {doc.crashes} time(s) on this document ({e})"
            if doc.todo is None:  # never opened: one row for the document
                yield DocFailed(code, msg)
            else:  # reopening after a failed page: the pages still to do
                yield from doc.rest(code, f"not rendered: {msg}")
            return False
        if reply[0] == "doc_error":
            yield DocFailed(*reply[1:])
            return False
        if doc.todo is None:
            _, count, repaired = reply
            yield Opened(count, repaired)
            try:
                doc.todo = deque(select(count))
            except PdfError as e:
                self._send(("close",))
                yield DocFailed(e.code, e.message, count)
                return False
            doc.limit_s = cfg.doc_limit_s(len(doc.todo))
        return True

    def _stream(self, doc: _DocState, name: str, render: RenderConfig, encoding: str,
                cancel: threading.Event | None) -> Iterator[Event]:
        """Stream the pages still to do from the open document. Returns True when the document has
        ended, False when a crash, a page's time-out or a recycle ended this pass with pages left."""
        cfg = self.cfg
        sent = False
        while doc.todo:
            try:
                if not sent:
                    self._send(("render", list(doc.todo), render, encoding))
                    sent = True
                reply = self._recv(doc, cancel)
            except _TimedOut as e:
                self._kill()
                self.restarts += 1
                i = doc.todo.popleft()
                if doc.doc_bound:
                    late = doc.late()
                    yield PageFailed(i, RENDER_TIMEOUT, f"page {i}: {late} (renderer killed)")
                    yield from doc.rest(RENDER_TIMEOUT, f"not rendered: {late}")
                    return True
                yield PageFailed(i, RENDER_TIMEOUT, f"page {i}: rendering took longer than "
                                                    f"{cfg.page_timeout_s:g} s ({e}; renderer killed)")
                break
            except _Died as e:
                if (yield from self._crashed(doc, name, e)):
                    return True
                break
            i = doc.todo.popleft()
            if reply[1] != i:  # the protocol is strictly ordered; anything else is a bug
                raise RuntimeError(f"renderer answered page {reply[1]}, expected {i}")
            self._pages += 1
            recycle = bool(doc.todo) and self._pages >= cfg.recycle_after_pages
            if recycle:  # mid-stream: a fresh process reopens the document for the rest
                self._kill()
                self.recycles += 1
            yield PageRendered(i, reply[2], reply[3]) if reply[0] == "page" else PageFailed(i, reply[2], reply[3])
            if recycle:
                break
        if doc.todo:
            return False
        if self._proc is not None:
            self._send(("close",))
        return True

    def _crashed(self, doc: _DocState, name: str, e: _Died) -> Iterator[PageFailed]:
        """The renderer crashed on the document's next page: count it, and give the page up after
        ``crash_tries``. Returns True when the document has had too many crashes (the rest gave up)."""
        cfg = self.cfg
        self.restarts += 1
        doc.crashes += 1
        i = doc.todo[0]
        doc.tries[i] = doc.tries.get(i, 0) + 1
        logger.warning("renderer crashed on %s page %d (%s): try %d of %d", name, i, e, doc.tries[i],
                       cfg.crash_tries)
        if doc.tries[i] >= cfg.crash_tries:
            doc.todo.popleft()
            yield PageFailed(i, RENDER_CRASHED, f"page {i}: the renderer process crashed on it "
                                                f"{doc.tries[i]} time(s) ({e})")
        if doc.crashes >= cfg.max_crashes_per_doc:
            yield from doc.rest(RENDER_CRASHED, f"not rendered: the renderer process crashed {doc.crashes} "
                                                f"time(s) on this document ({e})")
            return True
        return False


class _DocState:
    """One document's progress across the renderer processes it takes: the pages still to do
    (None until it is opened), its crashes, and the tries of each page that crashed one."""

    def __init__(self, cfg: RendererConfig):
        self.cfg = cfg
        self.limit_s = cfg.doc_limit_s(None)  # its renderer time (the page count sets it once known)
        self.spent = 0.0  # renderer time charged to it
        self.todo: deque[int] | None = None
        self.crashes = 0
        self.tries: dict[int, int] = {}
        self.doc_bound = False  # whether the last deadline was the document's, not the page's

    def budget(self) -> float:
        """The renderer time the next answer may take: the page's time-out, or what the document has left."""
        left = self.limit_s - self.spent
        self.doc_bound = left <= self.cfg.page_timeout_s
        return max(min(self.cfg.page_timeout_s, left), 0.0)

    def rest(self, code: str, message: str) -> Iterator[PageFailed]:
        """Every page still to do, failed with ``code``."""
        while self.todo:
            yield PageFailed(self.todo.popleft(), code, message)

    def late(self) -> str:
        return (f"the document's rendering time limit ({self.limit_s:g} s of renderer time: doc_timeout_s, "
                f"or page_budget_s per selected page) passed")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


_RENDERERS: dict[RendererConfig, IsolatedRenderer | InProcessRenderer] = {}


def renderer_for(cfg: RendererConfig) -> IsolatedRenderer | InProcessRenderer:
    """This process's renderer for ``cfg`` (kept between calls: a Ray worker reuses its renderer
    process across raster tasks): an :class:`IsolatedRenderer`, or with ``isolate`` off an
    :class:`~padoc_ray.raster.inprocess.InProcessRenderer`. A forked process gets renderers of its own."""
    from padoc_ray.raster.inprocess import InProcessRenderer

    r = _RENDERERS.get(cfg)
    if r is not None and isinstance(r, IsolatedRenderer) and r._owner != os.getpid():
        r = None
    if r is None:
        r = _RENDERERS[cfg] = IsolatedRenderer(cfg) if cfg.isolate else InProcessRenderer(cfg)
    return r
