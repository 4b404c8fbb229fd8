"""The Serve ingress's HTTP guard (padoc_ray/serve/guard.py), in-process and without Ray: the guard
on a small FastAPI app with the service's route shapes, served by uvicorn on 127.0.0.1 in a thread and
mounted the way Serve mounts an application under a route_prefix.

Serve keeps the whole path in ``scope["path"]`` and appends the route_prefix to ``scope["root_path"]``
(ray/serve/_private/proxy.py:405-408 calls ``set_root_path``, proxy_request_response.py:127-128; a
direct-ingress replica does the same, replica.py:3138-3142), and its uvicorn puts
``http_options.root_path`` in front of both (http_util.py:821, uvicorn's h11_impl.py:206-216)."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import select
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from starlette.requests import ClientDisconnect

from padoc_ray.serve import errors
from padoc_ray.serve.config import ServeConfig, token_fields
from padoc_ray.serve.guard import Guard, GuardConfig, is_open

TOKEN_A, TOKEN_B = "token-of-a", "token-of-b"
DIGEST_A, DIGEST_B = (hashlib.sha256(t.encode()).hexdigest() for t in (TOKEN_A, TOKEN_B))
CAP = 4096  # the tests' body cap
SLOW = str(CAP - 1)  # the Content-Length of a body that arrives a byte at a time (or never)
PREFIXES = [("", "/"), ("", "/padoc"), ("/gw", "/padoc")]  # (http_options.root_path, route_prefix)


class Seen:
    """What the app's routes got: requests that reached /v1/parse, and body bytes they received."""

    def __init__(self):
        self.entered = self.left = self.bytes = 0


def make_app(seen: Seen, config: GuardConfig) -> FastAPI:
    api = FastAPI()

    @api.get("/healthz")
    async def healthz():
        return {"status": "up"}

    @api.get("/readyz")
    async def readyz():
        return {"status": "ready"}

    @api.get("/v1/models")
    async def models(request: Request):
        return {"tenant": request.state.tenant}

    @api.post("/v1/parse")
    async def parse(request: Request):
        seen.entered += 1
        try:
            async for chunk in request.stream():
                seen.bytes += len(chunk)
        except ClientDisconnect:
            return Response(status_code=499)
        finally:
            seen.left += 1
        return {"tenant": request.state.tenant}

    @api.post("/v1/chat/completions")
    async def chat(body: dict):  # FastAPI reads and parses this body itself
        return {"keys": sorted(body)}

    api.add_middleware(Guard, config=config)
    errors.install(api)
    return api


def serve_mounted(app, route_prefix: str):
    """``app`` as Serve's proxy hands it requests for an application at ``route_prefix``."""
    async def mounted(scope, receive, send):
        if scope["type"] == "http" and route_prefix != "/":
            scope = dict(scope, root_path=scope.get("root_path", "") + route_prefix)
        await app(scope, receive, send)
    return mounted


class Service:
    def __init__(self, config: GuardConfig, root_path: str = "", route_prefix: str = "/"):
        self.seen = Seen()
        self.api = make_app(self.seen, config)
        self.prefix = "" if route_prefix == "/" else route_prefix
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(serve_mounted(self.api, route_prefix), root_path=root_path,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "uvicorn to start")
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}{self.prefix}", timeout=30)

    def guard(self) -> Guard:
        node = self.api.middleware_stack  # built on the first request
        while not isinstance(node, Guard):
            node = node.app
        return node

    def close(self):
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def service():
    made = []

    def make(root_path="", route_prefix="/", **kw) -> Service:
        kw = {"tokens_sha256": (DIGEST_A, DIGEST_B), "max_body_bytes": CAP, **kw}
        made.append(Service(GuardConfig(**kw), root_path, route_prefix))
        return made[-1]
    yield make
    for s in made:
        s.close()


def wait_for(ok, what: str, limit_s: float = 20.0) -> None:
    end = time.monotonic() + limit_s
    while not ok():
        if time.monotonic() > end:
            pytest.fail(f"waited {limit_s} s for {what}")
        time.sleep(0.01)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def code(resp) -> str:
    return resp.json()["error"]["code"]


class RawClient:
    """One HTTP/1.1 request written by hand, for bodies that arrive slowly, chunked, or never."""

    def __init__(self, svc: Service, path: str, headers: dict[str, str], source: str = "127.0.0.1"):
        self.sock = socket.create_connection(("127.0.0.1", svc.port), timeout=30, source_address=(source, 0))
        head = f"POST {svc.prefix}{path} HTTP/1.1\r\nHost: t\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(head.encode() + b"\r\n")

    def answered(self, wait_s: float = 0.0) -> bool:
        return bool(select.select([self.sock], [], [], wait_s)[0])

    def send_until_answered(self, pieces, every_s: float) -> int:
        """Send ``pieces`` one at a time until the server answers; how many were sent."""
        sent = 0
        for piece in pieces:
            if self.answered(every_s):
                break
            self.sock.sendall(piece)
            sent += 1
        return sent

    def response(self) -> tuple[int, dict[str, str], dict]:
        resp = http.client.HTTPResponse(self.sock)
        resp.begin()
        out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read())
        self.sock.close()
        return out


# ---- auth, under any prefix -----------------------------------------------------------------------
def test_open_routes():
    for route in ("/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/docs/a/b.js", "/",
                  "/ui/page.js"):
        assert is_open(route), route
    for route in ("", "//", "/ui", "/ui/", "/ui/../v1/models", "/uix/page.js",
                  "/v1/models", "/healthz/", "/healthzx", "/docs/", "/docs//x", "/docs/../v1/models",
                  "/docs/./x", "/admin", "/openapi.json/x"):
        assert not is_open(route), route


@pytest.mark.parametrize("root_path,route_prefix", PREFIXES)
def test_every_route_needs_the_token_but_the_open_ones_under_any_prefix(service, root_path, route_prefix):
    svc = service(root_path, route_prefix)
    for headers in ({}, bearer("wrong"), {"Authorization": TOKEN_A}, {"Authorization": f"Basic {TOKEN_A}"}):
        for r in (svc.http.get("/v1/models", headers=headers), svc.http.get("/nope", headers=headers),
                  svc.http.post("/v1/parse", headers=headers, json={"content_base64": "x" * 100})):
            assert (r.status_code, code(r)) == (401, errors.UNAUTHORIZED), (headers, r.request.url)
            assert r.headers["www-authenticate"] == "Bearer"
    assert svc.seen.entered == 0  # no body was read for a request without the token
    assert svc.http.get("/v1/models", headers=bearer(TOKEN_A)).json() == {"tenant": DIGEST_A[:16]}
    assert svc.http.get("/v1/models", headers=bearer(TOKEN_B)).json() == {"tenant": DIGEST_B[:16]}
    r = svc.http.get("/nope", headers=bearer(TOKEN_A))
    assert (r.status_code, code(r)) == (404, errors.NOT_FOUND)
    for route in ("/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect"):
        assert svc.http.get(route).status_code == 200, route


@pytest.mark.parametrize("root_path,route_prefix", PREFIXES)
def test_a_declared_body_over_the_cap_is_refused_unread(service, root_path, route_prefix):
    svc = service(root_path, route_prefix)
    client = RawClient(svc, "/v1/parse", {**bearer(TOKEN_A), "Content-Length": str(CAP + 1)})  # sends no body
    st, headers, body = client.response()
    assert (st, body["error"]["code"], headers["connection"]) == (413, "file_too_large", "close")
    assert svc.seen.entered == 0
    assert svc.http.post("/v1/parse", headers=bearer(TOKEN_A), content=b"x" * CAP).status_code == 200
    assert svc.seen.bytes == CAP


@pytest.mark.parametrize("root_path,route_prefix", PREFIXES)
@pytest.mark.parametrize("route", ["/v1/parse", "/v1/chat/completions"])
def test_a_chunked_body_is_refused_as_it_passes_the_cap(service, root_path, route_prefix, route):
    svc = service(root_path, route_prefix)
    client = RawClient(svc, route, {**bearer(TOKEN_A), "Transfer-Encoding": "chunked",
                                    "Content-Type": "application/json"})
    piece = b"400\r\n" + b" " * 1024 + b"\r\n"  # 1 KiB chunks; the cap is 4 KiB
    sent = client.send_until_answered([piece] * 1000, every_s=0.02)
    st, headers, body = client.response()
    assert (st, body["error"]["code"]) == (413, "file_too_large")
    assert sent < 1000  # answered while the body was still arriving
    assert svc.seen.bytes <= CAP  # the route never got more than the cap


# ---- slow bodies and request slots -------------------------------------------------------------------
def test_a_slow_body_gets_408_while_other_routes_answer(service):
    svc = service(body_timeout_s=1.0)
    slow = [RawClient(svc, "/v1/parse", {**bearer(TOKEN_A), "Content-Length": SLOW}) for _ in range(3)]
    for c in slow:
        c.sock.sendall(b"x")
    wait_for(lambda: svc.seen.entered == 3, "the slow requests to reach the route")
    assert svc.http.get("/healthz").status_code == 200
    assert svc.http.get("/v1/models", headers=bearer(TOKEN_B)).status_code == 200
    for c in slow:
        sent = c.send_until_answered([b"x"] * 200, every_s=0.1)  # one byte each 0.1 s, for 20 s at most
        st, headers, body = c.response()
        assert (st, body["error"]["code"], headers["connection"]) == (408, errors.BODY_TIMEOUT, "close")
        assert sent < 200
    wait_for(lambda: svc.seen.left == 3, "the slow requests to end")
    assert svc.guard().in_flight() == {}


def test_one_tenant_cannot_take_every_slot(service):
    svc = service(max_requests_per_tenant=16)
    holders = [RawClient(svc, "/v1/parse", {**bearer(TOKEN_A), "Content-Length": SLOW}) for _ in range(16)]
    wait_for(lambda: svc.seen.entered == 16, "16 requests of tenant A to be in flight")
    assert svc.guard().in_flight() == {DIGEST_A[:16]: 16}
    for _ in range(4):  # the 17th to 20th
        st, headers, body = RawClient(svc, "/v1/parse", {**bearer(TOKEN_A), "Content-Length": SLOW}).response()
        assert (st, body["error"]["code"], headers["retry-after"]) == (429, errors.TOO_MANY_REQUESTS, "1")
        r = svc.http.get("/v1/models", headers=bearer(TOKEN_A))
        assert (r.status_code, code(r)) == (429, errors.TOO_MANY_REQUESTS)
    assert svc.http.get("/v1/models", headers=bearer(TOKEN_B)).json() == {"tenant": DIGEST_B[:16]}
    assert svc.http.post("/v1/parse", headers=bearer(TOKEN_B), content=b"{}").status_code == 200
    assert svc.http.get("/healthz", headers=bearer(TOKEN_A)).status_code == 200  # open routes take no slot
    assert svc.seen.entered == 17
    for c in holders:
        c.sock.close()
    wait_for(lambda: svc.guard().in_flight() == {}, "the closed requests to give their slots back")
    assert svc.http.get("/v1/models", headers=bearer(TOKEN_A)).status_code == 200


def test_without_auth_slots_are_counted_per_client_address(service):
    svc = service(tokens_sha256=(), max_requests_per_tenant=2)
    assert svc.http.get("/v1/models").json() == {"tenant": ""}  # no auth: everyone is tenant ""
    holders = [RawClient(svc, "/v1/parse", {"Content-Length": SLOW}) for _ in range(2)]
    wait_for(lambda: svc.seen.entered == 2, "two requests from 127.0.0.1 to be in flight")
    assert svc.guard().in_flight() == {"client:127.0.0.1": 2}
    assert RawClient(svc, "/v1/parse", {"Content-Length": SLOW}).response()[0] == 429
    other = RawClient(svc, "/v1/parse", {"Content-Length": "2"}, source="127.0.0.2")
    other.sock.sendall(b"{}")
    assert other.response()[0] == 200
    for c in holders:
        c.sock.close()


# ---- the tenant header --------------------------------------------------------------------------
def test_the_tenant_header_names_the_tenant_and_is_validated(service):
    svc = service(tenant_header=True)
    assert svc.http.get("/v1/models", headers={"X-Padoc-Tenant": "acme"}).status_code == 401  # token still needed
    ok = svc.http.get("/v1/models", headers={**bearer(TOKEN_A), "X-Padoc-Tenant": "acme-1.eu_west"})
    assert ok.json() == {"tenant": "acme-1.eu_west"}
    for bad in ("", "a b", "x" * 65, "a/b", "ü"):
        r = svc.http.get("/v1/models", headers={**bearer(TOKEN_A), "X-Padoc-Tenant": bad.encode()})
        assert (r.status_code, code(r)) == (400, errors.BAD_TENANT), bad
    for headers in (bearer(TOKEN_A), [("Authorization", f"Bearer {TOKEN_A}"), ("X-Padoc-Tenant", "a"),
                                      ("X-Padoc-Tenant", "b")]):
        r = svc.http.get("/v1/models", headers=headers)
        assert (r.status_code, code(r)) == (400, errors.BAD_TENANT)
    assert svc.http.get("/healthz").status_code == 200
    open_svc = service(tokens_sha256=(), tenant_header=True)
    assert open_svc.http.get("/v1/models", headers={"X-Padoc-Tenant": "t9"}).json() == {"tenant": "t9"}


# ---- configuration ----------------------------------------------------------------------------------
def test_the_guard_s_config_comes_from_the_service_s():
    tokens = token_fields(f" {TOKEN_A}, ,{TOKEN_B},{TOKEN_A}")
    assert tokens == {"token_sha256": DIGEST_A, "extra_token_sha256": (DIGEST_B,)}
    assert token_fields("") == token_fields(None) == {"token_sha256": None, "extra_token_sha256": ()}
    cfg = ServeConfig(model="m", max_upload_bytes=1000, body_timeout_s=5, max_requests_per_tenant=3,
                      tenant_header=True, **tokens)
    g = GuardConfig.from_serve(cfg)
    assert (g.tokens_sha256, g.max_body_bytes, g.body_timeout_s, g.max_requests_per_tenant, g.tenant_header) == \
        ((DIGEST_A, DIGEST_B), 1000 + (1 << 20), 5, 3, True)
    assert GuardConfig.from_serve(ServeConfig(model="m")).tokens_sha256 == ()
    with pytest.raises(ValueError, match="extra_token_sha256 needs token_sha256"):
        ServeConfig(model="m", extra_token_sha256=(DIGEST_B,))
    with pytest.raises(ValueError, match="64 lowercase hex"):
        GuardConfig(tokens_sha256=(TOKEN_A,))
    with pytest.raises(ValueError, match="body_timeout_s"):
        GuardConfig(body_timeout_s=0)


async def never_called(scope, receive, send):
    raise AssertionError("the app is never called")


def asgi_call(scope: dict, app=never_called, config: GuardConfig | None = None) -> list[dict]:
    """What the guard sends for ``scope`` in front of ``app``; the body is 1000-byte chunks, without end."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}

    async def send(msg):
        sent.append(msg)

    asyncio.run(Guard(app, config or GuardConfig())({"path": "/v1/parse", "headers": [], **scope}, receive, send))
    return sent


def test_websockets_and_bad_lengths_are_refused():
    """Servers other than uvicorn (whose parser refuses bad lengths itself) may pass them on."""
    sent = asgi_call({"type": "websocket", "path": "/healthz"})
    assert [m["type"] for m in sent] == ["websocket.close"] and sent[0]["code"] == 1008
    for lengths in ([b"x1"], [b"\xb2"], [b"1", b"2"]):
        sent = asgi_call({"type": "http", "method": "POST", "headers": [(b"content-length", v) for v in lengths]})
        assert sent[0]["status"] == 400 and json.loads(sent[1]["body"])["error"]["code"] == errors.BAD_REQUEST


def test_an_app_without_starlette_s_exception_handling_still_gets_the_refusal_answered():
    async def raw_app(scope, receive, send):
        while True:
            await receive()

    sent = asgi_call({"type": "http", "method": "POST"}, raw_app, GuardConfig(max_body_bytes=CAP))
    assert sent[0]["status"] == 413 and json.loads(sent[1]["body"])["error"]["code"] == "file_too_large"


def test_the_host_guard_answers_only_the_names_it_was_given(service):
    from padoc_ray.viewer.hosts import answered_hosts

    svc = service(tokens_sha256=(), hosts=tuple(answered_hosts("127.0.0.1", ("api.internal",))))
    port = svc.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "api.internal", "API.internal:80"):
        assert svc.http.get("/v1/models", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "api.internal.evil"):
        r = svc.http.get("/v1/models", headers={"Host": host})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host", host
        assert svc.http.get("/", headers={"Host": host}).status_code == 400  # open routes too
    assert svc.http.get("/healthz", headers={"Host": "evil.example"}).status_code == 200  # probes by address
    # the service's guard: the host list without a token, or when one is given; none with a token alone
    assert set(GuardConfig.from_serve(ServeConfig(model="m")).hosts) == {"127.0.0.1", "localhost"}
    assert "0.0.0.0" not in GuardConfig.from_serve(ServeConfig(model="m", listen_host="0.0.0.0")).hosts
    assert "box.lan" in GuardConfig.from_serve(ServeConfig(model="m", listen_host="box.lan")).hosts
    tokens = token_fields(TOKEN_A)
    assert GuardConfig.from_serve(ServeConfig(model="m", **tokens)).hosts == ()
    assert "api.internal" in GuardConfig.from_serve(ServeConfig(model="m", allowed_hosts=("api.internal",),
                                                                **tokens)).hosts


def test_the_docs_page_allows_its_own_inline_script_and_nothing_else_inline():
    import base64
    import re

    from starlette.requests import Request

    from padoc_ray.serve import docs

    resp = docs.page(Request({"type": "http", "root_path": "", "headers": []}), "padoc-ray")
    policy = resp.headers["content-security-policy"]
    scripts = re.findall(rb"<script>(.*?)</script>", resp.body, re.S)
    assert scripts and "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";", 1)[0]
    for body in scripts:
        assert f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'" in policy
    assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy
