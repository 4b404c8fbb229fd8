"""Page layout: document styles, the stream of blocks a document is made of, and composing one page
(furniture, title block, bands of columns) with its reading order.

Reading order is the order blocks are placed in: the title block, then an optional full-width
float band, then each column top to bottom, columns left to right. Body regions get ``order``
1..n; page furniture (headers, footers, page numbers, page footnotes) gets None, as in
OmniDocBench. Positions are display points (origin top-left); ``generate`` turns them into
pixel boxes. This module draws through a :class:`~padoc_ray.corpus.draw.Painter` and knows nothing
of files, processes or rasterization.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from . import content as C
from .blocks import FigureBlock, FormulaBlock, Placed, RSpec, TableBlock, TextBlock, text_block
from .draw import CJK_FONT, Painter, line_height, text_width
from .profiles import PAGE_SIZES, Profile, weighted


@dataclass(frozen=True)
class Fonts:
    body: str
    bold: str
    italic: str
    heading: str


def fonts_for(lang: str, serif: bool, rng: random.Random) -> Fonts:
    if lang == "zh":
        return Fonts(CJK_FONT, CJK_FONT, CJK_FONT, CJK_FONT)
    if lang in ("el", "ru"):
        if serif:
            return Fonts("DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "DejaVuSans-Bold")
        return Fonts("DejaVuSans", "DejaVuSans-Bold", "DejaVuSans", "DejaVuSans-Bold")
    if serif:
        return Fonts("Times-Roman", "Times-Bold", "Times-Italic", rng.choice(["Times-Bold", "Helvetica-Bold"]))
    return Fonts("Helvetica", "Helvetica-Bold", "Helvetica-Oblique", "Helvetica-Bold")


@dataclass
class Style:
    lang: str
    fonts: Fonts
    size: float
    leading: float
    para_gap: float
    indent: float
    margins: tuple[float, float, float, float]  # top, bottom, left, right
    col_gap: float
    numbered: bool
    caption_center: bool
    slides: bool = False

    @property
    def spaced(self) -> bool:
        return self.lang != "zh"



@dataclass
class DocPlan:
    profile: Profile
    style: Style
    lang: str
    page_size: tuple[int, int]
    columns: int
    n_pages: int
    header: list[str]
    footer: str | None
    pn_style: int | None  # None: no page numbers
    pn_pos: str
    title: bool
    abstract: bool
    scanned: bool
    rotated: set[int] = field(default_factory=set)
    references: bool = False
    stream: "BlockStream | None" = None


def plan_document(rng: random.Random, prof: Profile, n_pages: int) -> DocPlan:
    lang = weighted(rng, prof.languages)
    slides = rng.random() < prof.p_slides_doc
    serif = rng.random() < prof.serif
    fonts = fonts_for(lang, serif, rng)
    if slides:
        size = rng.uniform(15, 19)
        style = Style(lang, fonts, size, size * 1.3, size * 0.6, 0.0, (30, 28, 40, 40), 24, False, True, slides=True)
        page, columns = PAGE_SIZES["slide"], rng.choice([1, 2])
    else:
        size = round(rng.uniform(*prof.body_size), 1)
        indent = size * 2 if lang == "zh" else rng.choice([0.0, 0.0, size * 1.5])
        m = rng.uniform(54, 78)
        style = Style(lang, fonts, size, size * rng.uniform(1.18, 1.4), rng.uniform(4.5, 9), indent,
                      (m + rng.uniform(0, 10), m, rng.uniform(50, 76), rng.uniform(50, 76)), rng.uniform(14, 24),
                      rng.random() < 0.75, rng.random() < 0.6)
        page, columns = PAGE_SIZES[weighted(rng, prof.page_sizes)], weighted(rng, prof.columns)
    kind = "academic" if prof.name == "academic" else "report" if prof.name == "report" else "other"
    doc = DocPlan(
        profile=prof, style=style, lang=lang, page_size=page, columns=columns, n_pages=n_pages,
        header=C.running_header(rng, lang, kind) if (rng.random() < prof.p_header and not slides) else [],
        footer=C.footer_text(rng, lang) if rng.random() < prof.p_footer else None,
        pn_style=rng.randrange(4) if rng.random() < prof.p_page_number else None,
        pn_pos=rng.choice(["bottom-center", "bottom-center", "bottom-right", "top-right"]),
        title=rng.random() < prof.p_title, abstract=rng.random() < prof.p_abstract and not slides,
        # Chinese pages are never scanned or rotated: STSong-Light is not embedded, and pdfium without a
        # CJK font can neither rasterize it nor keep its text layer on rotated text (see draw.cjk_renders)
        scanned=rng.random() < prof.p_scanned_doc and lang != "zh",
        rotated={i for i in range(n_pages) if rng.random() < prof.p_rotated_page and not slides and lang != "zh"},
        references=rng.random() < prof.p_references and lang == "en" and not slides,
    )
    doc.stream = BlockStream(rng, doc)
    return doc


class BlockStream:
    """The document's content, block by block, with its section/figure/table/equation counters.
    Blocks that did not fit go back to the front (``push``) and come first on the next column."""

    def __init__(self, rng: random.Random, doc: DocPlan):
        self.rng, self.doc, self.st = rng, doc, doc.style
        self.pending: deque = deque()
        self.sec = [0, 0]
        self.n_fig = self.n_tab = self.n_eq = self.n_ref = 0
        self.last = ""
        self.ended = False
        weights = dict(doc.profile.blocks)
        if self.st.slides:
            weights = {"list": 0.45, "paragraph": 0.2, "figure": 0.25, "table": 0.1}
        self.weights = weights

    def push(self, block) -> None:
        self.pending.appendleft(block)

    def para(self, n: tuple[int, int] = (2, 7)) -> TextBlock:
        st, rng = self.st, self.rng
        text = C.paragraph(rng, st.lang, rng.randrange(*n))
        return text_block("text_block", text, st.spaced, st.fonts.body, st.size, st.leading, indent=st.indent,
                          gap=st.para_gap)

    def heading(self) -> TextBlock:
        st, rng = self.st, self.rng
        level = 1 if (self.sec[0] == 0 or rng.random() < 0.45) else 2
        if level == 1:
            self.sec = [self.sec[0] + 1, 0]
        else:
            self.sec[1] += 1
        num = None
        if st.numbered:
            num = (C.zh_number(self.sec[0]) + "、" if st.lang == "zh" else str(self.sec[0])) if level == 1 \
                else f"{self.sec[0]}.{self.sec[1]}"
        size = st.size * (1.35 if level == 1 else 1.12)
        return text_block("title", C.section_heading(rng, st.lang, num), st.spaced, st.fonts.heading, size,
                          size * 1.2, splittable=False, keep=st.leading * 2 + 6, gap=st.para_gap)

    def caption(self, what: str, k: int) -> TextBlock:
        st = self.st
        size = st.size * 0.9
        return text_block(f"{what}_caption", C.caption(self.rng, st.lang, what, k), st.spaced, st.fonts.body, size,
                          size * 1.2, splittable=False, align="center" if st.caption_center else "left")

    def table(self, width: float) -> TableBlock:
        st, rng, prof = self.st, self.rng, self.doc.profile
        size = st.size * (0.9 if not st.slides else 0.75)
        max_cols = max(2, min(8, int(width / (size * 6))))
        lo, hi = prof.table_rows if not st.slides else (3, 5)
        spec = C.table_spec(rng, st.lang, rng.randint(lo, hi), rng.randrange(2, max_cols + 1),
                            merged=prof.p_merged_cells)
        self.n_tab += 1
        cap = self.caption("table", self.n_tab) if rng.random() < 0.85 else None
        note = None
        if rng.random() < prof.p_table_note:
            note = text_block("table_footnote", C.table_note(rng, st.lang), st.spaced, st.fonts.body, size * 0.9,
                              size * 1.1, splittable=False)
        sans = st.lang == "en" and rng.random() < 0.4
        return TableBlock(spec, cap, note, "Helvetica" if sans else st.fonts.body,
                          "Helvetica-Bold" if sans else st.fonts.bold, size, rng.random() < 0.5, rng.random() < 0.3)

    def figure(self, frac_lo: float = 0.6) -> FigureBlock:
        st, rng = self.st, self.rng
        self.n_fig += 1
        cap = self.caption("figure", self.n_fig) if rng.random() < 0.9 else None
        spec = C.chart_spec(rng, st.lang, self.doc.profile.photo_share)
        return FigureBlock.make(rng, spec, cap, rng.uniform(frac_lo, 1.0))

    def formula(self) -> FormulaBlock:
        st, rng = self.st, self.rng
        label = None
        if rng.random() < self.doc.profile.p_equation_number:
            self.n_eq += 1
            label = f"({self.n_eq})"
        return FormulaBlock(C.formula(rng), label, st.fonts.body if st.lang != "zh" else "Times-Roman",
                            st.size * rng.uniform(1.0, 1.2), rng.choice(["cm", "cm", "stix", "dejavuserif"]),
                            centered=rng.random() < 0.85)

    def list_items(self) -> list[TextBlock]:
        st, rng = self.st, self.rng
        n = rng.randrange(2, 7)
        out = []
        for marker in C.list_markers(rng, n, st.lang):
            text = C.list_item(rng, st.lang, marker)
            hang = text_width(marker + (" " if st.spaced else ""), st.fonts.body, st.size)
            out.append(text_block("text_block", text, st.spaced, st.fonts.body, st.size, st.leading, hang=hang,
                                  gap=st.para_gap * 0.6, min_lines=1))
        return out

    def references(self) -> list:
        st, rng = self.st, self.rng
        size = st.size * 0.88
        head = text_block("title", "References", True, st.fonts.heading, st.size * 1.3, st.size * 1.5,
                          splittable=False, keep=st.leading * 2 + 6, gap=st.para_gap)
        items = []
        for _ in range(rng.randrange(4, 12)):
            self.n_ref += 1
            items.append(text_block("reference", C.reference_entry(rng, self.n_ref), True, st.fonts.body, size,
                                    size * 1.2, hang=12.0, gap=3.0, min_lines=1))
        return [head] + items

    def next(self, width: float):
        """The next block, or None once the document has ended (after its reference list)."""
        if self.pending:
            return self.pending.popleft()
        if self.ended:
            return None
        kind = weighted(self.rng, self.weights)
        if self.last == "heading" or (kind == "heading" and self.last in ("", "heading")):
            kind = "paragraph"
        self.last = kind
        if kind == "heading":
            return self.heading()
        if kind == "list":
            items = self.list_items()
            for b in reversed(items[1:]):
                self.push(b)
            return items[0]
        if kind == "table":
            return self.table(width)
        if kind == "formula":
            return self.formula()
        if kind == "figure":
            return self.figure()
        if self.st.slides:
            return self.para((1, 4))
        return self.para((8, 15) if self.rng.random() < self.doc.profile.long_paragraphs else (2, 8))


# ---- composing a page ----------------------------------------------------------------------------
def _fill(p: Painter, stream: BlockStream, x: float, width: float, y0: float, y1: float, out: list[RSpec]) -> None:
    """Fill one column, top to bottom, with blocks from the stream. A table, figure or formula that
    does not fit waits (at most two of them) while text goes on filling the column, as floats do."""
    y = y0
    deferred: list = []
    first: list = []  # what must open the next column: a split paragraph's rest, or a block that did not fit
    for _ in range(200):
        if y1 - y <= 6:
            break
        block = stream.next(width)
        if block is None:
            break
        placed: Placed | None = block.fit(width, y1 - y)
        if placed is None:
            if y == y0:  # it does not fit even an empty column: drop it
                continue
            if isinstance(block, (TableBlock, FigureBlock, FormulaBlock)) and len(deferred) < 2:
                deferred.append(block)
                continue
            first.append(block)
            break
        out.extend(placed.draw(p, x, y))
        y += placed.height + max(block.gap, 4.0)  # padded boxes (1.5 pt each) never touch
        if placed.rest is not None:
            first.append(placed.rest)
            break
    for b in reversed(first + deferred):
        stream.push(b)


def _furniture(p: Painter, doc: DocPlan, page_no: int, W: float, H: float) -> list[RSpec]:
    st = doc.style
    top, bottom, left, right = st.margins
    out: list[RSpec] = []
    small = st.size * 0.82
    font = st.fonts.body
    y_head = top * 0.45
    if doc.header:
        out.append(RSpec("header", p.text(left, y_head, doc.header[0], font, small), doc.header[0]))
        if len(doc.header) > 1:
            w = text_width(doc.header[1], font, small)
            out.append(RSpec("header", p.text(W - right - w, y_head, doc.header[1], font, small), doc.header[1]))
        p.line(left, y_head + line_height(font, small) + 3, W - right, y_head + line_height(font, small) + 3, 0.5)
    y_foot = H - bottom * 0.6
    pos = doc.pn_pos
    if doc.pn_style is not None:
        text = C.page_number_text(doc.pn_style, page_no + 1, doc.n_pages, doc.lang)
        pfont = "Times-Roman" if doc.lang == "zh" and text.isascii() else font
        w = text_width(text, pfont, small)
        if pos == "top-right" and len(doc.header) != 1:
            pos = "bottom-right"
        if pos == "top-right":  # on the header line, at the right margin
            y, x = y_head + line_height(font, small) - line_height(pfont, small), W - right - w
        elif pos == "bottom-right" or (doc.footer and pos == "bottom-center"):
            y, x = y_foot, W - right - w
        else:
            y, x = y_foot, (W - w) / 2
        out.append(RSpec("page_number", p.text(x, y, text, pfont, small), text))
    if doc.footer:
        out.append(RSpec("footer", p.text(left, y_foot, doc.footer, font, small), doc.footer))
    return out


def page_columns(doc: DocPlan, W: float, H: float) -> int:
    """Body columns of a page: the document's, but at least two on a landscape (rotated) page."""
    return doc.columns if W < H * 1.2 or doc.style.slides else max(doc.columns, 2)


def compose_page(p: Painter, rng: random.Random, doc: DocPlan, page_no: int) -> list[RSpec]:
    """Draw one page; return its regions, body regions numbered in reading order."""
    st, stream = doc.style, doc.stream
    W, H = p.width, p.height
    top, bottom, left, right = st.margins
    regions = _furniture(p, doc, page_no, W, H)
    body: list[RSpec] = []
    bw = W - left - right
    y = top
    cols = page_columns(doc, W, H)
    # page footnote: at the foot of the first column
    col_w = (bw - (cols - 1) * st.col_gap) / cols
    bottoms = [H - bottom] * cols
    if rng.random() < doc.profile.p_footnote and not st.slides:
        fs = st.size * 0.8
        fn = text_block("page_footnote", C.footnote_text(rng, doc.lang, page_no + 1), st.spaced, st.fonts.body, fs,
                        fs * 1.2, splittable=False)
        placed = fn.fit(col_w, 10_000)
        if placed is not None and placed.height < (H - top - bottom) * 0.25:
            fy = H - bottom - placed.height
            regions += placed.draw(p, left, fy)
            p.line(left, fy - 5, left + col_w * 0.35, fy - 5, 0.4)
            bottoms[0] = fy - 12
    # title block (first page; every slide), full width
    if (page_no == 0 and doc.title) or st.slides:
        tsize = st.size * (1.6 if st.slides else 1.9)
        text = C.short_phrase(rng, doc.lang, 2, 6) if st.slides else C.short_phrase(rng, doc.lang, 4, 11)
        title = text_block("title", text, st.spaced, st.fonts.heading, tsize, tsize * 1.2, splittable=False,
                           align="left" if st.slides else "center")
        intro = [title]
        if doc.abstract and page_no == 0:
            intro.append(text_block("text_block", C.author_line(rng, doc.lang), st.spaced, st.fonts.italic, st.size,
                                    st.leading, align="center", splittable=False))
            intro.append(text_block("title", "Abstract" if doc.lang == "en" else {"zh": "摘要", "el": "Περίληψη",
                                                                                  "ru": "Аннотация"}[doc.lang],
                                    st.spaced, st.fonts.heading, st.size * 1.1, st.size * 1.3, splittable=False))
            ab = stream.para((3, 7))
            ab.splittable = False
            intro.append(ab)
        for b in intro:
            placed = b.fit(bw, bottoms[0] - y)
            if placed is None:
                break
            body += placed.draw(p, left, y)
            y += placed.height + max(b.gap, 8)
        y += 6
    elif cols > 1 and rng.random() < doc.profile.p_wide_float:
        block = stream.figure(0.5) if rng.random() < 0.5 else stream.table(bw)
        placed = block.fit(bw, (min(bottoms) - y) * 0.55)
        if placed is not None:
            body += placed.draw(p, left, y)
            y += placed.height + 14
    for k in range(cols):
        if page_no == doc.n_pages - 1 and doc.references and k == cols - 1:
            stream.pending.extend(stream.references())  # the reference list closes the document
            stream.ended = True
        _fill(p, stream, left + k * (col_w + st.col_gap), col_w, y, bottoms[k], body)
    for i, r in enumerate(body):
        r.order = i + 1
    return regions + body
