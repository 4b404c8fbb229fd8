"""The viewer on a large output: time to first byte and full load of its views (a benchmark, not a test).

Builds (once, cached) the driver benchmark's synthetic output (:func:`padoc_ray.bench.driver.build`)
and its documents table, serves it with ``padoc-ray view``'s app on a free local port, and times
``GET /`` (the documents table), a filtered table, a search and a document's page view (HTML, then
every asset it names), cold (the first, which reads every footer of ``pages/`` once) and warm.
``padoc-ray bench viewer --pages 1000000 --scratch DIR``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass

from padoc_ray import status


def _get(port: int, path: str) -> tuple[float, float, int, bytes]:
    """(seconds to the first byte of the answer, seconds to its last, status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    ttfb = time.perf_counter() - t0
    body = resp.read()
    conn.close()
    return ttfb, time.perf_counter() - t0, resp.status, body


def _load(port: int, path: str) -> dict:
    """A view and every script and stylesheet it names, one after another (as a browser's first visit)."""
    ttfb, html_s, code, body = _get(port, path)
    t0 = time.perf_counter() - html_s
    for asset in re.findall(rb'(?:src|href)="(/static/[^"]+)"', body):
        _get(port, asset.decode())
    return {"status": code, "ttfb_ms": round(ttfb * 1000, 1), "html_ms": round(html_s * 1000, 1),
            "load_ms": round((time.perf_counter() - t0) * 1000, 1), "bytes": len(body)}


def run(pages: int, scratch: str, repeats: int = 5) -> dict:
    import uvicorn

    from padoc_ray.bench import driver
    from padoc_ray.viewer.app import make_app

    folder = driver.build(scratch, pages)
    if not os.path.exists(os.path.join(folder, "documents", "documents.parquet")):
        driver.measure(folder, pages, 10)  # the driver's documents table, as a finished run writes it
    t0 = time.perf_counter()
    app = make_app(folder)
    open_s = time.perf_counter() - t0
    out = app.state.output
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    mid = out.documents.column("source_uri")[out.documents.num_rows // 2].as_py()
    views = {"table": "/", "table_filtered": "/?status=" + status.DOC_PARTIAL,
             "table_search": "/?q=" + os.path.basename(mid),
             "page_view": "/doc?" + urllib.parse.urlencode({"uri": mid, "page": 3})}
    result = {"pages": pages, "documents": out.documents.num_rows, "open_s": round(open_s, 2), "views": {}}
    t1 = time.perf_counter()
    out.warm()  # waits for the app's warm-up thread: every footer of pages/ read once
    result["footers_s"] = round(time.perf_counter() - t1, 2)
    out._index = None  # so the first page view below reads them itself: the cold figure includes them
    for name, path in views.items():
        cold = _load(port, path)
        warm = [_load(port, path) for _ in range(repeats)]
        result["views"][name] = {"cold": cold, "warm_median_ttfb_ms": statistics.median(w["ttfb_ms"] for w in warm),
                                 "warm_median_load_ms": statistics.median(w["load_ms"] for w in warm)}
    other = out.documents.column("source_uri")[out.documents.num_rows // 3].as_py()
    result["views"]["page_view_other_doc"] = _load(port, "/doc?" + urllib.parse.urlencode({"uri": other}))
    server.should_exit = True
    return result


@dataclass(frozen=True, kw_only=True)
class ViewerBenchConfig:
    """Build (once, cached in --scratch) the driver benchmark's synthetic output and its documents table, serve
    it with padoc-ray view's app on a free local port, and time the documents table, a filter, a search and a
    page view, cold and warm."""

    pages: int = 1_000_000  #: page rows of the synthetic output (built once, cached in scratch)
    scratch: str = "/tmp/padoc-bench"  #: where the synthetic output is built and kept
    json: str | None = None  #: write the figures here as JSON too


def main(cfg: ViewerBenchConfig) -> int:
    """Run the benchmark and print its figures as JSON (and write them to ``cfg.json``)."""
    r = run(cfg.pages, cfg.scratch)
    text = json.dumps(r, indent=2)
    print(text)
    if cfg.json:
        with open(cfg.json, "w") as f:
            f.write(text)
    return 0
