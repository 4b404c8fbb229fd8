"""The HTTP layer's overhead: the same one-page requests sent to the Serve endpoint and to a
:class:`~padoc_ray.host.PageHost` directly, at several client concurrencies (closed loops).

Each request is one PDF page (``pages=K``), teacher-forced with ground truth so the engine does
real-length work. The direct side renders each request's page in-process and hands it to the host (the same
load: PDF bytes in, record out); a second direct side hands it pages rendered beforehand (the
engine alone). The HTTP side pays for everything a client pays for: upload, auth, rendering in a
renderer process, the ingress-to-engine hop, JSON. The two sides run one after the other, never together,
each on its own engine with the same settings. Reported per concurrency and side: pages/s, P50
and P95 latency, and HTTP pages/s as a fraction of direct.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import json
import os
import socket
import time
import urllib.request
import uuid
from dataclasses import dataclass, replace
from typing import Sequence

from padoc_ray import status
from padoc_ray.bench import DEFAULT_MODEL, EXAMPLES_DIR, UsageError, pdf_paths, require_path
from padoc_ray.knobs import knob
from padoc_ray.scheduler import SchedulerConfig
from padoc_ray.perfmodel.table3 import quantile


@dataclass
class Item:
    path: str
    name: str
    page_index: int
    data: bytes


def _items(pdfs: Sequence[str]) -> list[Item]:
    import pypdfium2

    out = []
    for path in pdfs:
        with open(path, "rb") as f:
            data = f.read()
        n = len(pypdfium2.PdfDocument(data))
        out += [Item(path, os.path.basename(path), i, data) for i in range(n)]
    return out


def _summary(lat: list[float], wall: float, ok: int) -> dict:
    return {"requests": len(lat), "ok": ok, "wall_s": round(wall, 3), "pages_per_s": round(len(lat) / wall, 3),
            "p50_s": round(quantile(lat, 0.5), 4), "p95_s": round(quantile(lat, 0.95), 4)}


def _render(it: Item):
    from padoc_ray.pdf import RenderConfig, open_pdf, render_page

    doc = open_pdf(it.data)
    try:
        return render_page(doc, it.page_index, RenderConfig()).image
    finally:
        doc.close()


async def _direct(model: str, truth: dict, items: list[Item], concurrencies, n: int, cfg, warmup: int,
                  log) -> dict[str, dict]:
    """Two direct sides on one engine: ``direct`` renders each request's page (the same load an
    HTTP request brings: PDF bytes in, record out; pdfium under one lock, in a thread), and
    ``direct_prerendered`` hands the host images rendered beforehand (the engine alone)."""
    import threading

    from padoc_ray.host import PageHost, PageRequest
    from padoc_ray.pdf import doc_id_of

    pdfium = threading.Lock()  # pdfium is not thread-safe

    def render_locked(it: Item):
        with pdfium:
            return _render(it)

    ids = [doc_id_of(it.data) for it in items]
    pre = [PageRequest(doc_id=d, page_index=it.page_index, image=_render(it), source_name=it.name)
           for d, it in zip(ids, items)]
    host = await PageHost(model, cfg, truth=truth).start()
    out: dict[str, dict] = {"direct": {}, "direct_prerendered": {}}
    try:
        for i in range(warmup):
            await host.parse(replace(pre[i % len(pre)], salt=uuid.uuid4().hex))
        for side in ("direct_prerendered", "direct"):
            for c in concurrencies:
                lat: list[float] = []
                ok = 0
                nxt = 0

                async def worker():
                    nonlocal nxt, ok
                    while nxt < n:
                        k = nxt % len(items)
                        nxt += 1
                        t = time.perf_counter()
                        page = pre[k]
                        if side == "direct":
                            page = replace(page, image=await asyncio.to_thread(render_locked, items[k]))
                        rec = await host.parse(replace(page, salt=uuid.uuid4().hex))
                        lat.append(time.perf_counter() - t)
                        ok += rec.status == status.OK

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(c)))
                r = out[side][str(c)] = _summary(lat, time.perf_counter() - t0, ok)
                log(f"{side:<18} C={c:<3} {r['pages_per_s']:.2f} pages/s  p50 {r['p50_s']:.3f}s  p95 {r['p95_s']:.3f}s")
    finally:
        host.shutdown()
        await asyncio.sleep(0.5)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_service(model: str, gt: str | None, host_cfg, ready_timeout_s: float = 900, **serve_kw):
    """The Serve application (``padoc-ray serve``'s) on a fresh local Ray on 127.0.0.1, teacher-forced
    with ``gt`` (None: the model generates freely): yields (url, bearer token) once ``/readyz``
    answers; shuts Serve and Ray down after. ``serve_kw``: other
    :class:`~padoc_ray.serve.config.ServeConfig` fields."""
    from ray import serve

    from padoc_ray.ray_init import init_ray
    from padoc_ray.serve.app import build_app
    from padoc_ray.serve.config import ServeConfig, token_digest

    token = uuid.uuid4().hex
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    init_ray("local", include_dashboard=False)
    import ray

    try:
        # one token for every client of the benchmark: let that one tenant use every ingress slot
        serve_kw.setdefault("max_requests_per_tenant", ServeConfig.ingress_max_ongoing)
        cfg = ServeConfig(model=model, replay_gt=gt, host=host_cfg, token_sha256=token_digest(token), **serve_kw)
        serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": cfg.http_request_timeout_s})
        serve.run(build_app(cfg), name="padoc", route_prefix="/", blocking=False)
        end = time.monotonic() + ready_timeout_s
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=30) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError("the service did not become ready")
            time.sleep(1)
        yield url, token
    finally:
        serve.shutdown()
        ray.shutdown()


def _http(model: str, gt: str, items: list[Item], concurrencies, n: int, host_cfg, warmup: int, log) -> dict:
    import requests

    out = {}
    with local_service(model, gt, host_cfg) as (url, token):
        headers = {"Authorization": f"Bearer {token}"}
        local = __import__("threading").local()

        def one(k: int) -> tuple[float, bool]:
            s = getattr(local, "s", None) or requests.Session()
            local.s = s
            it = items[k % len(items)]
            t = time.perf_counter()
            r = s.post(f"{url}/v1/parse", params={"pages": str(it.page_index + 1)}, headers=headers,
                       files={"file": (it.name, it.data, "application/pdf")}, timeout=600)
            dt = time.perf_counter() - t
            return dt, r.status_code == 200 and r.json()["status"] == status.DOC_OK

        for k in range(warmup):
            one(k)
        for c in concurrencies:
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(c) as ex:
                res = list(ex.map(one, range(n)))
            out[str(c)] = _summary([r[0] for r in res], time.perf_counter() - t0, sum(r[1] for r in res))
            log(f"{'http':<18} C={c:<3} {out[str(c)]['pages_per_s']:.2f} pages/s  p50 {out[str(c)]['p50_s']:.3f}s  "
                f"p95 {out[str(c)]['p95_s']:.3f}s")
    return out


def run(model: str, gt: str, pdfs: Sequence[str], concurrencies: Sequence[int] = (1, 8, 32), requests: int = 64,
        warmup: int = 4, out_dir: str | None = None, log=print, constrain_layout: bool = False) -> dict:
    """``constrain_layout``: keep layout streams in the layout grammar (SchedulerConfig.constrain_layout)."""
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.host import HostConfig

    items = _items(pdfs)
    truth = load_truth(gt)
    missing = [f"{it.name} page {it.page_index}" for it in items if (it.name, it.page_index) not in truth]
    if missing:
        raise ValueError(f"no ground truth for {', '.join(missing[:5])} (the benchmark is teacher-forced)")
    host_cfg = HostConfig(pages_in_flight=max(32, max(concurrencies)),
                          scheduler=SchedulerConfig(constrain_layout=constrain_layout))
    direct = asyncio.run(_direct(model, truth, items, concurrencies, requests, host_cfg, warmup, log))
    http = _http(model, gt, items, concurrencies, requests, host_cfg, warmup, log)
    report = {"model": model, "pages": len(items), "requests_per_level": requests, "concurrency": {}}
    for c in concurrencies:
        d, p, h = direct["direct"][str(c)], direct["direct_prerendered"][str(c)], http[str(c)]
        report["concurrency"][str(c)] = {
            "direct": d, "direct_prerendered": p, "http": h,
            "http_over_direct_pages_per_s": round(h["pages_per_s"] / d["pages_per_s"], 3),
            "http_over_prerendered_pages_per_s": round(h["pages_per_s"] / p["pages_per_s"], 3)}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "http_bench.json"), "w") as f:
            json.dump(report, f, indent=2)
    return report


def format_table(report: dict) -> str:
    lines = ["| clients | direct pages/s (pre-rendered) | HTTP pages/s | HTTP / direct (/ pre-rendered) | "
             "direct P50 / P95 s | HTTP P50 / P95 s |", "|---|---|---|---|---|---|"]
    for c, b in report["concurrency"].items():
        d, p, h = b["direct"], b["direct_prerendered"], b["http"]
        lines.append(f"| {c} | {d['pages_per_s']:.2f} ({p['pages_per_s']:.2f}) | {h['pages_per_s']:.2f} | "
                     f"{b['http_over_direct_pages_per_s']:.2f} ({b['http_over_prerendered_pages_per_s']:.2f}) | "
                     f"{d['p50_s']:.3f} / {d['p95_s']:.3f} | {h['p50_s']:.3f} / {h['p95_s']:.3f} |")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class HttpBenchConfig:
    """Send the same one-page requests (teacher-forced) to a PageHost directly and to the Serve endpoint
    (padoc-ray serve's application on a local Ray) over HTTP, in closed loops at each concurrency, one side after
    the other; print pages/s and P50/P95 latency of both and HTTP pages/s as a fraction of direct."""

    model: str = knob(DEFAULT_MODEL, help="checkpoint directory")
    input: str = knob(EXAMPLES_DIR, help="folder or glob of PDFs", show=lambda v: "the bundled examples")
    gt: str = knob(os.path.join(EXAMPLES_DIR, "ground_truth.json"), help="ground truth covering every page of "
                   "--input", show=lambda v: "the examples'")
    concurrency: tuple[int, ...] = knob((1, 8, 32), parse="ints", help="clients, e.g. 1,8,32")
    requests: int = 64  #: one-page requests per concurrency and side
    warmup: int = 4  #: untimed requests per side first
    out: str | None = knob(None, help="folder for http_bench.json")
    scheduler: SchedulerConfig = knob(factory=SchedulerConfig, nested=("constrain_layout",))


def main(cfg: HttpBenchConfig) -> int:
    require_path(cfg.gt, "--gt")
    require_path(cfg.model, "--model")
    try:
        report = run(os.path.abspath(cfg.model), os.path.abspath(cfg.gt), pdf_paths(cfg.input), cfg.concurrency,
                     requests=cfg.requests, warmup=cfg.warmup, out_dir=cfg.out,
                     constrain_layout=cfg.scheduler.constrain_layout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(format_table(report))
    if cfg.out:
        print(f"wrote {os.path.join(cfg.out, 'http_bench.json')}")
    return 0
