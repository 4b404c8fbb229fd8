"""The online API's request bodies (pydantic: validation and the OpenAPI schema) and its description.

Pure: pydantic only. The routes are in :mod:`padoc_ray.serve.app`; the error shapes in
:mod:`padoc_ray.serve.errors`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

API_DESCRIPTION = """PaDoc document parsing (layout-fork decoding on vLLM).

Page results carry the batch job's page-row fields and status codes. `markdown` is **data, not HTML
to render**: tables come through as HTML (`<table>...`) and text is not escaped; sanitize before
showing it in a browser. When the service has a token (PADOC_RAY_API_TOKEN), every route needs
`Authorization: Bearer <token>` but /healthz, /readyz (which then shows the engine's counts only to
an authenticated caller), this schema and /docs."""

Mode = Literal["fork", "sequential"]
Format = Literal["json", "markdown"]


class ParseJSON(BaseModel):
    """The JSON body of /v1/parse and /v1/jobs: exactly one of ``content_base64`` and ``uri``."""

    model_config = ConfigDict(extra="forbid")
    content_base64: str | None = Field(None, description="the document (PDF or image), base64")
    uri: str | None = Field(None, description="an s3:// object in a bucket the operator allowed")
    filename: str | None = Field(None, max_length=255, description="a label; with --replay it picks the truth")
    pages: str | None = Field(None, max_length=1000, description="1-based pages, e.g. 1-3,7 (default: all)")
    mode: Mode | None = None
    format: Format | None = None


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
    mode: Mode | None = None


class ChatRequest(BaseModel):
    """OpenAI's chat-completion request, as far as a page parser reads it (one page image)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool | None = False
    padoc: PadocOptions | None = None


def upload_body(with_format: bool = True) -> dict:
    """``openapi_extra`` of a route taking a document as multipart (field ``file``) or JSON."""
    props = {"file": {"type": "string", "format": "binary"}, "pages": {"type": "string"},
             "mode": {"type": "string", "enum": ["fork", "sequential"]}}
    if with_format:
        props["format"] = {"type": "string", "enum": ["json", "markdown"]}
    return {"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": props}},
        "application/json": {"schema": ParseJSON.model_json_schema()}}}}
