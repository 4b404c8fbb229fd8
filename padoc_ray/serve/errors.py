"""The online service's error shapes and its request-level error codes.

Two shapes, both JSON:

* the API's own, ``{"error": {"code", "message"}}``: every route but chat, every framework error
  (unknown route, wrong method, invalid query) and every refusal of the HTTP guard
  (:mod:`padoc_ray.serve.guard`), chat's included;
* OpenAI's, ``{"error": {"message", "type", "param", "code"}}``: what /v1/chat/completions answers
  itself, so that OpenAI clients raise their usual exceptions.

Page and document codes (``file_too_large``, ``not_pdf``, ``overloaded``, ...) live in
:mod:`padoc_ray.status`; the codes here are about the request itself. :func:`install` adds the
framework handlers to an app. Pure: fastapi/starlette only.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from padoc_ray import status

# ---- request-level codes (docs/serve.md) ------------------------------------------------
BAD_REQUEST = "bad_request"  #: 400/422: a malformed request (query, JSON, Content-Length, options)
UNAUTHORIZED = "unauthorized"  #: 401: no valid bearer token (with ``WWW-Authenticate: Bearer``)
BAD_HOST = "bad_host"  #: 400: a Host header naming none of the names the service answers to (DNS rebinding)
BAD_TENANT = "bad_tenant"  #: 400: X-Padoc-Tenant missing or not 1-64 chars of [A-Za-z0-9._-]
NOT_FOUND = "not_found"  #: 404: no such route
METHOD_NOT_ALLOWED = "method_not_allowed"  #: 405
BODY_TIMEOUT = "body_timeout"  #: 408: the request body did not arrive whole within body_timeout_s
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  #: 415: neither multipart/form-data nor JSON
TOO_MANY_REQUESTS = "too_many_requests"  #: 429: the tenant has max_requests_per_tenant requests in flight
NOT_READY = "not_ready"  #: 503: the service is starting
BAD_PAGES = "bad_pages"  #: 422: a page selection that does not parse (``pages=``)
BAD_IMAGE_URL = "bad_image_url"  #: chat: an image_url that is neither a data URL nor an allowed s3:// URI
ONE_IMAGE = "one_image"  #: chat: not exactly one page image
STREAM_UNSUPPORTED = "stream_unsupported"  #: chat: stream=true
MODEL_NOT_FOUND = "model_not_found"  #: chat: a model other than the served one
JOB_NOT_FOUND = "job_not_found"  #: 404: no such job (or another tenant's)
JOB_NOT_FINISHED = "job_not_finished"  #: 409: the job's result is not ready (with Retry-After)
JOB_CANCELLED = "job_cancelled"  #: 409: the job was cancelled: it has no result
TOO_MANY_JOBS = "too_many_jobs"  #: 429: the service's or the tenant's job limits are reached (with Retry-After)
ERROR = "error"  #: a framework error whose status has no code of its own

#: the code of a framework error (an HTTPException without a code of its own), by status
HTTP_CODES = {400: BAD_REQUEST, 401: UNAUTHORIZED, 404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 408: BODY_TIMEOUT,
              413: status.FILE_TOO_LARGE, 415: UNSUPPORTED_MEDIA_TYPE, 422: BAD_REQUEST, 429: TOO_MANY_REQUESTS}


class Refused(HTTPException):
    """A request refused with one of this API's codes, raised where no response can be returned
    (inside an ASGI ``receive``). An HTTPException, so FastAPI's body parsing lets it through (it turns
    other exceptions into a 400) and :func:`http_error` answers it with its own code."""

    def __init__(self, status_code: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(status_code, message, headers)
        self.code = code

    def response(self) -> JSONResponse:
        return error(self.status_code, self.code, self.detail, self.headers)


def error(status_code: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's error shape: ``{"error": {"code", "message"}}``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status_code, headers=headers)


def openai_error(status_code: int, code: str, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error shape (chat): ``{"error": {"message", "type", "param", "code"}}``; ``kind`` is
    OpenAI's ``type`` (``invalid_request_error``, ``server_error``, ``timeout_error``)."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status_code, headers=headers)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Every framework error (and every :class:`Refused`) in the API's one error shape."""
    code = getattr(exc, "code", None) or HTTP_CODES.get(exc.status_code, ERROR)
    detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
    return error(exc.status_code, code, detail, headers=getattr(exc, "headers", None))


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A query or body that fails validation: 422 ``bad_request`` naming the first few problems."""
    problems = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()[:5])
    return error(422, BAD_REQUEST, problems[:1000] or "invalid request")


def install(api: FastAPI) -> None:
    """Answer every framework error of ``api`` in the API's error shape (before Serve freezes ``api``)."""
    api.add_exception_handler(HTTPException, http_error)
    api.add_exception_handler(RequestValidationError, validation_error)
