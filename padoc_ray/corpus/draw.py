"""Drawing on a reportlab canvas in *display* coordinates, returning exact boxes.

A :class:`Painter` draws one page in points with the origin at the top-left of the page as a
viewer shows it (y grows downwards), whatever the page's /Rotate is. Every drawing call returns
the box of what it drew: text boxes come from the font's advance widths and its ascent/descent
(reportlab's metrics, the same numbers reportlab writes into the PDF's font descriptors), formula
boxes from the hull of matplotlib's mathtext glyph outlines, images and rules from their
placement. Callers pad and convert them; this module knows nothing of regions or reading order.

Rotated pages (``rotated=True``): the page is *displayed* landscape, ``width x height`` points, and
stored the way many producers do it: a portrait MediaBox with ``/Rotate 90``. reportlab writes the
MediaBox swapped when a page has rotation 90, and the content is drawn through the transform
``x_pdf = height - b, y_pdf = a`` from the virtual upright page (a, b: points, y up), so it reads
upright once a viewer (pypdfium2's default rendering) applies /Rotate.

Fonts: the standard 14 PDF fonts for Latin text (not embedded; pdfium draws them with its own
bundled faces), matplotlib's bundled DejaVu TTFs (``matplotlib.get_data_path()``, embedded as
subsets) for Greek and Cyrillic, reportlab's built-in CID font ``STSong-Light`` for Chinese (not
embedded: a renderer needs a CJK font of its own to draw it; see ``cjk_renders``).
"""

from __future__ import annotations

import io
import logging
import os
from functools import lru_cache

from reportlab.lib.utils import ImageReader
from reportlab.pdfbase import pdfmetrics

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1 in display points, y down

DEJAVU = {
    "DejaVuSerif": "DejaVuSerif.ttf",
    "DejaVuSerif-Bold": "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic": "DejaVuSerif-Italic.ttf",
    "DejaVuSans": "DejaVuSans.ttf",
    "DejaVuSans-Bold": "DejaVuSans-Bold.ttf",
}
CJK_FONT = "STSong-Light"


@lru_cache(maxsize=1)
def ensure_fonts() -> None:
    """Register the DejaVu TTFs (from matplotlib's own data, never system fonts) and STSong-Light."""
    import matplotlib
    from reportlab.pdfbase.cidfonts import UnicodeCIDFont
    from reportlab.pdfbase.ttfonts import TTFont

    base = os.path.join(matplotlib.get_data_path(), "fonts", "ttf")
    for name, fn in DEJAVU.items():
        pdfmetrics.registerFont(TTFont(name, os.path.join(base, fn)))
    pdfmetrics.registerFont(UnicodeCIDFont(CJK_FONT))


@lru_cache(maxsize=4096)
def _ascent_descent(font: str, size: float) -> tuple[float, float]:
    return pdfmetrics.getAscentDescent(font, size)


def ascent_descent(font: str, size: float) -> tuple[float, float]:
    """(ascent, descent) in points; descent is negative."""
    return _ascent_descent(font, size)


def line_height(font: str, size: float) -> float:
    a, d = _ascent_descent(font, size)
    return a - d


@lru_cache(maxsize=65536)
def _width_cached(text: str, font: str, size: float) -> float:
    return pdfmetrics.stringWidth(text, font, size)


def text_width(text: str, font: str, size: float) -> float:
    if len(text) <= 24:
        return _width_cached(text, font, size)
    return pdfmetrics.stringWidth(text, font, size)


@lru_cache(maxsize=512)
def _formula_path(latex: str, size: float, family: str):
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    logging.getLogger("matplotlib.mathtext").setLevel(logging.ERROR)  # "Underful Vlist" chatter
    prop = FontProperties(family="DejaVu Serif", size=size, math_fontfamily=family)
    from matplotlib.transforms import Bbox

    path = TextPath((0, 0), f"${latex}$", prop=prop)
    # the hull of all on- and off-curve points encloses the ink (TrueType glyphs put their extremes on
    # curve, so it is the exact box in practice) at a hundredth of Path.get_extents' cost
    v = path.vertices[path.codes != 79]  # CLOSEPOLY vertices carry no position
    return path, Bbox.from_extents(*v.min(axis=0), *v.max(axis=0))


def formula_extent(latex: str, size: float, family: str = "cm") -> tuple[float, float]:
    """(width, height) in points of the formula's ink."""
    _, ext = _formula_path(latex, size, family)
    return ext.x1 - ext.x0, ext.y1 - ext.y0


class Painter:
    """Draws one page of a canvas in display coordinates (points, origin top-left, y down)."""

    def __init__(self, canvas, width: float, height: float, *, rotated: bool = False):
        self.c = canvas
        self.width, self.height, self.rotated = float(width), float(height), rotated
        self._font: tuple[str, float] | None = None
        self._fill: float | None = None

    # -- page lifecycle --
    def start(self) -> "Painter":
        c = self.c
        c.setPageSize((self.width, self.height))
        c.setPageRotation(90 if self.rotated else 0)
        c.saveState()
        if self.rotated:
            c.transform(0, 1, -1, 0, self.height, 0)
        return self

    def finish(self) -> None:
        self.c.restoreState()
        self.c.showPage()
        self._font = None
        self._fill = None

    def _y(self, y: float) -> float:
        return self.height - y

    def _set_font(self, font: str, size: float) -> None:
        if self._font != (font, size):
            self.c.setFont(font, size)
            self._font = (font, size)

    def _set_gray(self, g: float) -> None:
        if self._fill != g:
            self.c.setFillGray(g)
            self._fill = g

    # -- drawing --
    def text(self, x: float, top: float, s: str, font: str, size: float, gray: float = 0.0) -> Rect:
        """Draw ``s`` with its ascent line at ``top``; return its ascent/descent box."""
        a, d = _ascent_descent(font, size)
        self._set_font(font, size)
        self._set_gray(gray)
        self.c.drawString(x, self._y(top + a), s)
        return (x, top, x + text_width(s, font, size), top + a - d)

    def line(self, x0: float, y0: float, x1: float, y1: float, width: float = 0.5, gray: float = 0.0) -> Rect:
        c = self.c
        c.setLineWidth(width)
        c.setStrokeGray(gray)
        c.line(x0, self._y(y0), x1, self._y(y1))
        h = width / 2
        return (min(x0, x1) - h, min(y0, y1) - h, max(x0, x1) + h, max(y0, y1) + h)

    def rect(self, x: float, y: float, w: float, h: float, *, fill_gray: float | None = None,
             stroke: bool = True, width: float = 0.5) -> Rect:
        c = self.c
        c.setLineWidth(width)
        if fill_gray is not None:
            c.setFillGray(fill_gray)
            self._fill = fill_gray
        c.rect(x, self._y(y + h), w, h, stroke=int(stroke), fill=int(fill_gray is not None))
        return (x, y, x + w, y + h)

    def formula(self, latex: str, x: float, top: float, size: float, family: str = "cm") -> Rect:
        """Draw mathtext glyph outlines (vector) with their ink's top-left at (x, top)."""
        from reportlab.pdfgen.canvas import FILL_NON_ZERO

        path, ext = _formula_path(latex, size, family)
        ox, oy = x - ext.x0, self._y(top) - ext.y1  # PDF coords: y up
        p = self.c.beginPath()
        cur = (0.0, 0.0)
        start = (0.0, 0.0)
        for verts, code in path.iter_segments(curves=True, simplify=False):
            if code == 1:  # MOVETO
                cur = start = (verts[0], verts[1])
                p.moveTo(ox + cur[0], oy + cur[1])
            elif code == 2:  # LINETO
                cur = (verts[0], verts[1])
                p.lineTo(ox + cur[0], oy + cur[1])
            elif code == 3:  # CURVE3 -> cubic
                qx, qy, ex, ey = verts
                c1 = (cur[0] + 2 / 3 * (qx - cur[0]), cur[1] + 2 / 3 * (qy - cur[1]))
                c2 = (ex + 2 / 3 * (qx - ex), ey + 2 / 3 * (qy - ey))
                p.curveTo(ox + c1[0], oy + c1[1], ox + c2[0], oy + c2[1], ox + ex, oy + ey)
                cur = (ex, ey)
            elif code == 4:  # CURVE4
                p.curveTo(*(ox + v if i % 2 == 0 else oy + v for i, v in enumerate(verts)))
                cur = (verts[4], verts[5])
            elif code == 79:  # CLOSEPOLY
                p.close()
                cur = start
        self._set_gray(0.0)
        self.c.drawPath(p, stroke=0, fill=1, fillMode=FILL_NON_ZERO)
        return (x, top, x + ext.x1 - ext.x0, top + ext.y1 - ext.y0)

    def image(self, img, x: float, y: float, w: float, h: float) -> Rect:
        """Place a PIL image or encoded image bytes (JPEG/PNG) into the box (x, y, w, h)."""
        src = ImageReader(io.BytesIO(img)) if isinstance(img, (bytes, bytearray)) else ImageReader(img)
        self.c.drawImage(src, x, self._y(y + h), w, h)
        return (x, y, x + w, y + h)


def cjk_renders() -> bool:
    """Whether this pdfium draws STSong-Light glyphs (it needs a CJK font on the machine: the PDF
    does not embed one). Rendered images of CJK pages lack their text where this is False."""
    return _cjk_renders()


@lru_cache(maxsize=1)
def _cjk_renders() -> bool:
    import numpy as np
    import pypdfium2 as pdfium
    from reportlab.pdfgen import canvas

    ensure_fonts()
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(60, 40), invariant=1)
    c.setFont(CJK_FONT, 24)
    c.drawString(6, 10, "中文")
    c.showPage()
    c.save()
    doc = pdfium.PdfDocument(buf.getvalue())
    try:
        img = np.asarray(doc[0].render(scale=1).to_pil().convert("L"))
    finally:
        doc.close()
    return bool((img < 128).sum() > 20)
