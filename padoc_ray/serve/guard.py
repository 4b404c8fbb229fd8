"""The ingress's HTTP guard: pure ASGI middleware in front of every route, before any body is read.

* **Default-deny auth.** When tokens are configured, every route needs ``Authorization: Bearer
  <token>`` except the open ones (:data:`OPEN_ROUTES`: health, readiness, the schema and its UI,
  the page view and its assets, which hold no data: its data calls carry the token),
  whatever prefix the app is mounted under. A route is the path as Starlette routes it
  (``starlette._utils.get_route_path``, which its Router uses: ``path`` minus ``root_path``). Serve
  keeps an application's ``route_prefix`` in ``path`` and appends it to ``root_path``
  (ray/serve/_private/proxy.py, ``set_root_path``), so a check on ``path`` alone misses every route
  under a prefix.
* **Tenants.** A request's tenant is its token (the first 16 hex digits of the token's sha256; with
  several tokens accepted, each is its own tenant) or, with ``tenant_header``, the ``X-Padoc-Tenant``
  header that a trusted gateway sets (1-64 chars of ``[A-Za-z0-9._-]``, else 400 ``bad_tenant``; the
  token is still required when one is configured). With neither it is ``""``. Routes read it as
  ``request.state.tenant``.
* **Request slots.** One tenant has at most ``max_requests_per_tenant`` requests in flight on this
  replica (past it 429 ``too_many_requests`` with Retry-After), so that one client cannot hold all of
  Serve's ingress slots. Without a tenant (no token, no header) slots are counted per client address
  (``scope["client"]``: the TCP peer, so behind a load balancer every client shares its address; use
  a token per client or the tenant header there). Open routes take no slot and are never refused.
* **Host names.** With ``hosts`` set (a service without a token, or one given ``allowed_hosts``), a
  request whose Host header names none of them gets 400 ``bad_host``, open routes too, except the
  probes (``/healthz``, ``/readyz``: orchestrators call them by address): a web page that rebinds
  its own name to the service's address reads nothing (:mod:`padoc_ray.viewer.hosts`).
* **Bodies.** 413 ``file_too_large`` on a Content-Length over ``max_body_bytes`` (nothing is read),
  or as soon as a chunked body passes it; 408 ``body_timeout`` when the whole body has not arrived
  ``body_timeout_s`` after the request reached the guard, so a slow client holds its slot that long
  at most. Every refusal closes the connection (the body, if any, was not read whole).

Refusals use the API's error shape (:mod:`padoc_ray.serve.errors`). Pure: fastapi/starlette only.
Mount it with ``api.add_middleware(Guard, config=GuardConfig.from_serve(cfg))``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette._utils import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from padoc_ray import status
from padoc_ray.serve import errors
from padoc_ray.serve.errors import Refusal
from padoc_ray.viewer.hosts import answered_hosts, host_name

if TYPE_CHECKING:
    from padoc_ray.serve.config import ServeConfig

#: routes that need no token and take no request slot; one ending in "/" opens the routes under it ("/" is
#: the page view alone)
OPEN_ROUTES = ("/healthz", "/readyz", "/openapi.json", "/docs", "/docs/", "/", "/ui/")
#: room for the multipart or JSON envelope around a document of max_upload_bytes
ENVELOPE_BYTES = 1 << 20
#: routes an orchestrator probes by address: answered whatever the Host header names
PROBES = ("/healthz", "/readyz")
TENANT_HEADER = "X-Padoc-Tenant"
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_NUMBER = re.compile(r"[0-9]{1,20}")


def is_open(route: str, open_routes: tuple[str, ...] = OPEN_ROUTES) -> bool:
    """Whether ``route`` (a path as Starlette routes it) is open: one of ``open_routes``, or under one
    that ends in "/" with no empty, "." or ".." segment (no path that something in between could
    resolve to another route passes as open). ``"/"`` opens itself only, never every route."""
    for r in open_routes:
        if r == "/" or not r.endswith("/"):
            if route == r:
                return True
        elif route.startswith(r) and all(s not in ("", ".", "..") for s in route[len(r):].split("/")):
            return True
    return False


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    #: sha256 (lowercase hex) of each accepted bearer token, each its own tenant; empty: no auth
    tokens_sha256: tuple[str, ...] = ()
    #: the tenant is the X-Padoc-Tenant header (a trusted gateway sets it) instead of the token
    tenant_header: bool = False
    #: request bodies above this get 413, before they are read whole
    max_body_bytes: int = (50 << 20) + ENVELOPE_BYTES
    body_timeout_s: float = 60.0  #: seconds a client may take to send its whole body (408 after)
    max_requests_per_tenant: int = 16  #: requests of one tenant in flight at once (429 past it)
    retry_after_s: int = 1  #: the Retry-After of a 429
    open_routes: tuple[str, ...] = OPEN_ROUTES  #: routes that need no token and take no slot
    #: the Host names answered (any other: 400 bad_host); empty: any name
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [d for d in self.tokens_sha256 if not _DIGEST.fullmatch(d)]
        if bad:
            raise ValueError(f"tokens_sha256 holds sha256 digests (64 lowercase hex digits); got {len(bad)} others")
        if self.max_body_bytes < 1 or self.max_requests_per_tenant < 1 or self.retry_after_s < 1:
            raise ValueError("max_body_bytes, max_requests_per_tenant and retry_after_s must be >= 1")
        if not self.body_timeout_s > 0:
            raise ValueError("body_timeout_s must be > 0")
        if any(not r.startswith("/") for r in self.open_routes):
            raise ValueError(f"open_routes are paths starting with '/', got {self.open_routes}")

    @classmethod
    def from_serve(cls, cfg: ServeConfig) -> GuardConfig:
        """The guard of a service: its tokens, tenant mode, upload cap (plus the envelope), body
        deadline and per-tenant request cap."""
        tokens = tuple(d for d in (cfg.token_sha256, *cfg.extra_token_sha256) if d)
        hosts = answered_hosts(cfg.listen_host, cfg.allowed_hosts) if cfg.allowed_hosts or not tokens else ()
        return cls(tokens_sha256=tokens, tenant_header=cfg.tenant_header,
                   max_body_bytes=cfg.max_upload_bytes + ENVELOPE_BYTES, body_timeout_s=cfg.body_timeout_s,
                   max_requests_per_tenant=cfg.max_requests_per_tenant, hosts=tuple(hosts))


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]


class _Body:
    """The request's ``receive``, counted and bounded until the body's last message: raises
    :class:`Refusal` (413 past ``cap`` bytes, 408 past ``deadline``, the event loop's clock), and the
    same again on every later call. After the body it passes messages through untimed (a route may
    wait on ``receive`` for the client's disconnect)."""

    def __init__(self, receive: Receive, cap: int, deadline: float, timeout_s: float):
        self.receive, self.cap, self.deadline, self.timeout_s = receive, cap, deadline, timeout_s
        self.seen, self.done = 0, False
        self.refusal: Refusal | None = None

    async def __call__(self) -> Message:
        if self.refusal is not None:
            raise self.refusal
        if self.done:
            return await self.receive()
        try:
            async with asyncio.timeout_at(self.deadline):
                msg = await self.receive()
        except TimeoutError:
            self.refusal = Refusal(errors.BODY_TIMEOUT, f"the request body did not arrive whole within "
                                                        f"{self.timeout_s:g} s", close=True)
            raise self.refusal from None
        if msg["type"] != "http.request":
            self.done = True  # http.disconnect: the route sees it
            return msg
        self.seen += len(msg.get("body", b""))
        if self.seen > self.cap:
            self.refusal = Refusal(status.FILE_TOO_LARGE, f"request body over the limit of {self.cap} bytes",
                                   close=True)
            raise self.refusal
        self.done = not msg.get("more_body", False)
        return msg


def token_tenant(scope: Scope, cfg: GuardConfig) -> str | None:
    """The tenant of the request's bearer token (its digest's first 16 hex digits); None when it
    carries none of the configured tokens. Every token is compared (in constant time), so the time
    says nothing of which one matched."""
    auth = _headers(scope, b"authorization")
    scheme, _, token = (auth[0] if len(auth) == 1 else "").partition(" ")
    given = hashlib.sha256(token.strip().encode()).hexdigest() if scheme.lower() == "bearer" else ""
    tenant = None
    for digest in cfg.tokens_sha256:
        if hmac.compare_digest(given, digest):
            tenant = digest[:16]
    return tenant


def authenticated(scope: Scope, cfg: GuardConfig) -> bool:
    """Whether an open route's caller may see more (the engine's counts on /readyz): it carries a
    valid token, or the service has none."""
    return not cfg.tokens_sha256 or token_tenant(scope, cfg) is not None


class Guard:
    """Pure ASGI middleware: auth, tenant, request slot and body limits (see the module docstring)."""

    def __init__(self, app: ASGIApp, config: GuardConfig):
        self.app, self.config = app, config
        self._slots: collections.Counter[str] = collections.Counter()

    def in_flight(self) -> dict[str, int]:
        """Requests in flight on this replica, by slot (the tenant, or ``client:ADDRESS``)."""
        return {k: n for k, n in self._slots.items() if n}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the API has no websocket route
            return await WebSocketClose(1008, "no websocket routes")(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = get_route_path(scope)
        if self.config.hosts and route not in PROBES:
            got = _headers(scope, b"host")
            if len(got) != 1 or host_name(got[0]) not in self.config.hosts:
                shown = got[0][:100] if len(got) == 1 else f"{len(got)} Host headers"
                return await Refusal(errors.BAD_HOST, f"this service does not answer to {shown!r} (it answers "
                                                      f"to {', '.join(self.config.hosts)}; more names: allowed_hosts, "
                                                      f"--allowed-host)", close=True).response()(scope, receive, send)
        if is_open(route, self.config.open_routes):
            return await self.app(scope, receive, send)
        cfg = self.config
        try:
            tenant = self._tenant(scope)
            self._check_length(scope)
        except Refusal as e:
            return await e.response()(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        client = scope.get("client")
        slot = tenant or f"client:{client[0] if client else '?'}"
        if self._slots[slot] >= cfg.max_requests_per_tenant:
            refused = Refusal(errors.TOO_MANY_REQUESTS, f"{cfg.max_requests_per_tenant} requests of this tenant "
                              f"(without one: this client address) are in flight, the most it may have; retry when "
                              f"one finishes", retry_after=cfg.retry_after_s, close=True)
            return await refused.response()(scope, receive, send)
        self._slots[slot] += 1
        body = _Body(receive, cfg.max_body_bytes, asyncio.get_running_loop().time() + cfg.body_timeout_s,
                     cfg.body_timeout_s)
        started = False

        async def tracked(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, body, tracked)
        except Refusal as e:  # an inner app without Starlette's exception middleware let it through
            if not started:  # else the response is cut short: the server closes the connection
                await e.response()(scope, receive, send)
        finally:
            self._slots[slot] -= 1
            if not self._slots[slot]:
                del self._slots[slot]

    def _tenant(self, scope: Scope) -> str:
        """The request's tenant, after its token is checked (:class:`Refusal` 401 / 400)."""
        cfg, tenant = self.config, ""
        if cfg.tokens_sha256:
            tenant = token_tenant(scope, cfg) or ""
            if not tenant:
                raise Refusal(errors.UNAUTHORIZED, "a valid bearer token is required",
                              headers={"WWW-Authenticate": "Bearer"}, close=True)
        if cfg.tenant_header:
            values = _headers(scope, TENANT_HEADER.lower().encode())
            if len(values) != 1 or not _TENANT.fullmatch(values[0]):
                raise Refusal(errors.BAD_TENANT, f"send one {TENANT_HEADER} header of 1-64 characters of "
                                                 f"A-Z a-z 0-9 . _ -", close=True)
            tenant = values[0]
        return tenant

    def _check_length(self, scope: Scope) -> None:
        """413 on a declared body over the cap, 400 on a Content-Length that is not one number."""
        values = _headers(scope, b"content-length")
        if not values:
            return
        if len(values) > 1 or not _NUMBER.fullmatch(values[0].strip()):
            raise Refusal(errors.BAD_REQUEST, "invalid Content-Length", close=True)
        if int(values[0]) > self.config.max_body_bytes:
            raise Refusal(status.FILE_TOO_LARGE, f"request body over the limit of {self.config.max_body_bytes} "
                                                 f"bytes", close=True)
