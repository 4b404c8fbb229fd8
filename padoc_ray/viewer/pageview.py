"""One page row as a view: its boxes, its Markdown as sanitized HTML blocks tied to them, the raw row.

The browser side (``static/page.js``, ``static/page.css``) draws a view: the page image with one
overlay per region (coloured by category, numbered in reading order) and the blocks beside it;
hovering or clicking a box highlights its block and the other way round. Blocks come from the
row's span map (``spans``: ``markdown[start:end]`` is region ``order``'s block), or, for rows
written before it, from the same rule applied to the row's regions. Every block is made safe here,
on the server: text is escaped, table HTML goes through :func:`~padoc_ray.viewer.sanitize.sanitize_html`.
Serve's playground shares this module and the two assets.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from typing import Any, Mapping

from padoc_ray.output.rows import page_from_row
from padoc_ray.output.show import category_color
from padoc_ray.protocol import markdown_spans
from padoc_ray.viewer.sanitize import sanitize_html


def jsonable(v: Any) -> Any:
    """A row value as JSON (timestamps as ISO text, NaN as null)."""
    if isinstance(v, Mapping):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _spans(row: Mapping) -> list[dict]:
    if row.get("spans") is not None:
        return [dict(s) for s in row["spans"]]
    _, spans = markdown_spans(page_from_row(row, on_bad_region=lambda *_: None))
    return [{"order": o, "start": a, "end": b} for o, a, b in spans]


def block_html(text: str, category: str | None, content_format: str | None) -> str:
    """One region's Markdown block as safe HTML."""
    if content_format == "html":
        return sanitize_html(text)
    if category == "figure":
        return f'<div class="pd-figure">{html.escape(text)}</div>'
    if category == "title" and text.startswith("# "):
        return f"<h3>{html.escape(text[2:])}</h3>"
    if content_format == "latex" or text.startswith("```"):
        return f'<pre class="pd-pre">{html.escape(text)}</pre>'
    return "<p>" + html.escape(text).replace("\n", "<br>") + "</p>"


def color_hex(category: str | None) -> str:
    return "#%02x%02x%02x" % category_color(category or "")


def page_view(row: Mapping) -> dict:
    """The JSON a page view draws (see the module's docstring), with the raw row under ``row``."""
    regions = [r for r in (row.get("regions") or []) if isinstance(r, Mapping)]
    by_order = {r.get("order"): r for r in regions}
    md = row.get("markdown") or ""
    blocks = []
    for s in _spans(row):
        reg = by_order.get(s["order"], {})
        blocks.append({"order": s["order"], "start": s["start"], "end": s["end"], "category": reg.get("category"),
                       "html": block_html(md[s["start"]:s["end"]], reg.get("category"), reg.get("content_format"))})
    boxes = []
    for k, r in enumerate(sorted(regions, key=lambda r: (r.get("order") is None, r.get("order") or 0))):
        bbox = r.get("bbox")
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            continue  # a box that cannot be drawn is left out, as `show` does
        order = r["order"] if r.get("order") is not None else k
        boxes.append({"order": order, "category": r.get("category"), "bbox": [float(v) for v in bbox],
                      "color": color_hex(r.get("category"))})
    return {
        "source_uri": row.get("source_uri"), "doc_id": row.get("doc_id"), "page_index": row.get("page_index"),
        "status": row.get("status"), "error_code": row.get("error_code"), "error_message": row.get("error_message"),
        "image_width": row.get("image_width"), "image_height": row.get("image_height"),
        "regions": boxes, "blocks": blocks, "row": jsonable(dict(row)),
    }


def embed_json(value: Any) -> str:
    """JSON to put inside ``<script type="application/json">``: ``<``, ``>`` and ``&`` escaped, so no
    content can close the element."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
