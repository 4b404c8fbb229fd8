"""The OpenAI-compatible route: ``POST /v1/chat/completions`` with one page image in, its Markdown out.

The answer is a ``chat.completion`` whose ``usage`` counts the page's tokens, plus a ``padoc`` object
(the page's status, validity, branches, regions and their ``spans`` when the page row has them).
Errors come in OpenAI's error shape: a refusal (:class:`~padoc_ray.serve.errors.Refusal`) with its
code's status, or a failed page with its status's.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from padoc_ray import status
from padoc_ray.serve import errors
from padoc_ray.serve.engine import mode_refusal
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.runner import INTERACTIVE, Document, DocumentRunner, RunOptions
from padoc_ray.serve.schemas import ChatRequest, PadocOptions
from padoc_ray.serve.uploads import check_size, decode_base64, fetch_s3, label


def _image(body: ChatRequest) -> str:
    urls = [p.image_url.url for m in body.messages if isinstance(m.content, list)
            for p in m.content if p.type == "image_url" and p.image_url is not None]
    if len(urls) != 1:
        raise Refusal(errors.ONE_IMAGE, f"send exactly one page image (image_url); got {len(urls)}")
    return urls[0]


async def _document(url: str, cfg) -> tuple[bytes, str]:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or ";base64" not in header:
            raise Refusal(errors.BAD_IMAGE_URL, "image_url must be a base64 data URL or an allowed s3:// URI")
        data, name = decode_base64(payload, "the data URL", errors.BAD_IMAGE_URL), "image"
    elif url.startswith("s3://"):
        data, name = await fetch_s3(url, cfg)
    else:
        raise Refusal(errors.BAD_IMAGE_URL, "this service fetches no URLs: send a base64 data URL (or an allowed "
                                            "s3:// URI)")
    check_size(data, cfg)
    return data, name


async def chat(body: ChatRequest, *, cfg, runner: DocumentRunner, tenant: str, model_info: dict | None = None):
    """``model_info``: the served checkpoint's family and modes (:func:`padoc_ray.serve.engine.model_info`);
    a ``padoc.mode`` it lacks gets 422 ``unsupported_mode`` before anything is rendered."""
    try:
        if body.stream:
            raise Refusal(errors.STREAM_UNSUPPORTED, "stream=true is not supported; send stream=false")
        if body.model not in (None, cfg.served_model_id):
            raise Refusal(errors.MODEL_NOT_FOUND, f"the model {body.model!r} does not exist; see /v1/models")
        data, name = await _document(_image(body), cfg)
        padoc = body.padoc or PadocOptions()
        refused = mode_refusal(model_info, padoc.mode or cfg.host.mode)
        if refused is not None:
            raise refused
        runner.admit()
        opt = RunOptions(wanted=(0,), mode=padoc.mode or cfg.host.mode, max_pages=1, tenant=tenant,
                         salt=uuid.uuid4().hex, run_id=uuid.uuid4().hex[:12], klass=INTERACTIVE)
        page_rows, _ = await asyncio.wait_for(runner.parse_all(Document(data, label(padoc.filename, name)), opt),
                                              cfg.request_timeout_s)
    except Refusal as e:
        return e.openai_response()
    except TimeoutError:
        return Refusal(status.REQUEST_TIMEOUT, f"not finished within {cfg.request_timeout_s:g} s").openai_response(
            "timeout_error")
    row = page_rows[0]
    code = row["status"]
    if code not in status.CONTENT_CODES:
        return errors.openai_page_error(code, row.get("error_message") or code)
    completion = int(row.get("output_tokens") or 0)
    prompt = int(row.get("prompt_tokens") or 0)
    extra = {"status": code, "valid": row.get("valid"), "n_branches": row.get("n_branches"),
             "regions": len(row.get("regions") or [])}
    if row.get("spans") is not None:
        extra["spans"] = row["spans"]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": cfg.served_model_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": row.get("markdown") or ""},
                     "finish_reason": "stop" if code == status.OK else "length", "logprobs": None}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        "padoc": extra,
    }
