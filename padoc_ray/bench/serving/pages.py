"""The serving benchmark's page set: OmniDocBench-format ground truth files and their page images, each
image a one-page document whose truth teacher-forces the engine (:mod:`padoc_ray.bench.serving.run`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from padoc_ray.groundtruth import GroundTruthError, Truth, parse_truth
from padoc_ray.protocol import Page


class PageSetError(ValueError):
    """A page set that cannot be used (missing file, bad JSON, duplicate page names)."""


@dataclass
class BenchPage:
    name: str  #: the page image's file name: its replay truth's key and its upload name
    data: bytes  #: the image file's bytes (decoded per request, as a server would)
    doc_id: str
    truth: Page
    gt: str  #: the ground-truth file it came from
    #: the page's text layer, from its source PDF (``--pdfs``); None: an image page only
    text_layer: object = None


def load_page_sets(sets: Sequence[tuple[str, str]], limit: int | None = None,
                   pdfs: str | None = None) -> tuple[list[BenchPage], list[dict]]:
    """Pages of (GT.json, images folder) pairs in order, at most ``limit`` in all; and per set
    ``{"gt", "images", "count"}`` (pages used from it). ``pdfs``: the folder of the truth's source PDFs
    (``page_info.source_pdf``): each page gets its text layer from there. Raises :class:`PageSetError`."""
    from padoc_ray.pdf import doc_id_of

    if pdfs is not None and not os.path.isdir(pdfs):
        raise PageSetError(f"--pdfs {pdfs}: no such folder")
    layers = _TextLayers(pdfs) if pdfs is not None else None

    pages: list[BenchPage] = []
    info: list[dict] = []
    seen: dict[str, str] = {}
    for gt, images in sets:
        if not os.path.isfile(gt):
            raise PageSetError(f"--gt {gt}: no such file")
        if not os.path.isdir(images):
            raise PageSetError(f"--images {images}: no such folder")
        try:
            with open(gt, "rb") as f:
                entries = parse_truth(f.read(), f"--gt {gt}")
        except (OSError, GroundTruthError) as e:
            raise PageSetError(str(e)) from None
        n = 0
        for t in entries:
            if limit is not None and len(pages) >= limit:
                break
            if t.page is None:
                raise PageSetError(f"--gt {gt}: page {t.index} is not OmniDocBench format ({t.error})")
            truth = t.page
            name = os.path.basename(truth.image_path or "")
            path = os.path.join(images, name)
            if not name or not os.path.isfile(path):
                raise PageSetError(f"--gt {gt}: page {t.index}: image {path} not found (is --images right?)")
            if name in seen:
                raise PageSetError(f"page image name {name} is in both {seen[name]} and {gt} (the truth is matched "
                                   f"by file name)")
            seen[name] = gt
            with open(path, "rb") as f:
                data = f.read()
            layer = layers.of(t, gt) if layers is not None else None
            pages.append(BenchPage(name, data, doc_id_of(data), truth, gt, layer))
            n += 1
        info.append({"gt": gt, "images": images, "count": n})
    if not pages:
        raise PageSetError("the page set is empty")
    return pages, info


def bench_truth(pages: Sequence[BenchPage]) -> Truth:
    """The host's replay truth for the bench pages (each image is a one-page document)."""
    return Truth.of_pages({p.name: p.truth for p in pages})


class _TextLayers:
    """Text layers of the page set's source PDFs, each PDF opened once."""

    def __init__(self, folder: str):
        self.folder, self.docs = folder, {}

    def of(self, t, gt: str):
        from padoc_ray.pdf import PdfError, open_pdf, page_text_layer

        if t.source is None:
            raise PageSetError(f"--gt {gt}: page {t.index} names no source PDF and page (page_info.source_pdf, "
                               f"page_no), which --pdfs needs")
        name, page_no = t.source
        if name not in self.docs:
            path = os.path.join(self.folder, os.path.basename(name))
            try:
                with open(path, "rb") as f:
                    self.docs[name] = open_pdf(f.read())
            except OSError:
                raise PageSetError(f"--pdfs: {path} not found (page {t.index} of {gt})") from None
            except PdfError as e:
                raise PageSetError(f"--pdfs: {path}: {e}") from None
        doc = self.docs[name]
        if not 0 <= page_no < len(doc):
            raise PageSetError(f"--pdfs: {name} has no page {page_no} (page {t.index} of {gt})")
        return page_text_layer(doc, page_no)
