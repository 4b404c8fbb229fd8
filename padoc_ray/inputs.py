"""Local files (PDFs and page images) as pages for one :class:`~padoc_ray.host.PageHost`, without Ray.

:func:`load_pages` renders PDF pages (or takes images as one-page documents); :func:`parse_local`
runs them on a started host. What ``parse-page``, ``demo`` and the serving benchmarks feed an
engine; teacher-forcing truth comes from :func:`padoc_ray.groundtruth.load_truth`.
"""

from __future__ import annotations

import asyncio
import io
import os
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from padoc_ray.groundtruth import IMAGE_EXTS
from padoc_ray.host import PageHost, PageRequest
from padoc_ray.pdf import PdfError, RenderConfig, doc_id_of, iter_pages, open_pdf
from padoc_ray.scheduler import PageRecord


@dataclass
class LocalPage:
    source: str
    page_index: int
    page: PageRequest | None
    error: PdfError | None = None


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
            out.append(LocalPage(name, 0, PageRequest(doc_id=doc_id, page_index=0, image=img, source_name=name)))
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
            out.append(LocalPage(name, r.index, PageRequest(doc_id=doc_id, page_index=r.index, image=r.image,
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
