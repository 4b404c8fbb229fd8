"""What rendering one document yields: the renderers' (:mod:`.renderer`) events, in order.

:class:`Opened` once the document is open, then one :class:`PageRendered` or :class:`PageFailed`
per page to render (in order); or a single :class:`DocFailed` (after :class:`Opened` when the
page selection refused the document). They stay between a renderer and
:mod:`padoc_ray.raster.document`, which turns them into page rows. Pure: no pdfium, no pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Opened:
    page_count: int
    repaired: bool


@dataclass
class DocFailed:
    code: str
    message: str
    page_count: int | None = None  #: pages (or frames) counted before it failed, when known


@dataclass
class PageRendered:
    index: int
    meta: dict  #: image_width, image_height, page_width_pt, page_height_pt, rotation, render_s, text_layer_bytes
    image_bytes: bytes  #: see padoc_ray.raster.codec


@dataclass
class PageFailed:
    index: int
    code: str
    message: str


Event = Opened | DocFailed | PageRendered | PageFailed
#: page count -> page indices to render, in order; raising PdfError refuses the document (DocFailed)
Selector = Callable[[int], list[int]]
