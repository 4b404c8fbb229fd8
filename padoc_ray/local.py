"""Parse pages on one local engine, without Ray: what ``parse-page`` runs.

Renders PDF pages (or takes images) and runs them on a :class:`~padoc_ray.host.PageHost`.
Optional teacher forcing from OmniDocBench ground truth (``--replay``, loaded by
:func:`load_truth`) makes a random-weight model produce real-length, correct outputs.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from padoc_ray.host import HostPage, PageHost
from padoc_ray.pdf import PdfError, RenderConfig, doc_id_of, iter_pages, open_pdf
from padoc_ray.protocol import Page, page_from_omnidocbench
from padoc_ray.scheduler import PageRecord

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


@dataclass
class LocalPage:
    source: str
    page_index: int
    page: HostPage | None
    error: PdfError | None = None


def load_truth(gt_path: str | None) -> dict[tuple[str, int], Page]:
    """Ground truth keyed by (source PDF name, page_no) and by (image name, 0)."""
    if not gt_path:
        return {}
    with open(gt_path, "rb") as f:
        return truth_from_json(f.read())


def truth_from_json(data: bytes) -> dict[tuple[str, int], Page]:
    objs = json.loads(data.decode("utf-8"))
    out = {}
    for o in objs:
        page = page_from_omnidocbench(o)
        info = o.get("page_info", {})
        if info.get("source_pdf"):  # a page of a PDF: (file name, 0-based page_no)
            out[(os.path.basename(info["source_pdf"]), int(info.get("page_no", 0) or 0))] = page
        if info.get("image_path"):  # the page image itself is a one-page document; OmniDocBench's
            # page_no is then the page's number in a PDF we do not have, so it is not part of the key
            out.setdefault((os.path.basename(info["image_path"]), 0), page)
    return out


def load_pages(paths: Sequence[str], *, render: RenderConfig = RenderConfig(),
               pages: Iterable[int] | None = None) -> list[LocalPage]:
    """Render every requested page of PDFs, or take images as single pages. A page is named by
    its file's content hash, never by its file name (two files of one name are two documents)."""
    from PIL import Image

    want = sorted(set(pages)) if pages is not None else None
    out: list[LocalPage] = []
    for path in paths:
        name = os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read()
        doc_id = doc_id_of(data)
        if path.lower().endswith(IMAGE_EXTS):
            img = Image.open(io.BytesIO(data)).convert("RGB")
            out.append(LocalPage(name, 0, HostPage(doc_id=doc_id, page_index=0, image=img, source_name=name)))
            continue
        try:
            doc = open_pdf(data)
        except PdfError as e:
            out.append(LocalPage(name, -1, None, e))
            continue
        indices = [i for i in want if 0 <= i < len(doc)] if want is not None else None
        for r in iter_pages(doc, indices, render):
            if isinstance(r, PdfError):
                out.append(LocalPage(name, -1, None, r))
                continue
            out.append(LocalPage(name, r.index, HostPage(doc_id=doc_id, page_index=r.index, image=r.image,
                                                         source_name=name)))
        doc.close()
    return out


async def parse_local(host: PageHost, pages: list[LocalPage], *, mode: str | None = None) -> list[PageRecord | None]:
    """Run pages on a started host (it bounds the pages in flight); records in input order, None
    for a page that could not be rendered."""

    async def one(p: LocalPage) -> PageRecord | None:
        if p.page is None:
            return None
        return await host.parse(p.page if mode is None else replace(p.page, mode=mode))

    return list(await asyncio.gather(*(one(p) for p in pages)))
