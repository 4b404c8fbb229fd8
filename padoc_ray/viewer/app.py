"""The viewer's FastAPI app: the documents table at ``/``, a document's pages at ``/doc``.

Pages are made on the server (the table needs no script); a page view embeds its JSON
(:func:`~padoc_ray.viewer.pageview.page_view`) for ``static/page.js`` to draw. Every asset is
served from ``/static`` (no CDN: it works air-gapped), and every answer carries a Content
Security Policy that allows scripts, styles and images from this origin only: even content the
sanitizer let through could run nothing.
"""

from __future__ import annotations

import html
import os
import urllib.parse
from dataclasses import dataclass

from padoc_ray import status
from padoc_ray.storage import StorageConfig
from padoc_ray.viewer.data import PAGE_SIZE, DocQuery, Output, lost_pages
from padoc_ray.viewer.hosts import answered_hosts
from padoc_ray.viewer.images import PageImages, common_prefix
from padoc_ray.viewer.pageview import embed_json, page_view
from padoc_ray.knobs import knob

STATIC = os.path.join(os.path.dirname(__file__), "static")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@dataclass(frozen=True, kw_only=True)
class ViewerConfig:
    """``padoc-ray view``: where it listens and where the page images come from."""

    host: str = "127.0.0.1"  #: address to listen on (keep it local: the viewer has no auth)
    port: int = 8100  #: port to listen on (0: any free port; the printed URL says which)
    source_root: str | None = None  #: read the inputs from here instead (their common folder is replaced by it)
    export: str | None = None  #: write a static HTML report of a sample to this folder instead of serving
    export_pages: int = 3  #: pages per document status in --export's sample (every error page is in it)
    image_cache_pages: int = 256  #: rendered page images kept in memory
    #: read a row's source wherever it says, not only under the output's common input folder (an output from
    #: someone else names the files the viewer renders; --source-root confines them to that folder instead)
    any_source: bool = False
    #: names besides 127.0.0.1, localhost and ``host`` that the viewer answers to (the request's Host header);
    #: any other name gets 400, so a web page that rebinds its own name to this address reads nothing
    allowed_hosts: tuple[str, ...] = knob((), flags=("--allowed-host",), metavar="NAME,NAME,...",
                                          note="comma list; besides 127.0.0.1, localhost and --host")
    #: seconds a connection gets to send a whole request head (after it opens, or after its last answer); a
    #: client that sends part of one and then nothing is cut off then, not held open (uvicorn has no such limit)
    header_timeout_s: float = knob(10.0, parse="positive_float", metavar="SECONDS")

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError(f"--header-timeout-s must be positive, got {self.header_timeout_s}")


def page_images(out: Output, cfg: ViewerConfig, storage: StorageConfig) -> PageImages:
    """The viewer's page images, confined to ``--source-root``, else to the output's common input folder
    (unless ``any_source``)."""
    prefix = common_prefix(out.documents.column("source_uri").drop_null().to_pylist())
    return PageImages(storage, source_root=cfg.source_root, prefix=prefix if cfg.source_root else "",
                      cache_pages=cfg.image_cache_pages, confine=None if cfg.any_source else (prefix or None))


def e(v) -> str:
    return html.escape("" if v is None else str(v))


def q(**kw) -> str:
    return urllib.parse.urlencode({k: v for k, v in kw.items() if v not in (None, "")})


def layout(title: str, body: str, *, scripts: tuple[str, ...] = (), static: str = "/static") -> str:
    tags = "".join(f'<script src="{static}/{s}"></script>' for s in scripts)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<link rel="stylesheet" href="{static}/page.css"><link rel="stylesheet" href="{static}/viewer.css">'
            f'</head><body><header><a href="/">padoc-ray view</a> <span class="pd-title">{e(title)}</span></header>'
            f"<main>{body}</main>{tags}</body></html>")


def table_html(out: Output, query: DocQuery) -> str:
    rows, n = out.select(query)
    cur = {"status": query.status, "error_code": query.error_code, "q": query.q}

    def chips(col: str) -> str:
        items = []
        for v, c in out.counts(col):
            label = v or "(none)"
            link = q(**{**cur, col: v or "-"})
            items.append(f'<a class="pd-count" data-{col.replace("_", "-")}="{e(v)}" data-count="{c}" '
                         f'href="/?{link}">{e(label)} <b>{c}</b></a>')
        return " ".join(items)

    body = [f'<section class="pd-counts"><div>status: {chips("status")}</div>'
            f'<div>error code: {chips("error_code")}</div></section>',
            '<form class="pd-search" method="get" action="/">'
            + "".join(f'<input type="hidden" name="{k}" value="{e(v)}">' for k, v in cur.items() if v and k != "q")
            + f'<input name="q" placeholder="file name" value="{e(query.q)}"><button>search</button> '
            f'<a href="/">clear</a></form>',
            f'<p class="pd-matching">{n} documents match; page {query.page + 1} of {max(1, -(-n // PAGE_SIZE))}</p>',
            '<table class="pd-docs"><thead><tr><th>file</th><th>status</th><th>error code</th><th>pages</th>'
            "<th>ok</th><th>failed</th></tr></thead><tbody>"]
    for r in rows:
        name = os.path.basename(r["source_uri"] or "")
        link = f'/doc?{q(uri=r["source_uri"])}'
        body.append(f'<tr class="pd-doc" data-status="{e(r["status"])}"><td><a href="{link}">'
                    f'{e(name)}</a></td><td>{e(r["status"])}</td><td class="pd-code">{e(r["error_code"])}</td>'
                    f'<td>{e(r["page_count"])}</td><td>{e(r.get("pages_ok"))}</td><td>{e(r.get("pages_failed"))}</td></tr>')
    body.append("</tbody></table><nav class=\"pd-paging\">")
    if query.page > 0:
        body.append(f'<a rel="prev" href="/?{q(**cur, page=query.page - 1)}">previous</a> ')
    if (query.page + 1) * PAGE_SIZE < n:
        body.append(f'<a rel="next" href="/?{q(**cur, page=query.page + 1)}">next</a>')
    body.append("</nav>")
    return layout("documents", "".join(body))


def doc_html(doc: dict, rows: list[dict], page: int | None, *, image_url=None, page_url=None,
             static: str = "/static") -> str:
    """A document: its error rows, its lost pages, links to its pages, and the view of page ``page``."""
    name = os.path.basename(doc["source_uri"] or "")
    failed, missing = lost_pages(doc, rows)
    parts = [f'<section class="pd-docinfo"><h2>{e(name)}</h2><p>status <b class="pd-doc-status">{e(doc["status"])}'
             f'</b>; {e(doc["page_count"])} pages, {e(doc.get("pages_ok"))} ok</p>']
    for r in rows:
        if r["status"] != status.OK:
            where = "document" if r["page_index"] < 0 else f'page {r["page_index"] + 1}'
            code = r["error_code"] or r["status"]
            parts.append(f'<p class="pd-error" data-page="{r["page_index"]}">{e(where)}: '
                         f'<code class="pd-code">{e(code)}</code> {e(r["error_message"])}</p>')
    if failed or missing:
        lost = ", ".join(str(i + 1) for i in failed)
        parts.append(f'<p class="pd-lost">lost pages: {e(lost) or "none failed"}'
                     f'{f"; {missing} selected pages not written" if missing else ""}</p>')
    shown = [r for r in rows if r["page_index"] >= 0]
    if shown:
        page_url = page_url or (lambda i: f'/doc?{q(uri=doc["source_uri"], page=i)}')
        parts.append('<nav class="pd-pages">' + " ".join(
            f'<a class="pd-pagelink{" pd-current" if r["page_index"] == page else ""}" data-status="{e(r["status"])}" '
            f'href="{page_url(r["page_index"])}">{r["page_index"] + 1}</a>' for r in shown) + "</nav>")
    parts.append("</section>")
    row = next((r for r in shown if r["page_index"] == page), None)
    if row is not None:
        view = page_view(row)
        view["image_url"] = image_url(row) if image_url else f'/image?{q(uri=doc["source_uri"], page=page)}'
        parts.append(f'<div id="pd-page" class="pd-page-root"></div><script type="application/json" id="pd-page-data">'
                     f"{embed_json(view)}</script>")
    return layout(f"{name} page {page + 1}" if row else name, "".join(parts), scripts=("page.js", "viewer.js"),
                  static=static)


def make_app(output: str, cfg: ViewerConfig = ViewerConfig(), storage: StorageConfig | None = None):
    """The viewer's app over batch output ``output`` (raises ViewerInputError for one it cannot show)."""
    import threading

    from fastapi import FastAPI, Query, Response
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    storage = storage or StorageConfig()
    out = Output(output, storage)
    images = page_images(out, cfg, storage)
    threading.Thread(target=out.warm, name="viewer-footers", daemon=True).start()
    app = FastAPI(title="padoc-ray view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.output, app.state.images = out, images
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=answered_hosts(cfg.host, cfg.allowed_hosts))

    @app.middleware("http")
    async def csp(request, call_next):
        resp = await call_next(request)
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse)
    def documents(status: str | None = None, error_code: str | None = None, q: str | None = None, page: int = 0):
        return table_html(out, DocQuery(status=status, error_code=error_code, q=q, page=max(0, page)))

    @app.get("/doc", response_class=HTMLResponse)
    def document(uri: str, page: int | None = None):
        doc = out.document(uri)
        if doc is None:
            return HTMLResponse(layout("not found", f"<p>no document {e(uri)} in this output</p>"), status_code=404)
        rows = out.page_rows(uri)
        if page is None:
            page = next((r["page_index"] for r in rows if r["page_index"] >= 0), None)
        return doc_html(doc, rows, page)

    @app.get("/image")
    def image(uri: str, page: int = Query(ge=0)):
        from padoc_ray.output.show import ShowError

        row = next((r for r in out.page_rows(uri) if r["page_index"] == page), None)
        if row is None or not row.get("image_width"):
            return Response("no such page", status_code=404, media_type="text/plain")
        try:
            data = images.png(row)
        except ShowError as err:
            return Response(str(err), status_code=404, media_type="text/plain")
        return Response(data, media_type="image/png", headers={"Cache-Control": "max-age=3600"})

    return app
