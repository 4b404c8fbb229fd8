"""``/docs``: Swagger UI over the service's OpenAPI schema, its assets served by the service itself
(from the ``swagger-ui-bundle`` package), so the page works on an air-gapped cluster. The page carries
a Content Security Policy: scripts from the service and the page's one inline start-up script (by its
hash) only, requests to the service only, no frames."""

from __future__ import annotations

import base64
import hashlib
import os
import re

from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse

from padoc_ray.serve import errors

#: the Swagger UI files a page needs (nothing else of the bundle's folder is served)
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon-32x32.png": "image/png"}


def _folder() -> str:
    import swagger_ui_bundle

    return swagger_ui_bundle.swagger_ui_path


_INLINE = re.compile(rb"<script>(.*?)</script>", re.S)


def csp(html: bytes) -> str:
    """The page's policy: its inline scripts allowed by their sha256 and nothing else inline. Swagger UI
    sets styles inline and draws data: images, so those two are allowed."""
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(m).digest()).decode()}'"
                      for m in _INLINE.findall(html))
    return (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page(request, title: str):
    """The Swagger UI page; every URL in it is relative to the route prefix the service runs under."""
    root = request.scope.get("root_path", "").rstrip("/")
    resp = get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{title} - API",
                               swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
                               swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png")
    resp.headers["Content-Security-Policy"] = csp(resp.body)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def asset(name: str):
    if name not in ASSETS:
        return errors.Refusal(errors.NOT_FOUND, "no such asset").response()
    return FileResponse(os.path.join(_folder(), name), media_type=ASSETS[name],
                        headers={"Cache-Control": "public, max-age=86400"})
