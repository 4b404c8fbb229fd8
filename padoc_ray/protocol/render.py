"""Render a parsed page to Markdown or JSON.

Markdown follows reading order: titles as headings, tables as their HTML, display formulas as
``$$...$$``, code as fenced blocks, figures as an image placeholder. Page furniture (headers,
footers, page numbers, abandoned text) is left out unless asked for, as OmniDocBench's end-to-end
evaluation does. Knows nothing of tokens or engines.
"""

from __future__ import annotations

import json

from .page import Page, Region

SEPARATOR = "\n\n"  #: between two regions' blocks
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


def region_block(r: Region, index: int, *, include_furniture: bool = False) -> str | None:
    """Region ``index``'s block in the page's Markdown, or None when it has none there (furniture, empty)."""
    if r.category in FURNITURE and not include_furniture:
        return None
    return region_markdown(r, index)


def to_markdown(page: Page, *, include_furniture: bool = False) -> str:
    return markdown_spans(page, include_furniture=include_furniture)[0]


def markdown_spans(page: Page, *, include_furniture: bool = False) -> tuple[str, list[tuple[int, int, int]]]:
    """The page's Markdown and its span map: one ``(order, start, end)`` per region with content, in
    reading order, where ``markdown[start:end]`` is that region's rendered block (0-based character
    offsets, end exclusive; ``order`` is the region's position in ``page.regions``). Built in the same
    pass that joins the blocks, so the offsets cannot drift from the text: a client quoting a passage
    finds the region (and box) it came from."""
    blocks: list[str] = []
    spans: list[tuple[int, int, int]] = []
    at = 0
    for i, r in enumerate(page.regions):
        md = region_block(r, i, include_furniture=include_furniture)
        if md is None:
            continue
        if blocks:
            at += len(SEPARATOR)
        blocks.append(md)
        spans.append((i, at, at + len(md)))
        at += len(md)
    return SEPARATOR.join(blocks) + ("\n" if blocks else ""), spans


def to_json(page: Page, *, indent: int | None = 2) -> str:
    return json.dumps(page.to_dict(), indent=indent, ensure_ascii=False)
