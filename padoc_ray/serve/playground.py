"""Serve's page view at ``GET /``: upload a document (or name a job) and see each parsed page, drawn
by the viewer's own ``page.js`` (region boxes over the page image, the sanitized Markdown beside
it, hover and click linking them through the page's spans, the raw page JSON).

The page and its assets (``/ui/...``) hold no data, so they are open routes; every data call goes
to the ``/v1`` API with the bearer token the page asks for once (on its first 401) and keeps in
``sessionStorage``. Its URLs start with the request's ``root_path``, so it works under any Serve
``route_prefix``; a Content Security Policy allows scripts, styles and connections to this origin
only (images: this origin and the ``data:`` URLs of ``view=true``), so even content that got past
the sanitizer could run nothing.

``view=true`` (:func:`add_views`) is the API side: each page of a result gets ``view``, the JSON
``page.js`` draws (:func:`padoc_ray.viewer.pageview.page_view`, less the raw row, which is the page
itself), with ``image_url``, the page image as a PNG data URL, where the request rendered it.
"""

from __future__ import annotations

import html
import os

from fastapi.responses import FileResponse, HTMLResponse

from padoc_ray.serve import errors
from padoc_ray.viewer.app import STATIC as VIEWER_STATIC
from padoc_ray.viewer.pageview import page_view

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: every file the page loads: the viewer's page view, and the page's own script and style
ASSETS = {"page.js": (VIEWER_STATIC, "text/javascript"), "page.css": (VIEWER_STATIC, "text/css"),
          "playground.js": (STATIC, "text/javascript"), "playground.css": (STATIC, "text/css")}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>padoc-ray</title>
<link rel="stylesheet" href="{root}/ui/page.css"><link rel="stylesheet" href="{root}/ui/playground.css"></head>
<body data-root="{root}"><header><b>padoc-ray</b> <span>{model}</span></header>
<form id="pd-token" class="pd-form" hidden><label>API token <input type="password" name="token"
 autocomplete="off" required></label> <button>use it</button></form>
<form id="pd-upload" class="pd-form"><input type="file" name="file" required> <button>parse</button></form>
<form id="pd-job" class="pd-form"><input name="job" placeholder="job id" required> <button>show its result</button>
</form>
<p id="pd-status" role="status"></p><div id="pd-pages"></div>
<script src="{root}/ui/page.js"></script><script src="{root}/ui/playground.js"></script></body></html>
"""


def page(request, model: str) -> HTMLResponse:
    """The page view's HTML; every URL in it starts with the route prefix the service runs under."""
    root = request.scope.get("root_path", "").rstrip("/")
    return HTMLResponse(_PAGE.format(root=html.escape(root), model=html.escape(model)), headers=_HEADERS)


def asset(name: str):
    if name not in ASSETS:
        return errors.Refusal(errors.NOT_FOUND, "no such asset").response()
    folder, media = ASSETS[name]
    return FileResponse(os.path.join(folder, name), media_type=media,
                        headers={"Cache-Control": "no-cache", **_HEADERS})


def add_views(result: dict) -> dict:
    """``result`` (a /v1/parse or job result) with each page's ``view`` (see the module docstring);
    a page's ``image_url`` moves into its view."""
    for p in result["pages"]:
        image_url = p.pop("image_url", None)
        view = page_view(p)
        del view["row"]
        p["view"] = {**view, "image_url": image_url}
    return result
