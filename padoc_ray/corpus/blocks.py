"""Measured content blocks: paragraphs, headings, list items, tables, formulas and figures.

A block is fitted into a column (``fit(width, avail)``): it measures itself with the fonts' real
metrics and answers how tall it is and how to draw it, or None when it cannot fit. A paragraph
that fits only partly splits: the part that fits is placed and the rest comes back as a new block
for the next column or page (as real paragraphs continue, becoming two regions). Drawing returns
:class:`RSpec` region specs with exact, unpadded boxes in display points; reading order and the
page are ``layout``'s business.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, replace
from typing import Callable

from . import content as C
from .draw import Painter, Rect, ascent_descent, formula_extent, line_height, text_width
from .figures import render_figure

PAD = 1.5  # points added around every text box
FIG_PAD = 1.0  # ...and around figures, tables and formulas
FIG_PX_PER_PT = 1.6  # chart pixels per point of page


@dataclass
class RSpec:
    """One region as drawn: category, unpadded box (display points), content and its format."""

    category: str
    box: Rect
    content: str | None
    fmt: str = "text"
    pad: float = PAD
    order: int | None = None


@dataclass
class Placed:
    height: float
    draw: Callable[[Painter, float, float], list[RSpec]]  # (painter, x, y_top) -> regions
    rest: "TextBlock | None" = None


def union(boxes: list[Rect]) -> Rect:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


#: CJK punctuation that may not open a line (kinsoku): the char before it moves down with it
NO_LINE_START = frozenset("，。、；：？！）》」』”’·…%")


def wrap(tokens: list[str], sep: str, font: str, size: float, width: float, first: float = 0.0,
         hang: float = 0.0) -> list[tuple[float, int, int]]:
    """Greedy wrap by real advance widths: (x offset, token start, token end) per line."""
    sw = text_width(sep, font, size) if sep else 0.0
    lines: list[tuple[float, int, int]] = []
    start, cur, off = 0, 0.0, first
    i = 0
    while i < len(tokens):
        w = text_width(tokens[i], font, size)
        trial = cur + sw + w if i > start else w
        if i > start and trial > width - off:
            if not sep and tokens[i] in NO_LINE_START and i - 1 > start:
                i -= 1
            lines.append((off, start, i))
            start, cur, off = i, 0.0, hang
            continue
        cur = trial
        i += 1
    lines.append((off, start, len(tokens)))
    return lines


def tokens_of(text: str, spaced: bool) -> list[str]:
    return text.split() if spaced else list(text)


@dataclass
class TextBlock:
    """Wrapped text as one region (paragraph, list item, heading, caption, reference, footnote)."""

    category: str
    tokens: list[str]
    sep: str
    font: str
    size: float
    leading: float
    indent: float = 0.0  # first-line offset
    hang: float = 0.0  # offset of the other lines (list items, references)
    align: str = "left"  # or "center"
    splittable: bool = True
    min_lines: int = 2
    keep: float = 0.0  # free space needed below it (a heading keeps with what follows)
    gap: float = 6.0  # space after it

    def lines(self, width: float):
        return wrap(self.tokens, self.sep, self.font, self.size, width, self.indent, self.hang)

    def fit(self, width: float, avail: float) -> Placed | None:
        if not self.tokens:
            return None
        lines = self.lines(width)
        lh = line_height(self.font, self.size)
        if avail < lh + self.keep:
            return None
        max_lines = int((avail - lh - self.keep) // self.leading) + 1
        use, rest = len(lines), None
        if use > max_lines:
            if not self.splittable or max_lines < self.min_lines:
                return None
            use = max_lines
            rest = replace(self, tokens=self.tokens[lines[use][1]:], indent=self.hang)
        shown = lines[:use]

        def draw(p: Painter, x: float, y: float) -> list[RSpec]:
            boxes = []
            for i, (off, s, e) in enumerate(shown):
                text = self.sep.join(self.tokens[s:e])
                xo = (width - text_width(text, self.font, self.size)) / 2 if self.align == "center" else off
                boxes.append(p.text(x + xo, y + i * self.leading, text, self.font, self.size))
            content = self.sep.join(self.tokens[shown[0][1]:shown[-1][2]])
            return [RSpec(self.category, union(boxes), content)]

        return Placed(lh + (use - 1) * self.leading, draw, rest)


def text_block(category: str, text: str, spaced: bool, font: str, size: float, leading: float | None = None,
               **kw) -> TextBlock:
    return TextBlock(category, tokens_of(text, spaced), " " if spaced else "", font, size,
                     leading if leading is not None else size * 1.25, **kw)


# ---- tables --------------------------------------------------------------------------------------
@dataclass
class TableBlock:
    spec: C.TableSpec
    caption: TextBlock | None
    note: TextBlock | None
    font: str
    bold: str
    size: float
    stretch: bool
    shade_header: bool
    gap: float = 10.0

    def _geometry(self, size: float):
        pad_x, pad_y = size * 0.5, size * 0.3
        widths = [0.0] * self.spec.n_cols
        spans = []
        for c in self.spec.cells:
            w = text_width(c.text, self.bold if c.header else self.font, size) + 2 * pad_x
            if c.colspan == 1:
                widths[c.col] = max(widths[c.col], w)
            else:
                spans.append((c, w))
        widths = [max(w, size * 2) for w in widths]
        for c, w in spans:
            have = sum(widths[c.col:c.col + c.colspan])
            if have < w:
                for k in range(c.col, c.col + c.colspan):
                    widths[k] += (w - have) / c.colspan
        rh = line_height(self.font, size) + 2 * pad_y
        return widths, rh

    def fit(self, width: float, avail: float) -> Placed | None:
        size = self.size
        widths, rh = self._geometry(size)
        if sum(widths) > width:
            size = max(6.0, size * width / sum(widths) * 0.98)
            widths, rh = self._geometry(size)
            if sum(widths) > width:
                return None
        if self.stretch:
            extra = (width - sum(widths)) / len(widths)
            widths = [w + extra for w in widths]
        tw, th = sum(widths), rh * self.spec.n_rows
        cap = self.caption.fit(width, 10_000) if self.caption else None
        note = self.note.fit(width, 10_000) if self.note else None
        cap_h = cap.height + 5 if cap else 0.0
        note_h = note.height + 4 if note else 0.0
        height = cap_h + th + note_h
        if height > avail:
            return None
        spec, font, bold = self.spec, self.font, self.bold

        def draw(p: Painter, x: float, y: float) -> list[RSpec]:
            out: list[RSpec] = []
            if cap:
                out += cap.draw(p, x, y)
            x0 = x + (width - tw) / 2
            y0 = y + cap_h
            xs = [x0]
            for w in widths:
                xs.append(xs[-1] + w)
            ys = [y0 + r * rh for r in range(spec.n_rows + 1)]
            if self.shade_header and spec.header_rows:
                p.rect(x0, y0, tw, ys[spec.header_rows] - y0, fill_gray=0.88, stroke=False)
            if spec.style == "grid":
                for c in spec.cells:
                    p.rect(xs[c.col], ys[c.row], xs[c.col + c.colspan] - xs[c.col], ys[c.row + c.rowspan] - ys[c.row],
                           width=0.5)
            elif spec.style == "booktabs":
                p.line(x0, ys[0], x0 + tw, ys[0], 1.0)
                p.line(x0, ys[spec.header_rows], x0 + tw, ys[spec.header_rows], 0.5)
                p.line(x0, ys[-1], x0 + tw, ys[-1], 1.0)
                for c in spec.cells:
                    if c.header and c.colspan > 1:
                        yy = ys[c.row + c.rowspan]
                        p.line(xs[c.col] + 2, yy, xs[c.col + c.colspan] - 2, yy, 0.4)
            else:
                for r in range(spec.n_rows + 1):
                    p.line(x0, ys[r], x0 + tw, ys[r], 0.8 if r in (0, spec.n_rows) else 0.4)
            a, d = ascent_descent(font, size)
            for c in spec.cells:
                if not c.text:
                    continue
                f = bold if c.header else font
                cx0, cx1 = xs[c.col], xs[c.col + c.colspan]
                cy0, cy1 = ys[c.row], ys[c.row + c.rowspan]
                w = text_width(c.text, f, size)
                tx = cx0 + size * 0.5 if (c.col == 0 and not c.header) else (cx0 + cx1 - w) / 2
                p.text(tx, (cy0 + cy1 - (a - d)) / 2, c.text, f, size)
            out.append(RSpec("table", (x0, y0, x0 + tw, y0 + th), spec.html(), "html", pad=FIG_PAD))
            if note:
                out += note.draw(p, x, y0 + th + 4)
            return out

        return Placed(height, draw)


# ---- formulas ------------------------------------------------------------------------------------
@dataclass
class FormulaBlock:
    latex: str
    label: str | None  # "(3)"
    label_font: str
    size: float
    family: str
    centered: bool = True
    gap: float = 8.0

    def fit(self, width: float, avail: float) -> Placed | None:
        size = self.size
        lw = text_width(self.label, self.label_font, self.size * 0.9) if self.label else 0.0
        room = width - (lw + 14 if self.label else 0) - 2
        fw, fh = formula_extent(self.latex, size, self.family)
        if fw > room:
            size = size * room / fw * 0.97
            if size < self.size * 0.6:
                return None
            fw, fh = formula_extent(self.latex, size, self.family)
            if fw > room:
                return None
        lh = line_height(self.label_font, self.size * 0.9)
        inner = max(fh, lh)
        height = inner + 6
        if height > avail:
            return None

        def draw(p: Painter, x: float, y: float) -> list[RSpec]:
            fx = x + (room - fw) / 2 if self.centered else x + min(20.0, room - fw)
            top = y + 3 + (inner - fh) / 2
            box = p.formula(self.latex, fx, top, size, self.family)
            out = [RSpec("equation_isolated", box, f"$$\n{self.latex}\n$$", "latex", pad=FIG_PAD)]
            if self.label:
                ly = y + 3 + (inner - lh) / 2
                out.append(RSpec("equation_caption", p.text(x + width - lw, ly, self.label, self.label_font,
                                                            self.size * 0.9), self.label))
            return out

        return Placed(height, draw)


# ---- figures -------------------------------------------------------------------------------------
_ASPECT = {"line": (0.55, 0.75), "bar": (0.55, 0.75), "scatter": (0.7, 0.9), "hist": (0.55, 0.7),
           "pie": (0.75, 0.95), "photo": (0.55, 0.9)}


@dataclass
class FigureBlock:
    spec: C.ChartSpec
    caption: TextBlock | None
    frac: float  # share of the column width
    aspect: float
    gap: float = 10.0

    @classmethod
    def make(cls, rng: random.Random, spec: C.ChartSpec, caption: TextBlock | None, frac: float) -> "FigureBlock":
        lo, hi = _ASPECT[spec.kind]
        return cls(spec, caption, frac, lo + (hi - lo) * rng.random())

    def fit(self, width: float, avail: float) -> Placed | None:
        cap = self.caption.fit(width, 10_000) if self.caption else None
        cap_h = cap.height + 6 if cap else 0.0
        w = width * self.frac
        h = w * self.aspect
        if h + cap_h > avail:
            w = (avail - cap_h) / self.aspect
            h = w * self.aspect
            if w < width * 0.45 or h < 40:
                return None

        def draw(p: Painter, x: float, y: float) -> list[RSpec]:
            img = render_figure(self.spec, round(w * FIG_PX_PER_PT), round(h * FIG_PX_PER_PT))
            if self.spec.kind == "photo":  # photos go in as JPEG (DCT), as in real PDFs; charts losslessly
                buf = io.BytesIO()
                img.save(buf, "JPEG", quality=85)
                img = buf.getvalue()
            box = p.image(img, x + (width - w) / 2, y, w, h)
            out = [RSpec("figure", box, None, "none", pad=FIG_PAD)]
            if cap:
                out += cap.draw(p, x, y + h + 6)
            return out

        return Placed(h + cap_h, draw)
