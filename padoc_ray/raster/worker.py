"""The renderer process: opens and renders documents for :class:`~padoc_ray.raster.renderer.IsolatedRenderer`.

Started as ``python -m padoc_ray.raster.worker FD PARENT_PID [MEMORY_MB [NICE]]``; FD is its end of
a ``multiprocessing`` connection. Once it has loaded pdfium it says ``("ready",)``, then does one
thing at a time, in order:

    parent -> ("open", data, name, max_frames) child -> ("opened", page_count, repaired)
                                                        | ("doc_error", code, message, count)
    parent -> ("render", indices, render_cfg, encoding)
                                               child -> per index, in order:
                                                        ("page", index, meta, image_bytes)
                                                        | ("page_error", index, code, message)
    parent -> ("close",)                       (no answer: drops the open document)

A crash (pdfium can segfault on hostile files) or a hang costs only this process: the parent
notices the closed connection or its deadline, kills it and starts another. The process dies with
its parent (PR_SET_PDEATHSIG on Linux), and exits when the connection closes.

Test-only fault injection: ``PADOC_RAY_RENDER_FAULTS`` holds a JSON object mapping a document
name (the basename of its URI) to an action, optionally ``@open`` or ``@N`` (page index N;
default: every page), e.g. ``{"bad.pdf": "crash@2", "slow.pdf": "hang@open"}``. ``crash``: SIGSEGV;
``hang``: sleep forever (no CPU: stuck); ``spin``: a busy loop forever (CPU); ``fail``: an
unexpected exception (what an unforeseen pdfium error does); ``crawl``: 1.5 s of wall time
with about 0.15 s of CPU in it, then go on (what a renderer starved by a loaded machine looks like);
``burn``: 0.02 s of CPU time, then go on (a page's own work).
``PADOC_RAY_RENDER_START_DELAY`` (seconds) makes the process's start that much CPU time heavier
before it says it is ready: a slow start, which must never count against a document.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from padoc_ray.status import RENDER_FAILED

FAULTS_ENV = "PADOC_RAY_RENDER_FAULTS"
START_DELAY_ENV = "PADOC_RAY_RENDER_START_DELAY"


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux), so a renderer stuck in
    a hostile file never outlives the task that started it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(0)


def _limit_memory(mb: int) -> None:
    """Cap the address space: a render that would need more fails (or crashes) this process only."""
    if mb > 0:
        import resource

        limit = mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _faults() -> dict[str, tuple[str, str]]:
    """{document name: (action, where)} from the test-only environment variable."""
    spec = os.environ.get(FAULTS_ENV)
    if not spec:
        return {}
    out = {}
    for name, text in json.loads(spec).items():
        action, _, where = text.partition("@")
        out[name] = (action, where or "*")
    return out


def _burn(cpu_s: float) -> None:
    """Use ``cpu_s`` seconds of this process's CPU time (a test's fault or slow start)."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def _inject(fault: tuple[str, str] | None, where: str) -> None:
    if fault is None or fault[1] not in ("*", where) or (fault[1] == "*" and where == "open"):
        return
    if fault[0] == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault[0] == "hang":
        while True:
            time.sleep(3600)
    elif fault[0] == "spin":
        while True:
            pass
    elif fault[0] == "crawl":
        for _ in range(15):
            time.sleep(0.1)
            _burn(0.01)
    elif fault[0] == "burn":
        _burn(0.02)
    elif fault[0] == "fail":
        raise RuntimeError(f"injected failure at {where}")


def render_encoded(doc, index: int, render_cfg, encoding: str, buffer) -> tuple[dict, bytes]:
    """Render one page into ``buffer`` and encode it: (row metadata, image bytes). Raises PdfError.
    The one per-page step of both renderers (this process's and the in-process one). The metadata
    carries the page's text layer (``text_layer_bytes``: :meth:`TextLayer.to_bytes
    <padoc_ray.protocol.text_layer.TextLayer.to_bytes>`, capped; None for an image, a layer that could
    not be read, or a ``render_cfg`` that reads none), under the page's own deadline like its pixels."""
    from padoc_ray.pdf import render_page
    from padoc_ray.output.rows import TEXT_LAYER_KEY
    from padoc_ray.raster.codec import encode_image

    t = time.perf_counter()
    r = render_page(doc, index, render_cfg, pixels=True, bitmap_maker=buffer, text_layer=render_cfg.text_layer)
    meta = {"image_width": r.image.width, "image_height": r.image.height, "page_width_pt": r.width_pt,
            "page_height_pt": r.height_pt, "rotation": r.rotation, "render_s": time.perf_counter() - t,
            TEXT_LAYER_KEY: r.text_layer.to_bytes() if r.text_layer is not None else None}
    return meta, encode_image(r.image, encoding)


def serve(conn) -> None:
    """Answer requests on ``conn`` until it closes or asks to exit."""
    from padoc_ray.pdf import ImageDocument, PdfError, ReusedBitmapBuffer, is_repaired, open_document

    faults = _faults()
    buffer = ReusedBitmapBuffer()  # every page renders into one buffer, encoded before the next
    doc, fault = None, None
    _burn(float(os.environ.get(START_DELAY_ENV) or 0))  # a test's slow start
    try:
        conn.send(("ready",))  # started: a document's clock starts with its first request, not before
    except OSError:
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind in ("open", "close", "exit") and doc is not None:
            doc.close()
            doc = None
        if kind == "exit":
            return
        if kind == "open":
            _, data, name, max_frames = msg
            fault = faults.get(name)
            try:
                _inject(fault, "open")
                doc = open_document(data, max_frames=max_frames)
            except PdfError as e:
                conn.send(("doc_error", e.code, e.message, getattr(e, "count", None)))
            except Exception as e:  # noqa: BLE001 - a bug or an unforeseen library error: still one row
                conn.send(("doc_error", RENDER_FAILED, f"opening failed: {type(e).__name__}: {e}", None))
            else:
                conn.send(("opened", len(doc), not isinstance(doc, ImageDocument) and is_repaired(doc)))
            del data
        elif kind == "render":
            _, indices, render_cfg, encoding = msg
            for i in indices:
                try:
                    _inject(fault, str(i))
                    meta, payload = render_encoded(doc, i, render_cfg, encoding, buffer)
                except PdfError as e:
                    conn.send(("page_error", i, e.code, e.message))
                except Exception as e:  # noqa: BLE001
                    conn.send(("page_error", i, RENDER_FAILED, f"page {i}: {type(e).__name__}: {e}"))
                else:
                    conn.send(("page", i, meta, payload))


def main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    fd, parent_pid = int(argv[0]), int(argv[1])
    _die_with_parent(parent_pid)
    _limit_memory(int(argv[2]) if len(argv) > 2 else 0)
    if len(argv) > 3 and int(argv[3]) > 0:
        os.nice(int(argv[3]))
    serve(Connection(fd))


if __name__ == "__main__":
    main(sys.argv[1:])
