"""``padoc-ray view``: a local web app over a batch output (FastAPI, every asset served from here).

``data``: what a view reads (the ``documents/`` table whole; ``pages/`` only through row-group
statistics and filters); ``sanitize``: the allow-list HTML sanitizer for model content;
``pageview``: one page row as a view (boxes, sanitized Markdown blocks linked to them by the span
map, the raw row), the part Serve's playground shares with ``static/page.js`` and ``page.css``;
``app``: the routes; ``export``: a static HTML report of a sample. Imports no ray, vllm or torch.
"""
