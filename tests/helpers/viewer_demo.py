"""A small batch output for the viewer's tests, written with padoc_ray.output's writers: two good
PDFs (one with a failed page), one whose content holds script, and a bad input among them."""

from __future__ import annotations

import os

import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.output import rows
from padoc_ray.pdf import doc_id_of
from padoc_ray.pipeline import ledger
from padoc_ray.protocol import Box, Page, Region
from padoc_ray.scheduler import PageRecord

from tests.helpers.pdf_factory import text_pdf

W, H = 306, 396
#: content that must run nothing where it is shown
EVIL_TEXT = 'hello <script>window.__pwned = 1; alert("text")</script> <img src=x onerror="window.__pwned=2">'
EVIL_TABLE = ('<table><tr><td onclick="alert(1)">a</td><td><script>alert("t")</script>b</td></tr>'
              '<tr><td><img src="x" onerror="window.__pwned=3;alert(3)"></td></tr></table>')


def _regions(kind: str) -> tuple[Region, ...]:
    if kind == "evil":
        return (Region("title", Box(0.1, 0.05, 0.9, 0.12), "Evil <b>title</b>"),
                Region("text", Box(0.1, 0.15, 0.9, 0.3), EVIL_TEXT),
                Region("table", Box(0.1, 0.35, 0.9, 0.6), EVIL_TABLE, "html"))
    return (Region("title", Box(0.1, 0.05, 0.9, 0.12), "Quarterly report"),
            Region("header", Box(0.1, 0.0, 0.5, 0.03), "running head"),
            Region("text", Box(0.1, 0.15, 0.9, 0.3), "First paragraph of the page.\nSecond line."),
            Region("figure", Box(0.1, 0.32, 0.5, 0.5), None, "none"),
            Region("table", Box(0.1, 0.55, 0.9, 0.8), "<table><tr><td>1</td><td>2</td></tr></table>", "html"),
            Region("equation_isolated", Box(0.2, 0.82, 0.8, 0.9), "E = mc^2", "latex"))


def build(root: str, copies: int = 1, *, crafted: str | None = None) -> dict:
    """Inputs under ``root/in``, the output under ``root/out``; returns what was written. ``crafted``: a
    relative path from ``root/in`` (climbing out with ``..``): one more document whose row names it, as
    an output from someone else could; its PDF is written where it points."""
    src = os.path.join(root, "in")
    os.makedirs(src, exist_ok=True)
    out_rows, listed = [], []
    specs = [(f"good{k}.pdf", 2, "good") for k in range(copies)] + [("evil.pdf", 1, "evil"), ("broken.pdf", 0, "bad")]
    if crafted is not None:
        specs.append((crafted, 1, "good"))
        os.makedirs(os.path.dirname(os.path.normpath(os.path.join(src, crafted))), exist_ok=True)
    for name, pages, kind in specs:
        path = os.path.join(src, name)
        data = text_pdf(pages=pages) if pages else b"this is not a PDF at all"
        with open(path, "wb") as f:
            f.write(data)
        listed.append((path, len(data)))
        did = doc_id_of(data) if pages else None
        if kind == "bad":
            base = rows.base_row(run_id="r1", uri=path, doc_id=did, page_index=-1, page_count=None, mode="fork",
                                 model_id="m")
            out_rows.append(rows.error_row(base, status.NOT_PDF, "the file is neither a PDF nor an image"))
            continue
        for i in range(pages):
            base = rows.base_row(run_id="r1", uri=path, doc_id=did, page_index=i, page_count=pages, mode="fork",
                                 model_id="m")
            base.update(image_width=W, image_height=H)
            failed = kind == "good" and i == 1
            page = Page(width=W, height=H, regions=_regions(kind)[:2] if failed else _regions(kind), page_no=i)
            st = status.RUNAWAY if failed else status.OK
            rec = PageRecord(page_id=f"{name}:{i}", mode="fork", status=st, valid=not failed, page=page,
                             message="branch 1 repeats itself" if failed else "")
            out_rows.append(rows.page_row(base, rec))
    out = os.path.join(root, "out")
    os.makedirs(os.path.join(out, "pages"), exist_ok=True)
    os.makedirs(os.path.join(out, "documents"), exist_ok=True)
    table = rows.to_table(out_rows)
    pq.write_table(table, os.path.join(out, "pages", "r1_listing.parquet"), row_group_size=2)
    docs = ledger.documents_table(table, sorted(listed), None, None)
    pq.write_table(docs, os.path.join(out, "documents", "documents.parquet"))
    return {"out": out, "src": src, "rows": out_rows, "documents": docs}
