"""The Ray Serve application: a FastAPI ingress and an engine deployment wrapping :class:`PageHost`.

* :class:`EngineReplica` hosts one engine (one :class:`~padoc_ray.host.PageHost`) and only runs
  pages: a page row in, the finished row out. Autoscaled between ``engine_replicas``.
* :class:`Ingress` answers HTTP: auth, limits, reading uploads or allowed ``s3://`` objects,
  rendering (in renderer processes, see :mod:`padoc_ray.serve.documents`), one engine call per
  page, async jobs (:mod:`padoc_ray.serve.jobs`), the OpenAI-compatible chat endpoint.

:func:`build_app` turns a :class:`~padoc_ray.serve.config.ServeConfig` into the application;
``app_builder`` is what a Serve config file's ``import_path`` names. Endpoint reference: README
"Online endpoint" and ``/docs`` on a running service.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import tempfile
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.config import AutoscalingConfig, BackpressureConfig
from ray.serve.exceptions import BackPressureError, RequestCancelledError
from starlette.exceptions import HTTPException as StarletteHTTPException

from padoc_ray import status
from padoc_ray.pdf import doc_id_of
from padoc_ray.output import rows
from padoc_ray.raster import DocFailed
from padoc_ray.raster.document import DocumentOpened, PageRow
from padoc_ray.storage import normalize_uri, read_bytes, s3_key_is_plain, under_prefix
from padoc_ray.serve import config as serve_config
from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve.documents import (
    BadRequest,
    RenderPool,
    doc_error_status,
    document_status,
    page_choice,
    parse_page_spec,
    row_json,
)
from padoc_ray.serve.jobs import FINAL, JobStore

logger = logging.getLogger("padoc_ray.serve")

API_DESCRIPTION = """PaDoc document parsing (layout-fork decoding on vLLM).

Page results carry the batch job's page-row fields and status codes. `markdown` is **data, not HTML
to render**: tables come through as HTML (`<table>...`) and text is not escaped; sanitize before
showing it in a browser. When the service has a token (PADOC_RAY_API_TOKEN), every /v1 route needs
`Authorization: Bearer <token>`; /healthz, /readyz and this schema are open."""

api = FastAPI(title="padoc-ray", version="1", description=API_DESCRIPTION)

#: page statuses that still carry the page's content (limits cut it short, nothing else went wrong)
CONTENT_STATUSES = status.CONTENT_CODES


# ---- request bodies (also the OpenAPI schema) --------------------------------------------------------
class ParseJSON(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content_base64: str | None = Field(None, description="the document (PDF or image), base64")
    uri: str | None = Field(None, description="an s3:// object in a bucket the operator allowed")
    filename: str | None = Field(None, max_length=255, description="a label; with --replay it picks the truth")
    pages: str | None = Field(None, max_length=1000, description="1-based pages, e.g. 1-3,7 (default: all)")
    mode: Literal["fork", "sequential"] | None = None
    format: Literal["json", "markdown"] | None = None


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class PadocOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filename: str | None = Field(None, max_length=255)
    mode: Literal["fork", "sequential"] | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool | None = False
    padoc: PadocOptions | None = None


def _error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _openai_error(status: int, code: str, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status)


def _label(name: str | None, default: str) -> str:
    """A client-given file name as a label only: its last path part, printable, at most 255 chars."""
    base = os.path.basename((name or "").replace("\\", "/").rstrip("/"))
    base = "".join(c for c in base if c.isprintable())[:255]
    return base or default


# ---- the engine deployment ---------------------------------------------------------------------------------
class EngineReplica:
    """One PageHost: pages in, rows out. Builds its engine in the replica's event loop."""

    async def __init__(self, cfg: ServeConfig):
        from padoc_ray.host import PageHost

        self.host = await PageHost.from_config(cfg.model, cfg.host, cfg.storage, cfg.replay_gt)

    async def parse_page(self, row: dict, image: bytes, tenant: str, salt: str) -> dict:
        from padoc_ray.host import parse_row

        return await parse_row(self.host, row, image, tenant=tenant, salt=salt)

    async def ready(self) -> dict:
        await self.host.probe(timeout_s=30)
        return self.host.stats()

    async def stats(self) -> dict:
        return self.host.stats()

    async def check_health(self) -> None:
        if self.host.dead is not None:
            raise RuntimeError(f"engine died: {self.host.dead}")

    def __del__(self):
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


# ---- auth and body size, before anything reads the body ---------------------------------------------
class _TooLarge(HTTPException):
    def __init__(self):
        super().__init__(413, "request body too large")


class _Guard:
    """Pure ASGI middleware for /v1 routes: bearer-token check (constant-time, on the token's
    sha256) before the body is read; 413 on a Content-Length over the cap, or as soon as a chunked
    body passes it. Sets ``request.state.tenant`` (the token's digest prefix; "" without auth)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        cfg: ServeConfig | None = serve_config.ACTIVE.get("cfg")
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        if cfg is None:  # not configured (never expected): refuse rather than serve without auth
            return await _error(503, "not_ready", "the service is starting")(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        tenant = ""
        if cfg.token_sha256:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            given = hashlib.sha256(token.strip().encode()).hexdigest() if scheme.lower() == "bearer" else ""
            if not hmac.compare_digest(given, cfg.token_sha256):
                resp = JSONResponse({"error": {"code": "unauthorized", "message": "a valid bearer token is required"}},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, send)
            tenant = cfg.token_sha256[:16]
        scope.setdefault("state", {})["tenant"] = tenant
        cap = cfg.max_upload_bytes + (1 << 20)  # room for the multipart/JSON envelope around the document
        too_large = _error(413, status.FILE_TOO_LARGE, f"request body over the limit of {cfg.max_upload_bytes} bytes")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            return await too_large(scope, receive, send)
        seen = 0
        started = False

        async def counted():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > cap:
                    raise _TooLarge()
            return msg

        async def tracked(msg):
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await too_large(scope, receive, send)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
               413: status.FILE_TOO_LARGE, 415: "unsupported_media_type", 422: "bad_request"}


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Every framework error in the API's one error shape."""
    code = _HTTP_CODES.get(exc.status_code, "error")
    detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
    return _error(exc.status_code, code, detail, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()[:5])
    return _error(422, "bad_request", problems[:1000] or "invalid request")


#: before @serve.ingress below, which freezes a copy of ``api`` (later changes would not reach it)
api.add_middleware(_Guard)
api.add_exception_handler(StarletteHTTPException, _http_error)
api.add_exception_handler(RequestValidationError, _validation_error)


# ---- the ingress ---------------------------------------------------------------------------------------------
@serve.ingress(api)
class Ingress:
    async def __init__(self, cfg: ServeConfig, engine):
        from ray.util import metrics

        self.cfg, self.engine = cfg, engine
        # for the auth/size middleware. Through the module: Serve ships this class by value, with
        # copies of this file's globals, while the middleware reads the imported module's
        serve_config.ACTIVE["cfg"] = cfg
        self.pool = RenderPool(cfg.renderer, cfg.render_workers)
        store = cfg.job_store or os.path.join(tempfile.gettempdir(), "padoc-ray-jobs")
        self.jobs = JobStore(store, cfg.storage)
        self.replica_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.running: dict[str, asyncio.Task] = {}
        self.m_requests = metrics.Counter("padoc_http_requests", "HTTP requests by route and status code",
                                          tag_keys=("route", "code"))
        self.m_pages = metrics.Counter("padoc_pages", "pages answered, by status", tag_keys=("status",))
        self.m_page_s = metrics.Histogram("padoc_page_seconds", "end-to-end seconds per page (engine side)",
                                          boundaries=[0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300])
        self.sweeper = asyncio.create_task(self._sweep())

    def __del__(self):
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()

    # ---- helpers ----
    def _tenant(self, request: Request) -> str:
        return request.state.tenant if hasattr(request.state, "tenant") else ""

    def _count(self, route: str, code: int) -> None:
        self.m_requests.inc(tags={"route": route, "code": str(code)})

    async def _fetch_s3(self, uri: str) -> tuple[bytes, str]:
        """An allowed s3:// object's bytes (its key's last part is its label). Errors never name the bucket."""
        try:
            uri = normalize_uri(uri)
        except ValueError:
            raise BadRequest(status.DISALLOWED_URI, "not an allowed storage URI") from None
        if not uri.startswith("s3://") or not s3_key_is_plain(uri) or \
                not any(under_prefix(uri, p) for p in self.cfg.allowed_s3):
            raise BadRequest(status.DISALLOWED_URI, "this service reads no storage URI but those under its allowed "
                                                     "prefixes", status.http_status(status.DISALLOWED_URI))
        cap = self.cfg.max_upload_bytes
        try:
            data = await asyncio.to_thread(read_bytes, uri, self.cfg.storage, max_bytes=cap)
        except (OSError, ValueError):
            raise BadRequest(status.READ_FAILED, "the object could not be read (missing, or no access)",
                             status.http_status(status.READ_FAILED)) from None
        if len(data) > cap:
            raise BadRequest(status.FILE_TOO_LARGE, f"the object is over the limit of {cap} bytes",
                             status.http_status(status.FILE_TOO_LARGE))
        return data, _label(uri.rsplit("/", 1)[-1], "document")

    async def _document(self, request: Request) -> tuple[bytes, str, dict]:
        """(bytes, label, options) of a /v1/parse or /v1/jobs request: multipart or JSON."""
        q = request.query_params
        opts = {"pages": q.get("pages"), "mode": q.get("mode"), "format": q.get("format")}
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise BadRequest(status.MISSING_FILE, "multipart field 'file' (the document) is required")
            for k in ("pages", "mode", "format"):
                v = form.get(k)
                if isinstance(v, str) and v:
                    opts[k] = v
            data = await upload.read()
            name = _label(upload.filename, "document")
        elif ctype.startswith("application/json"):
            try:
                body = ParseJSON.model_validate_json(await request.body())
            except ValueError as e:
                raise BadRequest("bad_request", f"invalid JSON body: {str(e)[:500]}", 422) from None
            for k in ("pages", "mode", "format"):
                if getattr(body, k):
                    opts[k] = getattr(body, k)
            if (body.content_base64 is None) == (body.uri is None):
                raise BadRequest("bad_request", "give exactly one of content_base64 and uri")
            if body.uri is not None:
                data, name = await self._fetch_s3(body.uri)
            else:
                try:
                    data = base64.b64decode(body.content_base64, validate=True)
                except (binascii.Error, ValueError):
                    raise BadRequest("bad_request", "content_base64 is not valid base64") from None
                name = "document"
            name = _label(body.filename, name)
        else:
            raise BadRequest("unsupported_media_type", "send multipart/form-data (field 'file') or application/json",
                             415)
        if opts["mode"] not in (None, "fork", "sequential"):
            raise BadRequest("bad_request", "mode is fork or sequential", 422)
        if opts["format"] not in (None, "json", "markdown"):
            raise BadRequest("bad_request", "format is json or markdown", 422)
        if len(data) > self.cfg.max_upload_bytes:
            raise BadRequest(status.FILE_TOO_LARGE, f"over the limit of {self.cfg.max_upload_bytes} bytes",
                             status.http_status(status.FILE_TOO_LARGE))
        return data, name, opts

    # ---- one document through render + engine ----
    async def _pages(self, data: bytes, name: str, wanted, mode: str, tenant: str, salt: str, run_id: str,
                     max_pages: int, skip: frozenset[int] = frozenset()) -> AsyncIterator[Any]:
        """Yields a :class:`DocumentOpened` (its ``pages``: those selected, less ``skip``) then one
        finished page row per page, in the order pages finish. A document-level failure raises
        :class:`BadRequest`. Leaving early cancels the engine calls of the pages still running."""
        cfg = self.cfg
        base = dict(run_id=run_id, uri=name, doc_id=doc_id_of(data), mode=mode, model_id=cfg.served_model_id)
        out: asyncio.Queue = asyncio.Queue()
        done = object()
        live: dict[int, Any] = {}
        tasks: set[asyncio.Task] = set()

        async def call(rp: PageRow) -> None:
            i = rp.row["page_index"]
            for attempt in range(2):  # a replica that died mid-page: one more try on another
                resp = self.engine.parse_page.remote(rp.row, rp.image, tenant, salt)
                live[i] = resp
                try:
                    row = await resp
                    break
                except BackPressureError:
                    row = rows.error_row(rp.row, status.OVERLOADED, "every engine replica is at capacity; retry later")
                    break
                except (asyncio.CancelledError, RequestCancelledError):
                    resp.cancel()  # we are leaving (client gone, deadline, job cancelled): no retry
                    raise asyncio.CancelledError from None
                except Exception as e:  # noqa: BLE001 - the replica failed (died, restarting)
                    logger.warning("page %d of %s: engine call failed (%s), try %d", i, name, type(e).__name__,
                                   attempt + 1)
                    row = rows.error_row(rp.row, status.ENGINE_UNAVAILABLE, "the engine failed while parsing this page")
                    await asyncio.sleep(1.0)
                finally:
                    live.pop(i, None)
            await out.put(row)

        async def feed() -> None:
            try:
                async with contextlib.aclosing(self.pool.render(
                        data, name, page_choice(wanted, max_pages), cfg.render, cfg.image_encoding, base,
                        max_frames=cfg.limits.max_image_frames, skip=skip)) as items:
                    async for item in items:
                        if isinstance(item, PageRow) and item.rendered:
                            t = asyncio.create_task(call(item))
                            tasks.add(t)
                            t.add_done_callback(tasks.discard)
                        else:  # the document opened or failed, or a page's rendering failed (its row)
                            await out.put(item.row if isinstance(item, PageRow) else item)
                await asyncio.gather(*list(tasks))
            except Exception as e:  # noqa: BLE001
                await out.put(DocFailed(status.RENDER_FAILED, f"{type(e).__name__}"))
            finally:
                await out.put(done)

        feeder = asyncio.create_task(feed())
        try:
            while True:
                item = await out.get()
                if item is done:
                    break
                if isinstance(item, DocFailed):
                    raise BadRequest(item.code, item.message, doc_error_status(item.code))
                if isinstance(item, dict):
                    self.m_pages.inc(tags={"status": item.get("status") or "unknown"})
                    if item.get("e2e_s") is not None:
                        self.m_page_s.observe(item["e2e_s"])
                yield item
        finally:
            for resp in list(live.values()):
                resp.cancel()
            for t in list(tasks):
                t.cancel()
            feeder.cancel()
            await asyncio.gather(feeder, *list(tasks), return_exceptions=True)

    async def _parse_all(self, data, name, opts, tenant, max_pages) -> tuple[list[dict], int | None, list[int]]:
        wanted = parse_page_spec(opts["pages"], max(max_pages, self.cfg.max_job_pages))
        mode = opts["mode"] or self.cfg.host.mode
        got, count, selected = [], None, []
        async with contextlib.aclosing(self._pages(data, name, wanted, mode, tenant, uuid.uuid4().hex,
                                                   uuid.uuid4().hex[:12], max_pages)) as gen:
            async for item in gen:
                if isinstance(item, DocumentOpened):
                    count, selected = item.page_count, list(item.pages)
                else:
                    got.append(item)
        return sorted(got, key=lambda r: r["page_index"]), count, selected

    def _result(self, name: str, page_rows: list[dict], count: int | None, mode: str) -> dict:
        ok = sum(r["status"] == status.OK for r in page_rows)
        return {
            "status": document_status(page_rows), "model": self.cfg.served_model_id, "mode": mode,
            "document": {"name": name, "doc_id": page_rows[0]["doc_id"] if page_rows else None, "page_count": count,
                         "pages_selected": len(page_rows), "pages_ok": ok, "pages_failed": len(page_rows) - ok},
            "pages": [row_json(r) for r in page_rows],
        }

    @staticmethod
    def _markdown(result: dict) -> Response:
        parts = [f"<!-- page {p['page_index'] + 1}: {p['status']} -->\n\n{p.get('markdown') or ''}"
                 for p in result["pages"]]
        return PlainTextResponse("\n\n".join(parts), media_type="text/markdown; charset=utf-8",
                                 headers={"X-Padoc-Status": result["status"]})

    # ---- routes ----
    @api.get("/healthz", summary="the process is up")
    async def healthz(self) -> dict:
        return {"status": status.OK}

    @api.get("/readyz", summary="the engine is loaded and answers a probe")
    async def readyz(self):
        try:
            stats = await asyncio.wait_for(self.engine.ready.remote(), 30)
        except BackPressureError:  # loaded, not broken: stay in rotation
            return {"status": "ready", "model": self.cfg.served_model_id, "engine": "busy"}
        except Exception as e:  # noqa: BLE001
            return JSONResponse({"status": "not_ready", "reason": type(e).__name__}, status_code=503,
                                headers={"Retry-After": "5"})
        return {"status": "ready", "model": self.cfg.served_model_id, "engine": stats}

    @api.get("/v1/models", summary="the served model and its protocol")
    async def models(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.cfg.served_model_id, "object": "model", "created": 0, "owned_by": "padoc-ray",
            "protocol": "padoc", "modes": ["fork", "sequential"], "default_mode": self.cfg.host.mode,
            "max_pages_per_request": self.cfg.max_pages, "max_job_pages": self.cfg.max_job_pages,
            "max_upload_bytes": self.cfg.max_upload_bytes,
        }]}

    @api.post("/v1/parse", summary="parse a document (multipart field `file`, or JSON)",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}, "pages": {"type": "string"},
                      "mode": {"type": "string", "enum": ["fork", "sequential"]},
                      "format": {"type": "string", "enum": ["json", "markdown"]}}}},
                  "application/json": {"schema": ParseJSON.model_json_schema()}}}})
    async def parse(self, request: Request, stream: bool = False, pages: str | None = None,
                    mode: Literal["fork", "sequential"] | None = None,
                    format: Literal["json", "markdown"] | None = None,
                    timeout: float | None = Query(None, ge=1, le=86400, description="seconds before 504 (at "
                                                                                     "most the service's request "
                                                                                     "timeout)")):
        tenant = self._tenant(request)
        budget = min(timeout or self.cfg.request_timeout_s, self.cfg.request_timeout_s)
        try:
            data, name, opts = await self._document(request)
            if stream:
                return await self._stream(data, name, opts, tenant, budget)
            page_rows, count, _ = await asyncio.wait_for(
                self._parse_all(data, name, opts, tenant, self.cfg.max_pages), budget)
        except BadRequest as e:
            self._count("parse", e.status)
            return _error(e.status, e.code, e.message)
        except TimeoutError:
            self._count("parse", 504)
            return _error(504, status.REQUEST_TIMEOUT, f"not finished within {budget:g} s; use /v1/jobs for large "
                                                  f"documents")
        result = self._result(name, page_rows, count, opts["mode"] or self.cfg.host.mode)
        if all(p["status"] == status.OVERLOADED for p in result["pages"]) and result["pages"]:
            self._count("parse", 503)
            return _error(503, status.OVERLOADED, "every engine replica is at capacity; retry later",
                          headers={"Retry-After": "2"})
        self._count("parse", 200)
        return self._markdown(result) if opts["format"] == "markdown" else result

    async def _stream(self, data: bytes, name: str, opts: dict, tenant: str, budget: float) -> Response:
        """NDJSON: a ``{"type": "document", ...}`` line once the document is open, one ``{"type":
        "page", ...}`` line per page as it finishes, and a final ``{"type": "result", ...}`` line. A
        document that cannot be parsed gets its error status before anything is streamed."""
        import json

        cfg = self.cfg
        wanted = parse_page_spec(opts["pages"], cfg.max_pages)
        mode = opts["mode"] or cfg.host.mode
        gen = self._pages(data, name, wanted, mode, tenant, uuid.uuid4().hex, uuid.uuid4().hex[:12], cfg.max_pages)
        deadline = time.monotonic() + budget
        try:
            first = await asyncio.wait_for(anext(gen), budget)
        except BaseException:
            await gen.aclose()
            raise

        async def lines():
            got: list[dict] = []
            try:
                yield json.dumps({"type": "document", "name": name, "page_count": first.page_count,
                                  "pages_selected": len(first.pages)}) + "\n"
                while True:
                    try:
                        row = await asyncio.wait_for(anext(gen), max(0.0, deadline - time.monotonic()))
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        seen = {r["page_index"] for r in got}
                        for i in first.pages:
                            if i not in seen:
                                r = {"page_index": i, "status": status.REQUEST_TIMEOUT, "error_code": status.REQUEST_TIMEOUT,
                                     "error_message": f"not finished within {budget:g} s",
                                     "markdown": None}
                                got.append(r)
                                yield json.dumps({"type": "page", **r}) + "\n"
                        break
                    got.append(row)
                    yield json.dumps({"type": "page", **row_json(row)}, ensure_ascii=False) + "\n"
                yield json.dumps({"type": "result", "status": document_status(got), "pages": len(got)}) + "\n"
            finally:
                await gen.aclose()

        self._count("parse_stream", 200)
        return StreamingResponse(lines(), media_type="application/x-ndjson")

    # ---- async jobs ----
    @api.post("/v1/jobs", status_code=202, summary="start an async parse job (same body as /v1/parse)",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}, "pages": {"type": "string"},
                      "mode": {"type": "string", "enum": ["fork", "sequential"]}}}},
                  "application/json": {"schema": ParseJSON.model_json_schema()}}}})
    async def create_job(self, request: Request, pages: str | None = None,
                         mode: Literal["fork", "sequential"] | None = None):
        tenant = self._tenant(request)
        cfg = self.cfg
        try:
            data, name, opts = await self._document(request)
            wanted = parse_page_spec(opts["pages"], cfg.max_job_pages)
            selected = (await self._count_pages(data, name, wanted)).selected
        except BadRequest as e:
            self._count("jobs", e.status)
            return _error(e.status, e.code, e.message)
        options = {"pages": list(wanted) if wanted is not None else None, "mode": opts["mode"] or cfg.host.mode}
        state = await asyncio.to_thread(self.jobs.create, tenant=tenant, name=name, data=data, options=options,
                                        pages_total=len(selected), owner=self.replica_id)
        self._start_job(state["id"])
        self._count("jobs", 202)
        return JSONResponse(self._job_view(state, 0), status_code=202,
                            headers={"Location": f"/v1/jobs/{state['id']}"})

    async def _count_pages(self, data: bytes, name: str, wanted) -> DocumentOpened:
        """Open the document in a renderer (nothing rendered): its page count and selection, or its error."""
        opened = None
        async with contextlib.aclosing(self.pool.render(data, name, page_choice(wanted, self.cfg.max_job_pages),
                                                        self.cfg.render, self.cfg.image_encoding, {},
                                                        max_frames=self.cfg.limits.max_image_frames,
                                                        count_only=True)) as items:
            async for item in items:
                if isinstance(item, DocFailed):
                    raise BadRequest(item.code, item.message, doc_error_status(item.code))
                if isinstance(item, DocumentOpened):
                    opened = item
        if opened is None:
            raise BadRequest(status.RENDER_FAILED, "the document could not be opened", 422)
        return opened

    def _job_view(self, st: dict, pages_done: int, cancelling: bool = False) -> dict:
        state = st["status"]
        if cancelling and state not in FINAL:
            state = status.JOB_CANCELLING
        return {"id": st["id"], "status": state, "pages_done": pages_done, "pages_total": st["pages_total"],
                "document_status": st.get("document_status"), "error": st.get("error"), "name": st["name"],
                "created": st["created"], "updated": st["updated"]}

    def _own_job(self, job_id: str, tenant: str) -> dict | None:
        st = self.jobs.get(job_id)
        if st is None or not hmac.compare_digest(st.get("tenant", ""), tenant):
            return None
        return st

    @api.get("/v1/jobs/{job_id}", summary="a job's progress")
    async def get_job(self, job_id: str, request: Request):
        st = await asyncio.to_thread(self._own_job, job_id, self._tenant(request))
        if st is None:
            return _error(404, "job_not_found", "no such job")
        done = await asyncio.to_thread(self.jobs.done_pages, job_id)
        cancelling = await asyncio.to_thread(self.jobs.cancelled, job_id)
        return self._job_view(st, len(done), cancelling)

    @api.get("/v1/jobs/{job_id}/result", summary="a finished job's result (as /v1/parse answers)")
    async def job_result(self, job_id: str, request: Request, format: Literal["json", "markdown"] | None = None):
        st = await asyncio.to_thread(self._own_job, job_id, self._tenant(request))
        if st is None:
            return _error(404, "job_not_found", "no such job")
        if st["status"] == status.JOB_FAILED:
            err = st.get("error") or {}
            code = err.get("code") or status.JOB_FAILED
            return _error(doc_error_status(code), code, err.get("message", ""))
        if st["status"] != status.JOB_DONE:
            return _error(409, "job_not_finished", f"the job is {st['status']}", headers={"Retry-After": "2"})
        page_rows = await asyncio.to_thread(self.jobs.page_rows, job_id)
        count = next((r["page_count"] for r in page_rows if r["page_count"] is not None), None)
        result = {"id": job_id, **self._result(st["name"], page_rows, count, st["options"]["mode"])}
        return self._markdown(result) if format == "markdown" else result

    @api.delete("/v1/jobs/{job_id}", summary="cancel a job: its engine work stops")
    async def cancel_job(self, job_id: str, request: Request):
        st = await asyncio.to_thread(self._own_job, job_id, self._tenant(request))
        if st is None:
            return _error(404, "job_not_found", "no such job")
        if st["status"] not in FINAL:
            await asyncio.to_thread(self.jobs.cancel, job_id)
            task = self.running.get(job_id)
            if task is not None:
                task.cancel()
        done = await asyncio.to_thread(self.jobs.done_pages, job_id)
        return self._job_view(st, len(done), cancelling=st["status"] not in FINAL)

    def _start_job(self, job_id: str) -> None:
        task = asyncio.create_task(self._run_job(job_id))
        self.running[job_id] = task
        task.add_done_callback(lambda _t: self.running.pop(job_id, None))

    async def _run_job(self, job_id: str) -> None:
        store = self.jobs
        st = await asyncio.to_thread(store.get, job_id)
        st.update(status=status.JOB_RUNNING, owner=self.replica_id, heartbeat=time.time())
        await asyncio.to_thread(store.put, st)
        beat = asyncio.create_task(self._heartbeat(job_id, st, asyncio.current_task()))
        try:
            if await asyncio.to_thread(store.cancelled, job_id):
                raise asyncio.CancelledError
            data = await asyncio.to_thread(store.input, job_id)
            skip = frozenset(await asyncio.to_thread(store.done_pages, job_id))
            wanted = tuple(st["options"]["pages"]) if st["options"]["pages"] is not None else None
            async with contextlib.aclosing(self._pages(
                    data, st["name"], wanted, st["options"]["mode"], st["tenant"], job_id, job_id[:12],
                    self.cfg.max_job_pages, skip)) as gen:
                async for item in gen:
                    if isinstance(item, dict):
                        await asyncio.to_thread(store.write_page, job_id, item)
            page_rows = await asyncio.to_thread(store.page_rows, job_id)
            st.update(status=status.JOB_DONE, document_status=document_status(page_rows))
        except BadRequest as e:
            st.update(status=status.JOB_FAILED, error={"code": e.code, "message": e.message})
        except asyncio.CancelledError:
            if not await asyncio.to_thread(store.cancelled, job_id):
                raise  # the replica is shutting down: another one takes the job over
            st.update(status=status.JOB_CANCELLED)
        except Exception as e:  # noqa: BLE001
            logger.exception("job %s failed", job_id)
            st.update(status=status.JOB_FAILED, error={"code": status.INTERNAL_ERROR, "message": type(e).__name__})
        finally:
            beat.cancel()
        await asyncio.to_thread(store.put, st)
        logger.info("job %s: %s", job_id, st["status"])

    async def _heartbeat(self, job_id: str, st: dict, runner: asyncio.Task) -> None:
        """Keep the job's lease and notice a cancel written by any replica."""
        n = 0
        while True:
            await asyncio.sleep(0.5)
            n += 1
            if await asyncio.to_thread(self.jobs.cancelled, job_id):
                runner.cancel()
                return
            if n % 4 == 0:
                st["heartbeat"] = time.time()
                await asyncio.to_thread(self.jobs.put, dict(st))

    async def _sweep(self) -> None:
        """Take over jobs whose owner stopped beating (a killed replica)."""
        while True:
            await asyncio.sleep(1.0)
            try:
                for job_id in await asyncio.to_thread(self.jobs.ids):
                    if job_id in self.running:
                        continue
                    st = await asyncio.to_thread(self.jobs.get, job_id)
                    if st is None or st["status"] in FINAL:
                        continue
                    if time.time() - st.get("heartbeat", 0) < self.cfg.job_lease_s:
                        continue
                    st.update(owner=self.replica_id, heartbeat=time.time())
                    await asyncio.to_thread(self.jobs.put, st)
                    await asyncio.sleep(0.5)
                    again = await asyncio.to_thread(self.jobs.get, job_id)
                    if again and again.get("owner") == self.replica_id and job_id not in self.running:
                        logger.info("taking over job %s", job_id)
                        self._start_job(job_id)
            except Exception:  # noqa: BLE001 - the store hiccuped: try again next round
                logger.exception("job sweep failed")

    # ---- OpenAI-compatible ----
    @api.post("/v1/chat/completions", summary="OpenAI-compatible: a page image in, its Markdown out")
    async def chat(self, body: ChatRequest, request: Request):
        cfg = self.cfg
        if body.stream:
            return _openai_error(400, "stream_unsupported", "stream=true is not supported; send stream=false")
        if body.model not in (None, cfg.served_model_id):
            return _openai_error(404, "model_not_found", f"the model {body.model!r} does not exist; see /v1/models")
        urls = [p.image_url.url for m in body.messages if isinstance(m.content, list)
                for p in m.content if p.type == "image_url" and p.image_url is not None]
        if len(urls) != 1:
            return _openai_error(400, "one_image", f"send exactly one page image (image_url); got {len(urls)}")
        url = urls[0]
        try:
            if url.startswith("data:"):
                header, sep, payload = url.partition(",")
                if not sep or ";base64" not in header:
                    raise BadRequest("bad_image_url", "image_url must be a base64 data URL or an allowed s3:// URI")
                try:
                    data = base64.b64decode(payload, validate=True)
                except (binascii.Error, ValueError):
                    raise BadRequest("bad_image_url", "the data URL is not valid base64") from None
                name = "image"
            elif url.startswith("s3://"):
                data, name = await self._fetch_s3(url)
            else:
                raise BadRequest("bad_image_url", "this service fetches no URLs: send a base64 data URL "
                                                  "(or an allowed s3:// URI)")
            if len(data) > cfg.max_upload_bytes:
                raise BadRequest(status.FILE_TOO_LARGE, f"over the limit of {cfg.max_upload_bytes} bytes",
                                 status.http_status(status.FILE_TOO_LARGE))
            padoc = body.padoc or PadocOptions()
            name = _label(padoc.filename, name)
            opts = {"pages": "1", "mode": padoc.mode, "format": None}
            page_rows, _, _ = await asyncio.wait_for(
                self._parse_all(data, name, opts, self._tenant(request), 1), cfg.request_timeout_s)
        except BadRequest as e:
            return _openai_error(e.status, e.code, e.message)
        except TimeoutError:
            return _openai_error(504, status.REQUEST_TIMEOUT, f"not finished within {cfg.request_timeout_s:g} s",
                                 "timeout_error")
        row = page_rows[0]
        code = row["status"]
        if code == status.OVERLOADED:
            r = _openai_error(503, status.OVERLOADED, "every engine replica is at capacity; retry later",
                              "server_error")
            r.headers["Retry-After"] = "2"
            return r
        if code not in CONTENT_STATUSES:
            return _openai_error(status.http_status(code, 500), code, row.get("error_message") or code,
                                 "server_error")
        completion = int(row.get("output_tokens") or 0)
        prompt = int(row.get("prompt_tokens") or 0)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": cfg.served_model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": row.get("markdown") or ""},
                         "finish_reason": "stop" if code == status.OK else "length", "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "padoc": {"status": code, "valid": row.get("valid"), "n_branches": row.get("n_branches"),
                      "regions": len(row.get("regions") or [])},
        }


# ---- building the application ------------------------------------------------------------------------
def build_app(cfg: ServeConfig):
    """The Serve application for ``cfg``: ``serve.run(build_app(cfg))``."""
    engine = serve.deployment(EngineReplica).options(
        name="Engine",
        ray_actor_options={"num_cpus": cfg.engine_cpus, "num_gpus": cfg.engine_gpus},
        max_ongoing_requests=cfg.engine_max_ongoing, max_queued_requests=cfg.engine_max_queued,
        autoscaling_config=AutoscalingConfig(
            min_replicas=cfg.engine_replicas[0], initial_replicas=cfg.engine_replicas[0],
            max_replicas=cfg.engine_replicas[1], target_ongoing_requests=cfg.target_ongoing_pages,
            upscale_delay_s=10, downscale_delay_s=300),
        health_check_period_s=5, health_check_timeout_s=60, graceful_shutdown_timeout_s=10,
    )
    ingress = serve.deployment(Ingress).options(
        name="Ingress", num_replicas=cfg.ingress_replicas, ray_actor_options={"num_cpus": cfg.ingress_cpus},
        max_ongoing_requests=cfg.ingress_max_ongoing, max_queued_requests=cfg.ingress_max_queued,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=2),
        graceful_shutdown_timeout_s=10,
    )
    return ingress.bind(cfg, engine.bind(cfg))


def app_builder(args: dict[str, Any]):
    """For Serve config files: ``import_path: padoc_ray.serve.app:app_builder`` with ``args`` as
    :meth:`ServeConfig.from_args` reads them (see cluster/serve.yaml)."""
    return build_app(ServeConfig.from_args(args))
