"""The online service's refusals: one type (:class:`Refusal`), the request-level error codes, and the
one place a code becomes an HTTP status (:func:`http_status`).

A refusal is a code and a message, and maybe a Retry-After, ``Connection: close`` or another header.
Whoever refuses (the runner, the upload reader, the job manager, the OpenAI route, the HTTP guard)
names the code only; its HTTP status follows from the code, at the edge: :func:`http_status` is
the only place statuses are chosen. Two error shapes, both JSON:

* the API's own, ``{"error": {"code", "message"}}`` (:meth:`Refusal.response`): every route but
  chat, every framework error (unknown route, wrong method, invalid query) and every refusal of
  the HTTP guard (:mod:`padoc_ray.serve.guard`), chat's included;
* OpenAI's, ``{"error": {"message", "type", "param", "code"}}`` (:meth:`Refusal.openai_response`):
  what /v1/chat/completions answers itself, so that OpenAI clients raise their usual exceptions.

Page and document codes (``file_too_large``, ``not_pdf``, ``overloaded``, ...) live in
:mod:`padoc_ray.status`, whose table gives their status; the codes here are about the request
itself, each a :class:`Code` that carries its status. A code string may stand for two codes that
differ in status only, so that clients keep the code they always got: ``bad_request`` is 400
(:data:`BAD_REQUEST`, a request that cannot be read) or 422 (:data:`INVALID_REQUEST`, values that
fail validation), and :class:`Overrides` holds the catalogue codes one refusal answers with a
status of its own. :func:`install` adds the framework handlers to an app. Pure: fastapi/starlette only.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from padoc_ray import status


class Code(str):
    """A request-level error code: the string clients get, and ``http``, the status it is answered with."""

    http: int

    def __new__(cls, name: str, http: int) -> Code:
        code = super().__new__(cls, name)
        code.http = http
        return code

    def __reduce__(self):
        return Code, (str(self), self.http)


# ---- request-level codes (docs/serve.md) ------------------------------------------------
BAD_REQUEST = Code("bad_request", 400)  #: a request that cannot be read (Content-Length, base64, the body's fields)
INVALID_REQUEST = Code(BAD_REQUEST, 422)  #: ``bad_request`` at 422: values that fail validation (query, JSON, options)
UNAUTHORIZED = Code("unauthorized", 401)  #: no valid bearer token (with ``WWW-Authenticate: Bearer``)
BAD_HOST = Code("bad_host", 400)  #: a Host header naming none of the names the service answers to (DNS rebinding)
BAD_TENANT = Code("bad_tenant", 400)  #: X-Padoc-Tenant missing or not 1-64 chars of [A-Za-z0-9._-]
NOT_FOUND = Code("not_found", 404)  #: no such route (or asset)
METHOD_NOT_ALLOWED = Code("method_not_allowed", 405)
BODY_TIMEOUT = Code("body_timeout", 408)  #: the request body did not arrive whole within body_timeout_s
UNSUPPORTED_MEDIA_TYPE = Code("unsupported_media_type", 415)  #: neither multipart/form-data nor JSON
TOO_MANY_REQUESTS = Code("too_many_requests", 429)  #: the tenant has max_requests_per_tenant requests in flight
NOT_READY = Code("not_ready", 503)  #: the service is starting
BAD_PAGES = Code("bad_pages", 422)  #: a page selection that does not parse (``pages=``)
BAD_IMAGE_URL = Code("bad_image_url", 400)  #: chat: an image_url that is neither a data URL nor an allowed s3:// URI
ONE_IMAGE = Code("one_image", 400)  #: chat: not exactly one page image
STREAM_UNSUPPORTED = Code("stream_unsupported", 400)  #: chat: stream=true
MODEL_NOT_FOUND = Code("model_not_found", 404)  #: chat: a model other than the served one
JOB_NOT_FOUND = Code("job_not_found", 404)  #: no such job (or another tenant's)
JOB_NOT_FINISHED = Code("job_not_finished", 409)  #: the job's result is not ready (with Retry-After)
JOB_CANCELLED = Code("job_cancelled", 409)  #: the job was cancelled: it has no result
TOO_MANY_JOBS = Code("too_many_jobs", 429)  #: the service's or the tenant's job limits are reached (with Retry-After)
ERROR = "error"  #: a framework error whose status has no code of its own


class Overrides:
    """Status-catalogue codes (:mod:`padoc_ray.status`) as one refusal answers them, with a status other
    than the catalogue's: the code clients get is the catalogue's."""

    #: ``disallowed_uri`` at 400: a storage URI that does not parse (one outside the allowed prefixes: 403)
    UNPARSABLE_URI = Code(status.DISALLOWED_URI, 400)


#: the code of a framework error (an HTTPException that is no :class:`Refusal`), by its status
HTTP_CODES = {400: BAD_REQUEST, 401: UNAUTHORIZED, 404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 408: BODY_TIMEOUT,
              413: status.FILE_TOO_LARGE, 415: UNSUPPORTED_MEDIA_TYPE, 422: INVALID_REQUEST, 429: TOO_MANY_REQUESTS}


def http_status(code: str, default: int = 422) -> int:
    """The HTTP status a refusal with ``code`` is answered with: a :class:`Code` carries its own; any
    other code is the status catalogue's (:func:`padoc_ray.status.http_status`: ``default`` for a code
    it does not know)."""
    return code.http if isinstance(code, Code) else status.http_status(code, default)


class Refusal(HTTPException):
    """A request refused: ``code`` and ``message``; the HTTP status is the code's (:func:`http_status`).

    ``retry_after``: seconds for a Retry-After header (try again then); ``close``: the connection
    closes after the answer (the HTTP guard's refusals: the body, if any, was not read whole);
    ``headers``: any other header (WWW-Authenticate). An HTTPException, so that FastAPI's body parsing
    lets it through (it turns other exceptions into a 400): raised anywhere, even inside an ASGI
    ``receive``, it is answered by :func:`http_error`; a route that catches it answers
    :meth:`response` or :meth:`openai_response`."""

    def __init__(self, code: str, message: str, *, retry_after: int | None = None, close: bool = False,
                 headers: dict[str, str] | None = None):
        headers = dict(headers or {})
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if close:
            headers["Connection"] = "close"
        super().__init__(http_status(code), message, headers)
        self.code, self.message, self.close = code, message, close

    @property
    def status(self) -> int:
        """The HTTP status (``status_code``)."""
        return self.status_code

    def response(self) -> JSONResponse:
        """The refusal in the API's error shape."""
        return error(self.status_code, self.code, self.message, self.headers)

    def openai_response(self, kind: str | None = None) -> JSONResponse:
        """The refusal in OpenAI's error shape (see :func:`openai_error` for ``kind``)."""
        return openai_error(self.status_code, self.code, self.message, kind, self.headers)


def error(status_code: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's error shape: ``{"error": {"code", "message"}}``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status_code, headers=headers)


def openai_error(status_code: int, code: str, message: str, kind: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error shape (chat): ``{"error": {"message", "type", "param", "code"}}``; ``kind`` is
    OpenAI's ``type``: ``invalid_request_error`` for a 4xx and ``server_error`` otherwise, unless
    given (``timeout_error``)."""
    kind = kind or ("invalid_request_error" if 400 <= status_code < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status_code, headers=headers)


def openai_page_error(code: str, message: str) -> JSONResponse:
    """A chat page that has no content, in OpenAI's error shape: ``code`` is the page's status, answered
    with the catalogue's HTTP status for it (500 for a status the catalogue lacks)."""
    return openai_error(http_status(code, 500), code, message)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Every framework error (and every :class:`Refusal` no route caught) in the API's one error shape."""
    if isinstance(exc, Refusal):
        return exc.response()
    detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
    return error(exc.status_code, HTTP_CODES.get(exc.status_code, ERROR), detail, headers=exc.headers)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A query or body that fails validation: 422 ``bad_request`` naming the first few problems."""
    problems = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()[:5])
    return Refusal(INVALID_REQUEST, problems[:1000] or "invalid request").response()


def install(api: FastAPI) -> None:
    """Answer every framework error of ``api`` in the API's error shape (before Serve freezes ``api``)."""
    api.add_exception_handler(HTTPException, http_error)
    api.add_exception_handler(RequestValidationError, validation_error)
