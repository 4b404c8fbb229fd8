"""What a request names as its document: a multipart upload, base64 in JSON, or an allowed s3://
object; and its options (pages, mode, format). Errors are refusals (:class:`~padoc_ray.serve.errors.Refusal`).

The body itself is bounded before it reaches here (size and time: :mod:`padoc_ray.serve.guard`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os

from padoc_ray import status
from padoc_ray.serve import errors
from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.runner import Document
from padoc_ray.serve.schemas import ParseJSON
from padoc_ray.storage import normalize_uri, read_bytes, s3_key_is_plain, under_prefix

OPTIONS = ("pages", "mode", "format")


def label(name: str | None, default: str) -> str:
    """A client-given file name as a label only: its last path part, printable, at most 255 chars."""
    base = os.path.basename((name or "").replace("\\", "/").rstrip("/"))
    base = "".join(c for c in base if c.isprintable())[:255]
    return base or default


def check_size(data: bytes, cfg: ServeConfig, what: str = "") -> None:
    if len(data) > cfg.max_upload_bytes:
        raise Refusal(status.FILE_TOO_LARGE, f"{what}over the limit of {cfg.max_upload_bytes} bytes")


async def fetch_s3(uri: str, cfg: ServeConfig) -> tuple[bytes, str]:
    """An allowed s3:// object's bytes (its key's last part is its label). Errors never name the bucket."""
    try:
        uri = normalize_uri(uri)
    except ValueError:
        raise Refusal(errors.Overrides.UNPARSABLE_URI, "not an allowed storage URI") from None
    if not uri.startswith("s3://") or not s3_key_is_plain(uri) or not any(under_prefix(uri, p)
                                                                         for p in cfg.allowed_s3):
        raise Refusal(status.DISALLOWED_URI, "this service reads no storage URI but those under its allowed "
                                              "prefixes")
    try:
        data = await asyncio.to_thread(read_bytes, uri, cfg.storage, max_bytes=cfg.max_upload_bytes)
    except (OSError, ValueError):
        raise Refusal(status.READ_FAILED, "the object could not be read (missing, or no access)") from None
    check_size(data, cfg, "the object is ")
    return data, label(uri.rsplit("/", 1)[-1], "document")


async def read_document(request, cfg: ServeConfig) -> tuple[Document, dict]:
    """(document, options) of a /v1/parse or /v1/jobs request: multipart or JSON."""
    q = request.query_params
    opts = {k: q.get(k) for k in OPTIONS}
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        form = await request.form()
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise Refusal(status.MISSING_FILE, "multipart field 'file' (the document) is required")
        for k in OPTIONS:
            v = form.get(k)
            if isinstance(v, str) and v:
                opts[k] = v
        data = await upload.read()
        name = label(upload.filename, "document")
    elif ctype.startswith("application/json"):
        try:
            body = ParseJSON.model_validate_json(await request.body())
        except ValueError as e:
            raise Refusal(errors.INVALID_REQUEST, f"invalid JSON body: {str(e)[:500]}") from None
        for k in OPTIONS:
            if getattr(body, k):
                opts[k] = getattr(body, k)
        if (body.content_base64 is None) == (body.uri is None):
            raise Refusal(errors.BAD_REQUEST, "give exactly one of content_base64 and uri")
        if body.uri is not None:
            data, name = await fetch_s3(body.uri, cfg)
        else:
            data, name = decode_base64(body.content_base64, "content_base64"), "document"
        name = label(body.filename, name)
    else:
        raise Refusal(errors.UNSUPPORTED_MEDIA_TYPE, "send multipart/form-data (field 'file') or application/json")
    if opts["mode"] not in (None, "fork", "sequential"):
        raise Refusal(errors.INVALID_REQUEST, "mode is fork or sequential")
    if opts["format"] not in (None, "json", "markdown"):
        raise Refusal(errors.INVALID_REQUEST, "format is json or markdown")
    check_size(data, cfg)
    return Document(data, name), opts


def decode_base64(text: str, what: str, code: str = errors.BAD_REQUEST) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Refusal(code, f"{what} is not valid base64") from None
