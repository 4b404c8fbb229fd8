"""Page and region types, and conversion from/to OmniDocBench ground-truth JSON.

Boxes are stored normalized to [0, 1] (x1, y1, x2, y2, origin top-left) so they do not depend on
the render size; a page keeps its pixel width and height to convert back. This module knows
nothing of tokens (see ``codec``) or of any model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from .spec import DEFAULT_CATEGORIES, ProtocolSpec

# OmniDocBench stores content under a key that depends on the content format.
_GT_CONTENT_KEY = {"text": "text", "latex": "latex", "html": "html"}


class PageFormatError(ValueError):
    """Ground-truth or prediction JSON that cannot be read as a page."""


@dataclass(frozen=True)
class Box:
    """Normalized box, origin top-left, 0 <= x1 <= x2 <= 1 for a well-formed box."""

    x1: float
    y1: float
    x2: float
    y2: float

    @classmethod
    def from_pixels(cls, x1: float, y1: float, x2: float, y2: float, width: float, height: float) -> "Box":
        return cls(x1 / width, y1 / height, x2 / width, y2 / height)

    def to_pixels(self, width: float, height: float) -> tuple[float, float, float, float]:
        return (self.x1 * width, self.y1 * height, self.x2 * width, self.y2 * height)

    @property
    def is_valid(self) -> bool:
        vals = (self.x1, self.y1, self.x2, self.y2)
        return all(math.isfinite(v) for v in vals) and self.x1 <= self.x2 and self.y1 <= self.y2

    def clipped(self) -> "Box":
        c = lambda v: min(1.0, max(0.0, v))  # noqa: E731
        return Box(c(self.x1), c(self.y1), c(self.x2), c(self.y2))

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.x1, self.y1, self.x2, self.y2)


@dataclass(frozen=True)
class Region:
    """One layout region with its content.

    ``content`` is None when the category has no content (figures) or the content is unknown
    (a branch that was never decoded); ``errors`` holds parse flags for this region.
    """

    category: str
    box: Box
    content: str | None = None
    content_format: str = "text"
    order: int | None = None  # reading-order value from the source annotation, if any
    ignore: bool = False
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Page:
    """Regions in reading order (the order the protocol serializes them in)."""

    width: int
    height: int
    regions: tuple[Region, ...] = ()
    page_no: int = 0
    image_path: str | None = None
    errors: tuple[str, ...] = ()  # page-level parse flags
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "width": self.width,
            "height": self.height,
            "page_no": self.page_no,
            "image_path": self.image_path,
            "errors": list(self.errors),
            "regions": [
                {
                    "index": i,
                    "category": r.category,
                    "bbox": list(r.box.as_tuple()),
                    "content": r.content,
                    "content_format": r.content_format,
                    "order": r.order,
                    "ignore": r.ignore,
                    "errors": list(r.errors),
                }
                for i, r in enumerate(self.regions)
            ],
        }


#: how far (fraction of the page) boxes may overshoot page_info's size before it counts as swapped
SWAP_TOLERANCE = 0.02


def size_is_swapped(width: float, height: float, max_x: float, max_y: float, tol: float = SWAP_TOLERANCE) -> bool:
    """True when boxes reaching ``max_x``/``max_y`` (pixels) overshoot a ``width`` x ``height`` page by
    more than ``tol`` but fit it with width and height exchanged. OmniDocBench has pages whose
    page_info lists a portrait image's size as landscape (10 of the 18 demo pages)."""
    if width == height or not (math.isfinite(max_x) and math.isfinite(max_y)):
        return False
    over = max_x > width * (1 + tol) or max_y > height * (1 + tol)
    return over and max_x <= height * (1 + tol) and max_y <= width * (1 + tol)


def _poly_extent(dets: list) -> tuple[float, float]:
    mx = my = 0.0
    for det in dets:
        poly = det.get("poly") if isinstance(det, Mapping) else None
        if isinstance(poly, (list, tuple)) and len(poly) >= 4 and len(poly) % 2 == 0:
            try:
                mx, my = max(mx, *map(float, poly[0::2])), max(my, *map(float, poly[1::2]))
            except (TypeError, ValueError):
                continue
    return mx, my


def _poly_box(poly: Any, width: float, height: float) -> Box:
    if not isinstance(poly, (list, tuple)) or len(poly) < 4 or len(poly) % 2:
        raise PageFormatError(f"poly must be a flat list of x,y pairs, got {poly!r:.80}")
    try:
        xs = [float(v) for v in poly[0::2]]
        ys = [float(v) for v in poly[1::2]]
    except (TypeError, ValueError) as e:
        raise PageFormatError(f"poly has a non-number: {poly!r:.80}") from e
    return Box.from_pixels(min(xs), min(ys), max(xs), max(ys), width, height)


def _reading_sequence(dets: list[tuple[int, Mapping, Box]]) -> list[tuple[int, Mapping, Box]]:
    """Canonical serialization order.

    Regions with an ``order`` come by order. Regions without one (headers, footers, page numbers,
    abandoned text) are placed by position: before the first ordered region that starts below
    them, so a header leads and a page number trails. Ties keep the annotation's own order.
    """
    ordered = sorted((d for d in dets if d[1].get("order") is not None), key=lambda d: (float(d[1]["order"]), d[0]))
    loose = sorted((d for d in dets if d[1].get("order") is None), key=lambda d: (d[2].y1, d[2].x1, d[0]))
    out: list = []
    i = 0
    for d in ordered:
        while i < len(loose) and loose[i][2].y1 < d[2].y1:
            out.append(loose[i])
            i += 1
        out.append(d)
    out.extend(loose[i:])
    return out


def page_from_omnidocbench(obj: Mapping, spec: ProtocolSpec | None = None, *, drop_ignored: bool = False,
                           fix_swapped: bool = True) -> Page:
    """Read one OmniDocBench page (``layout_dets`` + ``page_info``).

    With ``fix_swapped``, a page_info size that is evidently width/height exchanged (see
    :func:`size_is_swapped`) is used transposed, and ``extra["size_swapped"]`` is set.

    Raises :class:`PageFormatError` with a specific reason for anything it cannot read.
    """
    if not isinstance(obj, Mapping):
        raise PageFormatError("page is not a JSON object")
    info = obj.get("page_info")
    if not isinstance(info, Mapping):
        raise PageFormatError("page_info missing")
    try:
        width, height = float(info["width"]), float(info["height"])
    except (KeyError, TypeError, ValueError) as e:
        raise PageFormatError("page_info needs numeric width and height") from e
    if not (width > 0 and height > 0 and math.isfinite(width) and math.isfinite(height)):
        raise PageFormatError(f"page size {width}x{height} is not positive")
    dets = obj.get("layout_dets")
    if not isinstance(dets, list):
        raise PageFormatError("layout_dets missing or not a list")
    swapped = fix_swapped and size_is_swapped(width, height, *_poly_extent(dets))
    if swapped:
        width, height = height, width
    formats = {c.name: c.content_format for c in spec.categories} if spec else DEFAULT_CATEGORIES
    boxed = []
    for i, det in enumerate(dets):
        if not isinstance(det, Mapping):
            raise PageFormatError(f"layout_dets[{i}] is not an object")
        cat = det.get("category_type")
        if cat not in formats:
            raise PageFormatError(f"layout_dets[{i}]: unknown category {cat!r}")
        if drop_ignored and det.get("ignore"):
            continue
        boxed.append((i, det, _poly_box(det.get("poly"), width, height)))
    regions = []
    for _, det, box in _reading_sequence(boxed):
        fmt = formats[det["category_type"]]
        content = None
        if fmt != "none":
            val = det.get(_GT_CONTENT_KEY[fmt])
            content = "" if val is None else str(val)
        order = det.get("order")
        regions.append(
            Region(
                category=det["category_type"],
                box=box,
                content=content,
                content_format=fmt,
                order=int(order) if order is not None else None,
                ignore=bool(det.get("ignore", False)),
            )
        )
    return Page(
        width=int(round(width)),
        height=int(round(height)),
        regions=tuple(regions),
        page_no=int(info.get("page_no", 0) or 0),
        image_path=info.get("image_path"),
        extra={**{k: v for k, v in info.items() if k not in ("width", "height", "page_no", "image_path")},
               **({"size_swapped": True} if swapped else {})},
    )


def page_to_omnidocbench(page: Page) -> dict:
    """Write a page as OmniDocBench JSON; reading order becomes ``order`` 1..N."""
    dets = []
    for i, r in enumerate(page.regions):
        x1, y1, x2, y2 = r.box.to_pixels(page.width, page.height)
        det: dict[str, Any] = {
            "category_type": r.category,
            "poly": [x1, y1, x2, y1, x2, y2, x1, y2],
            "ignore": r.ignore,
            "order": i + 1,
            "anno_id": i,
        }
        if r.content_format in _GT_CONTENT_KEY and r.content is not None:
            det[_GT_CONTENT_KEY[r.content_format]] = r.content
        dets.append(det)
    info = {"page_no": page.page_no, "width": page.width, "height": page.height, "image_path": page.image_path}
    info.update(page.extra)
    return {"layout_dets": dets, "page_info": info}


def load_omnidocbench(objs: Iterable[Mapping], spec: ProtocolSpec | None = None) -> list[Page]:
    return [page_from_omnidocbench(o, spec) for o in objs]


def with_regions(page: Page, regions: Iterable[Region], errors: Iterable[str] = ()) -> Page:
    return replace(page, regions=tuple(regions), errors=tuple(errors))
