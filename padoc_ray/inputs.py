"""Local files (PDFs and page images) as pages for one :class:`~padoc_ray.host.PageHost`, without Ray.

:func:`render_local` renders one file through the path every surface shares (the renderer, isolated
or not, with its caps and codes: :func:`padoc_ray.raster.document.document_rows`) into page rows of
the batch job's schema, and :func:`parse_rows` runs its rendered rows on a started host and finishes
them as the batch job and Serve do (:func:`padoc_ray.output.rows.page_row`): what ``parse-page``
does. :func:`load_pages` renders PDF pages in this process, with no caps (or takes images as
one-page documents), and :func:`parse_local` runs them: what benchmarks and tests that need page
images feed an engine. Teacher-forcing truth comes from :func:`padoc_ray.groundtruth.load_truth`.
"""

from __future__ import annotations

import asyncio
import io
import os
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from padoc_ray.groundtruth import IMAGE_EXTS
from padoc_ray.host import PageHost, PageRequest, row_request
from padoc_ray.output import rows
from padoc_ray.pdf import PdfError, RenderConfig, doc_id_of, iter_pages, open_pdf
from padoc_ray.raster import DocFailed
from padoc_ray.raster.document import DocumentOpened, PageChoice, PageRow, document_rows
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


# ---- one file through the shared renderer-to-row path ------------------------------------------------------
@dataclass
class LocalDocument:
    """One file as :func:`render_local` rendered it: every selected page's :class:`PageRow` (in page
    order; a page whose rendering failed carries its error row), or why the document failed as a whole."""

    source: str  #: the file's name
    page_count: int | None = None  #: pages (frames of an image); None when it could not be opened
    pages: list[PageRow] = field(default_factory=list)
    failed: DocFailed | None = None  #: the document-level error (nothing rendered)

    @property
    def rendered(self) -> bool:
        """Whether any page rendered (so there is something for an engine to do)."""
        return any(p.rendered for p in self.pages)


def render_local(renderer, data: bytes, name: str, base: dict, choice: PageChoice, render: RenderConfig,
                 encoding: str, *, max_frames: int | None) -> LocalDocument:
    """Render one document's selected pages with ``renderer`` (the batch job's and Serve's path, see
    :func:`padoc_ray.raster.document.document_rows`, which says what ``base`` holds)."""
    doc = LocalDocument(name)
    for item in document_rows(renderer, data, name, base, choice, render, encoding, max_frames=max_frames):
        if isinstance(item, DocFailed):
            doc.failed, doc.page_count = item, item.page_count
        elif isinstance(item, DocumentOpened):
            doc.page_count = item.page_count
        else:
            doc.pages.append(item)
    return doc


async def parse_rows(host: PageHost, pages: list[PageRow]) -> list[tuple[dict, PageRecord | None]]:
    """Run the rendered pages on a started host (it bounds the pages in flight): for each page in order,
    its finished row (:func:`padoc_ray.output.rows.page_row`, as the batch job's engine stage and Serve's
    replica make it) and the scheduler's record; a page whose rendering failed keeps its error row, with
    no record."""

    async def one(p: PageRow) -> tuple[dict, PageRecord | None]:
        if not p.rendered:
            return p.row, None
        rec = await host.parse(row_request(p.row, p.image))
        return rows.page_row(p.row, rec, render_s=p.row.get("render_s")), rec

    return list(await asyncio.gather(*(one(p) for p in pages)))
