"""Render a parsed page to Markdown or JSON.

Markdown follows reading order: titles as headings, tables as their HTML, display formulas as
``$$...$$``, code as fenced blocks, figures as an image placeholder. Page furniture (headers,
footers, page numbers, abandoned text) is left out unless asked for, as OmniDocBench's end-to-end
evaluation does. Knows nothing of tokens or engines.
"""

from __future__ import annotations

import json

from .page import Page, Region

FURNITURE = frozenset({"header", "footer", "page_number", "abandon", "page_footnote"})


def region_markdown(r: Region, index: int) -> str | None:
    text = (r.content or "").strip()
    cat = r.category
    if cat == "figure":
        return f"![figure {index}](#region-{index})"
    if not text:
        return None
    if cat == "title":
        return "# " + " ".join(text.split())
    if r.content_format == "latex":
        if text.startswith("$$") and text.endswith("$$") and len(text) >= 4:
            return text  # already delimited, as OmniDocBench's ground truth stores display math
        return f"$$\n{text}\n$$"
    if r.content_format == "html":
        return text
    if cat in ("code_txt", "code_algorithm"):
        return f"```\n{text}\n```"
    return text


def to_markdown(page: Page, *, include_furniture: bool = False) -> str:
    blocks = []
    for i, r in enumerate(page.regions):
        if r.category in FURNITURE and not include_furniture:
            continue
        md = region_markdown(r, i)
        if md is not None:
            blocks.append(md)
    return "\n\n".join(blocks) + ("\n" if blocks else "")


def to_json(page: Page, *, indent: int | None = 2) -> str:
    return json.dumps(page.to_dict(), indent=indent, ensure_ascii=False)
